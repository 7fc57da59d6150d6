"""Pure status logic: compute_status and decide, table-driven."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from rljob_operator.status import compute_status, decide, merge_conditions, rayjob_outcome

NOW = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.timezone.utc)
LATER = NOW + datetime.timedelta(minutes=5)


def rljob(status: dict[str, Any] | None = None, generation: int = 1, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "demo", "namespace": "default", "uid": "u1", "generation": generation},
            "spec": {"config": {}, "runPolicy": {"backoffLimit": 2}, **spec}, "status": status or {}}


def rayjob(attempt: int, deployment: str = "", job: str = "", suspend: bool = False, **st: Any) -> dict[str, Any]:
    status = {k: v for k, v in {"jobDeploymentStatus": deployment, "jobStatus": job, **st}.items() if v}
    return {"metadata": {"name": f"demo-a{attempt}", "labels": {"rl.hybridflow.dev/attempt": str(attempt)}},
            "spec": {"suspend": suspend}, "status": status}


def cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == ctype)


@pytest.mark.parametrize(("rj", "outcome"), [
    (None, "missing"),
    (rayjob(1), "pending"),
    (rayjob(1, suspend=True), "suspended"),
    (rayjob(1, "Initializing", "PENDING"), "starting"),
    (rayjob(1, "Running", "RUNNING"), "running"),
    (rayjob(1, "Complete", "SUCCEEDED"), "succeeded"),
    (rayjob(1, "Complete", "FAILED"), "failed"),
    (rayjob(1, "Failed", "FAILED"), "failed"),
    (rayjob(1, "Suspended"), "suspended"),
    (rayjob(1, "ValidationFailed"), "invalid"),
])
def test_rayjob_outcome(rj: dict[str, Any] | None, outcome: str) -> None:
    assert rayjob_outcome(rj) == outcome


# (RLJob, observed RayJobs, problems) -> (attempt to ensure, suspend, phase, status.attempt, event reasons)
CASES = [
    ("new job", rljob(), [], [], 1, False, "Pending", 1, []),
    ("starting", rljob(), [rayjob(1, "Initializing")], [], 1, False, "Starting", 1, []),
    ("running", rljob({"phase": "Starting", "attempt": 1}), [rayjob(1, "Running", "RUNNING")], [], 1, False,
     "Running", 1, []),
    ("succeeded", rljob({"phase": "Running", "attempt": 1}), [rayjob(1, "Complete", "SUCCEEDED")], [],
     None, None, "Succeeded", 1, ["Succeeded"]),
    ("first failure retries", rljob({"phase": "Running", "attempt": 1}),
     [rayjob(1, "Failed", "FAILED", reason="AppFailed", message="OOM")], [], 2, False, "Retrying", 2,
     ["AttemptFailed"]),
    ("retry created", rljob({"phase": "Retrying", "attempt": 2}),
     [rayjob(1, "Failed", "FAILED"), rayjob(2, "Initializing")], [], 2, False, "Starting", 2, []),
    ("last attempt fails: give up", rljob({"phase": "Running", "attempt": 3}),
     [rayjob(1, "Failed", "FAILED"), rayjob(2, "Failed", "FAILED"),
      rayjob(3, "Failed", "FAILED", reason="AppFailed", message="NCCL timeout")], [], None, None, "Failed", 3,
     ["Failed"]),
    ("rayjob rejected by KubeRay is not retried", rljob({"phase": "Starting", "attempt": 1}),
     [rayjob(1, "ValidationFailed", reason="ValidationFailed", message="bad spec")], [], None, None, "Failed", 1,
     ["Failed"]),
    ("invalid: no children", rljob(), [], ["spec.config.trainer.nnodes: must be >= 1"], None, None, "Invalid",
     None, ["InvalidSpec"]),
    ("suspend", rljob({"phase": "Running", "attempt": 1}, suspend=True), [rayjob(1, "Running")], [], 1, True,
     "Suspended", 1, ["Suspended"]),
    ("queued by kueue", rljob(queueName="q"), [rayjob(1, suspend=True)], [], 1, None, "Queued", 1, ["Queued"]),
    ("restart with lost status picks the highest attempt", rljob({}),
     [rayjob(1, "Failed", "FAILED"), rayjob(2, "Running")], [], 2, False, "Running", 2, []),
]


@pytest.mark.parametrize(("title", "job", "observed", "problems", "ensure", "suspend", "phase", "attempt",
                          "events"), CASES, ids=[c[0] for c in CASES])
def test_decide(title: str, job: dict[str, Any], observed: list[dict[str, Any]], problems: list[str],
                ensure: int | None, suspend: bool | None, phase: str, attempt: int | None,
                events: list[str]) -> None:
    plan = decide(job, observed, problems, NOW)
    assert (plan.attempt, plan.suspend, plan.status["phase"]) == (ensure, suspend, phase)
    assert plan.status.get("attempt") == attempt
    assert [e.reason for e in plan.events] == events


def test_failure_reason_is_carried_to_failed_condition() -> None:
    plan = decide(rljob({"phase": "Running", "attempt": 3}),
                  [rayjob(1, "Failed", "FAILED"), rayjob(2, "Failed", "FAILED"),
                   rayjob(3, "Failed", "FAILED", reason="AppFailed", message="NCCL timeout")], [], NOW)
    failed = cond(plan.status, "Failed")
    assert (failed["status"], failed["reason"], failed["message"]) == ("True", "AppFailed", "NCCL timeout")
    assert plan.status["lastFailure"] == {"attempt": 3, "reason": "AppFailed", "message": "NCCL timeout"}
    assert plan.status["completionTime"] == "2026-11-30T12:00:00Z"


def test_invalid_message_and_event_once() -> None:
    problems = ["spec.resources.cpu: 'lots' is not a quantity; use e.g. 8 or 500m"]
    plan = decide(rljob(), [], problems, NOW)
    validated = cond(plan.status, "Validated")
    assert validated["status"] == "False" and problems[0] in validated["message"]
    again = decide(rljob(plan.status), [], problems, LATER)
    assert again.events == [] and again.status == plan.status  # nothing to write, nothing to post


def test_last_transition_time_kept_when_status_unchanged() -> None:
    first = compute_status(rljob(), rayjob(1, "Initializing"), [], NOW, attempt=1)
    second = compute_status(rljob(first), rayjob(1, "Initializing"), [], LATER, attempt=1)
    assert second == first
    running = compute_status(rljob(second), rayjob(1, "Running", "RUNNING"), [], LATER, attempt=1)
    assert cond(running, "Running")["lastTransitionTime"] == "2026-11-30T12:05:00Z"
    assert cond(running, "Validated")["lastTransitionTime"] == "2026-11-30T12:00:00Z"
    assert running["startTime"] == first["startTime"] == "2026-11-30T12:00:00Z"


def test_children_names_and_generation_in_status() -> None:
    status = compute_status(rljob(generation=4), rayjob(2, "Running", dashboardURL="h:8265"), [], NOW, attempt=2)
    assert (status["rayJobName"], status["configMapName"]) == ("demo-a2", "demo-config")
    assert status["observedGeneration"] == 4 and cond(status, "Running")["observedGeneration"] == 4
    assert status["dashboardURL"] == "h:8265"


def test_finished_job_stays_finished_until_spec_changes() -> None:
    done = rljob({"phase": "Succeeded", "attempt": 1, "observedGeneration": 1})
    assert decide(done, [], [], NOW).attempt is None


def test_deadline_exceeded_gives_up() -> None:
    job = rljob({"phase": "Running", "attempt": 1, "startTime": "2026-11-30T11:00:00Z"},
                runPolicy={"backoffLimit": 3, "activeDeadlineSeconds": 60})
    plan = decide(job, [rayjob(1, "Running")], [], NOW)
    assert plan.status["phase"] == "Failed" and plan.status["lastFailure"]["reason"] == "DeadlineExceeded"


def test_merge_conditions_orders_types() -> None:
    conds = merge_conditions([], {"Failed": ("False", "x", "y"), "Validated": ("True", "a", "b")}, NOW, None)
    assert [c["type"] for c in conds] == ["Validated", "Failed"]
