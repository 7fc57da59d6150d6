"""Pure status logic for stalls (issue 6): a stalled attempt is a failure, and retries stay bounded."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from rljob_operator.status import Abandon, decide, failures_before


def _stall(message: str | None) -> Abandon | None:
    return Abandon("Stalled", message) if message else None

NOW = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.timezone.utc)
STALL = "Attempt 1 made no progress past step 7 for more than 60s (spec.runPolicy.stallTimeoutSeconds)."


def rljob(status: dict[str, Any] | None = None, backoff: int = 2, **run_policy: Any) -> dict[str, Any]:
    return {"metadata": {"name": "demo", "namespace": "default", "uid": "u1", "generation": 1},
            "spec": {"config": {}, "runPolicy": {"backoffLimit": backoff, **run_policy}}, "status": status or {}}


def rayjob(attempt: int, deployment: str = "", job: str = "", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"demo-a{attempt}", "labels": {"rl.hybridflow.dev/attempt": str(attempt)}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T11:59:00Z"
    status = {k: v for k, v in {"jobDeploymentStatus": deployment, "jobStatus": job}.items() if v}
    return {"metadata": meta, "spec": {}, "status": status}


def cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == ctype)


RUNNING_1 = {"phase": "Running", "attempt": 1, "failedAttempts": 0}

# title, RLJob, RayJobs, stalled -> (attempt to ensure, stop, phase, status.attempt, failedAttempts, events)
CASES = [
    ("a stall stops the attempt and counts as a failure", rljob(RUNNING_1), [rayjob(1, "Running", "RUNNING")],
     STALL, None, ["demo-a1"], "Restarting", 2, 1, ["Stalled"]),
    ("no stall: nothing happens", rljob(RUNNING_1), [rayjob(1, "Running", "RUNNING")], None,
     1, [], "Running", 1, 0, []),
    ("a stall of an attempt that is not running is ignored", rljob({"phase": "Starting", "attempt": 1}),
     [rayjob(1, "Initializing")], STALL, 1, [], "Starting", 1, 0, []),
    ("the stopped attempt is being deleted: wait, keep the spec applied",
     rljob({"phase": "Restarting", "attempt": 2, "failedAttempts": 1,
            "lastFailure": {"attempt": 1, "reason": "Stalled", "message": STALL}}),
     [rayjob(1, "Running", "RUNNING", deleting=True)], None, None, [], "Restarting", 2, 1, []),
    ("the stopped attempt is gone: the next one starts",
     rljob({"phase": "Restarting", "attempt": 2, "failedAttempts": 1,
            "lastFailure": {"attempt": 1, "reason": "Stalled", "message": STALL}}),
     [], None, 2, [], "Retrying", 2, 1, ["AttemptFailed"]),
    ("the last retry stalls: give up and release the cluster",
     rljob({"phase": "Running", "attempt": 3, "failedAttempts": 2}), [rayjob(3, "Running", "RUNNING")], STALL,
     None, ["demo-a3"], "Failed", 3, 3, ["Failed", "Stalled"]),
    ("a failure after a deleted stalled attempt still counts it",
     rljob({"phase": "Running", "attempt": 3, "failedAttempts": 2}),
     [rayjob(1, "Failed", "FAILED"), rayjob(3, "Failed", "FAILED")], None, None, [], "Failed", 3, 3, ["Failed"]),
]


@pytest.mark.parametrize(("title", "job", "observed", "stalled", "ensure", "stop", "phase", "attempt", "failed",
                          "events"), CASES, ids=[c[0] for c in CASES])
def test_decide_with_stalls(title: str, job: dict[str, Any], observed: list[dict[str, Any]], stalled: str | None,
                            ensure: int | None, stop: list[str], phase: str, attempt: int, failed: int,
                            events: list[str]) -> None:
    plan = decide(job, observed, [], NOW, abandon=_stall(stalled))
    assert (plan.attempt, plan.stop, plan.status["phase"]) == (ensure, stop, phase)
    assert (plan.status["attempt"], plan.status["failedAttempts"]) == (attempt, failed)
    assert [e.reason for e in plan.events] == events
    assert cond(plan.status, "SpecApplied")["status"] == "True"  # a stall is not a spec change


def test_stall_is_the_recorded_failure() -> None:
    plan = decide(rljob(RUNNING_1), [rayjob(1, "Running", "RUNNING")], [], NOW, abandon=_stall(STALL))
    assert plan.status["lastFailure"] == {"attempt": 1, "reason": "Stalled", "message": STALL}
    (event,) = plan.events
    assert event.type == "Warning" and STALL in event.message and "attempt 2 resumes" in event.message
    gave_up = decide(rljob({"phase": "Running", "attempt": 3, "failedAttempts": 2}),
                     [rayjob(3, "Running", "RUNNING")], [], NOW, abandon=_stall(STALL))
    failed = cond(gave_up.status, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "Stalled")
    assert "backoffLimit=2" in gave_up.events[-1].message


@pytest.mark.parametrize(("status", "observed", "attempt", "count"), [
    ({}, [], 1, 0),
    ({}, [rayjob(1, "Failed", "FAILED"), rayjob(2, "Failed", "FAILED")], 3, 2),  # an older operator's status
    ({"attempt": 3, "failedAttempts": 2}, [rayjob(3, "Running")], 3, 2),  # stalled attempts left no RayJob
    ({"attempt": 2, "failedAttempts": 1}, [rayjob(2, "Failed", "FAILED"), rayjob(3)], 3, 2),  # lost write
    ({"attempt": 2, "failedAttempts": 0}, [rayjob(1, "Failed", "FAILED", deleting=True)], 2, 0),  # counted
])
def test_failures_before(status: dict[str, Any], observed: list[dict[str, Any]], attempt: int, count: int) -> None:
    by_attempt = {int(r["metadata"]["labels"]["rl.hybridflow.dev/attempt"]): r for r in observed}
    assert failures_before(status, by_attempt, attempt) == count


def _converge(job: dict[str, Any], rayjobs: dict[int, dict[str, Any]], stalled: str | None) -> list[str]:
    """Apply one decision the way reconcile does (stop, create, write status); return the event reasons."""
    plan = decide(job, list(rayjobs.values()), [], NOW, abandon=_stall(stalled))
    for name in plan.stop:
        del rayjobs[int(name.rsplit("-a", 1)[1])]  # no KubeRay finalizer: deleted at once
    if plan.attempt is not None and plan.attempt not in rayjobs:
        rayjobs[plan.attempt] = rayjob(plan.attempt, "Running", "RUNNING")  # it starts and then hangs again
    job["status"] = plan.status
    return [e.reason for e in plan.events]


@pytest.mark.parametrize("backoff", [0, 1, 3])
def test_a_job_that_always_stalls_gets_backoff_limit_retries(backoff: int) -> None:
    job, rayjobs = rljob(backoff=backoff), dict[int, dict[str, Any]]()
    reasons: list[str] = []
    for _ in range(4 * (backoff + 2)):
        reasons += _converge(job, rayjobs, None)  # not stalled yet: create / observe
        if job["status"]["phase"] == "Failed":
            break
        reasons += _converge(job, rayjobs, STALL)
    assert job["status"]["phase"] == "Failed" and job["status"]["lastFailure"]["reason"] == "Stalled"
    assert job["status"]["attempt"] == backoff + 1 == job["status"]["failedAttempts"]
    assert reasons.count("Stalled") == backoff + 1 and reasons.count("Failed") == 1
    assert rayjobs == {}  # the last stalled attempt was stopped too


def test_deadline_releases_a_running_cluster() -> None:
    job = rljob({"phase": "Running", "attempt": 1, "startTime": "2026-11-30T11:00:00Z"}, activeDeadlineSeconds=60)
    plan = decide(job, [rayjob(1, "Running", "RUNNING")], [], NOW)
    assert plan.status["phase"] == "Failed" and plan.stop == ["demo-a1"]
