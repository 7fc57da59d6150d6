"""Per-role status (issue 15, part 3): pods by role, losses between two looks, and what decide makes of them."""

from __future__ import annotations

import datetime
import pathlib
from typing import Any

import pytest
import yaml

from rljob_operator import api, role_status
from rljob_operator.builders import build_rayjob
from rljob_operator.role_status import Loss, PodView, RoleTrack
from rljob_operator.status import Abandon, decide

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOW = datetime.datetime(2026, 12, 4, 12, 0, tzinfo=datetime.timezone.utc)
Obj = dict[str, Any]


def pod(name: str, role: str | None = None, attempt: int | None = 1, ready: bool = True, restarts: int = 0,
        phase: str = "Running", waiting: str | None = None, node_type: str = "worker", **status: Any) -> Obj:
    labels = {"rl.hybridflow.dev/rljob": "job", "ray.io/node-type": node_type}
    if attempt is not None:
        labels["rl.hybridflow.dev/attempt"] = str(attempt)
    if role:
        labels["rl.hybridflow.dev/role"] = role
    container: Obj = {"name": "ray-worker", "ready": ready, "restartCount": restarts,
                      "state": {"waiting": {"reason": waiting}} if waiting else {"running": {}}}
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": labels},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [container], **status}}


def view(p: Obj) -> PodView:
    got = role_status.view_pod(p)
    assert got is not None
    return got


def test_pods_get_their_role_and_readiness() -> None:
    head = view(pod("job-a1-head", node_type="head"))
    assert (head.role, head.attempt, head.ready) == ("trainer", 1, True)  # the head runs the driver
    assert view(pod("w", role="rollout", restarts=2)).restarts == 2
    crashing = view(pod("c", role="rollout", ready=False, waiting="CrashLoopBackOff"))
    assert (crashing.ready, crashing.reason) == (False, "CrashLoopBackOff")
    unscheduled = view(pod("p", role="rollout", ready=False, phase="Pending", containerStatuses=[],
                           conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]))
    assert (unscheduled.phase, unscheduled.reason) == ("Pending", "Unschedulable")
    assert role_status.view_pod(pod("smoke", attempt=None)) is None  # the smoke run's pods carry no attempt
    deleting = pod("d", role="rollout")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-04T12:00:00Z"
    assert view(deleting).ready is False


def _rljob(path: str) -> api.RLJob:
    job = yaml.safe_load((ROOT / "examples" / path).read_text())
    job["metadata"]["uid"] = "u1"
    return api.RLJob.model_validate(job)


def test_desired_pods_come_from_the_attempts_rayjob() -> None:
    assert role_status.desired_pods(build_rayjob(_rljob("rljob_multirole.yaml"), 1)) == \
        {"trainer": 2, "rollout": 1}  # the head and one trainer pod; one rollout pod
    single = build_rayjob(_rljob("rljob_grpo_2node.yaml"), 1)
    assert set(role_status.desired_pods(single)) == {"trainer"}
    assert role_status.desired_pods(None) == {}


def test_losses_between_two_looks() -> None:
    before = {v.uid: v for v in map(view, [pod("a", "rollout"), pod("b", "rollout"), pod("c"), pod("d", "rollout")])}
    after = {v.uid: v for v in map(view, [
        pod("b", "rollout", ready=False, phase="Failed", reason="Evicted"),
        pod("c", restarts=1),
        pod("d", "rollout"),
        pod("e", "rollout"),  # a new pod is no loss
    ])}
    losses = role_status.find_losses(before, after)
    assert [(x.pod, x.role) for x in losses] == [("a", "rollout"), ("b", "rollout"), ("c", "trainer")]
    assert "deleted" in losses[0].how and "Evicted" in losses[1].how and "restarted" in losses[2].how
    # KubeRay deletes the Failed pod next: that is the same loss, not a second one
    gone = {uid: v for uid, v in after.items() if v.name != "b"}
    assert role_status.find_losses(after, gone) == []


def _views(*pods: Obj) -> list[PodView]:
    return [view(p) for p in pods]


def test_a_loss_counts_only_after_the_grace_period_while_the_attempt_runs() -> None:
    running = {"attempt": 1, "phase": "Running"}
    track = role_status.track_pods(None, running, _views(pod("h", node_type="head"), pod("r", "rollout")), NOW)
    track = role_status.track_pods(track, running, _views(pod("h", node_type="head")), NOW)
    assert [x.pod for x, _ in track.pending] == ["r"]
    assert role_status.confirm_losses(track, NOW + datetime.timedelta(seconds=4), 10, True, True) == ([], 6.0)
    due, wait = role_status.confirm_losses(track, NOW + datetime.timedelta(seconds=10), 10, True, True)
    assert [x.pod for x in due] == ["r"] and wait is None
    assert track.restarts == {"rollout": 1} and track.ended_by is None
    # the job ended meanwhile (KubeRay deletes the pods after the RayJob finished): nothing counts
    track = role_status.track_pods(track, running, [], NOW)
    assert role_status.confirm_losses(track, NOW + datetime.timedelta(seconds=30), 10, False, True) == ([], None)
    assert track.pending == [] and track.ended_by is None


def test_a_lost_trainer_pod_ends_a_running_attempt_not_a_starting_one() -> None:
    for phase, ends in (("Running", True), ("Starting", False)):
        status = {"attempt": 2, "phase": phase}
        track = role_status.track_pods(None, status, _views(pod("w", attempt=2)), NOW)
        track = role_status.track_pods(track, status, [], NOW)
        role_status.confirm_losses(track, NOW, 0, True, trainer_running=phase == "Running")
        assert track.restarts == {"trainer": 1}
        assert (track.ended_by is not None) is ends


def test_memory_starts_over_with_each_attempt_and_from_status_after_a_restart() -> None:
    status = {"attempt": 1, "phase": "Running", "roles": [{"name": "rollout", "desired": 1, "ready": 1, "restarts": 3}]}
    track = role_status.track_pods(None, status, _views(pod("r", "rollout")), NOW)
    assert track.restarts == {"rollout": 3} and track.pending == []  # pods already there are not losses
    track = role_status.track_pods(track, {"attempt": 2, "phase": "Starting"}, _views(pod("r", "rollout")), NOW)
    assert (track.attempt, track.restarts, track.pods) == (2, {}, {})  # attempt 1's pod is not attempt 2's


def test_roles_condition_names_what_is_missing_and_why() -> None:
    pods = _views(pod("h", node_type="head"), pod("t"),
                  pod("r", "rollout", ready=False, phase="Pending", containerStatuses=[],
                      conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]))
    roles = role_status.compute_roles({"trainer": 2, "rollout": 2}, pods, {"rollout": 1})
    assert roles == [{"name": "trainer", "desired": 2, "ready": 2, "restarts": 0},
                     {"name": "rollout", "desired": 2, "ready": 0, "restarts": 1}]
    status, reason, message = role_status.roles_condition(roles, pods, "Running")
    assert (status, reason) == ("False", "RolesNotReady")
    assert "rollout 0/2 ready" in message and "pod r Pending, Unschedulable: no node fits" in message
    ok = role_status.compute_roles({"trainer": 2}, pods[:2], {})
    assert role_status.roles_condition(ok, pods[:2], "Running")[:2] == ("True", "AllRolesReady")
    assert role_status.roles_condition(ok, [], "Succeeded")[:2] == ("False", "NoCluster")


# ------------------------------------------------------------------------------------ decide


def _job(phase: str = "Running", attempt: int = 1, **spec: Any) -> Obj:
    job = yaml.safe_load((ROOT / "examples" / "rljob_multirole.yaml").read_text())
    job["spec"].pop("scheduling", None)  # no Kueue: the RayJob runs as created
    job["spec"].update(spec)
    job["metadata"].update(uid="u1", generation=1, namespace="default")
    job["status"] = {"phase": phase, "attempt": attempt, "failedAttempts": 0, "observedGeneration": 1}
    return job


def _running_rayjob(job: Obj, attempt: int = 1) -> Obj:
    rayjob = build_rayjob(api.RLJob.model_validate(job), attempt)
    rayjob["status"] = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}
    return rayjob


def test_decide_writes_roles_and_reports_a_lost_rollout_pod_without_ending_the_attempt() -> None:
    job = _job()
    rayjob = _running_rayjob(job)
    pods = tuple(_views(pod("h", node_type="head"), pod("t", "trainer"), pod("r2", "rollout", ready=False,
                                                                            waiting="ContainerCreating")))
    seen = role_status.RolesSeen(1, pods, {"rollout": 1}, (Loss("r1", "rollout", "was deleted (its node or the pod "
                                                                  "itself is gone)"),))
    plan = decide(job, [rayjob], [], NOW, roles=seen)
    assert plan.status["phase"] == "Running" and plan.attempt == 1 and plan.stop == []
    assert plan.status["roles"] == [{"name": "trainer", "desired": 2, "ready": 2, "restarts": 0},
                                    {"name": "rollout", "desired": 1, "ready": 0, "restarts": 1}]
    cond = next(c for c in plan.status["conditions"] if c["type"] == "RolesReady")
    assert cond["status"] == "False" and "rollout 0/1 ready" in cond["message"]
    (event,) = [e for e in plan.events if e.reason == "PodLost"]
    assert "r1" in event.message and "rollout pods lost in attempt 1: 1" in event.message


def test_decide_starts_the_next_attempt_when_a_trainer_pod_is_lost() -> None:
    job = _job()
    rayjob = _running_rayjob(job)
    lost = Abandon("TrainerPodLost", role_status.trainer_loss_message(Loss("t", "trainer", "failed: Evicted"), 1))
    plan = decide(job, [rayjob], [], NOW, abandon=lost,
                  roles=role_status.RolesSeen(1, (), {"trainer": 1}, ()))
    assert plan.stop == [rayjob["metadata"]["name"]]  # the RayJob of attempt 1 is stopped first
    assert plan.status["phase"] == "Restarting" and plan.status["attempt"] == 2
    assert plan.status["lastFailure"]["reason"] == "TrainerPodLost"
    assert plan.status["failedAttempts"] == 1
    assert plan.status["roles"] == []  # attempt 2 has no RayJob yet, and attempt 1's counts are not its
    (event,) = [e for e in plan.events if e.reason == "TrainerPodLost"]
    assert "Pod t of role trainer failed: Evicted" in event.message and "attempt 2 resumes" in event.message


@pytest.mark.parametrize("deployment", ["Complete", "Suspended"])
def test_a_trainer_loss_after_the_attempt_stopped_running_changes_nothing(deployment: str) -> None:
    job = _job()
    rayjob = _running_rayjob(job)
    rayjob["status"] = {"jobDeploymentStatus": deployment, "jobStatus": "SUCCEEDED" if deployment == "Complete" else ""}
    plan = decide(job, [rayjob], [], NOW, abandon=Abandon("TrainerPodLost", "gone"))
    assert plan.status.get("lastFailure") is None and plan.status["attempt"] == 1


def test_without_a_look_at_the_pods_no_roles_are_written() -> None:
    job = _job()
    plan = decide(job, [_running_rayjob(job)], [], NOW)
    assert "roles" not in plan.status
    assert all(c["type"] != "RolesReady" for c in plan.status["conditions"])


def test_a_track_keeps_the_attempts_end_until_the_attempt_changes() -> None:
    track = RoleTrack(1, {}, {}, ended_by=Loss("t", "trainer", "was deleted"))
    again = role_status.track_pods(track, {"attempt": 1, "phase": "Running"}, [], NOW)
    assert again.ended_by == track.ended_by
    assert role_status.track_pods(again, {"attempt": 2, "phase": "Restarting"}, [], NOW).ended_by is None
