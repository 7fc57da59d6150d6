"""Gang scheduling (pure): the labels Kueue and KubeRay's batch schedulers read on an attempt's RayJob.

An RLJob names one scheduler in `spec.scheduling` (or, deprecated, a Kueue LocalQueue in `spec.queueName`).
Every label goes on the RayJob: KubeRay copies a RayJob's labels to the RayCluster it creates
(rayjob_controller.go, constructRayClusterForRayJob), and its batch-scheduler plugins read them there.
Facts used, from KubeRay v1.7's ray-operator (controllers/ray/batchscheduler/ and utils/constant.go) and
the Ray docs on KubeRay's Kueue, Volcano, YuniKorn and KAI Scheduler integrations:

- Kueue: label `kueue.x-k8s.io/queue-name` = LocalQueue; the RayJob is created with `spec.suspend: true`
  and Kueue unsuspends it once the quota fits the head and every worker (one Workload per RayJob).
- Volcano (`--batch-scheduler=volcano`): `volcano.sh/queue-name` = Queue, `ray.io/priority-class-name` =
  the PodGroup's priority class; `ray.io/scheduler-name: volcano` is what the deprecated
  `--enable-batch-scheduler` flag selects by. KubeRay creates a PodGroup of minMember = all pods.
- YuniKorn (`--batch-scheduler=yunikorn`): `yunikorn.apache.org/app-id`, `yunikorn.apache.org/queue`, and
  `ray.io/gang-scheduling-enabled` (read for its presence) for task groups, YuniKorn's gang scheduling.
- KAI Scheduler (`--batch-scheduler=kai-scheduler`): `kai.scheduler/queue` = Queue; without it KAI
  leaves the pods pending. KAI's PodGrouper gangs the RayCluster's pods.

The batch-scheduler plugins set the pods' `schedulerName` themselves, so the builders do not.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from rljob_operator import api, names

Obj = dict[str, Any]

LABEL_KUEUE_QUEUE = names.LABEL_KUEUE_QUEUE
LABEL_RAY_SCHEDULER_NAME = "ray.io/scheduler-name"
LABEL_RAY_PRIORITY_CLASS = "ray.io/priority-class-name"
LABEL_RAY_GANG_SCHEDULING = "ray.io/gang-scheduling-enabled"
LABEL_VOLCANO_QUEUE = "volcano.sh/queue-name"
LABEL_YUNIKORN_APP_ID = "yunikorn.apache.org/app-id"
LABEL_YUNIKORN_QUEUE = "yunikorn.apache.org/queue"
LABEL_KAI_QUEUE = "kai.scheduler/queue"
#: Every label this module may set; a user's own pod label of the same key is refused (validation.py).
SCHEDULING_LABELS = (LABEL_KUEUE_QUEUE, LABEL_RAY_SCHEDULER_NAME, LABEL_RAY_PRIORITY_CLASS,
                     LABEL_RAY_GANG_SCHEDULING, LABEL_VOLCANO_QUEUE, LABEL_YUNIKORN_APP_ID,
                     LABEL_YUNIKORN_QUEUE, LABEL_KAI_QUEUE)
_MAX_LABEL_VALUE = 63


@dataclass(frozen=True)
class Scheduler:
    """What one `spec.scheduling.scheduler` value means for the RayJob and for validation."""

    #: The label that carries spec.scheduling.queue (None: the scheduler has no queues here).
    queue_label: str | None
    #: Whether a queue must be named (the scheduler never admits a job without one).
    needs_queue: bool
    #: What the queue is, for messages.
    queue_kind: str
    #: A KubeRay batch scheduler: KubeRay's operator must run with --batch-scheduler=<name>.
    kuberay_batch: bool


SCHEDULERS: dict[str, Scheduler] = {
    "default": Scheduler(None, False, "", False),
    "kueue": Scheduler(LABEL_KUEUE_QUEUE, True, "a Kueue LocalQueue in the RLJob's namespace", False),
    "volcano": Scheduler(LABEL_VOLCANO_QUEUE, False, "a Volcano Queue", True),
    "yunikorn": Scheduler(LABEL_YUNIKORN_QUEUE, False, "a YuniKorn queue, e.g. root.team-a", True),
    "kai-scheduler": Scheduler(LABEL_KAI_QUEUE, True, "a KAI Scheduler Queue", True),
}
assert tuple(SCHEDULERS) == api.SCHEDULERS, "api.SchedulerName and SCHEDULERS must list the same names"


def effective_scheduling(spec: api.RLJobSpec) -> api.SchedulingSpec | None:
    """spec.scheduling, or the deprecated spec.queueName as Kueue scheduling; None: the default scheduler."""
    if spec.scheduling is not None:
        return spec.scheduling
    if spec.queue_name is not None:
        return api.SchedulingSpec(scheduler="kueue", queue=spec.queue_name)
    return None


def kueue_queue(spec: Obj) -> str | None:
    """The Kueue LocalQueue of a raw RLJob spec (status.py reads specs as dicts); None: not queued by Kueue."""
    scheduling = spec.get("scheduling")
    if isinstance(scheduling, dict):
        return scheduling.get("queue") if scheduling.get("scheduler") == "kueue" else None
    queue = spec.get("queueName")
    return queue if isinstance(queue, str) else None


def yunikorn_app_id(namespace: str | None, rayjob_name: str) -> str:
    """A YuniKorn application id for one attempt, unique across namespaces and a valid label value.

    `<namespace>-<rayjob>` when it fits in 63 characters, else `<rayjob>-<8 hex digits of the namespace>`
    (RayJob names are at most 47 characters, names.MAX_RAYJOB_NAME_LENGTH).
    """
    if not namespace:
        return rayjob_name
    joined = f"{namespace}-{rayjob_name}"
    if len(joined) <= _MAX_LABEL_VALUE:
        return joined
    return f"{rayjob_name}-{hashlib.sha256(namespace.encode()).hexdigest()[:8]}"


def build_scheduling_labels(rljob: api.RLJob, rayjob_name: str) -> dict[str, str]:
    """The labels of one attempt's RayJob that hand it to its scheduler (empty for the default scheduler).

    `rljob` carries the pod settings in effect (the operator's pod defaults merged in): Volcano's
    PodGroup takes spec.pod.priorityClassName.
    """
    scheduling = effective_scheduling(rljob.spec)
    if scheduling is None or scheduling.scheduler == "default":
        return {}
    kind = SCHEDULERS[scheduling.scheduler]
    labels: dict[str, str] = {}
    if kind.queue_label is not None and scheduling.queue is not None:
        labels[kind.queue_label] = scheduling.queue
    if scheduling.scheduler == "volcano":
        labels[LABEL_RAY_SCHEDULER_NAME] = "volcano"
        if rljob.spec.pod.priority_class_name:
            labels[LABEL_RAY_PRIORITY_CLASS] = rljob.spec.pod.priority_class_name
    elif scheduling.scheduler == "yunikorn":
        labels[LABEL_YUNIKORN_APP_ID] = yunikorn_app_id(rljob.metadata.namespace, rayjob_name)
        labels[LABEL_RAY_GANG_SCHEDULING] = "true"
    return labels


def admitted_by_kueue(rljob: api.RLJob) -> bool:
    """Whether Kueue admits the job: its RayJobs are created suspended and Kueue unsuspends them."""
    scheduling = effective_scheduling(rljob.spec)
    return scheduling is not None and scheduling.scheduler == "kueue"
