"""Resource pools: one Ray placement group per node, one bundle per worker process (GPU or CPU slot).

Several worker groups may share a pool (colocation, e.g. the actor and the critic on the same GPUs):
each takes `1 / max_colocate_count` of every bundle, so `max_colocate_count` groups fit.

Roles: on a cluster the RLJob operator may give a pool's work pods of its own (spec.roles, e.g. the rollout
replicas of split placement on their own GPU type; the sandbox role's CPU pods hold the code sandbox's
run_code servers instead, see sandbox_service.py). Those pods advertise a Ray custom resource with one unit
per worker slot, and the operator names it per role in $HYBRIDFLOW_ROLE_RESOURCES (JSON, role -> resource,
e.g. `{"trainer": "rljob.role/trainer", "rollout": "rljob.role/rollout"}`). Every bundle of a pool whose role
is named there asks for one unit, so Ray places the pool on that role's pods. Without the variable (local
runs, single-role jobs) bundles ask for CPU/GPU only, as before.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_PG_TIMEOUT_S = 120.0
#: Set by the RLJob operator on the pods of a multi-role job (rljob_operator.roles): role -> Ray custom resource.
ROLE_RESOURCES_ENV = "HYBRIDFLOW_ROLE_RESOURCES"
#: The role whose pods each pool of the trainer (main_ppo.build_worker_groups) runs on.
POOL_ROLES = {"global_pool": "trainer", "rollout_pool": "rollout"}
#: A role whose pods hold no pool but the run_code servers of the code sandbox (controller/sandbox_service.py).
SANDBOX_ROLE = "sandbox"


def role_resources_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The role -> Ray custom resource mapping of $HYBRIDFLOW_ROLE_RESOURCES; empty when it is unset."""
    raw = (os.environ if environ is None else environ).get(ROLE_RESOURCES_ENV, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"${ROLE_RESOURCES_ENV}={raw!r} is not JSON; it maps roles to Ray custom resources, e.g. "
            '{"trainer": "rljob.role/trainer", "rollout": "rljob.role/rollout"} (the RLJob operator sets it; '
            "unset it to place every pool anywhere)"
        ) from err
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) and v for k, v in value.items()):
        raise ValueError(
            f"${ROLE_RESOURCES_ENV}={raw!r} must be a JSON object of role names to resource names, e.g. "
            '{"rollout": "rljob.role/rollout"}'
        )
    return dict(value)


class RayResourcePool:
    """A set of worker slots: `process_on_nodes[i]` slots on node i, placed with STRICT_PACK."""

    def __init__(
        self,
        process_on_nodes: list[int],
        use_gpu: bool = False,
        name_prefix: str = "pool",
        max_colocate_count: int = 1,
        cpus_per_process: float = 1.0,
        pg_timeout_s: float = DEFAULT_PG_TIMEOUT_S,
        role_resource: str | None = None,
    ) -> None:
        if not process_on_nodes or any(n < 1 for n in process_on_nodes):
            raise ValueError(
                f"resource pool {name_prefix!r}: process_on_nodes={process_on_nodes} must list at least "
                "one node with at least one process each (trainer.nnodes x trainer.n_gpus_per_node)"
            )
        if max_colocate_count < 1:
            raise ValueError(f"resource pool {name_prefix!r}: max_colocate_count must be >= 1")
        if cpus_per_process <= 0:
            raise ValueError(f"resource pool {name_prefix!r}: cpus_per_process must be > 0")
        self.process_on_nodes = list(process_on_nodes)
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix
        self.max_colocate_count = max_colocate_count
        self.cpus_per_process = cpus_per_process
        self.pg_timeout_s = pg_timeout_s
        #: A Ray custom resource only this pool's role's nodes have (one unit per slot); None: any node.
        self.role_resource = role_resource
        self._pgs: list[Any] | None = None

    @property
    def world_size(self) -> int:
        """Total number of worker slots."""
        return sum(self.process_on_nodes)

    def bundle(self) -> dict[str, float]:
        """The resources of one slot."""
        res: dict[str, float] = {"CPU": self.cpus_per_process}
        if self.use_gpu:
            res["GPU"] = 1.0
        if self.role_resource:
            res[self.role_resource] = 1.0
        return res

    def actor_resources(self) -> dict[str, float]:
        """What one actor of one colocated group asks for inside a slot."""
        share = 1.0 / self.max_colocate_count
        res = {"num_cpus": self.cpus_per_process * share}
        if self.use_gpu:
            res["num_gpus"] = share
        return res

    def get_placement_groups(self) -> list[Any]:
        """Create (once) and return the placement groups, one per node, waiting until they are placed."""
        if self._pgs is not None:
            return self._pgs
        import ray
        from ray.util.placement_group import placement_group

        pgs = [
            placement_group(
                [self.bundle() for _ in range(n)],
                strategy="STRICT_PACK",
                name=f"{self.name_prefix}_pg{i}_{id(self):x}",
            )
            for i, n in enumerate(self.process_on_nodes)
        ]
        try:
            ray.get([pg.ready() for pg in pgs], timeout=self.pg_timeout_s)
        except ray.exceptions.GetTimeoutError as err:
            for pg in pgs:
                ray.util.remove_placement_group(pg)
            if self.role_resource:
                raise RuntimeError(
                    f"resource pool {self.name_prefix!r} could not be placed within {self.pg_timeout_s:.0f}s: it "
                    f"needs {self.process_on_nodes} slots of {self.bundle()} per node, on nodes advertising "
                    f"{self.role_resource!r} (${ROLE_RESOURCES_ENV}), and the Ray cluster has "
                    f"{ray.cluster_resources()} in total. Check that the role's pods are running and that each "
                    "advertises one unit per slot (the RLJob's spec.roles and spec.config.trainer must agree: "
                    "re-render the job with `rljob render`)."
                ) from err
            raise RuntimeError(
                f"resource pool {self.name_prefix!r} could not be placed within {self.pg_timeout_s:.0f}s: "
                f"it needs {self.process_on_nodes} slots of {self.bundle()} per node, and the Ray "
                f"cluster has {ray.cluster_resources()} in total. Lower trainer.n_gpus_per_node / "
                "trainer.nnodes, or give Ray more resources (trainer.ray_init.num_cpus, more nodes)."
            ) from err
        self._pgs = pgs
        return pgs

    def slots(self) -> list[tuple[Any, int, int]]:
        """(placement group, bundle index, local rank) for each global rank, node by node."""
        return [
            (pg, idx, idx)
            for pg, n in zip(self.get_placement_groups(), self.process_on_nodes, strict=True)
            for idx in range(n)
        ]

    def release(self) -> None:
        """Remove the placement groups (the actors in them must be gone or are killed by Ray)."""
        if self._pgs is None:
            return
        import ray

        for pg in self._pgs:
            ray.util.remove_placement_group(pg)
        self._pgs = None


@dataclass
class ResourcePoolManager:
    """Named pools and which role runs on which pool.

    `resource_pool_spec`: pool name -> processes per node, e.g. `{"global_pool": [2]}`.
    `mapping`: role name ("actor_rollout_ref", "critic", "rollout", ...) -> pool name.
    Colocated placement maps every role to one pool; split placement gives the rollout its own.
    `role_resources`: role (POOL_ROLES) -> Ray custom resource the pool's bundles ask for; by default
    $HYBRIDFLOW_ROLE_RESOURCES (empty when unset: pools go wherever they fit).
    """

    resource_pool_spec: dict[str, list[int]]
    mapping: dict[str, str]
    use_gpu: bool = False
    cpus_per_process: float = 1.0
    max_colocate_count: int = 2
    role_resources: dict[str, str] = field(default_factory=role_resources_from_env)
    pools: dict[str, RayResourcePool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted({p for p in self.mapping.values() if p not in self.resource_pool_spec})
        if unknown:
            raise ValueError(
                f"roles map to undefined resource pools {unknown}; define them in resource_pool_spec "
                f"(known pools: {sorted(self.resource_pool_spec)})"
            )

    def create_resource_pools(self) -> None:
        """Create every pool (placement groups are placed lazily, on first use)."""
        for name, nodes in self.resource_pool_spec.items():
            if name not in self.pools:
                self.pools[name] = RayResourcePool(
                    process_on_nodes=nodes,
                    use_gpu=self.use_gpu,
                    name_prefix=name,
                    max_colocate_count=self.max_colocate_count,
                    cpus_per_process=self.cpus_per_process,
                    role_resource=self.role_resources.get(POOL_ROLES.get(name, "")),
                )

    def get_resource_pool(self, role: str) -> RayResourcePool:
        """The pool a role runs on."""
        if role not in self.mapping:
            raise KeyError(f"no resource pool for role {role!r}; mapped roles: {sorted(self.mapping)}")
        self.create_resource_pools()
        return self.pools[self.mapping[role]]
