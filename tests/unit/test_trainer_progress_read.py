"""Reading a trainer's progress (its /metrics, else progress.json) and the per-job stall clock of the resync."""

from __future__ import annotations

import asyncio
import datetime
import json
import pathlib
from typing import Any

import aiohttp
import aiohttp.web
import pytest

from rljob_operator import trainer_progress as tp
from rljob_operator.handlers import Runtime, current_rayjob
from rljob_operator.reconcile import TrainerRead, progress_root, read_progress
from rljob_operator.settings import Settings

METRICS = "hybridflow_step 5\nhybridflow_total_steps 10\nhybridflow_reward_mean 0.5\nhybridflow_checkpoint_step 4\n"
RECORD = {"step": 3, "total_steps": 10, "metrics": {"reward_mean": 0.25},
          "checkpoint": {"step": 2, "uri": "file:///x/global_step_2", "time": "2026-01-01T00:00:00Z"}}
NOW = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.timezone.utc)


def rljob(location: str, stall: int | None = None, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "job", "namespace": "ml", "uid": "u1", "generation": 1},
            "spec": {"config": {"trainer": {"default_local_dir": location}},
                     "runPolicy": {"stallTimeoutSeconds": stall} if stall else {}},
            "status": status}


def rayjob(attempt: int = 1, cluster: str | None = "job-a1-rc", location: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"job-a{attempt}", "namespace": "ml",
                            "labels": {"rl.hybridflow.dev/attempt": str(attempt), "rl.hybridflow.dev/rljob": "job"}}
    if location:
        meta["annotations"] = {"rl.hybridflow.dev/checkpoint-location": location}
    return {"metadata": meta, "status": {"rayClusterName": cluster} if cluster else {}}


async def _read(routes: dict[str, tuple[int, str]], job: dict[str, Any], rj: dict[str, Any] | None) -> TrainerRead:
    """Serve `routes` (path -> (status, body)) on 127.0.0.1 and read the trainer through it."""

    async def handle(request: aiohttp.web.Request) -> aiohttp.web.Response:
        code, body = routes.get(request.path, (404, "not found"))
        return aiohttp.web.Response(status=code, text=body)

    app = aiohttp.web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            return await read_progress(session, job, rj, timeout=2,
                                       url_template=f"http://127.0.0.1:{port}/{{namespace}}/{{rljob}}/{{cluster}}")
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("routes", "record", "cluster", "step", "problems"), [
    ({"/ml/job/job-a1-rc": (200, METRICS)}, RECORD, "job-a1-rc", 5, []),  # the live endpoint wins
    ({}, RECORD, "job-a1-rc", 3, ["HTTP 404"]),  # unreachable trainer: the record
    ({"/ml/job/job-a1-rc": (200, "other_metric 1\n")}, RECORD, "job-a1-rc", 3, ["no hybridflow_step"]),
    ({"/ml/job/job-a1-rc": (200, "hybridflow_step{ 1\n")}, RECORD, "job-a1-rc", 3, ["127.0.0.1"]),  # garbage
    ({}, RECORD, None, 3, ["names no Ray cluster"]),
    ({}, None, "job-a1-rc", None, ["HTTP 404", "progress.json: not written yet"]),
    ({}, "{broken", "job-a1-rc", None, ["HTTP 404", "not a hybridflow progress record"]),
])
def test_read_progress(tmp_path: pathlib.Path, routes: dict[str, tuple[int, str]], record: Any,
                       cluster: str | None, step: int | None, problems: list[str]) -> None:
    root = str(tmp_path / "ckpt")
    if record is not None:
        (tmp_path / "ckpt").mkdir()
        (tmp_path / "ckpt" / "progress.json").write_text(record if isinstance(record, str) else json.dumps(record))
    read = asyncio.run(_read(routes, rljob(root), rayjob(cluster=cluster)))
    assert ((read.fragment or {}).get("progress") or {}).get("step") == step
    assert len(read.problems) == len(problems) and all(p in got for p, got in zip(problems, read.problems, strict=True))
    if step == 5:
        assert read.fragment == {"progress": {"step": 5, "totalSteps": 10, "percent": 50.0},
                                 "metrics": {"rewardMean": 0.5},
                                 "checkpoint": {"step": 4, "uri": f"{root}/global_step_4"}}


def test_storage_errors_degrade_to_a_problem() -> None:
    read = asyncio.run(_read({}, rljob("nosuchproto://bucket/run"), rayjob()))
    assert read.fragment is None and "nosuchproto://bucket/run/progress.json" in read.problems[-1]


def test_progress_root_is_the_attempts_pinned_location() -> None:
    assert progress_root(rljob("/new"), rayjob(location="s3://b/old")) == "s3://b/old"
    assert progress_root(rljob("/new"), rayjob()) == "/new"
    assert progress_root(rljob("/new"), None) == "/new"


def test_metrics_url_template() -> None:
    assert tp.trainer_metrics_url(rayjob(), template="http://h/{namespace}/{rljob}/{cluster}:{port}") == \
        "http://h/ml/job/job-a1-rc:8000"


def test_current_rayjob_follows_status_attempt() -> None:
    jobs = [rayjob(attempt) for attempt in (9, 10, 11)]  # by name, "job-a9" would sort last
    assert current_rayjob(rljob("/x", attempt=10), jobs) is jobs[1]
    assert current_rayjob(rljob("/x"), jobs) is None


def _read_step(step: int | None) -> TrainerRead:
    return TrainerRead({"progress": {"step": step}} if step is not None else None, [] if step else ["HTTP 404"])


def test_stall_clock_of_the_resync() -> None:
    runtime = Runtime(settings=Settings(), client=None)  # no API calls here
    job = rljob("/x", stall=60, phase="Running", attempt=1)
    at = [NOW + datetime.timedelta(seconds=s) for s in (0, 50, 100, 161, 170)]
    assert runtime.check_stall("u1", job, _read_step(5), at[0]) is None
    assert runtime.check_stall("u1", job, _read_step(6), at[1]) is None  # a step: the clock restarts
    assert runtime.check_stall("u1", job, None, at[2]) is None  # not read this round: unknown, keep the clock
    runtime.unread["u1"] = "http://x/metrics: HTTP 404"
    message = runtime.check_stall("u1", job, _read_step(None), at[3])
    assert message is not None and "past step 6 for more than 60s" in message and "HTTP 404" in message
    # Not running (e.g. Restarting after the stall): the clock stops and starts afresh when it runs again.
    assert runtime.check_stall("u1", {**job, "status": {"phase": "Restarting", "attempt": 2}}, None, at[4]) is None
    assert "u1" not in runtime.watches
    no_timeout = rljob("/x", phase="Running", attempt=1)
    assert runtime.check_stall("u2", no_timeout, _read_step(1), at[0]) is None
    assert runtime.check_stall("u2", no_timeout, _read_step(1), at[4]) is None and "u2" not in runtime.watches
