"""Resource pools: one Ray placement group per node, one bundle per worker process (GPU or CPU slot).

Several worker groups may share a pool (colocation, e.g. the actor and the critic on the same GPUs):
each takes `1 / max_colocate_count` of every bundle, so `max_colocate_count` groups fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_PG_TIMEOUT_S = 120.0


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
    """

    resource_pool_spec: dict[str, list[int]]
    mapping: dict[str, str]
    use_gpu: bool = False
    cpus_per_process: float = 1.0
    max_colocate_count: int = 2
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
                )

    def get_resource_pool(self, role: str) -> RayResourcePool:
        """The pool a role runs on."""
        if role not in self.mapping:
            raise KeyError(f"no resource pool for role {role!r}; mapped roles: {sorted(self.mapping)}")
        self.create_resource_pools()
        return self.pools[self.mapping[role]]
