"""`RayWorkerGroup`: a set of Ray actors, one per resource-pool slot, driven from the single controller.

Every `@register`-ed method of the worker class becomes a method of the group with the same name:
`wg.compute_log_prob(batch)` splits `batch` by rank, runs the method on every actor and returns the
concatenated result. Blocking methods return the collected value; methods registered with
`blocking=False` return a `GroupFuture` whose `.get()` collects later (so the controller can run two
groups at once).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybridflow.controller.decorator import (
    Dispatch,
    DispatchResult,
    Execute,
    MethodSpec,
    collect,
    dispatch,
    registered_methods,
)
from hybridflow.controller.oom import get_or_explain_oom
from hybridflow.controller.resource_pool import RayResourcePool
from hybridflow.controller.worker import apply_dist_env


@dataclass
class RayClassWithInitArgs:
    """A worker class plus the arguments its `__init__` gets on every rank."""

    cls: type
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        self.cls = cls
        self.args = args
        self.kwargs = kwargs


def _with_dist_env(cls: type) -> type:
    """A subclass that exports the rendezvous environment before the worker's own `__init__` runs."""

    class GroupMember(cls):
        def __init__(self, *args: Any, hybridflow_dist_env: dict[str, str], **kwargs: Any) -> None:
            apply_dist_env(hybridflow_dist_env)
            super().__init__(*args, **kwargs)

    GroupMember.__name__ = cls.__name__
    GroupMember.__qualname__ = cls.__qualname__
    return GroupMember


class GroupFuture:
    """Pending results of a non-blocking group call; `get()` waits and collects them."""

    def __init__(
        self, refs: list[Any], mode: Dispatch, context: dict[str, Any], method: str = "", group: str = ""
    ) -> None:
        self.refs = refs
        self._mode = mode
        self._context = context
        self._method = method
        self._group = group

    def get(self, timeout: float | None = None) -> Any:
        """Wait for every rank and return the collected value.

        A rank killed for memory raises `WorkerOutOfMemoryError`, naming the settings to lower.
        """
        values = get_or_explain_oom(self.refs, self._method, self._group, timeout=timeout)
        return collect(self._mode, values, self._context)


class RayWorkerGroup:
    """One Ray actor per slot of `resource_pool`, created from `cls_with_init`; see the module doc."""

    def __init__(
        self,
        resource_pool: RayResourcePool,
        cls_with_init: RayClassWithInitArgs,
        name_prefix: str | None = None,
        env_vars: dict[str, str] | None = None,
        runtime_env: Callable[[int], dict[str, Any] | None] | None = None,
    ) -> None:
        self.resource_pool = resource_pool
        self.worker_cls = cls_with_init.cls
        self.name_prefix = name_prefix or self.worker_cls.__name__
        self.workers: list[Any] = []
        self._create_actors(cls_with_init, env_vars or {}, runtime_env or (lambda rank: None))
        self._method_specs = registered_methods(self.worker_cls)
        for name, spec in self._method_specs.items():
            if hasattr(type(self), name):
                raise ValueError(
                    f"worker method {self.worker_cls.__name__}.{name} clashes with a RayWorkerGroup "
                    "attribute of the same name; rename the worker method"
                )
            setattr(self, name, self._bind(name, spec))

    @property
    def world_size(self) -> int:
        """Number of actors in the group."""
        return len(self.workers)

    def _create_actors(
        self, cls_with_init: RayClassWithInitArgs, env_vars: dict[str, str],
        runtime_env: Callable[[int], dict[str, Any] | None],
    ) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote_cls: Any = ray.remote(_with_dist_env(cls_with_init.cls))
        world_size = self.resource_pool.world_size
        local_world = self.resource_pool.process_on_nodes
        master: dict[str, str] = {}
        for rank, (pg, bundle_idx, local_rank) in enumerate(self.resource_pool.slots()):
            dist_env = {
                **env_vars,
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(local_world[0] if len(set(local_world)) == 1 else 0),
                **master,
            }
            options: dict[str, Any] = {
                **self.resource_pool.actor_resources(),
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=bundle_idx
                ),
            }
            env = runtime_env(rank)  # e.g. Ray's nsight plugin for a profiled rank (hybridflow.profiling)
            if env:
                options["runtime_env"] = env
            actor = remote_cls.options(**options).remote(
                *cls_with_init.args, hybridflow_dist_env=dist_env, **cls_with_init.kwargs
            )
            if rank == 0:
                # Rank 0 chose MASTER_ADDR/PORT on its own node; the others rendezvous there.
                addr, port = ray.get(actor._hybridflow_master_address.remote())
                master = {"MASTER_ADDR": addr, "MASTER_PORT": port}
            self.workers.append(actor)

    def _bind(self, name: str, spec: MethodSpec) -> Any:
        @functools.wraps(getattr(self.worker_cls, name))
        def group_method(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, spec, *args, **kwargs)

        return group_method

    def _call(self, name: str, spec: MethodSpec, *args: Any, **kwargs: Any) -> Any:
        planned: DispatchResult = dispatch(spec.dispatch_mode, self.world_size, *args, **kwargs)
        ranks = range(self.world_size) if spec.execute_mode is Execute.ALL else range(1)
        refs = [
            getattr(self.workers[r], name).remote(*planned.args[r], **planned.kwargs[r]) for r in ranks
        ]
        future = GroupFuture(refs, spec.dispatch_mode, planned.context, method=name, group=self.name_prefix)
        return future.get() if spec.blocking else future

    def execute_all(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call any actor method on every rank with the same arguments; return the per-rank results."""
        refs = [getattr(w, method_name).remote(*args, **kwargs) for w in self.workers]
        return get_or_explain_oom(refs, method_name, self.name_prefix)

    def execute_rank_zero(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Call any actor method on rank 0 only and return its result."""
        ref = getattr(self.workers[0], method_name).remote(*args, **kwargs)
        return get_or_explain_oom(ref, method_name, self.name_prefix)

    def shutdown(self) -> None:
        """Kill the group's actors (the resource pool stays for reuse)."""
        import ray

        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
