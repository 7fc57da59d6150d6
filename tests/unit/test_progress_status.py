"""Operator side of issue 6: trainer metrics / progress record -> status fragment, ETA, stall clock."""

from __future__ import annotations

import datetime
import json

import pytest

from rljob_operator import trainer_progress as tp

METRICS = """
# HELP hybridflow_step Last completed training step.
# TYPE hybridflow_step gauge
hybridflow_step{namespace="ml",rljob="tiny"} 12.0
# TYPE hybridflow_total_steps gauge
hybridflow_total_steps{namespace="ml",rljob="tiny"} 48.0
# TYPE hybridflow_step_duration_seconds gauge
hybridflow_step_duration_seconds{namespace="ml",rljob="tiny"} 2.5
# TYPE hybridflow_reward_mean gauge
hybridflow_reward_mean{namespace="ml",rljob="tiny"} 0.625
# TYPE hybridflow_kl gauge
hybridflow_kl{namespace="ml",rljob="tiny"} 0.002
# TYPE hybridflow_throughput_tokens_per_second gauge
hybridflow_throughput_tokens_per_second{namespace="ml",rljob="tiny"} 1500.0
# TYPE hybridflow_checkpoint_step gauge
hybridflow_checkpoint_step{namespace="ml",rljob="tiny"} 10.0
# TYPE hybridflow_checkpoint_timestamp_seconds gauge
hybridflow_checkpoint_timestamp_seconds{namespace="ml",rljob="tiny"} 0.0
# TYPE hybridflow_checkpoint_age_seconds gauge
hybridflow_checkpoint_age_seconds{namespace="ml",rljob="tiny"} 5.0
"""
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def test_metrics_text_to_status() -> None:
    report = tp.parse_trainer_metrics(METRICS)
    assert report is not None and report.step == 12 and report.checkpoint_time == "1970-01-01T00:00:00Z"
    assert tp.build_progress_status(report, "s3://b/run/") == {
        "progress": {"step": 12, "totalSteps": 48, "percent": 25.0, "etaSeconds": 90},
        "metrics": {"rewardMean": 0.625, "kl": 0.002, "throughputTokensPerSecond": 1500.0},
        "checkpoint": {"step": 10, "uri": "s3://b/run/global_step_10", "time": "1970-01-01T00:00:00Z"},
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", None),
        ("# TYPE other gauge\nother 1\n", None),  # not a hybridflow trainer
        ("hybridflow_step 3\nhybridflow_checkpoint_age_seconds NaN\n",
         {"progress": {"step": 3}}),  # before totals, metrics and any checkpoint
        ("hybridflow_step 3\nhybridflow_total_steps 0\nhybridflow_reward_mean NaN\n",
         {"progress": {"step": 3, "totalSteps": 0}}),
    ],
)
def test_partial_metrics(text: str, expected: dict | None) -> None:
    report = tp.parse_trainer_metrics(text)
    assert (None if report is None else tp.build_progress_status(report)) == expected


def test_progress_record_to_status() -> None:
    raw = json.dumps({"step": 4, "total_steps": 8, "avg_step_seconds": 3.0, "attempt": 2,
                      "metrics": {"reward_mean": 0.5, "kl": 0.1, "throughput_tokens_per_second": 10.0},
                      "checkpoint": {"step": 4, "uri": "s3://b/r/global_step_4", "time": "2026-01-01T00:00:00Z"},
                      "future_key": 1})
    report = tp.parse_progress_record(raw)
    assert report is not None
    assert tp.build_progress_status(report, "ignored") == {
        "progress": {"step": 4, "totalSteps": 8, "percent": 50.0, "etaSeconds": 12},
        "metrics": {"rewardMean": 0.5, "kl": 0.1, "throughputTokensPerSecond": 10.0},
        "checkpoint": {"step": 4, "uri": "s3://b/r/global_step_4", "time": "2026-01-01T00:00:00Z"},
    }


@pytest.mark.parametrize("raw", [b"{", b"[]", b'{"step": "4"}', b"\xff"])
def test_bad_progress_record_is_ignored(raw: bytes) -> None:
    assert tp.parse_progress_record(raw) is None


@pytest.mark.parametrize(
    ("step", "total", "secs", "eta"),
    [(0, 10, 2.0, 20), (10, 10, 2.0, 0), (12, 10, 2.0, 0), (None, 10, 2.0, None), (1, None, 2.0, None),
     (1, 10, None, None), (1, 10, -1.0, None)],
)
def test_eta(step: int | None, total: int | None, secs: float | None, eta: int | None) -> None:
    assert tp.compute_eta_seconds(step, total, secs) == eta


@pytest.mark.parametrize(
    ("rayjob", "url"),
    [
        (None, None),
        ({"metadata": {"namespace": "ml"}, "status": {}}, None),
        ({"metadata": {"namespace": "ml"}, "status": {"rayClusterName": "tiny-a1-abc"}},
         "http://tiny-a1-abc-head-svc.ml.svc:8000/metrics"),
    ],
)
def test_metrics_url(rayjob: dict | None, url: str | None) -> None:
    assert tp.trainer_metrics_url(rayjob) == url


def test_stall_clock() -> None:
    later = NOW + datetime.timedelta(seconds=100)
    watch = tp.watch_step(None, attempt=1, step=None, now=NOW)
    assert tp.watch_step(watch, 1, None, later) is watch  # nothing yet: the clock keeps running
    assert tp.is_stalled(watch, later, 60) and not tp.is_stalled(watch, later, 120)
    assert not tp.is_stalled(watch, later, None)
    moved = tp.watch_step(watch, 1, 5, later)
    assert moved.since == later and not tp.is_stalled(moved, later, 60)
    assert tp.watch_step(moved, 1, 5, later + datetime.timedelta(seconds=5)) is moved
    assert tp.watch_step(moved, 2, 5, later).attempt == 2  # a new attempt restarts the clock
    assert "stallTimeoutSeconds" in tp.stall_message(moved, 60) and "step 5" in tp.stall_message(moved, 60)
