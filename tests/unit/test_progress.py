"""Progress record: summary metrics, JSON round trip, atomic writes, the tracking backend across attempts."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest

from hybridflow import progress
from hybridflow.progress import CheckpointInfo, Progress, ProgressLogger
from hybridflow.tracking import Tracking


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"critic/score/mean": 0.5, "critic/rewards/mean": 0.1}, {"reward_mean": 0.5}),
        ({"critic/rewards/mean": 0.1}, {"reward_mean": 0.1}),
        ({"actor/ppo_kl": 0.3, "actor/kl_loss": 0.02}, {"kl": 0.02}),  # reference KL wins
        ({"actor/ppo_kl": 0.0, "dpo/kl": 0.05}, {"kl": 0.05}),  # online DPO: the KL from the reference
        ({"actor/ppo_kl": 0.3}, {"kl": 0.3}),
        ({"critic/score/mean": None, "perf/throughput": 1200.0, "timing_s/step": 2.5, "actor/entropy": 1.1,
          "response_length/mean": 17.0},
         {"throughput_tokens_per_second": 1200.0, "step_seconds": 2.5, "entropy": 1.1, "response_length_mean": 17.0}),
        ({"actor/pg_loss": 1.0}, {}),
        ({"train/loss": 0.4, "timing_s/step": 0.2}, {"loss": 0.4, "step_seconds": 0.2}),  # the SFT and DPO trainers
    ],
)
def test_summarize_metrics(data: dict, expected: dict) -> None:
    assert progress.summarize_metrics(data) == expected


def test_record_round_trip_ignores_unknown_keys() -> None:
    record = Progress(step=3, total_steps=10, attempt=2, metrics={"reward_mean": 0.5},
                      checkpoint=CheckpointInfo(step=2, uri="s3://b/r/global_step_2", time="2026-01-01T00:00:00Z"),
                      wandb_run_id="abc")
    raw = json.loads(record.to_json())
    raw["from_the_future"] = 1
    assert Progress.from_json(json.dumps(raw)) == record


@pytest.mark.parametrize(("raw", "match"), [("{", "not valid JSON"), ('{"step": "x"}', "no integer 'step'")])
def test_broken_record_says_what_is_wrong(raw: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Progress.from_json(raw)


def test_read_absent_is_none_and_write_replaces(tmp_path: Path) -> None:
    root = str(tmp_path / "run")
    assert progress.read_progress(root) is None
    progress.write_progress(root, Progress(step=1))
    progress.write_progress(root, Progress(step=2, total_steps=4))
    assert progress.read_progress(root) == Progress(step=2, total_steps=4)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["progress.json"]  # no temp files left


def test_iso_utc() -> None:
    assert progress.iso_utc(0) == "1970-01-01T00:00:00Z"


def test_logger_tracks_steps_checkpoints_and_survives_a_restart() -> None:
    root = "memory://bucket/progress-run"
    now = [1000.0]
    env = {progress.ATTEMPT_ENV: "1"}
    first = ProgressLogger(root, total_steps=10, wandb_run_id="run-1", clock=lambda: now[0], env=env)
    first.log({"critic/score/mean": 0.25, "timing_s/step": 2.0}, step=1)
    now[0] += 2
    first.log({"critic/score/mean": 0.5, "timing_s/step": 4.0}, step=2)
    first.checkpoint_saved(2, f"{root}/global_step_2")
    record = progress.read_progress(root)
    assert record is not None
    assert (record.step, record.total_steps, record.attempt, record.avg_step_seconds) == (2, 10, 1, 3.0)
    assert record.metrics == {"reward_mean": 0.5, "step_seconds": 4.0}
    assert record.checkpoint == CheckpointInfo(2, f"{root}/global_step_2", "1970-01-01T00:16:42Z")
    assert record.updated == "1970-01-01T00:16:42Z"
    # A second attempt (no W&B id of its own yet) keeps the checkpoint and the run id.
    second = ProgressLogger(root, total_steps=10, clock=lambda: now[0], env={progress.ATTEMPT_ENV: "2"})
    assert second.record.wandb_run_id == "run-1" and second.record.checkpoint == record.checkpoint
    second.log({"critic/score/mean": 0.75}, step=3)
    again = progress.read_progress(root)
    assert again is not None and (again.attempt, again.step, again.wandb_run_id) == (2, 3, "run-1")
    fsspec.filesystem("memory").rm("/bucket", recursive=True)


def test_logger_warns_and_continues_when_storage_fails(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where the run folder should be: every write fails
    warnings: list[str] = []
    logger = ProgressLogger(str(blocker / "run"), warn=warnings.append)
    logger.log({"critic/score/mean": 1.0}, step=1)
    assert warnings and "training continues" in warnings[-1]


def test_tracking_writes_progress_beside_checkpoints(tmp_path: Path) -> None:
    tracker = Tracking("p", "e", [], default_local_dir=str(tmp_path / "ckpt"), total_steps=5)
    tracker.log({"critic/score/mean": 0.5}, step=1)
    tracker.checkpoint_saved(1, str(tmp_path / "ckpt" / "global_step_1"))
    tracker.finish()
    record = progress.read_progress(str(tmp_path / "ckpt"))
    assert record is not None and record.step == 1 and record.checkpoint is not None
    assert record.checkpoint.step == 1 and record.total_steps == 5
