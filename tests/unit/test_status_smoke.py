"""The smoke run in the pure state machine (status.decide / smoke_gate): before attempt 1, once, table-driven."""

from __future__ import annotations

import copy
import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_operator import changes, names
from rljob_operator.status import decide, log_tail

REPO = Path(__file__).resolve().parents[2]
NOW = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.timezone.utc)
CONFIG = yaml.safe_load((REPO / "examples" / "rljob_cpu_tiny.yaml").read_text())["spec"]["config"]
SMOKE = "demo-smoke"
LOGS = "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n" + \
    "\n".join(f"line {i}" for i in range(100)) + "\nFileNotFoundError: outputs/demo/data/train.parquet"


def rljob(status: dict[str, Any] | None = None, generation: int = 1, smoke: dict[str, Any] | None = None,
          **spec: Any) -> dict[str, Any]:
    run_policy = {"backoffLimit": 2, **({"smokeRun": smoke} if smoke is not None else {})}
    return {"metadata": {"name": "demo", "namespace": "default", "uid": "u1", "generation": generation},
            "spec": {"config": copy.deepcopy(CONFIG), "checkpoint": {"uri": "s3://b/demo"}, "runPolicy": run_policy,
                     **spec},
            "status": status or {}}


def smoke_rayjob(job: dict[str, Any], deployment: str = "", job_status: str = "", deleting: bool = False,
                 **st: Any) -> dict[str, Any]:
    """The smoke RayJob as the operator builds it from `job` (same annotations), with KubeRay's status."""
    meta: dict[str, Any] = {"name": SMOKE, "uid": "s1", "labels": names.smoke_run_labels("demo"),
                            "annotations": changes.smoke_annotations(job, "s3://b/demo/smoke-run")}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T11:59:00Z"
    status = {k: v for k, v in {"jobDeploymentStatus": deployment, "jobStatus": job_status, **st}.items() if v}
    return {"metadata": meta, "spec": {"suspend": False}, "status": status}


def attempt_rayjob(attempt: int, deployment: str = "", job_status: str = "") -> dict[str, Any]:
    status = {k: v for k, v in {"jobDeploymentStatus": deployment, "jobStatus": job_status}.items() if v}
    return {"metadata": {"name": f"demo-a{attempt}", "labels": names.attempt_labels("demo", attempt)},
            "spec": {}, "status": status}


def cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == ctype)


def test_a_new_job_starts_its_smoke_run_and_no_attempt() -> None:
    plan = decide(rljob(smoke={"steps": 2}), [], [], NOW)
    assert (plan.smoke, plan.attempt, plan.suspend, plan.status["phase"]) == (True, None, False, "SmokeRun")
    assert "attempt" not in plan.status and "rayJobName" not in plan.status  # no full attempt yet
    assert plan.status["smokeRun"] == {"rayJobName": SMOKE, "state": "Pending", "steps": 2, "trainBatchSize": 1,
                                       "nnodes": 1, "nGpusPerNode": 1, "checkpointUri": "s3://b/demo/smoke-run"}
    smoke = cond(plan.status, "SmokeRunPassed")
    assert (smoke["status"], smoke["reason"]) == ("Unknown", "SmokeRunPending") and SMOKE in smoke["message"]
    assert plan.annotations[changes.ANNOTATION_CHECKPOINT] == "s3://b/demo/smoke-run"


def test_a_job_without_smoke_run_is_unchanged() -> None:
    plan = decide(rljob(), [], [], NOW)
    assert (plan.smoke, plan.attempt, plan.status["phase"]) == (False, 1, "Pending")
    assert "smokeRun" not in plan.status and "SmokeRunPassed" not in {c["type"] for c in plan.status["conditions"]}


def test_running_smoke_run_records_its_start() -> None:
    job = rljob({"phase": "SmokeRun"}, smoke={})
    plan = decide(job, [smoke_rayjob(job, "Running", "RUNNING", startTime="2026-11-30T11:58:00Z")], [], NOW)
    assert (plan.smoke, plan.attempt, plan.status["phase"]) == (True, None, "SmokeRun")
    assert plan.status["smokeRun"]["state"] == "Running"
    assert plan.status["smokeRun"]["startTime"] == "2026-11-30T11:58:00Z"
    assert cond(plan.status, "ClusterReady")["status"] == "True"


def test_success_starts_attempt_1_in_the_same_reconcile() -> None:
    job = rljob({"phase": "SmokeRun", "smokeRun": {"rayJobName": SMOKE, "state": "Running"}}, smoke={})
    plan = decide(job, [smoke_rayjob(job, "Complete", "SUCCEEDED", endTime="2026-11-30T11:59:30Z")], [], NOW)
    assert (plan.smoke, plan.attempt, plan.status["phase"], plan.status["attempt"]) == (False, 1, "Pending", 1)
    assert plan.status["smokeRun"]["state"] == "Passed"
    assert plan.status["smokeRun"]["completionTime"] == "2026-11-30T11:59:30Z"
    assert cond(plan.status, "SmokeRunPassed")["status"] == "True"
    assert [e.reason for e in plan.events] == ["SmokeRunPassed"]
    assert plan.annotations[changes.ANNOTATION_CHECKPOINT] == "s3://b/demo"  # the full run resumes from its own place


def test_the_pass_is_recorded_when_attempt_1_is_already_seen() -> None:
    """reconcile decides again right after creating attempt 1, with the status not yet written."""
    job = rljob({"phase": "SmokeRun", "smokeRun": {"rayJobName": SMOKE, "state": "Running"}}, smoke={})
    plan = decide(job, [smoke_rayjob(job, "Complete", "SUCCEEDED"), attempt_rayjob(1)], [], NOW)
    assert (plan.attempt, plan.status["phase"], plan.status["smokeRun"]["state"]) == (1, "Starting", "Passed")


def test_a_passed_smoke_run_is_not_repeated_on_retries() -> None:
    passed = {"rayJobName": SMOKE, "state": "Passed", "steps": 2}
    job = rljob({"phase": "Running", "attempt": 1, "smokeRun": passed}, smoke={})
    observed = [smoke_rayjob(job, "Complete", "SUCCEEDED"), attempt_rayjob(1, "Failed", "FAILED")]
    plan = decide(job, observed, [], NOW)
    assert (plan.smoke, plan.attempt, plan.status["phase"], plan.status["failedAttempts"]) == (False, 2, "Retrying", 1)
    assert plan.status["smokeRun"] == passed and cond(plan.status, "SmokeRunPassed")["status"] == "True"


def test_a_lost_status_finds_the_passed_smoke_run_again() -> None:
    """Operator restart with the status write lost: the succeeded smoke RayJob is the evidence."""
    job = rljob({}, smoke={})
    plan = decide(job, [smoke_rayjob(job, "Complete", "SUCCEEDED")], [], NOW)
    assert (plan.smoke, plan.attempt, plan.status["smokeRun"]["state"]) == (False, 1, "Passed")


def test_failure_fails_the_job_with_the_log_tail_and_uses_no_retry() -> None:
    job = rljob({"phase": "SmokeRun", "smokeRun": {"rayJobName": SMOKE, "state": "Running"}}, smoke={})
    failed = smoke_rayjob(job, "Failed", "FAILED", reason="AppFailed", message=LOGS)
    plan = decide(job, [failed], [], NOW, smoke_step=1)
    assert (plan.smoke, plan.attempt, plan.stop, plan.status["phase"]) == (False, None, [], "Failed")
    failure = cond(plan.status, "Failed")
    assert (failure["status"], failure["reason"]) == ("True", "SmokeRunFailed")
    message = failure["message"]
    assert "FileNotFoundError: outputs/demo/data/train.parquet" in message and "line 99" in message
    assert "line 10\n" not in message  # the tail, not the whole log
    assert "after step 1 of 2" in message and "AppFailed" in message and "re-create the RLJob" in message
    assert plan.status["lastFailure"] == {"attempt": 0, "reason": "SmokeRunFailed", "message": message}
    assert "failedAttempts" not in plan.status and "attempt" not in plan.status  # backoffLimit is untouched
    assert plan.status["smokeRun"]["state"] == "Failed"
    assert cond(plan.status, "SmokeRunPassed")["reason"] == "SmokeRunFailed"
    (event,) = plan.events
    assert (event.type, event.reason) == ("Warning", "Failed") and "full run was never started" in event.message
    # Finished is final: the next reconcile changes nothing and starts nothing.
    again = decide({**job, "status": plan.status}, [failed], [], NOW)
    assert (again.smoke, again.attempt, again.status, again.events) == (False, None, plan.status, [])


def test_failure_without_logs_points_at_the_rayjob() -> None:
    job = rljob({"phase": "SmokeRun"}, smoke={})
    plan = decide(job, [smoke_rayjob(job, "ValidationFailed")], [], NOW)
    message = cond(plan.status, "Failed")["message"]
    assert plan.status["phase"] == "Failed" and "kubectl describe rayjob demo-smoke" in message


def test_suspend_during_the_smoke_run_suspends_it() -> None:
    job = rljob({"phase": "SmokeRun"}, smoke={}, suspend=True)
    plan = decide(job, [smoke_rayjob(job, "Running", "RUNNING")], [], NOW)
    assert (plan.smoke, plan.attempt, plan.suspend, plan.status["phase"]) == (True, None, True, "Suspended")


def test_kueue_admits_the_smoke_run() -> None:
    job = rljob(smoke={}, scheduling={"scheduler": "kueue", "queue": "q"})
    plan = decide(job, [], [], NOW)
    assert (plan.smoke, plan.suspend, plan.status["phase"]) == (True, None, "Queued")


def _edited(job: dict[str, Any], **spec: Any) -> dict[str, Any]:
    new = copy.deepcopy(job)
    new["metadata"]["generation"] = 2
    new["spec"].update(spec)
    return new


@pytest.mark.parametrize(("edit", "restarts"), [
    ({"image": "team/trainer:fix"}, ["image"]),
    ({"runPolicy": {"backoffLimit": 2, "smokeRun": {"steps": 5}}}, ["runPolicy.smokeRun"]),
    ({"runPolicy": {"backoffLimit": 5, "smokeRun": {}}}, []),  # live: the smoke run goes on
], ids=["image", "smokeRun", "backoffLimit"])  # fmt: skip
def test_spec_edit_during_the_smoke_run(edit: dict[str, Any], restarts: list[str]) -> None:
    job = rljob({"phase": "SmokeRun"}, smoke={})
    running = smoke_rayjob(job, "Running", "RUNNING")
    plan = decide(_edited(job, **edit), [running], [], NOW)
    if not restarts:
        assert (plan.smoke, plan.stop, plan.status["phase"]) == (True, [], "SmokeRun")
        return
    assert (plan.smoke, plan.attempt, plan.stop, plan.status["phase"]) == (False, None, [SMOKE], "Restarting")
    (event,) = [e for e in plan.events if e.reason == "SpecChanged"]
    assert all(f"spec.{f}" in event.message for f in restarts) and "new smoke run" in event.message
    assert cond(plan.status, "SpecApplied")["reason"] == "Restarting"
    # While it stops: nothing is deleted twice, nothing else starts; once gone: a new smoke run, same name.
    waiting = decide(_edited(job, **edit), [smoke_rayjob(job, "Running", "RUNNING", deleting=True)], [], NOW)
    assert (waiting.smoke, waiting.attempt, waiting.stop, waiting.status["phase"]) == (False, None, [], "Restarting")
    fresh = decide(_edited(job, **edit), [], [], NOW)
    assert (fresh.smoke, fresh.attempt, fresh.status["phase"]) == (True, None, "SmokeRun")
    assert fresh.annotations[changes.ANNOTATION_GENERATION] == "2"


def test_removing_the_smoke_run_skips_it() -> None:
    job = rljob({"phase": "SmokeRun", "smokeRun": {"rayJobName": SMOKE, "state": "Running"}}, smoke={})
    running = smoke_rayjob(job, "Running", "RUNNING")
    removed = _edited(job, runPolicy={"backoffLimit": 2})
    plan = decide(removed, [running], [], NOW)
    assert (plan.smoke, plan.attempt, plan.stop, plan.status["phase"]) == (False, None, [SMOKE], "Restarting")
    assert plan.status["smokeRun"]["state"] == "Skipped"
    assert cond(plan.status, "SmokeRunPassed")["reason"] == "SmokeRunSkipped"
    gone = decide({**removed, "status": plan.status}, [], [], NOW)
    assert (gone.smoke, gone.attempt, gone.status["phase"]) == (False, 1, "Pending")


def test_smoke_timeout_fails_the_job_and_releases_the_cluster() -> None:
    job = rljob({"phase": "SmokeRun", "smokeRun": {"rayJobName": SMOKE, "state": "Running",
                                                   "startTime": "2026-11-30T11:50:00Z"}}, smoke={"timeoutSeconds": 900})
    running = smoke_rayjob(job, "Running", "RUNNING")
    within = decide(job, [running], [], NOW)
    assert within.status["phase"] == "SmokeRun" and within.requeue_after == 300
    late = decide(job, [running], [], NOW + datetime.timedelta(seconds=301))
    assert (late.status["phase"], late.stop) == ("Failed", [SMOKE])
    failure = cond(late.status, "Failed")
    assert failure["reason"] == "SmokeRunFailed" and "timeoutSeconds=900" in failure["message"]


def test_job_deadline_counts_the_smoke_run() -> None:
    job = rljob({"phase": "SmokeRun", "startTime": "2026-11-30T11:00:00Z"}, smoke={})
    job["spec"]["runPolicy"]["activeDeadlineSeconds"] = 600
    plan = decide(job, [smoke_rayjob(job, "Running", "RUNNING")], [], NOW)
    assert (plan.status["phase"], plan.stop, cond(plan.status, "Failed")["reason"]) == (
        "Failed", [SMOKE], "DeadlineExceeded")


def test_smoke_run_is_not_started_once_the_full_run_has() -> None:
    """Added to a job already running (or pending) its attempt 1: no smoke run."""
    job = rljob({"phase": "Pending", "attempt": 1}, generation=2, smoke={})
    plan = decide(job, [], [], NOW)
    assert (plan.smoke, plan.attempt) == (False, 1) and "smokeRun" not in plan.status


def test_ttl_deletes_the_smoke_rayjob_with_the_rest() -> None:
    job = rljob({"phase": "Failed", "completionTime": "2026-11-30T11:00:00Z",
                 "smokeRun": {"rayJobName": SMOKE, "state": "Failed"}}, smoke={})
    job["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = 60
    plan = decide(job, [smoke_rayjob(job, "Failed", "FAILED")], [], NOW)
    assert plan.stop == [SMOKE] and plan.delete_config_map


def test_log_tail_keeps_the_end() -> None:
    assert log_tail(None) == "" and log_tail("") == ""
    assert log_tail("a\nb\nc", lines=2) == "b\nc"
    assert log_tail("x" * 50, chars=10) == "..." + "x" * 10
