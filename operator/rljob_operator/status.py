"""Pure status logic: what an RLJob's status is, and what to do next, from what was observed.

`compute_status` is the ONE place that turns observations (the RayJob of the current attempt, the
validation problems) into `status` (phase, conditions, attempt, child names, times, last failure).
`decide` picks the attempt whose children must exist (first run, retry after a failure or a stall while
retries remain, a new attempt after a spec edit that needs one (see changes.py), nothing when invalid or
finished), the superseded RayJobs to stop, the RayJob's desired `suspend`, the new status and the
Events of the transitions. No I/O, no clock: `now` is passed in.

The smoke run (spec.runPolicy.smokeRun) comes before attempt 1: `smoke_gate` decides it (create, wait, restart
after a spec edit, pass, fail) and holds the full attempt back until it passed; see its docstring.

Retries are counted in `status.failedAttempts`, not only from the failed RayJobs still visible: a stalled
attempt's RayJob is deleted (it still holds the cluster), so it could not be counted later, and restarts
after stalls must stay bounded by `spec.runPolicy.backoffLimit` (issue 6).

KubeRay facts used (ray.io/v1 RayJob, KubeRay v1.7.0 CRD): `status.jobDeploymentStatus` in
Initializing | Running | Complete | Failed | Suspending | Suspended | Retrying | Waiting | ValidationFailed,
`status.jobStatus` in PENDING | RUNNING | SUCCEEDED | FAILED | STOPPED, plus reason/message/
dashboardURL/startTime/endTime.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from rljob_operator import api, changes, names
from rljob_operator import smoke as smoke_run
from rljob_operator.role_status import RolesSeen, compute_roles, desired_pods, roles_condition
from rljob_operator.roles import TRAINER
from rljob_operator.scheduling import kueue_queue

Obj = dict[str, Any]
CONDITION_TYPES = ("Validated", "SmokeRunPassed", "Suspended", "ClusterReady", "RolesReady", "Running", "Succeeded", "Failed", "SpecApplied")
TERMINAL_PHASES = ("Succeeded", "Failed")
#: RayJob outcomes that retrying the same manifest cannot fix (KubeRay rejected the RayJob itself).
PERMANENT_RAYJOB_FAILURES = ("ValidationFailed",)
#: RayJob outcomes of an attempt that still holds (or may soon hold) a Ray cluster.
ACTIVE_OUTCOMES = ("pending", "starting", "running", "suspended")
SPEC_APPLIED = ("True", "Applied", "Every field of the spec is in effect.")
#: How much of a failed smoke run's log (the RayJob's status.message, where Ray puts the driver's last lines)
#: goes into the Failed condition: the end of it, at most this many lines and characters.
LOG_TAIL_LINES = 25
LOG_TAIL_CHARS = 3000


def rfc3339(now: datetime.datetime) -> str:
    """Kubernetes' timestamp format (UTC, second precision, `Z`)."""
    return now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime.datetime | None:
    """Parse an RFC 3339 timestamp as written by the API server; None when absent or malformed."""
    if not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def rayjob_outcome(rayjob: Obj | None) -> str:
    """Classify a RayJob: missing | pending | starting | running | suspended | succeeded | failed | invalid."""
    if rayjob is None:
        return "missing"
    st = rayjob.get("status") or {}
    deployment, job = st.get("jobDeploymentStatus", ""), st.get("jobStatus", "")
    if deployment in PERMANENT_RAYJOB_FAILURES:
        return "invalid"
    if deployment == "Failed" or (deployment == "Complete" and job in ("FAILED", "STOPPED")):
        return "failed"
    if deployment == "Complete" or job == "SUCCEEDED":
        return "succeeded" if job in ("SUCCEEDED", "") else "failed"
    if deployment in ("Suspending", "Suspended") or ((rayjob.get("spec") or {}).get("suspend") and not deployment):
        return "suspended"
    if deployment == "Running":
        return "running"
    if deployment in ("Initializing", "Waiting", "Retrying"):
        return "starting"
    return "pending"


def _failure_of(rayjob: Obj, attempt: int) -> Obj:
    st = rayjob.get("status") or {}
    reason = st.get("reason") or f"RayJob{st.get('jobDeploymentStatus') or 'Failed'}"
    message = st.get("message") or (
        f"RayJob {rayjob['metadata']['name']} ended with jobDeploymentStatus={st.get('jobDeploymentStatus')}, "
        f"jobStatus={st.get('jobStatus')}; see `kubectl describe rayjob {rayjob['metadata']['name']}` "
        f"and the head pod's logs")
    return {"attempt": attempt, "reason": reason, "message": message}


def merge_conditions(old: list[Obj], desired: dict[str, tuple[str, str, str]], now: datetime.datetime,
                     generation: int | None) -> list[Obj]:
    """Conditions in a fixed order; `lastTransitionTime` is kept when a condition's status did not change."""
    previous = {c.get("type"): c for c in old or []}
    result = []
    for ctype in CONDITION_TYPES:
        if ctype not in desired:
            continue
        status, reason, message = desired[ctype]
        before = previous.get(ctype) or {}
        changed = before.get("status") != status
        cond = {"type": ctype, "status": status, "reason": reason, "message": message,
                "lastTransitionTime": rfc3339(now) if changed or not before.get("lastTransitionTime")
                else before["lastTransitionTime"]}
        if generation is not None:
            cond["observedGeneration"] = generation
        result.append(cond)
    return result


def _desired_conditions(phase: str, problems: list[str], outcome: str, suspended: bool,
                        failure: Obj | None, spec_applied: tuple[str, str, str],
                        smoke: Obj | None = None,
                        roles_ready: tuple[str, str, str] | None = None) -> dict[str, tuple[str, str, str]]:
    if problems:
        msg = "; ".join(problems) + ". Fix the RLJob spec (`rljob validate job.yaml` shows the same checks)."
        return {"Validated": ("False", "InvalidSpec", msg)}
    conds = {"Validated": ("True", "Valid", "The spec passed validation.")}
    if smoke:
        conds["SmokeRunPassed"] = smoke_condition(smoke)
    conds["Suspended"] = (("True", "Suspended", "spec.suspend is true: the Ray cluster is released; set it to "
                           "false to resume from the latest checkpoint.") if suspended
                          else ("True", "Queued", "Waiting for Kueue to admit the RayJob.") if phase == "Queued"
                          else ("False", "NotSuspended", "The job is not suspended."))
    ready = outcome in ("running", "succeeded")
    conds["ClusterReady"] = ("True", "ClusterReady", "The Ray cluster is up.") if ready else \
        ("False", "ClusterNotReady", f"The Ray cluster is not ready (phase {phase}).")
    if roles_ready is not None:
        conds["RolesReady"] = roles_ready
    conds["Running"] = ("True", "TrainerRunning", "The trainer is running.") if phase == "Running" else \
        ("False", "NotRunning", f"The trainer is not running (phase {phase}).")
    conds["Succeeded"] = ("True", "Succeeded", "Training finished.") if phase == "Succeeded" else \
        ("False", "NotFinished", "Training has not finished.")
    if phase == "Failed" and failure:
        conds["Failed"] = ("True", failure.get("reason") or "Failed", failure.get("message") or "")
    else:
        conds["Failed"] = ("False", "NoFailure", "The job has not failed.")
    conds["SpecApplied"] = spec_applied
    return conds


def compute_status(rljob: Obj, rayjob: Obj | None, validation_problems: list[str], now: datetime.datetime, *,
                   attempt: int, gave_up: bool = False, last_failure: Obj | None = None,
                   restarting: bool = False, spec_applied: tuple[str, str, str] = SPEC_APPLIED,
                   failed_attempts: int | None = None, smoke: Obj | None = None, in_smoke: bool = False,
                   roles: RolesSeen | None = None) -> Obj:
    """The RLJob status for the current attempt, from the RayJob of that attempt (None: not created yet).

    `gave_up`: the attempt failed and no retries are left (phase Failed). `last_failure`: the latest
    failed attempt (kept in status and shown while retrying). `restarting`: a superseded attempt is
    being stopped before this one starts (phase Restarting). `spec_applied`: the SpecApplied condition.
    `failed_attempts`: attempts that failed so far (None: keep the recorded count). `smoke`: the new
    status.smokeRun (None: keep the recorded one). `in_smoke`: `rayjob` is the smoke run's, no attempt
    has started (phase SmokeRun while it is under way; no attempt or RayJob name in status yet).
    `roles`: the attempt's pods as the operator saw them (status.roles and the RolesReady condition; None:
    not watched, neither is written).
    """
    old = rljob.get("status") or {}
    spec = rljob.get("spec") or {}
    meta = rljob.get("metadata") or {}
    name = meta.get("name", "")
    suspended = bool(spec.get("suspend"))
    outcome = rayjob_outcome(rayjob)
    failure = last_failure or old.get("lastFailure")
    if validation_problems:
        phase = "Invalid"
    elif outcome == "succeeded":
        phase = "Succeeded"
    elif gave_up or outcome == "invalid":
        phase = "Failed"
    elif suspended:
        phase = "Suspended"
    elif restarting:
        phase = "Restarting"
    elif outcome == "suspended" or (outcome == "missing" and kueue_queue(spec)):
        phase = "Queued" if kueue_queue(spec) else "Suspended"
    elif in_smoke:
        phase = "SmokeRun"
    elif outcome == "missing":  # the next attempt is about to be created
        phase = "Retrying" if (failure or {}).get("attempt") == attempt - 1 else "Pending"
    else:
        phase = {"running": "Running", "starting": "Starting", "pending": "Starting",
                 "failed": "Retrying"}[outcome]
    status: Obj = {k: v for k, v in old.items() if k in ("progress", "metrics", "checkpoint", "export", "startTime")}
    smoke_record = old.get("smokeRun") if smoke is None else smoke
    status["observedGeneration"] = meta.get("generation")
    status["phase"] = phase
    roles_ready = None
    if roles is not None and not validation_problems and not in_smoke:
        # Pods and counts of another attempt (a retry was just decided) say nothing of this one.
        same = roles.attempt == attempt
        pods = roles.pods if same else ()
        status["roles"] = compute_roles(desired_pods(rayjob), pods, roles.restarts if same else {})
        roles_ready = roles_condition(status["roles"], pods, phase)
    status["conditions"] = merge_conditions(old.get("conditions") or [],
                                            _desired_conditions(phase, validation_problems, outcome,
                                                                suspended, failure, spec_applied, smoke_record,
                                                                roles_ready),
                                            now, meta.get("generation"))
    if not validation_problems:
        status["configMapName"] = names.config_map_name(name)
        if not in_smoke:
            status["attempt"] = attempt
            status["rayJobName"] = names.ray_job_name(name, attempt)
    elif old.get("attempt"):
        status["attempt"] = old["attempt"]
    if smoke_record:
        status["smokeRun"] = smoke_record
    status["failedAttempts"] = old.get("failedAttempts") if failed_attempts is None else failed_attempts
    ray_status = (rayjob or {}).get("status") or {}
    if ray_status.get("dashboardURL"):
        status["dashboardURL"] = ray_status["dashboardURL"]
    if rayjob is not None and "startTime" not in status:
        status["startTime"] = ray_status.get("startTime") or rfc3339(now)
    if phase in TERMINAL_PHASES:
        status["completionTime"] = old.get("completionTime") or ray_status.get("endTime") or rfc3339(now)
    if failure:
        status["lastFailure"] = failure
    return {k: v for k, v in status.items() if v is not None}


@dataclass
class EventSpec:
    """A Kubernetes Event to post about the RLJob."""

    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Plan:
    """What reconcile must make true: children of `attempt` (None: none), RayJob suspend, status, events."""

    attempt: int | None
    suspend: bool | None
    status: Obj
    events: list[EventSpec] = field(default_factory=list)
    #: Superseded RayJobs to delete (they belong to an attempt replaced after a spec edit).
    stop: list[str] = field(default_factory=list)
    #: Annotations of the attempt's RayJob (which spec and checkpoint location it is built from).
    annotations: dict[str, str] = field(default_factory=dict)
    #: Checkpoint location to build with instead of the spec's (set while a change of it is refused).
    checkpoint_uri: str | None = None
    #: Delete the RLJob's ConfigMap (with `stop` naming every RayJob: the finished job's TTL expired).
    delete_config_map: bool = False
    #: Reconcile again after this many seconds (a finished job's TTL or the smoke run's timeout is running).
    requeue_after: float | None = None
    #: The children to ensure are the smoke run's (`attempt` is None then): build_smoke_children.
    smoke: bool = False


def is_smoke_run(rayjob: Obj) -> bool:
    """Whether a RayJob is an RLJob's smoke run (its `rl.hybridflow.dev/smoke-run` label)."""
    return ((rayjob.get("metadata") or {}).get("labels") or {}).get(names.LABEL_SMOKE_RUN) == "true"


def attempt_of(rayjob: Obj) -> int:
    """The attempt number of one of our RayJobs (its `rl.hybridflow.dev/attempt` label; 0 if unlabelled)."""
    try:
        return int(((rayjob.get("metadata") or {}).get("labels") or {}).get(names.LABEL_ATTEMPT, "0"))
    except ValueError:
        return 0


def _transition_events(old: Obj, new: Obj) -> list[EventSpec]:
    events = []
    old_conds = {c["type"]: c for c in old.get("conditions") or []}
    new_conds = {c["type"]: c for c in new["conditions"]}
    validated = new_conds.get("Validated")
    if validated and validated["status"] == "False" and \
            old_conds.get("Validated", {}).get("message") != validated["message"]:
        events.append(EventSpec("Warning", "InvalidSpec", validated["message"]))
    applied = new_conds.get("SpecApplied")
    if applied and applied["reason"] == "CheckpointChangeRefused" and \
            old_conds.get("SpecApplied", {}).get("message") != applied["message"]:
        events.append(EventSpec("Warning", "SpecChangeRefused", applied["message"]))
    phase, before = new["phase"], old.get("phase")
    if phase == before:
        return events
    failure = new.get("lastFailure") or {}
    if phase == "Retrying" and failure:
        events.append(EventSpec("Warning", "AttemptFailed",
                                f"Attempt {failure.get('attempt')} failed ({failure.get('reason')}: "
                                f"{failure.get('message')}); starting attempt {new['attempt']}, which resumes "
                                f"from the latest checkpoint."))
    elif phase == "Failed" and failure.get("attempt") == 0:
        events.append(EventSpec("Warning", "Failed", f"The smoke run failed, so the full run was never started: "
                                                     f"{failure.get('reason')}: {failure.get('message')}"))
    elif phase == "Failed":
        events.append(EventSpec("Warning", "Failed", f"Giving up after attempt {new.get('attempt')}: "
                                                     f"{failure.get('reason')}: {failure.get('message')}"))
    elif phase == "Succeeded":
        events.append(EventSpec("Normal", "Succeeded", f"Training finished in attempt {new.get('attempt')}."))
    elif phase in ("Suspended", "Queued"):
        events.append(EventSpec("Normal", phase, new_conds["Suspended"]["message"]))
    return events


def failures_before(old: Obj, by_attempt: dict[int, Obj], attempt: int) -> int:
    """How many attempts before `attempt` failed: the recorded count plus failed RayJobs it does not cover.

    `status.failedAttempts` covers the attempts before `status.attempt`; a failed RayJob from that attempt
    on (the status write was lost) is added. Without the count (a status written by an older operator)
    every failed RayJob still visible counts, which is what that operator did.
    """
    recorded = old.get("failedAttempts")
    counted = recorded if isinstance(recorded, int) and not isinstance(recorded, bool) else None
    since = int(old.get("attempt") or 1) if counted is not None else 1
    seen = sum(1 for a, r in by_attempt.items() if since <= a < attempt and rayjob_outcome(r) == "failed")
    return (counted or 0) + seen


@dataclass(frozen=True)
class Abandon:
    """Why the running attempt must end although its RayJob still runs: reason `Stalled` (no step for
    spec.runPolicy.stallTimeoutSeconds; the caller keeps the clock) or `TrainerPodLost` (role_status)."""

    reason: str
    message: str


def decide(rljob: Obj, rayjobs: list[Obj], validation_problems: list[str], now: datetime.datetime,
           abandon: Abandon | None = None, smoke_step: int | None = None, roles: RolesSeen | None = None) -> Plan:
    """Decide the next step of an RLJob from its observed RayJobs (all attempts, the smoke run) and validation
    problems.

    `abandon`: the current attempt cannot go on (it stalled, or lost a trainer pod). A running attempt that is
    abandoned is handled like a failed one, with the reason given: its RayJob is stopped and the next attempt
    resumes from the latest checkpoint, or the job fails when no retries are left. `smoke_step`: the last step
    a failed smoke run reported (its progress.json), for the failure message. `roles`: the attempt's pods
    (status.roles, RolesReady; its newly confirmed losses of rollout or sandbox pods become Events).
    """
    old = rljob.get("status") or {}
    spec = rljob.get("spec") or {}
    meta = rljob.get("metadata") or {}
    by_attempt = {attempt_of(r): r for r in rayjobs if attempt_of(r) > 0}
    # The highest attempt seen anywhere wins: after a restart or a lost status write, no attempt repeats.
    attempt = max([old.get("attempt") or 1, *by_attempt])
    backoff_limit = int((spec.get("runPolicy") or {}).get("backoffLimit", 3))
    if validation_problems:
        status = compute_status(rljob, None, validation_problems, now, attempt=attempt)
        return Plan(None, None, status, _transition_events(old, status))
    if old.get("phase") in TERMINAL_PHASES:
        # Finished is final: later edits change nothing but the TTL; recreate the RLJob to run again.
        return finished_plan(rljob, rayjobs, {**old, "observedGeneration": meta.get("generation")}, now)
    gate = smoke_gate(rljob, rayjobs, now, smoke_step=smoke_step)
    if gate.plan is not None:
        return gate.plan
    rayjob = by_attempt.get(attempt)
    outcome = rayjob_outcome(rayjob)
    events: list[EventSpec] = []
    kwargs: dict[str, Any] = {}
    location = changes.checkpoint_location(rljob)
    pinned = changes.pinned_location(list(by_attempt.values()))
    refused = pinned is not None and pinned != location
    if refused:
        kwargs["spec_applied"] = ("False", "CheckpointChangeRefused", _refusal(location, str(pinned)))
    previous = by_attempt.get(attempt - 1)
    if previous is not None and rayjob_outcome(previous) == "failed" and \
            (old.get("lastFailure") or {}).get("attempt") != attempt - 1:
        kwargs["last_failure"] = _failure_of(previous, attempt - 1)  # e.g. status lost before the retry
    failed = failures_before(old, by_attempt, attempt)
    edited = changes.changed_fields(rljob, rayjob) if rayjob is not None and outcome in ACTIVE_OUTCOMES else []
    stall = abandon is not None and rayjob is not None and outcome == "running" and not edited
    if edited:
        events.append(EventSpec("Normal", "SpecChanged", (
            f"spec.{', spec.'.join(edited)} changed: stopping attempt {attempt} "
            f"(RayJob {names.ray_job_name(meta.get('name', ''), attempt)}); "
            f"attempt {attempt + 1} then starts from the new spec and resumes from the latest checkpoint.")))
        attempt, rayjob, outcome = attempt + 1, None, "missing"
    elif (outcome in ("failed", "invalid") or stall) and rayjob is not None:
        failure = {"attempt": attempt, "reason": abandon.reason, "message": abandon.message} \
            if stall and abandon is not None else _failure_of(rayjob, attempt)
        # Retries used = failed attempts so far, this one included; restarts after a spec edit are not failures.
        failed += 1
        retry = outcome != "invalid" and failed <= backoff_limit and not _deadline_passed(old, spec, now)
        if stall and abandon is not None:
            events.append(EventSpec("Warning", abandon.reason, f"{abandon.message} Stopping RayJob {rayjob['metadata']['name']}; " + (
                f"attempt {attempt + 1} resumes from the latest checkpoint." if retry else
                f"no retries left (spec.runPolicy.backoffLimit={backoff_limit}), so the job fails.")))
        if retry:
            attempt, rayjob = attempt + 1, None
            kwargs["last_failure"] = failure
        else:
            kwargs.update(gave_up=True, last_failure=failure)
    elif _deadline_passed(old, spec, now) and outcome not in ("succeeded",):
        deadline = spec["runPolicy"]["activeDeadlineSeconds"]
        kwargs.update(gave_up=True, last_failure={
            "attempt": attempt, "reason": "DeadlineExceeded",
            "message": f"The job ran longer than spec.runPolicy.activeDeadlineSeconds={deadline}; raise it "
                       f"to allow longer runs"})
    # Superseded attempts still holding a cluster are stopped before the new one starts: two attempts
    # must never write checkpoints to the same place at once.
    stale = [r for a, r in sorted(by_attempt.items()) if a < attempt and rayjob_outcome(r) in ACTIVE_OUTCOMES]
    # A stalled attempt is superseded by a failure, not by a spec edit: the spec stays applied.
    after_failure = (kwargs.get("last_failure") or old.get("lastFailure") or {}).get("attempt") == attempt - 1
    if stale and not refused and not after_failure:
        waiting = ", ".join(r["metadata"]["name"] for r in stale)
        kwargs["spec_applied"] = ("False", "Restarting", (
            f"Waiting for RayJob {waiting} of a superseded attempt to stop; attempt {attempt} then starts "
            f"from the current spec and resumes from the latest checkpoint."))
    status = compute_status(rljob, rayjob, [], now, attempt=attempt, restarting=bool(stale),
                            failed_attempts=failed, smoke=gate.smoke, roles=roles, **kwargs)
    events = gate.events + _transition_events(old, status) + events + _loss_events(roles, status)
    if status["phase"] in TERMINAL_PHASES:
        # Giving up on an attempt that still holds a cluster (stalled, past the deadline): release it.
        holding = [rayjob] if rayjob is not None and outcome in ACTIVE_OUTCOMES else []
        return Plan(None, None, status, events, stop=[r["metadata"]["name"] for r in holding
                                                      if not r["metadata"].get("deletionTimestamp")],
                    requeue_after=_ttl_remaining_of(spec, status, now))
    suspend = True if spec.get("suspend") else (None if kueue_queue(spec) else False)
    return Plan(None if stale else attempt, suspend, status, events,
                stop=[r["metadata"]["name"] for r in stale if not r["metadata"].get("deletionTimestamp")],
                annotations=changes.attempt_annotations(rljob, str(pinned) if refused else location),
                checkpoint_uri=str(pinned) if refused else None)


def _loss_events(roles: RolesSeen | None, status: Obj) -> list[EventSpec]:
    """An Event for each newly confirmed loss of a pod that the attempt survives (not the trainer's)."""
    events: list[EventSpec] = []
    if roles is None:
        return events
    for loss in roles.losses:
        if loss.role == TRAINER:
            continue  # it ends the attempt: the TrainerPodLost event says so
        lost = next((r["restarts"] for r in status.get("roles") or [] if r["name"] == loss.role), None)
        events.append(EventSpec("Warning", "PodLost", (
            f"Pod {loss.pod} of role {loss.role} {loss.how}. The attempt goes on: KubeRay replaces the pod, and the "
            f"trainer uses the role's other pods meanwhile and the new one once Ray restarts its actors there"
            + (f" ({loss.role} pods lost in attempt {roles.attempt}: {lost})." if lost is not None else "."))))
    return events


def _refusal(wanted: str, pinned: str) -> str:
    return (f"The checkpoint location changed to {wanted!r}, but this job's attempts write and resume "
            f"checkpoints at {pinned!r}: the change is refused and every attempt keeps using {pinned!r}, "
            f"so that resuming does not lose the progress. Set spec.checkpoint.uri back to {pinned!r}, or "
            f"delete and recreate the RLJob to start from scratch at the new location.")


def _deadline_passed(old: Obj, spec: Obj, now: datetime.datetime) -> bool:
    deadline = (spec.get("runPolicy") or {}).get("activeDeadlineSeconds")
    start = parse_time(old.get("startTime"))
    return bool(deadline and start and (now - start).total_seconds() > deadline)


# ----------------------------------------------------------------------------------------- TTL


def ttl_remaining(status: Obj, now: datetime.datetime, ttl: int) -> float | None:
    """Seconds until a finished job's children are due for deletion (<= 0: due); None: not finished.

    The clock starts at `status.completionTime`, which compute_status sets when the job ends.
    """
    done = parse_time(status.get("completionTime"))
    if status.get("phase") not in TERMINAL_PHASES or done is None:
        return None
    return (done + datetime.timedelta(seconds=ttl) - now).total_seconds()


def ttl_expired(status: Obj, now: datetime.datetime, ttl: int) -> bool:
    """Whether a finished job's children are due for deletion: `ttl` seconds after it ended (Kubernetes
    Job semantics for ttlSecondsAfterFinished)."""
    remaining = ttl_remaining(status, now, ttl)
    return remaining is not None and remaining <= 0


def _ttl_of(spec: Obj) -> int | None:
    ttl = (spec.get("runPolicy") or {}).get("ttlSecondsAfterFinished")
    return ttl if isinstance(ttl, int) and not isinstance(ttl, bool) else None


def _ttl_remaining_of(spec: Obj, status: Obj, now: datetime.datetime) -> float | None:
    ttl = _ttl_of(spec)
    return None if ttl is None else max(0.0, ttl_remaining(status, now, ttl) or 0.0)


def finished_plan(rljob: Obj, rayjobs: list[Obj], status: Obj, now: datetime.datetime) -> Plan:
    """The plan of a finished RLJob: nothing, a requeue while its TTL runs, or deleting its children.

    Deleting removes every RayJob of the job (KubeRay's garbage collection takes their Ray clusters) and
    the ConfigMap; the RLJob keeps its status, with `childrenDeletedAt` saying when.
    """
    spec = rljob.get("spec") or {}
    ttl = _ttl_of(spec)
    if ttl is None or status.get("childrenDeletedAt"):
        return Plan(None, None, status)
    if not ttl_expired(status, now, ttl):
        return Plan(None, None, status, requeue_after=_ttl_remaining_of(spec, status, now))
    name = (rljob.get("metadata") or {}).get("name", "")
    doomed = sorted(r["metadata"]["name"] for r in rayjobs if not r["metadata"].get("deletionTimestamp"))
    what = ", ".join([*(f"RayJob {n}" for n in doomed), f"ConfigMap {names.config_map_name(name)}"])
    message = (f"Deleted {what}: spec.runPolicy.ttlSecondsAfterFinished={ttl} s passed since the job ended at "
               f"{status.get('completionTime')}. The RLJob and its status stay; `kubectl delete rljob {name}` "
               f"removes it.")
    return Plan(None, None, {**status, "childrenDeletedAt": rfc3339(now)},
                [EventSpec("Normal", "ChildrenDeleted", message)], stop=doomed, delete_config_map=True)


# ------------------------------------------------------------------------------------------ smoke run


@dataclass
class SmokeGate:
    """What the smoke run means for this reconcile: a plan of its own (it is under way, or it failed), or
    let the attempts go ahead (`plan` None) with a new status.smokeRun (`smoke`, None: keep) and events."""

    plan: Plan | None = None
    smoke: Obj | None = None
    events: list[EventSpec] = field(default_factory=list)


def smoke_gate(rljob: Obj, rayjobs: list[Obj], now: datetime.datetime, *, smoke_step: int | None = None) -> SmokeGate:
    """Decide the smoke run (spec.runPolicy.smokeRun) of a valid, unfinished RLJob; see docs/operations.md.

    - It runs only before attempt 1: once an attempt exists (or status.attempt is set), or once it passed
      (recorded, or its RayJob succeeded: a lost status write is recovered), it is over, and retries and
      spec edits of the full run never repeat it.
    - Under way: its RayJob `<name>-smoke` is ensured with the RLJob's suspend (Kueue admits it like an
      attempt); phase SmokeRun (Suspended / Queued when so). No full attempt, so no full GPU request.
    - A spec edit that needs a new attempt (changes.py), or an edit of smokeRun itself, stops it and, once
      its RayJob is gone, starts it again from the new spec (the same name; phase Restarting meanwhile).
    - smokeRun removed while it is under way: it is stopped and marked Skipped; then attempt 1 starts.
    - It failed (or ran past smokeRun.timeoutSeconds, or the job past activeDeadlineSeconds): the job
      fails, reason SmokeRunFailed with the log tail. Not retried, not counted in failedAttempts.
    """
    old, spec = rljob.get("status") or {}, rljob.get("spec") or {}
    wanted = (spec.get("runPolicy") or {}).get("smokeRun")
    recorded = old.get("smokeRun") or {}
    smoke = next((r for r in rayjobs if is_smoke_run(r)), None)
    outcome = rayjob_outcome(smoke)
    if recorded.get("state") == "Passed":
        return SmokeGate()
    if outcome == "succeeded":
        record = {**_smoke_record(rljob, smoke, recorded, now), "state": "Passed",
                  "completionTime": ((smoke or {}).get("status") or {}).get("endTime") or rfc3339(now)}
        return SmokeGate(smoke=record, events=[EventSpec("Normal", "SmokeRunPassed", (
            f"Smoke run {record['rayJobName']} ({describe_smoke(record)}) succeeded; starting the full run."))])
    if any(attempt_of(r) > 0 for r in rayjobs) or old.get("attempt"):
        # The full run has started: a smoke run still on record as under way was skipped (smokeRun removed).
        unfinished = recorded.get("state") in ("Pending", "Running")
        return SmokeGate(smoke={**recorded, "state": "Skipped"} if unfinished else None)
    if wanted is None:
        if smoke is None or outcome not in ACTIVE_OUTCOMES:
            return SmokeGate(smoke={**recorded, "state": "Skipped"} if recorded else None)
        record = {**_smoke_record(rljob, smoke, recorded, now), "state": "Skipped"}
        return SmokeGate(plan=_smoke_stopping(rljob, smoke, record, now, (
            f"spec.runPolicy.smokeRun was removed: waiting for the smoke run's RayJob {smoke['metadata']['name']} to "
            f"stop; attempt 1 then starts without a smoke run.")))
    record = _smoke_record(rljob, smoke, recorded, now)
    if smoke is not None and smoke["metadata"].get("deletionTimestamp"):
        return SmokeGate(plan=_smoke_stopping(rljob, smoke, record, now, (
            f"Waiting for the smoke run's RayJob {smoke['metadata']['name']} of a previous spec to stop; a new "
            f"smoke run then tests the current spec before the full run starts.")))
    edited = changes.smoke_changed_fields(rljob, smoke) if smoke is not None and outcome in ACTIVE_OUTCOMES else []
    if edited and smoke is not None:
        message = (f"spec.{', spec.'.join(edited)} changed: stopping the smoke run's RayJob {smoke['metadata']['name']}; "
                   f"a new smoke run then tests the new spec before the full run starts.")
        plan = _smoke_stopping(rljob, smoke, record, now, message)
        plan.events.append(EventSpec("Normal", "SpecChanged", message))
        return SmokeGate(plan=plan)
    failure = _smoke_failure(rljob, smoke, record, now, smoke_step)
    if failure is not None:
        record = {**record, "state": "Failed", "completionTime": rfc3339(now)}
        status = compute_status(rljob, smoke, [], now, attempt=1, gave_up=True, last_failure=failure,
                                smoke=record, in_smoke=True)
        holding = [smoke] if smoke is not None and outcome in ACTIVE_OUTCOMES else []
        return SmokeGate(plan=Plan(None, None, status, _transition_events(old, status),
                                   stop=[r["metadata"]["name"] for r in holding],
                                   requeue_after=_ttl_remaining_of(spec, status, now)))
    status = compute_status(rljob, smoke, [], now, attempt=1, smoke=record, in_smoke=True)
    suspend = True if spec.get("suspend") else (None if kueue_queue(spec) else False)
    return SmokeGate(plan=Plan(None, suspend, status, _transition_events(old, status),
                               annotations=changes.smoke_annotations(rljob, record.get("checkpointUri") or ""),
                               requeue_after=_smoke_timeout_remaining(wanted, record, now), smoke=True))


def _smoke_stopping(rljob: Obj, smoke: Obj, record: Obj, now: datetime.datetime, message: str) -> Plan:
    """Stop the smoke run's RayJob (unless already going) and wait: phase Restarting, SpecApplied=False."""
    status = compute_status(rljob, smoke, [], now, attempt=1, restarting=True, smoke=record, in_smoke=True,
                            spec_applied=("False", "Restarting", message))
    deleting = smoke["metadata"].get("deletionTimestamp")
    return Plan(None, None, status, _transition_events(rljob.get("status") or {}, status),
                stop=[] if deleting else [smoke["metadata"]["name"]])


def _smoke_record(rljob: Obj, smoke: Obj | None, recorded: Obj, now: datetime.datetime) -> Obj:
    """status.smokeRun for the current spec: RayJob name, shape (smoke.derive), state from its RayJob."""
    name = (rljob.get("metadata") or {}).get("name", "")
    record: Obj = {"rayJobName": names.smoke_run_name(name)}
    try:
        shape = smoke_run.derive(api.RLJob.model_validate({"metadata": rljob.get("metadata") or {"name": name},
                                                           "spec": rljob.get("spec") or {}}))
        record.update(steps=shape.steps, trainBatchSize=shape.train_batch_size, nnodes=shape.nnodes,
                      nGpusPerNode=shape.n_gpus_per_node, checkpointUri=shape.location)
    except Exception:  # validation refuses such a spec before this point; keep what was recorded
        record.update({k: v for k, v in recorded.items() if k in ("steps", "trainBatchSize", "nnodes", "nGpusPerNode",
                                                                  "checkpointUri")})
    outcome = rayjob_outcome(smoke)
    record["state"] = "Running" if outcome == "running" else "Pending"
    # The clock of smokeRun.timeoutSeconds starts when KubeRay starts the RayJob (not while Kueue holds it);
    # without a RayJob (none yet, or the previous one is gone after a spec edit) it starts again.
    started = recorded.get("startTime") if smoke is not None else None
    if smoke is not None and outcome not in ("missing", "pending", "suspended"):
        started = started or (smoke.get("status") or {}).get("startTime") or rfc3339(now)
    if started:
        record["startTime"] = started
    return record


def describe_smoke(record: Obj) -> str:
    """The smoke run's shape from status.smokeRun, e.g. `2 steps on 1 node x 2 GPUs, data.train_batch_size 1`."""
    if not record.get("steps"):
        return "shape unknown"
    return (f"{record['steps']} step(s) on {record.get('nnodes')} node(s) x {record.get('nGpusPerNode')} GPU(s) or "
            f"processes, data.train_batch_size {record.get('trainBatchSize')}")


def smoke_condition(record: Obj) -> tuple[str, str, str]:
    """The SmokeRunPassed condition from status.smokeRun."""
    name, state, shape = record.get("rayJobName"), record.get("state"), describe_smoke(record)
    if state == "Passed":
        return "True", "SmokeRunPassed", f"The smoke run (RayJob {name}: {shape}) succeeded; the full run may start."
    if state == "Failed":
        return ("False", "SmokeRunFailed", f"The smoke run (RayJob {name}: {shape}) failed; condition Failed and "
                                           f"status.lastFailure hold its log tail. The full run was not started.")
    if state == "Skipped":
        return ("False", "SmokeRunSkipped", "spec.runPolicy.smokeRun was removed before the smoke run finished; "
                                            "the full run starts without it.")
    return ("Unknown", f"SmokeRun{state or 'Pending'}", f"The smoke run (RayJob {name}: {shape}) is "
            f"{'running' if state == 'Running' else 'starting'}; the full run starts once it succeeds.")


def _smoke_timeout_remaining(wanted: Obj, record: Obj, now: datetime.datetime) -> float | None:
    timeout, started = wanted.get("timeoutSeconds"), parse_time(record.get("startTime"))
    if not isinstance(timeout, int) or isinstance(timeout, bool) or started is None:
        return None
    return max(0.0, timeout - (now - started).total_seconds())


def _smoke_failure(rljob: Obj, smoke: Obj | None, record: Obj, now: datetime.datetime,
                   step: int | None) -> Obj | None:
    """lastFailure (attempt 0, reason SmokeRunFailed) when the smoke run failed or ran out of time, else None."""
    old, spec = rljob.get("status") or {}, rljob.get("spec") or {}
    wanted = (spec.get("runPolicy") or {}).get("smokeRun") or {}
    name, shape = record["rayJobName"], describe_smoke(record)
    fix = ("Fix the cause, then delete and re-create the RLJob (a failed job does not start again); the full run's "
           "checkpoint location was not touched.")
    outcome = rayjob_outcome(smoke)
    if smoke is not None and outcome in ("failed", "invalid"):
        st = smoke.get("status") or {}
        reason = st.get("reason") or f"RayJob{st.get('jobDeploymentStatus') or 'Failed'}"
        reached = f" after step {step} of {record.get('steps')}" if step is not None else ""
        tail = log_tail(st.get("message"))
        logs = (f" Last log lines:\n{tail}\n" if tail else
                f" The RayJob gives no log (jobDeploymentStatus={st.get('jobDeploymentStatus')}, "
                f"jobStatus={st.get('jobStatus')}); see `kubectl describe rayjob {name}` and its head pod's logs. ")
        message = (f"The smoke run (RayJob {name}: {shape}) failed{reached} with {reason}, before the full run's "
                   f"GPUs were requested.{logs}{fix}")
        return {"attempt": 0, "reason": "SmokeRunFailed", "message": message}
    remaining = _smoke_timeout_remaining(wanted, record, now) if outcome in ACTIVE_OUTCOMES else None
    if remaining is not None and remaining <= 0:
        return {"attempt": 0, "reason": "SmokeRunFailed", "message": (
            f"The smoke run (RayJob {name}: {shape}) did not finish within spec.runPolicy.smokeRun.timeoutSeconds="
            f"{wanted['timeoutSeconds']} (state {record.get('state')}); it was stopped. Raise the timeout if model "
            f"loading takes longer, else see its head pod's logs. {fix}")}
    if _deadline_passed(old, spec, now):
        return {"attempt": 0, "reason": "DeadlineExceeded", "message": (
            f"The job ran longer than spec.runPolicy.activeDeadlineSeconds={spec['runPolicy']['activeDeadlineSeconds']} "
            f"during its smoke run (RayJob {name}); raise it to allow longer runs")}
    return None


def log_tail(message: str | None, lines: int = LOG_TAIL_LINES, chars: int = LOG_TAIL_CHARS) -> str:
    """The end of a RayJob's status.message: Ray writes "Job entrypoint command failed with exit code N, last
    available logs (truncated to 20,000 chars):" and the driver's last output there (KubeRay copies it)."""
    if not message:
        return ""
    kept = message.strip().splitlines()[-lines:]
    text = "\n".join(kept)
    return text if len(text) <= chars else "..." + text[-chars:]
