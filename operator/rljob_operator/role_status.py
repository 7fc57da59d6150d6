"""Pure per-role status (issue 15, part 3): pods by role, what each role wants and has, which pods were lost.

An attempt's pods carry the attempt's labels (names.attempt_labels) and, on multi-role jobs, the role
(roles.LABEL_ROLE); KubeRay adds `ray.io/node-type` (head | worker) and `ray.io/group` (the worker group).
The head pod runs the driver, so it belongs to the trainer role, as do the pods of the one worker group of a
job without spec.roles.

Recovery differs by role (DESIGN.md, "Rollout as a service"): a lost rollout or sandbox pod is replaced by
KubeRay while the trainer keeps going (its router sends requests to the other replicas and Ray restarts the
replica on the new pod), so it only counts as a restart of its role. A lost trainer pod takes actors the
driver cannot do without (an FSDP rank, the driver itself), so the attempt is over: the operator starts the
next one from the latest checkpoint (status.decide, reason TrainerPodLost) instead of waiting for a
collective to time out or for the stall timeout.

A pod is lost when it disappears while its attempt runs (deleted, its node gone), when it turns Failed
(evicted), or when its Ray container restarts (the Ray node in it died, and every actor with it). Which pods
were there before is the caller's memory (`PodView`s from the previous look): losses are found by
comparing two looks, `find_losses`.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rljob_operator import names
from rljob_operator.roles import LABEL_ROLE, TRAINER

Obj = dict[str, Any]
#: KubeRay's pod labels (ray-operator/controllers/ray/utils/constant.go).
LABEL_NODE_TYPE = "ray.io/node-type"
LABEL_GROUP = "ray.io/group"
#: Pod phases and container states worth naming when a role is not ready.
_WAITING_HINTS = {
    "Unschedulable": "no node fits its requests (resources, nodeSelector, tolerations)",
    "ImagePullBackOff": "its image cannot be pulled (spec.image, imagePullSecrets)",
    "ErrImagePull": "its image cannot be pulled (spec.image, imagePullSecrets)",
    "CrashLoopBackOff": "its container keeps crashing (see its logs)",
    "CreateContainerConfigError": "a Secret or ConfigMap it needs is missing",
}


@dataclass(frozen=True)
class PodView:
    """What the operator keeps of one pod of an attempt."""

    name: str
    uid: str
    role: str
    attempt: int
    ready: bool
    restarts: int
    phase: str
    #: Why it is not ready, when it says so (a waiting reason, the pod's reason, an unschedulable condition).
    reason: str = ""


@dataclass(frozen=True)
class Loss:
    """One pod of the current attempt lost: which, of what role, how (for events and the failure message)."""

    pod: str
    role: str
    how: str


def pod_role(pod: Obj) -> str:
    """The role of one of our pods: its role label, else trainer (the head, and the one group without roles)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return str(labels.get(LABEL_ROLE) or TRAINER)


def view_pod(pod: Obj) -> PodView | None:
    """The view of one of our pods; None for a pod of no attempt (the smoke run's, an unlabelled one)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    try:
        attempt = int(labels.get(names.LABEL_ATTEMPT, ""))
    except ValueError:
        return None
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = (conditions.get("Ready") or {}).get("status") == "True" and not meta.get("deletionTimestamp")
    return PodView(name=str(meta.get("name", "")), uid=str(meta.get("uid") or meta.get("name", "")),
                   role=pod_role(pod), attempt=attempt, ready=ready,
                   restarts=sum(int(c.get("restartCount") or 0) for c in containers),
                   phase=str(status.get("phase") or "Pending"), reason=_not_ready_reason(status, conditions))


def _not_ready_reason(status: Obj, conditions: Mapping[str, Obj]) -> str:
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return str(waiting["reason"])
    scheduled = conditions.get("PodScheduled") or {}
    if scheduled.get("status") == "False" and scheduled.get("reason"):
        return str(scheduled["reason"])
    return str(status.get("reason") or "")


def desired_pods(rayjob: Obj | None) -> dict[str, int]:
    """Pods each role of a RayJob's cluster should have: the head (trainer) plus each worker group's replicas.

    Read from the RayJob's own rayClusterSpec, so it is the attempt's shape even after a spec edit.
    """
    cluster = ((rayjob or {}).get("spec") or {}).get("rayClusterSpec") or {}
    if not cluster:
        return {}
    wanted = {TRAINER: 1}
    for group in cluster.get("workerGroupSpecs") or []:
        role = pod_role(group.get("template") or {})
        wanted[role] = wanted.get(role, 0) + int(group.get("replicas") or 0)
    return wanted


def find_losses(before: Mapping[str, PodView], now: Mapping[str, PodView]) -> list[Loss]:
    """Pods lost between two looks at one attempt (both keyed by uid): gone, turned Failed, or restarted."""
    losses = []
    for uid, old in before.items():
        new = now.get(uid)
        if new is None:
            if old.phase != "Failed":  # a Failed pod was counted when it failed; KubeRay then deletes it
                losses.append(Loss(old.name, old.role, "was deleted (its node or the pod itself is gone)"))
        elif new.phase == "Failed" and old.phase != "Failed":
            why = f": {new.reason}" if new.reason else ""
            losses.append(Loss(old.name, old.role, f"failed{why}"))
        elif new.restarts > old.restarts and new.phase != "Failed":
            losses.append(Loss(old.name, old.role, f"had its Ray container restarted ({new.restarts} restarts)"))
    return losses


def compute_roles(wanted: Mapping[str, int], pods: Iterable[PodView], restarts: Mapping[str, int]) -> list[Obj]:
    """status.roles: per role (trainer first) the pods wanted, the ready ones, and the pods lost so far."""
    pods = list(pods)
    order = [TRAINER, *sorted(r for r in {*wanted, *(p.role for p in pods)} if r != TRAINER)]
    result = []
    for role in order:
        if role not in wanted and not any(p.role == role for p in pods):
            continue
        result.append({"name": role, "desired": int(wanted.get(role, 0)),
                       "ready": sum(1 for p in pods if p.role == role and p.ready),
                       "restarts": int(restarts.get(role, 0))})
    return result


def roles_condition(roles: list[Obj], pods: Iterable[PodView], phase: str) -> tuple[str, str, str]:
    """The RolesReady condition: every role has its pods ready, or which are missing and why."""
    if phase not in ("Starting", "Running"):
        return "False", "NoCluster", f"No Ray cluster runs the job (phase {phase})."
    short = [r for r in roles if r["ready"] < r["desired"]]
    if not short:
        counts = ", ".join(f"{r['name']} {r['ready']}/{r['desired']}" for r in roles)
        return "True", "AllRolesReady", f"Every role has its pods ready: {counts}."
    pods = list(pods)
    parts = []
    for role in short:
        waiting = [p for p in pods if p.role == role["name"] and not p.ready]
        detail = "; ".join(_why_not_ready(p) for p in waiting[:3])
        more = f" and {len(waiting) - 3} more" if len(waiting) > 3 else ""
        parts.append(f"{role['name']} {role['ready']}/{role['desired']} ready" + (f" ({detail}{more})" if detail else ""))
    return "False", "RolesNotReady", "; ".join(parts) + "."


def _why_not_ready(pod: PodView) -> str:
    hint = _WAITING_HINTS.get(pod.reason)
    what = f"{pod.phase}, {pod.reason}" if pod.reason else pod.phase
    return f"pod {pod.name} {what}" + (f": {hint}" if hint else "")


def trainer_loss_message(loss: Loss, attempt: int) -> str:
    """The failure message of an attempt ended by a lost trainer pod."""
    return (f"Pod {loss.pod} of role {loss.role} {loss.how} while attempt {attempt} ran; the trainer's workers on "
            f"it are gone, so the attempt cannot finish. If pods keep being lost, check their nodes (`kubectl "
            f"describe pod`, node pressure, preemption).")


@dataclass
class RoleTrack:
    """The operator's memory of one RLJob's current attempt: its pods at the last look, losses waiting to be
    confirmed, and the pods lost per role so far (seeded from status.roles when the operator (re)starts)."""

    attempt: int
    pods: dict[str, PodView]
    restarts: dict[str, int]
    #: Losses seen but not yet confirmed, with when they were seen (see `confirm_losses`).
    pending: list[tuple[Loss, datetime.datetime]] = field(default_factory=list)
    #: The confirmed loss of a trainer pod that ends this attempt (kept until the attempt changes).
    ended_by: Loss | None = None


@dataclass(frozen=True)
class RolesSeen:
    """What `status.decide` needs of the pods: the current attempt's pods, lost pods per role, new losses."""

    attempt: int
    pods: tuple[PodView, ...]
    restarts: Mapping[str, int]
    #: Losses confirmed in this look (each reported once: an Event, and for the trainer the attempt's end).
    losses: tuple[Loss, ...] = ()


def track_pods(track: RoleTrack | None, status: Obj, pods: Iterable[PodView], now: datetime.datetime) -> RoleTrack:
    """The next look at an RLJob's pods: losses since the last look join `pending` while the job starts or runs.

    A new attempt (or a first look, when the operator starts) begins a new memory, so pods that were there
    before it are not counted as lost; at a first look the counts come from status.roles.
    """
    attempt = int(status.get("attempt") or 0)
    views = {v.uid: v for v in pods if v.attempt == attempt}
    if track is None:
        recorded = {str(r.get("name")): int(r.get("restarts") or 0) for r in status.get("roles") or []
                    if isinstance(r, dict)}
        return RoleTrack(attempt, views, recorded)
    if track.attempt != attempt:
        return RoleTrack(attempt, views, {})
    live = status.get("phase") in ("Starting", "Running")
    pending = list(track.pending) + ([(loss, now) for loss in find_losses(track.pods, views)] if live else [])
    return RoleTrack(attempt, views, dict(track.restarts), pending, track.ended_by)


def confirm_losses(track: RoleTrack, now: datetime.datetime, grace: float, attempt_running: bool,
                   trainer_running: bool) -> tuple[list[Loss], float | None]:
    """Losses at least `grace` seconds old while the attempt still runs: counted in `track.restarts` and returned,
    with the seconds until the next pending one is due (None: none pending).

    The grace period keeps a job's own end from counting: KubeRay deletes the cluster's pods right after the
    RayJob finishes, and the pod deletions may reach the operator before the RayJob's new status does. When
    the attempt no longer runs (finished, suspended, superseded), pending losses are dropped.
    `trainer_running`: the driver runs (phase Running), so a lost trainer pod ends the attempt (`ended_by`);
    while the cluster is still starting, KubeRay's replacement is all it takes.
    """
    if not attempt_running:
        track.pending = []
        return [], None
    due = [loss for loss, seen in track.pending if (now - seen).total_seconds() >= grace]
    track.pending = [(loss, seen) for loss, seen in track.pending if (now - seen).total_seconds() < grace]
    for loss in due:
        track.restarts[loss.role] = track.restarts.get(loss.role, 0) + 1
        if loss.role == TRAINER and trainer_running and track.ended_by is None:
            track.ended_by = loss
    wait = min((grace - (now - seen).total_seconds() for _, seen in track.pending), default=None)
    return due, wait


def roles_seen(track: RoleTrack, losses: Iterable[Loss] = ()) -> RolesSeen:
    """The pods part of a reconcile's input, from the memory of them."""
    return RolesSeen(track.attempt, tuple(sorted(track.pods.values(), key=lambda p: p.name)), dict(track.restarts),
                     tuple(losses))
