"""Roles (pure): an RLJob's pods by the kind of work they do, each role its own KubeRay worker group.

- trainer: the actor, reference, critic, reward model and teacher workers, the trainer's global pool:
  trainer.nnodes pods of trainer.n_gpus_per_node GPUs, with spec.resources and spec.pod.
- rollout (spec.roles.rollout, with trainer.placement split): the rollout pool, which the trainer makes of
  the global pool's shape (hybridflow.trainer.main_ppo.build_worker_groups), on pods with the role's own
  resources, GPU type, nodeSelector and tolerations.

Sizes are derived from the trainer config, never written twice, so the manifest and the trainer agree. Each
role's pods advertise the Ray custom resource `rljob.role/<role>`, one unit per worker slot (a GPU, or a
process with trainer.device cpu); $HYBRIDFLOW_ROLE_RESOURCES tells the trainer which resource each role's
pool must ask for (hybridflow.controller.resource_pool). Without spec.roles there is one worker group
("workers") and no custom resource, as before. All roles are worker groups of one RayCluster, so Kueue and
the gang schedulers admit them together (scheduling.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hybridflow.config import HybridFlowConfig
from hybridflow.controller.resource_pool import POOL_ROLES, ROLE_RESOURCES_ENV
from hybridflow.recipes import TrainerConfigTree
from rljob_operator import api

#: Prefix of the Ray custom resource each role's pods advertise: rljob.role/trainer, rljob.role/rollout.
ROLE_RESOURCE_PREFIX = "rljob.role/"
TRAINER = "trainer"
ROLLOUT = "rollout"
#: The pod label naming a pod's role (on multi-role jobs).
LABEL_ROLE = "rl.hybridflow.dev/role"
assert {TRAINER, ROLLOUT} <= set(POOL_ROLES.values()), "the trainer's pools must know every operator role"
__all__ = ["LABEL_ROLE", "ROLE_RESOURCES_ENV", "ROLE_RESOURCE_PREFIX", "ROLLOUT", "TRAINER", "Role", "config_problems",
           "derive", "has_roles", "role_resources_env", "rollout_replicas"]


@dataclass(frozen=True)
class Role:
    """One role's worker group: how many pods, what each has, where it may run."""

    name: str
    pods: int
    #: GPUs each pod requests (0 with trainer.device cpu).
    gpus_per_pod: int
    #: Worker slots per pod (GPUs, or processes on CPU): the units of the role's Ray custom resource.
    slots_per_pod: int
    gpu_resource_name: str
    cpu: api.Quantity
    memory: api.Quantity
    shared_memory: api.Quantity
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def resource(self) -> str:
        """The Ray custom resource the role's pods advertise."""
        return ROLE_RESOURCE_PREFIX + self.name

    @property
    def group_name(self) -> str:
        """The KubeRay worker group's name (its pods' ray.io/group label)."""
        return self.name


def has_roles(rljob: api.RLJob) -> bool:
    """Whether the RLJob asks for roles with pods of their own (else: one worker group, as before)."""
    return rljob.spec.roles is not None and rljob.spec.roles.rollout is not None


def derive(rljob: api.RLJob, config: TrainerConfigTree) -> list[Role]:
    """The roles of an RLJob run with `config` (an attempt's or the smoke run's), trainer first; [] without spec.roles.

    Validate first (config_problems): this assumes a rollout role comes with trainer.placement split.
    """
    if not has_roles(rljob):
        return []
    assert rljob.spec.roles is not None and rljob.spec.roles.rollout is not None
    trainer = config.trainer
    # split placement: the rollout pool has the global pool's shape, trainer.nnodes x trainer.n_gpus_per_node
    shape = {"pods": trainer.nnodes, "slots_per_pod": trainer.n_gpus_per_node,
             "gpus_per_pod": 0 if trainer.device == "cpu" else trainer.n_gpus_per_node}
    res, pod, own = rljob.spec.resources, rljob.spec.pod, rljob.spec.roles.rollout
    pod_tolerations = [t.model_dump(mode="json", exclude_none=True) for t in pod.tolerations]
    own_tolerations = [t.model_dump(mode="json", exclude_none=True) for t in own.tolerations]
    return [
        Role(name=TRAINER, **shape, gpu_resource_name=res.gpu_resource_name, cpu=res.cpu, memory=res.memory,
             shared_memory=res.shared_memory, node_selector=dict(pod.node_selector), tolerations=pod_tolerations),
        Role(name=ROLLOUT, **shape,
             gpu_resource_name=_first(own.resources.gpu_resource_name, res.gpu_resource_name),
             cpu=_first(own.resources.cpu, res.cpu), memory=_first(own.resources.memory, res.memory),
             shared_memory=_first(own.resources.shared_memory, res.shared_memory),
             node_selector={**pod.node_selector, **own.node_selector},
             tolerations=pod_tolerations + [t for t in own_tolerations if t not in pod_tolerations]),
    ]


def _first(value: Any, default: Any) -> Any:
    return default if value is None else value


def role_resources_env(roles: list[Role]) -> str:
    """The value of $HYBRIDFLOW_ROLE_RESOURCES for these roles: JSON, role -> Ray custom resource."""
    return json.dumps({r.name: r.resource for r in roles}, sort_keys=True, separators=(",", ":"))


def rollout_replicas(config: HybridFlowConfig) -> tuple[int, str]:
    """(rollout server replicas, why) as the trainer decides them for the rollout pool of split placement.

    The same rule as hybridflow.workers.rollout_service.replica_count (a test holds them together); it is
    repeated here because that module imports torch, which the operator does not have.
    """
    ro, trainer = config.actor_rollout_ref.rollout, config.trainer
    if ro.replicas:
        return int(ro.replicas), "spec.config.actor_rollout_ref.rollout.replicas"
    if trainer.device != "cuda":
        return 1, "one replica with trainer.device cpu, since an engine uses every core"
    world = trainer.nnodes * trainer.n_gpus_per_node
    tp = ro.tensor_model_parallel_size
    return max(1, world // tp), (f"one per tensor-parallel group: {trainer.nnodes} node(s) x {trainer.n_gpus_per_node} "
                                 f"GPUs / tensor_model_parallel_size {tp}")


def config_problems(rljob: api.RLJob, config: TrainerConfigTree | None) -> list[str]:
    """What makes spec.roles impossible with spec.config (empty when the roles fit); None: config invalid."""
    if not has_roles(rljob):
        return []
    assert rljob.spec.roles is not None and rljob.spec.roles.rollout is not None
    if rljob.spec.recipe != "ppo":
        return [f"spec.roles.rollout: spec.recipe {rljob.spec.recipe} trains on fixed data and has no rollout; "
                "remove spec.roles.rollout"]
    if not isinstance(config, HybridFlowConfig):
        return []  # None: the trainer config's own problems are reported; the rest needs a valid config
    placement = config.trainer.placement
    if placement != "split":
        return [f"spec.roles.rollout: needs spec.config.trainer.placement: split (it is {placement}): only split "
                "placement gives the rollout devices of its own, a pool of the trainer's shape that the rollout pods "
                "hold; set trainer.placement: split, or remove spec.roles.rollout to keep the rollout on the "
                "trainer's GPUs"]
    return _size_problems(rljob.spec.roles.rollout, config)


def _size_problems(own: api.RolloutRoleSpec, config: HybridFlowConfig) -> list[str]:
    problems: list[str] = []
    ro, trainer = config.actor_rollout_ref.rollout, config.trainer
    tp = ro.tensor_model_parallel_size
    if own.replicas is not None:
        if ro.mode != "async":
            problems.append(
                f"spec.roles.rollout.replicas: counts rollout server replicas (actor_rollout_ref.rollout.mode: "
                f"async), but the mode is {ro.mode}, where the rollout is one worker group over the pool's "
                f"{trainer.nnodes} x {trainer.n_gpus_per_node} slots; set rollout.mode: async, or remove "
                "spec.roles.rollout.replicas")
        else:
            have, why = rollout_replicas(config)
            if have != own.replicas:
                problems.append(
                    f"spec.roles.rollout.replicas: {own.replicas} contradicts spec.config, which gives {have} replicas ({why}); "
                    f"set spec.config.actor_rollout_ref.rollout.replicas: {own.replicas}"
                    f"{_pool_hint(own.replicas, config)}, or remove spec.roles.rollout.replicas")
    if own.gpus_per_replica is not None:
        if trainer.device == "cpu":
            problems.append(
                "spec.roles.rollout.gpusPerReplica: trainer.device is cpu, so the replicas use no GPUs; remove it")
        elif own.gpus_per_replica != tp:
            problems.append(
                f"spec.roles.rollout.gpusPerReplica: {own.gpus_per_replica} contradicts "
                f"spec.config.actor_rollout_ref.rollout.tensor_model_parallel_size {tp} (each replica is one "
                f"tensor-parallel group); set tensor_model_parallel_size: {own.gpus_per_replica}, or remove "
                "spec.roles.rollout.gpusPerReplica")
    return problems


def _pool_hint(replicas: int, config: HybridFlowConfig) -> str:
    """When `replicas` do not fit the rollout pool: the trainer.nnodes that makes them fit."""
    trainer, tp = config.trainer, config.actor_rollout_ref.rollout.tensor_model_parallel_size
    if trainer.device != "cuda" or trainer.n_gpus_per_node <= 0:
        return ""
    need, have = replicas * tp, trainer.nnodes * trainer.n_gpus_per_node
    if need <= have:
        return ""
    nodes = -(-need // trainer.n_gpus_per_node)
    return (f" and, since {replicas} replicas x {tp} GPUs need {need} and the pool has {have}, trainer.nnodes: "
            f"{nodes} (the rollout pool has the trainer's shape)")
