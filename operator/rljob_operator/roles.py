"""Roles (pure): an RLJob's pods by the kind of work they do, each role its own KubeRay worker group.

- trainer: the actor, reference, critic, reward model and teacher workers, the trainer's global pool:
  trainer.nnodes pods of trainer.n_gpus_per_node GPUs, with spec.resources and spec.pod.
- rollout (spec.roles.rollout, with trainer.placement split): the rollout pool, which the trainer makes of
  the global pool's shape (hybridflow.trainer.main_ppo.build_worker_groups), on pods with the role's own
  resources, GPU type, nodeSelector and tolerations.
- sandbox (spec.roles.sandbox): CPU-only pods, one per run_code server of the code sandbox; the trainer starts
  spec.config.trainer.sandbox.replicas servers (hybridflow.controller.sandbox_service), so that is the pod count.
  The pods advertise no CPUs to Ray (num-cpus 0): only the servers, which ask for the role's resource, run there.

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

from hybridflow._config.sandbox import TOOL_KEY, sandbox_consumers
from hybridflow.config import HybridFlowConfig
from hybridflow.controller.resource_pool import POOL_ROLES, ROLE_RESOURCES_ENV, SANDBOX_ROLE
from hybridflow.recipes import TrainerConfigTree
from rljob_operator import api

#: Prefix of the Ray custom resource each role's pods advertise: rljob.role/trainer, rljob.role/rollout.
ROLE_RESOURCE_PREFIX = "rljob.role/"
TRAINER = "trainer"
ROLLOUT = "rollout"
SANDBOX = "sandbox"
#: The pod label naming a pod's role (on multi-role jobs).
LABEL_ROLE = "rl.hybridflow.dev/role"
assert {TRAINER, ROLLOUT} <= set(POOL_ROLES.values()), "the trainer's pools must know every operator role"
assert SANDBOX == SANDBOX_ROLE, "the trainer's sandbox service must know the sandbox role"
__all__ = ["LABEL_ROLE", "ROLE_RESOURCES_ENV", "ROLE_RESOURCE_PREFIX", "ROLLOUT", "SANDBOX", "TRAINER", "Role",
           "config_problems", "derive", "has_roles", "role_resources_env", "rollout_replicas"]


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
    #: Only actors asking for the role's resource may run on its pods: Ray sees no CPUs there (num-cpus 0), so
    #: work asking for CPU alone (a CPU trainer's pools, helper actors) goes elsewhere.
    exclusive: bool = False

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
    roles = rljob.spec.roles
    return roles is not None and (roles.rollout is not None or roles.sandbox is not None)


def derive(rljob: api.RLJob, config: TrainerConfigTree) -> list[Role]:
    """The roles of an RLJob run with `config` (an attempt's or the smoke run's), trainer first; [] without spec.roles.

    Validate first (config_problems): this assumes a rollout role comes with trainer.placement split and a sandbox
    role with trainer.sandbox.replicas.
    """
    if not has_roles(rljob):
        return []
    assert rljob.spec.roles is not None
    trainer, own = config.trainer, rljob.spec.roles
    gpus = 0 if trainer.device == "cpu" else trainer.n_gpus_per_node
    # split placement: the rollout pool has the global pool's shape, trainer.nnodes x trainer.n_gpus_per_node; without
    # a rollout role the trainer's pods hold both pools, as the single worker group does (builders.cluster_shape)
    pools = 2 if own.rollout is None and getattr(trainer, "placement", "colocate") == "split" else 1
    res, pod = rljob.spec.resources, rljob.spec.pod
    result = [Role(name=TRAINER, pods=trainer.nnodes * pools, slots_per_pod=trainer.n_gpus_per_node, gpus_per_pod=gpus,
                   gpu_resource_name=res.gpu_resource_name, cpu=res.cpu, memory=res.memory,
                   shared_memory=res.shared_memory, node_selector=dict(pod.node_selector),
                   tolerations=_tolerations(pod.tolerations))]
    if own.rollout is not None:
        result.append(_own_role(rljob, ROLLOUT, own.rollout, pods=trainer.nnodes, slots_per_pod=trainer.n_gpus_per_node,
                                gpus_per_pod=gpus))
    if own.sandbox is not None:
        # one run_code server per pod, one unit each; CPU only, whatever trainer.device is
        result.append(_own_role(rljob, SANDBOX, own.sandbox, pods=sandbox_replicas(config), slots_per_pod=1,
                                gpus_per_pod=0, exclusive=True))
    return result


def _own_role(rljob: api.RLJob, name: str, own: api.RolloutRoleSpec | api.SandboxRoleSpec, **shape: Any) -> Role:
    """A role with pods of its own: its resources over spec.resources', its nodeSelector and tolerations over spec.pod's."""
    res, pod, mine = rljob.spec.resources, rljob.spec.pod, own.resources
    pod_tolerations = _tolerations(pod.tolerations)
    return Role(name=name, **shape,
                gpu_resource_name=_first(mine.gpu_resource_name, res.gpu_resource_name),
                cpu=_first(mine.cpu, res.cpu), memory=_first(mine.memory, res.memory),
                shared_memory=_first(mine.shared_memory, res.shared_memory),
                node_selector={**pod.node_selector, **own.node_selector},
                tolerations=pod_tolerations + [t for t in _tolerations(own.tolerations) if t not in pod_tolerations])


def _tolerations(tolerations: list[api.Toleration]) -> list[dict[str, Any]]:
    return [t.model_dump(mode="json", exclude_none=True) for t in tolerations]


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


def sandbox_replicas(config: TrainerConfigTree) -> int:
    """The run_code servers the trainer starts on the sandbox role, one per pod (trainer.sandbox.replicas)."""
    sandbox = getattr(config.trainer, "sandbox", None)  # the RL trainer's key; sft/dpo have none
    return int(sandbox.replicas) if sandbox is not None else 0


def config_problems(rljob: api.RLJob, config: TrainerConfigTree | None) -> list[str]:
    """What makes spec.roles impossible with spec.config (empty when the roles fit); None: config invalid."""
    if rljob.spec.roles is None:
        return []
    problems = []
    if rljob.spec.roles.rollout is not None:
        problems += _rollout_problems(rljob, config)
    if rljob.spec.roles.sandbox is not None:
        problems += _sandbox_problems(rljob.spec.recipe, rljob.spec.roles.sandbox, config)
    return problems


def _rollout_problems(rljob: api.RLJob, config: TrainerConfigTree | None) -> list[str]:
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


def _sandbox_problems(recipe: str, own: api.SandboxRoleSpec, config: TrainerConfigTree | None) -> list[str]:
    """A sandbox role needs servers to hold (trainer.sandbox.replicas) and something in the config that runs code."""
    if recipe != "ppo":
        return [f"spec.roles.sandbox: spec.recipe {recipe} trains on fixed data and runs no code (no tools, no code "
                "scorers); remove spec.roles.sandbox"]
    if own.resources.gpu_resource_name is not None:
        problems = ["spec.roles.sandbox.resources.gpuResourceName: the sandbox pods are CPU-only (they run programs "
                    "for the code tool and the code scorers, no model) and request no GPUs; remove it"]
    else:
        problems = []
    if not isinstance(config, HybridFlowConfig):
        return problems  # None: the trainer config's own problems are reported; the rest needs a valid config
    have = sandbox_replicas(config)
    if have == 0:
        problems.append(
            "spec.roles.sandbox: spec.config starts no sandbox servers (trainer.sandbox.replicas is 0); set "
            f"spec.config.trainer.sandbox.replicas: {own.replicas or 1} (one run_code server per sandbox pod), or "
            "remove spec.roles.sandbox")
    elif own.replicas is not None and own.replicas != have:
        problems.append(
            f"spec.roles.sandbox.replicas: {own.replicas} contradicts spec.config.trainer.sandbox.replicas {have} "
            f"(one run_code server per sandbox pod); set spec.config.trainer.sandbox.replicas: {own.replicas}, or "
            "remove spec.roles.sandbox.replicas")
    users, why_not = sandbox_consumers(config)
    if not users:
        problems.append(
            f"spec.roles.sandbox: nothing in spec.config runs code in the sandbox: {'; '.join(why_not)}. Set {TOOL_KEY} "
            "to a tool config with the code_interpreter tool (verl's SandboxFusionTool) without sandbox_fusion_url, "
            "or score code data sources (codecontests, apps, codeforces, taco) with the built-in scorers and "
            "reward_model.sandbox_fusion.url unset; or remove spec.roles.sandbox")
    return problems
