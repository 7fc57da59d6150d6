"""Spec edits while running (changes.py and status.decide): live, new attempt, refused; table-driven."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest

from rljob_operator import changes
from rljob_operator.status import decide

NOW = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.timezone.utc)
URI = "s3://ckpt/demo"
SPEC: dict[str, Any] = {
    "config": {"trainer": {"nnodes": 1, "default_local_dir": "ignored-when-uri-set"}},
    "image": "trainer:1", "checkpoint": {"uri": URI}, "runPolicy": {"backoffLimit": 2},
}


def rljob(generation: int = 1, status: dict[str, Any] | None = None, **edits: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    for path, value in edits.items():  # edits as dotted paths with `__` for dots: config__trainer__nnodes=2
        *parents, leaf = path.split("__")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return {"metadata": {"name": "demo", "namespace": "default", "uid": "u1", "generation": generation},
            "spec": spec, "status": status if status is not None else {"phase": "Running", "attempt": 1}}


def rayjob(attempt: int, built_from: dict[str, Any], deployment: str = "Running", job: str = "RUNNING",
           deleting: bool = False) -> dict[str, Any]:
    """A RayJob as the operator built it from `built_from` (annotations), in a KubeRay state."""
    meta: dict[str, Any] = {"name": f"demo-a{attempt}", "labels": {"rl.hybridflow.dev/attempt": str(attempt)},
                            "annotations": changes.attempt_annotations(built_from,
                                                                       changes.checkpoint_location(built_from))}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T11:59:00Z"
    return {"metadata": meta, "spec": {"suspend": False},
            "status": {"jobDeploymentStatus": deployment, "jobStatus": job}}


def cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == ctype)


def test_fingerprint_ignores_live_fields_and_location() -> None:
    base = changes.fingerprint(SPEC)
    assert set(base) == {"config", "image"}  # checkpoint without its uri is empty
    live = rljob(2, suspend=True, runPolicy__backoffLimit=9, runPolicy__activeDeadlineSeconds=60,
                 checkpoint__uri="s3://elsewhere", config__trainer__default_local_dir="/x")["spec"]
    assert changes.fingerprint(live) == base
    assert changes.fingerprint(rljob(2, image="trainer:2")["spec"]).keys() == base.keys()
    assert changes.fingerprint(rljob(2, image="trainer:2")["spec"])["image"] != base["image"]
    assert changes.fingerprint({**SPEC, "pod": {}}) == base  # an empty field equals an absent one


@pytest.mark.parametrize(("edit", "fields"), [
    ({"config__trainer__nnodes": 2}, ["config"]),
    ({"image": "trainer:2"}, ["image"]),
    ({"resources__cpu": "16"}, ["resources"]),
    ({"pod__nodeSelector": {"gpu": "h100"}}, ["pod"]),
    ({"queueName": "team-a"}, ["queueName"]),
    ({"checkpoint__keep": 2}, ["checkpoint"]),
    ({"image": "trainer:2", "config__trainer__nnodes": 4}, ["config", "image"]),
    ({"runPolicy__backoffLimit": 7}, []),
    ({"suspend": True}, []),
    ({"checkpoint__uri": "s3://elsewhere"}, []),  # refused, not restarted (see below)
])
def test_changed_fields(edit: dict[str, Any], fields: list[str]) -> None:
    built = rayjob(1, rljob(1))
    assert changes.changed_fields(rljob(2, **edit), built) == fields


def test_no_restart_without_a_newer_generation_or_annotations() -> None:
    built = rayjob(1, rljob(1))
    assert changes.changed_fields(rljob(1, image="trainer:2"), built) == []  # same generation: never a loop
    legacy = {**built, "metadata": {**built["metadata"], "annotations": {}}}
    assert changes.changed_fields(rljob(2, image="trainer:2"), legacy) == []


def test_checkpoint_location_prefers_the_uri() -> None:
    assert changes.checkpoint_location(rljob()) == URI
    assert changes.checkpoint_location(rljob(checkpoint__uri=None)) == "ignored-when-uri-set"


# (title, RLJob, observed RayJobs) -> (attempt to ensure, stop, phase, status.attempt, SpecApplied reason, events)
V1 = rljob(1)
CASES = [
    ("live edit: backoffLimit", rljob(2, runPolicy__backoffLimit=5), [rayjob(1, V1)],
     1, [], "Running", 1, "Applied", []),
    ("live edit: suspend", rljob(2, suspend=True), [rayjob(1, V1)], 1, [], "Suspended", 1, "Applied", ["Suspended"]),
    ("config edit stops the attempt", rljob(2, config__trainer__nnodes=2), [rayjob(1, V1)],
     None, ["demo-a1"], "Restarting", 2, "Restarting", ["SpecChanged"]),
    ("image edit while starting", rljob(2, image="trainer:2"), [rayjob(1, V1, "Initializing", "")],
     None, ["demo-a1"], "Restarting", 2, "Restarting", ["SpecChanged"]),
    ("waiting for the old attempt to go", rljob(2, {"phase": "Restarting", "attempt": 2}, image="trainer:2"),
     [rayjob(1, V1, deleting=True)], None, [], "Restarting", 2, "Restarting", []),
    ("old attempt gone: new attempt", rljob(2, {"phase": "Restarting", "attempt": 2}, image="trainer:2"), [],
     2, [], "Pending", 2, "Applied", []),
    ("edit of a failed attempt: plain retry", rljob(2, image="trainer:2"),
     [rayjob(1, V1, "Failed", "FAILED")], 2, [], "Retrying", 2, "Applied", ["AttemptFailed"]),
    ("checkpoint edit refused", rljob(2, checkpoint__uri="s3://elsewhere"), [rayjob(1, V1)],
     1, [], "Running", 1, "CheckpointChangeRefused", ["SpecChangeRefused"]),
    ("checkpoint + image edit: restart, location kept", rljob(2, checkpoint__uri="s3://x", image="trainer:2"),
     [rayjob(1, V1)], None, ["demo-a1"], "Restarting", 2, "CheckpointChangeRefused",
     ["SpecChangeRefused", "SpecChanged"]),
    ("finished is final", rljob(3, {"phase": "Succeeded", "attempt": 1, "observedGeneration": 1}, image="trainer:2"),
     [rayjob(1, V1, "Complete", "SUCCEEDED")], None, [], "Succeeded", 1, None, []),
]


@pytest.mark.parametrize(("title", "job", "observed", "ensure", "stop", "phase", "attempt", "applied", "events"),
                         CASES, ids=[c[0] for c in CASES])
def test_decide_spec_edits(title: str, job: dict[str, Any], observed: list[dict[str, Any]], ensure: int | None,
                           stop: list[str], phase: str, attempt: int, applied: str | None,
                           events: list[str]) -> None:
    plan = decide(job, observed, [], NOW)
    assert (plan.attempt, plan.stop, plan.status["phase"], plan.status["attempt"]) == (ensure, stop, phase, attempt)
    if applied is not None:
        assert cond(plan.status, "SpecApplied")["reason"] == applied
    assert [e.reason for e in plan.events] == events
    assert plan.status["observedGeneration"] == job["metadata"]["generation"]


def test_refused_location_stays_pinned_and_is_reported_once() -> None:
    job = rljob(2, checkpoint__uri="s3://elsewhere")
    plan = decide(job, [rayjob(1, V1)], [], NOW)
    assert plan.checkpoint_uri == URI
    assert plan.annotations[changes.ANNOTATION_CHECKPOINT] == URI
    message = cond(plan.status, "SpecApplied")["message"]
    assert "s3://elsewhere" in message and "Set spec.checkpoint.uri back to 's3://ckpt/demo'" in message
    again = decide({**job, "status": plan.status}, [rayjob(1, V1)], [], NOW)
    assert again.events == [] and again.status == plan.status
    reverted = decide(rljob(3, plan.status), [rayjob(1, V1)], [], NOW)
    assert cond(reverted.status, "SpecApplied")["reason"] == "Applied" and reverted.checkpoint_uri is None


def test_restarts_do_not_use_up_retries() -> None:
    """Attempt 1 was replaced after an edit, attempt 2 failed: with backoffLimit 1 there is still a retry."""
    v2 = rljob(2, image="trainer:2", runPolicy__backoffLimit=1)
    plan = decide({**v2, "status": {"phase": "Running", "attempt": 2}}, [rayjob(2, v2, "Failed", "FAILED")], [], NOW)
    assert (plan.attempt, plan.status["phase"]) == (3, "Retrying")
    second = decide({**v2, "status": plan.status},
                    [rayjob(2, v2, "Failed", "FAILED"), rayjob(3, v2, "Failed", "FAILED")], [], NOW)
    assert (second.attempt, second.status["phase"]) == (None, "Failed")


def test_new_attempt_records_the_spec_it_is_built_from() -> None:
    job = rljob(2, {"phase": "Restarting", "attempt": 2}, image="trainer:2")
    plan = decide(job, [], [], NOW)
    assert plan.annotations[changes.ANNOTATION_GENERATION] == "2"
    assert changes.changed_fields(job, {"metadata": {"annotations": plan.annotations}}) == []
