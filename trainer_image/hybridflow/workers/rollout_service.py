"""Rollout as a service: async engine replicas (vLLM `AsyncLLM`, SGLang) in Ray actors, a router, and the
agent-loop manager.

    RolloutService(config, tokenizer, pool)       # replicas on the pool's slots (each spans one TP group)
      .generate_sequences(batch)                  # agent loops -> router -> replicas, a padded batch back
      .update_weights(actor_group)                # after every actor update: the actor's full weights into
                                                  # every replica (object store; no engine restart)

Each replica runs with `max_restarts`: when one dies (OOM, SIGKILL, a lost pod) the router retries its
requests on the others, and once Ray has restarted it the service pushes the current weights into it
before it is used again. The agent loops and the router are Ray-free (`hybridflow.agent`); Ray lives here.

A replica with tensor_model_parallel_size = tp > 1 spans tp consecutive slots of the pool, on one node: the
replica actor sits in the first and a `ReplicaSeat` holds its share of each of the others (so Ray's books
show what the engine uses) and names that slot's GPU; the engine's tp ranks run as its worker processes (vLLM
workers, SGLang schedulers) on those GPUs (GPU) or, with vLLM-CPU, on tp disjoint core lists (CPU). Weights reach every rank through the same push: each
rank takes the full tensors and keeps its shard.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from typing import Any

from hybridflow._config import verl_features
from hybridflow.agent.base import TokenOutput
from hybridflow.agent.manager import AgentLoopManager, EventLoopThread
from hybridflow.agent.router import ReplicaUnavailable, Router
from hybridflow.agent.stream import GroupStream, PromptCursor, VersionedServer
from hybridflow.profiling import WorkerProfiler, store_file
from hybridflow.protocol import DataProto

logger = logging.getLogger(__name__)
REPLICA_RESTARTS = 3


class RolloutReplica:
    """A Ray actor holding one async engine replica (vLLM AsyncLLM or SGLang Engine), serving token-in/token-out
    requests."""

    def __init__(self, config: Any, replica_rank: int = 0, peer_gpus: list[str] | None = None) -> None:
        """`peer_gpus`: with tensor parallelism on GPU, the GPUs of the replica's other slots (its seats')."""
        import ray

        from hybridflow.engines.fsdp_engine import import_external_lib
        from hybridflow.rollout.registry import build_server_engine
        from hybridflow.workers.cpu_slots import cpu_threads
        from hybridflow.workers.fsdp_workers import as_config

        cfg = as_config(config)
        arr = cfg.actor_rollout_ref
        import_external_lib(arr.model.external_lib)
        ro = arr.rollout
        self.rank = replica_rank
        split_cpu = cfg.trainer.device != "cuda" and cfg.trainer.placement == "split"
        if peer_gpus:
            # the engine's worker processes (one per rank) see this slot's GPU, then the seats' ones, in order
            own = [str(g) for g in ray.get_gpu_ids()]
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(own + list(peer_gpus))
        # rollout.profiler (server mode: vLLM's torch profiler in the chosen replicas, traces in a folder of its own)
        self.profiler = WorkerProfiler(cfg, ("rollout",), replica_rank, f"rollout_replica{replica_rank}")
        chosen = self.profiler.active and self.profiler.tool == "torch"  # not torch_memory's default rank 0
        self.profile_dir = tempfile.mkdtemp(prefix="hybridflow-replica-profile-") if chosen else None
        self.profile_label: str | None = None
        self.engine = build_server_engine(
            cfg,
            # split placement on CPU: the replica's threads on its own slots' cores, the trainer's on the others
            cpu_cores=cpu_threads(cfg) * ro.tensor_model_parallel_size if split_cpu else None,
            profile_dir=self.profile_dir,
            profile_contents=self.profiler.contents,
        )
        self.weights_version = -1

    async def start_profile(self, label: str) -> None:
        """Start the engine's profiler for a profiled step (`label`: global_step_N), if this replica is chosen."""
        if self.profile_dir is None:
            return
        self.profile_label = label
        await self.engine.start_profile()

    async def stop_profile(self) -> list[str]:
        """Stop it and copy the engine's traces beside the checkpoints: <root>/<label>/rollout_replica<R>/<file>
        (one per engine process: vLLM's front end, engine core, workers)."""
        if self.profile_dir is None or self.profile_label is None:
            return []
        await self.engine.stop_profile()
        written = []
        for folder, _, names in sorted(os.walk(self.profile_dir)):
            for name in sorted(names):
                local = os.path.join(folder, name)
                relative = os.path.relpath(local, self.profile_dir)
                written.append(store_file(local, self.profiler.root, self.profile_label,
                                          f"{self.profiler.name}/{relative}"))
                os.remove(local)
        self.profile_label = None
        return written

    def shutdown(self) -> None:
        """Stop the engine and remove the profiler's scratch folder (its traces were copied out step by step)."""
        try:
            self.engine.shutdown()
        finally:
            if self.profile_dir is not None:
                shutil.rmtree(self.profile_dir, ignore_errors=True)

    async def ready(self) -> dict[str, Any]:
        """The replica's process id and weight version (a restarted replica reports -1)."""
        return {"pid": os.getpid(), "rank": self.rank, "weights_version": self.weights_version}

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       multi_modal_data: dict[str, Any] | None = None) -> TokenOutput:
        """One generation (see `AsyncVLLMEngine.generate` / `AsyncSGLangEngine.generate`)."""
        return await self.engine.generate(prompt_ids, sampling_params, request_id, multi_modal_data)

    async def abort(self, request_id: str) -> None:
        """Cancel a request in flight."""
        await self.engine.abort(request_id)

    async def load_weights(self, state_dict: dict[str, Any], version: int) -> int:
        """Take the trainer's full weights (resolved from the object store by Ray) in place."""
        await self.engine.wake_up()
        await self.engine.load_weights(state_dict.items())
        self.weights_version = version
        return version

    async def sleep(self) -> None:
        """Free device memory while training (GPU sleep mode; no-op on CPU)."""
        await self.engine.sleep()

    async def wake_up(self) -> None:
        """Take device memory back before serving (no-op on CPU)."""
        await self.engine.wake_up()


class ReplicaSeat:
    """Holds a tensor-parallel replica's share of one of its slots beyond the first, and names the slot's GPUs."""

    def gpus(self) -> list[str]:
        """The GPU ids Ray gave this slot (none on CPU)."""
        import ray

        return [str(g) for g in ray.get_gpu_ids()]


class RayReplicaClient:
    """`AsyncServerClient` over one replica actor; a dead actor becomes `ReplicaUnavailable`."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       multi_modal_data: dict[str, Any] | None = None) -> TokenOutput:
        """Forward to the actor; Ray's actor-death errors become `ReplicaUnavailable` for the router."""
        import ray.exceptions as rex

        try:
            return await self.handle.generate.remote(prompt_ids, sampling_params, request_id, multi_modal_data)
        except (rex.RayActorError, rex.ActorUnavailableError) as err:
            raise ReplicaUnavailable(str(err)) from err

    async def abort(self, *, request_id: str) -> None:
        """Cancel a request on the replica (its `generate` returns what it had, finish_reason abort)."""
        import ray.exceptions as rex

        try:
            await self.handle.abort.remote(request_id)
        except (rex.RayActorError, rex.ActorUnavailableError) as err:
            raise ReplicaUnavailable(str(err)) from err


def replica_count(config: Any, world_size: int) -> int:
    """`rollout.replicas`, else one per tensor-parallel group of the pool's slots, slots // tp (verl's sizing);
    on CPU one, since a vLLM-CPU engine binds its threads to every core (its tp ranks to disjoint lists of
    them) and a second would only contend for them."""
    ro = config.actor_rollout_ref.rollout
    if ro.replicas:
        return int(ro.replicas)
    if config.trainer.device != "cuda":
        return 1
    return max(1, world_size // ro.tensor_model_parallel_size)


def replica_slots(rank: int, tp: int, world_size: int) -> list[int]:
    """The pool slots (global ranks, node by node) replica `rank` spans: tp consecutive ones.

    Each slot holds one replica share (the pool's max_colocate_count counts one for the rollout), so replicas
    never share slots: one more would wait for Ray forever.
    """
    if tp < 1 or world_size % tp:
        raise ValueError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} does not divide the rollout pool's "
            f"{world_size} slots, so a replica would not fit; use a tensor_model_parallel_size that divides "
            "trainer.n_gpus_per_node"
        )
    if (rank + 1) * tp > world_size:
        raise ValueError(
            f"rollout replica {rank} would need slots {rank * tp}..{(rank + 1) * tp - 1} of a rollout pool of "
            f"{world_size} (tensor_model_parallel_size={tp} slots each); set actor_rollout_ref.rollout.replicas "
            f"to at most {world_size // tp}, or leave it null"
        )
    return list(range(rank * tp, (rank + 1) * tp))


class RolloutService:
    """Replicas + router + agent-loop manager for `rollout.mode=async` (see the module docstring)."""

    def __init__(self, config: Any, tokenizer: Any, resource_pool: Any, events: EventLoopThread | None = None) -> None:
        """`events`: the event loop to run the router on (one already serving an endpoint in front of it)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.config = config
        remote = ray.remote(max_restarts=REPLICA_RESTARTS, max_task_retries=0)(RolloutReplica)
        seat = ray.remote(ReplicaSeat)
        slots = resource_pool.slots()
        tp = config.actor_rollout_ref.rollout.tensor_model_parallel_size
        count = replica_count(config, resource_pool.world_size)

        def options(index: int) -> dict[str, Any]:
            pg, bundle, _ = slots[index]
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle)
            return {**resource_pool.actor_resources(), "scheduling_strategy": strategy}

        self.replicas, self.seats = [], []
        for rank in range(count):
            first, *others = replica_slots(rank, tp, len(slots))
            if any(slots[i][0] is not slots[first][0] for i in others):
                raise ValueError(
                    f"rollout replica {rank} would span slots {[first, *others]} on different nodes: "
                    f"{verl_features.ROLLOUT_TP_NODES.message}"
                )
            seats = [seat.options(**options(i)).remote() for i in others]
            peer_gpus = [gpu for ids in ray.get([s.gpus.remote() for s in seats]) for gpu in ids]
            self.seats.extend(seats)
            self.replicas.append(remote.options(**options(first)).remote(config, rank, peer_gpus or None))
        ray.get([r.ready.remote() for r in self.replicas])
        self.events = events or EventLoopThread()
        self.router = self.events.run(self._make_router())
        self.asynchronous = config.async_training.enabled
        # Asynchronous training: the loops talk to the replicas through a server that stamps every token
        # with its weight version and can pause generations for a weight push (`hybridflow.agent.stream`).
        self.server = VersionedServer(self.router) if self.asynchronous else None
        self.manager = AgentLoopManager(config, tokenizer, self.server or self.router, events=self.events)
        self.stream: GroupStream | None = None
        self.version = 0
        self.generating = False
        self._weights: Any = None  # object ref of the latest full state dict, for replicas that rejoin

    async def _make_router(self) -> Router:
        return Router([RayReplicaClient(r) for r in self.replicas], on_failure=self._rejoin)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Trajectories for every row (see `AgentLoopManager.generate_sequences`); on GPU the replicas sleep
        (vLLM sleep mode, weights and KV cache released) while the trainer has the devices. In asynchronous
        training the replicas own their devices and keep serving the stream (validation runs beside it, on
        the weights last pushed)."""
        if self.asynchronous:
            if self.stream is not None:
                self.events.run(self.stream.wait_synced())
            return self.manager.generate_sequences(prompts)
        self._broadcast("wake_up")
        self.generating = True
        try:
            return self.manager.generate_sequences(prompts)
        finally:
            self.generating = False
            self._broadcast("sleep")

    def update_weights(self, actor_group: Any, version: int | None = None) -> None:
        """Gather the actor's full weights (a collective on all ranks) and load them into every replica, as
        `version` (default: the next one)."""
        import ray

        self.events.run(self.router.wait_recovered())
        refs = [w.full_state_dict_rank0.remote() for w in actor_group.workers]
        self.version = self.version + 1 if version is None else version
        self._weights = refs[0]
        self._broadcast("load_weights", refs[0], self.version)
        ray.get(refs[1:])

    # -- asynchronous training -------------------------------------------------------------------------
    def start_stream(self, loader: Any, version: int, state: tuple[dict[str, Any], list[DataProto]] | None) -> None:
        """Start producing groups from `loader`'s prompts with the weights of `version` already loaded, or
        continue a checkpoint's stream (`state`: its snapshot)."""
        cfg = self.config
        at = cfg.async_training
        self.server.version = version
        self.stream = GroupStream(
            self.manager, self.server, PromptCursor(loader),
            groups_per_step=cfg.data.train_batch_size, n=cfg.actor_rollout_ref.rollout.n,
            staleness_threshold=at.effective_staleness_threshold, sync_every=at.trigger_parameter_sync_step,
            max_staleness=at.effective_max_staleness, partial_rollout=at.partial_rollout,
            one_batch_at_a_time=at.mode == "one_step_off", meta_info={"do_sample": True},
        )
        if state is not None:
            self.stream.restore(*state)
        self.events.run(self._start())

    async def _start(self) -> None:
        assert self.stream is not None
        self.stream.start()

    def take(self, groups: int, trainer_version: int) -> tuple[DataProto, dict[str, float]]:
        """The next training batch from the stream (see `GroupStream.take`)."""
        assert self.stream is not None, "start_stream first"
        return self.events.run(self.stream.take(groups, trainer_version))

    def publish_weights(self, actor_group: Any, version: int) -> None:
        """Gather the actor's weights now; the stream loads them into every replica at its next sync point
        while the trainer goes on."""
        import ray

        assert self.stream is not None, "start_stream first"
        refs = [w.full_state_dict_rank0.remote() for w in actor_group.workers]
        ray.get(refs[1:])
        self._weights, self.version = refs[0], version
        self.events.run(self.stream.publish(lambda: self._load_all(refs[0], version), version))

    async def _load_all(self, weights: Any, version: int) -> None:
        """Load `weights` into every live replica; a dead one is handed to the router's recovery."""
        await self.router.wait_recovered()
        results = await asyncio.gather(*(r.load_weights.remote(weights, version) for r in self.replicas),
                                       return_exceptions=True)
        for index, result in enumerate(results):
            if isinstance(result, BaseException):
                logger.warning("rollout replica %d is down during a weight push (%s); it rejoins with the "
                               "current weights once Ray restarts it", index, type(result).__name__)
                self.router.mark_failed(index)

    def snapshot(self) -> tuple[dict[str, Any], list[DataProto]]:
        """The stream's state for a checkpoint (it pauses until `release`)."""
        assert self.stream is not None
        return self.events.run(self.stream.snapshot())

    def release(self) -> None:
        """Let the stream produce again after a checkpoint."""
        if self.stream is not None:
            self.events.run(self.stream.release())

    def start_profile(self, label: str) -> None:
        """The step profiler's group interface: the chosen replicas start vLLM's profiler (`label`: the step)."""
        self._broadcast("start_profile", label)

    def stop_profile(self) -> list[list[str]]:
        """Stop it; each replica's trace files, as a worker group returns them (none from a replica that died in
        the window: its traces went with it)."""
        import ray
        import ray.exceptions as rex

        written = []
        for index, ref in enumerate([r.stop_profile.remote() for r in self.replicas]):
            try:
                written.append(ray.get(ref))
            except (rex.RayActorError, rex.ActorUnavailableError) as err:
                logger.warning("rollout replica %d is down: its profile of this step is lost (%s)", index,
                               type(err).__name__)
        return written

    def _broadcast(self, method: str, *args: Any) -> None:
        """Call `method` on every replica; one that is dead or restarting is handed to the router, whose
        recovery (`_rejoin`) brings it back with the current weights."""
        import ray
        import ray.exceptions as rex

        refs = [getattr(r, method).remote(*args) for r in self.replicas]
        failed = []
        for index, ref in enumerate(refs):
            try:
                ray.get(ref)
            except (rex.RayActorError, rex.ActorUnavailableError) as err:
                logger.warning("rollout replica %d is down during %s (%s); it rejoins once Ray restarts it",
                               index, method, type(err).__name__)
                failed.append(index)
        if failed:
            self.events.run(self._mark_failed(failed))

    async def _mark_failed(self, indices: list[int]) -> None:
        for index in indices:
            self.router.mark_failed(index)

    async def _rejoin(self, index: int) -> None:
        """A replica failed: wait for Ray to restart it, push the current weights, then serve again."""
        replica = self.replicas[index]
        for _ in range(600):
            try:
                await replica.ready.remote()
                break
            except Exception:  # noqa: BLE001 - still restarting
                await asyncio.sleep(0.5)
        else:
            raise RuntimeError(f"rollout replica {index} did not come back after a failure; see its log")
        if self._weights is not None:
            await replica.load_weights.remote(self._weights, self.version)
        if not self.generating and not self.asynchronous:  # it came back while the trainer has the devices
            await replica.sleep.remote()
        logger.warning("rollout replica %d restarted and resynced to weight version %d", index, self.version)

    def shutdown(self) -> None:
        """Stop the replicas (their engines, then their actors) and the event loop."""
        import ray

        if self.stream is not None:
            self.events.run(self.stream.close())
        self.events.run(self.router.close())
        try:  # a clean stop first: a replica that is dead or stuck is killed below all the same
            ray.get([replica.shutdown.remote() for replica in self.replicas], timeout=30)
        except Exception as err:  # noqa: BLE001
            logger.warning("stopping the rollout replicas cleanly failed (%s); killing them", err)
        for replica in self.replicas:
            ray.kill(replica, no_restart=True)
        for seat in self.seats:
            ray.kill(seat)
        self.manager.close()  # the OpenAI endpoint, then the event loop the manager shares
