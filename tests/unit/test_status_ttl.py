"""spec.runPolicy.ttlSecondsAfterFinished: when a finished job's children are deleted (pure, table-driven)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from rljob_operator.status import decide, ttl_expired, ttl_remaining

END = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.timezone.utc)
ENDED = "2026-11-30T12:00:00Z"


def _at(seconds: float) -> datetime.datetime:
    return END + datetime.timedelta(seconds=seconds)


# (status, now, ttl) -> expired
EXPIRY = {
    "succeeded, before the TTL": ({"phase": "Succeeded", "completionTime": ENDED}, _at(59), 60, False),
    "succeeded, at the TTL": ({"phase": "Succeeded", "completionTime": ENDED}, _at(60), 60, True),
    "failed, after the TTL": ({"phase": "Failed", "completionTime": ENDED}, _at(61), 60, True),
    "ttl 0: at once": ({"phase": "Succeeded", "completionTime": ENDED}, END, 0, True),
    "running: never": ({"phase": "Running", "completionTime": ENDED}, _at(3600), 60, False),
    "invalid: never": ({"phase": "Invalid"}, _at(3600), 0, False),
    "finished without a completion time: never": ({"phase": "Succeeded"}, _at(3600), 0, False),
    "malformed completion time: never": ({"phase": "Succeeded", "completionTime": "yesterday"}, _at(3600), 0, False),
}  # fmt: skip


@pytest.mark.parametrize("case", EXPIRY)
def test_ttl_expired(case: str) -> None:
    status, now, ttl, expired = EXPIRY[case]
    assert ttl_expired(status, now, ttl) is expired


def test_ttl_remaining_counts_from_the_completion_time() -> None:
    status = {"phase": "Succeeded", "completionTime": ENDED}
    assert ttl_remaining(status, _at(15), 60) == 45
    assert ttl_remaining({"phase": "Running"}, _at(15), 60) is None


def _finished(ttl: int | None, **status: Any) -> dict[str, Any]:
    run_policy = {} if ttl is None else {"ttlSecondsAfterFinished": ttl}
    return {"metadata": {"name": "demo", "namespace": "default", "uid": "u1", "generation": 1},
            "spec": {"config": {}, "runPolicy": run_policy},
            "status": {"phase": "Succeeded", "attempt": 2, "completionTime": ENDED, "observedGeneration": 1,
                       "rayJobName": "demo-a2", **status}}


def _rayjob(attempt: int, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": f"demo-a{attempt}", "labels": {"rl.hybridflow.dev/attempt": str(attempt)}, **meta},
            "spec": {}, "status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}}


def test_no_ttl_keeps_the_children_and_asks_for_nothing() -> None:
    plan = decide(_finished(None), [_rayjob(1), _rayjob(2)], [], _at(10**6))
    assert (plan.stop, plan.delete_config_map, plan.requeue_after, plan.events) == ([], False, None, [])


def test_before_the_ttl_the_operator_comes_back_when_it_runs_out() -> None:
    plan = decide(_finished(60), [_rayjob(1), _rayjob(2)], [], _at(20))
    assert (plan.stop, plan.delete_config_map, plan.requeue_after) == ([], False, 40)
    assert "childrenDeletedAt" not in plan.status


def test_after_the_ttl_every_child_is_deleted_and_recorded() -> None:
    job = _finished(60)
    plan = decide(job, [_rayjob(2), _rayjob(1), _rayjob(3, deletionTimestamp=ENDED)], [], _at(61))
    assert plan.stop == ["demo-a1", "demo-a2"] and plan.delete_config_map and plan.requeue_after is None
    assert plan.status == {**job["status"], "childrenDeletedAt": "2026-11-30T12:01:01Z"}
    (event,) = plan.events
    assert (event.type, event.reason) == ("Normal", "ChildrenDeleted")
    assert "RayJob demo-a1, RayJob demo-a2, ConfigMap demo-config" in event.message
    assert "ttlSecondsAfterFinished=60" in event.message and "kubectl delete rljob demo" in event.message


def test_once_deleted_nothing_more_happens() -> None:
    plan = decide(_finished(60, childrenDeletedAt="2026-11-30T12:01:01Z"), [], [], _at(600))
    assert (plan.stop, plan.delete_config_map, plan.requeue_after, plan.events) == ([], False, None, [])


def test_the_reconcile_that_sees_the_end_schedules_the_ttl() -> None:
    job = _finished(30)
    job["status"] = {"phase": "Running", "attempt": 1}
    plan = decide(job, [_rayjob(1)], [], END)
    assert plan.status["phase"] == "Succeeded" and plan.requeue_after == 30
