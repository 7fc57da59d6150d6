"""Streaming rollout for asynchronous training: whole groups into a bounded queue, every token stamped with the
policy version that generated it.

    VersionedServer(router)          # between the agent loops and the router: knows the weight version, can
                                     # pause new requests, drain or abort (partial rollout) those in flight
    GroupStream(manager, server, cursor, ...)
      .start()                       # a producer task on the manager's event loop: prompts -> n agent loops ->
                                     # one packed group -> the queue, while the trainer trains
      .take(groups, trainer_version) # the oldest complete groups (a batch); blocks until there are enough
      .publish(load, version)        # new weights: applied at a batch boundary (one-step-off), after the
                                     # requests in flight finish, or by pausing them (partial rollout)
      .snapshot() / .release()       # for a checkpoint: quiesce, return everything needed to resume exactly

Admission (verl's freshness control): between two weight syncs at most (1 + staleness_threshold) x
sync_every x groups_per_step groups are started; with staleness 1 and one batch generating at a time this
is one-step-off (batch k is generated with the weights of step k-2 while step k-1 trains). A group is handed
over only complete (GRPO and RLOO normalise within it); one whose oldest token is more than `max_staleness`
versions behind the trainer is dropped and its prompt generated again. Ray-free.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hybridflow.agent.base import TokenOutput, with_images
from hybridflow.protocol import DataProto

logger = logging.getLogger(__name__)

#: The versions of the model tokens the current trajectory has generated so far (set per trajectory task).
TOKEN_VERSIONS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("token_versions", default=None)


class VersionedServer:
    """An `AsyncServerClient` that stamps generated tokens with the weight version and can be paused.

    A request aborted by `pause(abort=True)` (partial rollout) is continued after `resume` with the new
    weights: the tokens so far are appended to the prompt and the budget shrinks, so the agent loop sees one
    generation whose tokens carry two versions.
    """

    def __init__(self, server: Any, version: int = 0) -> None:
        self.server = server
        self.version = version
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._inflight: dict[str, int] = {}
        self._interrupted: set[str] = set()
        self.resumed_requests = 0  # partial-rollout continuations

    @property
    def failovers(self) -> int:
        """The router's failover count (the manager reports it per step)."""
        return int(getattr(self.server, "failovers", 0))

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       multi_modal_data: dict[str, Any] | None = None) -> TokenOutput:
        """Generate, waiting while paused; continue across a partial-rollout pause (see the class docstring)."""
        budget = int(sampling_params.get("max_tokens", 1))
        tokens: list[int] = []
        logprobs: list[float] | None = []
        versions: list[int] = []
        cached = None
        while True:
            await self._open.wait()
            version = self.version
            params = dict(sampling_params, max_tokens=budget - len(tokens))
            self._enter(request_id)
            try:
                out = await self.server.generate(request_id=request_id, prompt_ids=list(prompt_ids) + tokens,
                                                 sampling_params=params, **with_images(multi_modal_data))
            finally:
                interrupted = request_id in self._interrupted
                self._leave(request_id)
            tokens += out.token_ids
            versions += [version] * len(out.token_ids)
            logprobs = logprobs + list(out.log_probs) if (logprobs is not None and out.log_probs is not None) else None
            cached = out.cached_tokens if cached is None else cached
            if out.finish_reason == "abort" and interrupted and len(tokens) < budget:
                self.resumed_requests += 1
                continue
            reason = "length" if out.finish_reason == "abort" and interrupted else out.finish_reason
            break
        record = TOKEN_VERSIONS.get()
        if record is not None:
            record.extend(versions)
        return TokenOutput(tokens, logprobs, reason, cached)

    def _enter(self, request_id: str) -> None:
        self._inflight[request_id] = self._inflight.get(request_id, 0) + 1
        self._idle.clear()

    def _leave(self, request_id: str) -> None:
        left = self._inflight.get(request_id, 1) - 1
        if left <= 0:
            self._inflight.pop(request_id, None)
            self._interrupted.discard(request_id)
        else:
            self._inflight[request_id] = left
        if not self._inflight:
            self._idle.set()

    async def pause(self, abort: bool) -> None:
        """Hold new requests, then wait until none is in flight; with `abort`, cut those in flight short
        (they continue after `resume`)."""
        self._open.clear()
        if abort:
            ids = list(self._inflight)
            self._interrupted.update(ids)
            await asyncio.gather(*(self.server.abort(request_id=rid) for rid in ids), return_exceptions=True)
        await self._idle.wait()

    def resume(self, version: int) -> None:
        """Serve again, with the weights of `version`."""
        self.version = version
        self._open.set()


@dataclass
class PromptCursor:
    """The training prompts in the loader's order (same seed and per-epoch permutation), one at a time, with a
    front queue of prompts handed back (dropped stale groups, or the not-yet-trained ones of a checkpoint)."""

    loader: Any
    epoch: int = 0
    offset: int = 0  # prompts of `epoch` already handed out
    front: deque[tuple[int, int]] = field(default_factory=deque)  # (epoch, dataset position)

    def next(self) -> tuple[int, int]:
        """The next prompt as (epoch, dataset position)."""
        if self.front:
            return self.front.popleft()
        order = self.loader.epoch_order(self.epoch)
        usable = len(self.loader) * self.loader.batch_size  # drop_last: the loader's epoch length
        if self.offset >= usable:
            self.epoch, self.offset = self.epoch + 1, 0
            order = self.loader.epoch_order(self.epoch)
        item = (self.epoch, int(order[self.offset]))
        self.offset += 1
        return item

    def sample(self, key: tuple[int, int]) -> DataProto:
        """The one-row prompt batch of a prompt."""
        batch = self.loader.collate_fn([self.loader.dataset[key[1]]])
        batch.non_tensor_batch["prompt_key"] = np.array([f"{key[0]}:{key[1]}"], dtype=object)
        return batch

    def state_dict(self) -> dict[str, Any]:
        """Position plus prompts handed back; with the loader's own checks (same data, seed, batch size)."""
        return {"epoch": self.epoch, "offset": self.offset, "front": [list(k) for k in self.front],
                "loader": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict`; refuses a different dataset, seed or batch size (the loader's check)."""
        loader_state = dict(state["loader"])
        loader_state["position"] = 0
        self.loader.load_state_dict(loader_state)
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self.front = deque((int(e), int(i)) for e, i in state["front"])


@dataclass
class Group:
    """A finished prompt group: its packed rows and the policy versions of its model tokens."""

    key: tuple[int, int]
    batch: DataProto
    min_version: int
    max_version: int
    seq: int  # hand-out order: batches are taken oldest version first, then in the order prompts were handed out

    def lag(self, trainer_version: int) -> int:
        """Policy versions between the oldest token and the trainer."""
        return trainer_version - self.min_version


class GroupStream:
    """The producer and queue of asynchronous training (see the module docstring)."""

    def __init__(self, manager: Any, server: VersionedServer, cursor: PromptCursor, *, groups_per_step: int,
                 n: int, staleness_threshold: float, sync_every: int, max_staleness: int, partial_rollout: bool,
                 one_batch_at_a_time: bool, meta_info: dict[str, Any] | None = None) -> None:
        self.manager = manager
        self.server = server
        self.cursor = cursor
        self.groups_per_step = groups_per_step
        self.n = n
        self.sync_every = sync_every
        self.window = sync_every * groups_per_step  # groups per sync window
        self.budget = int(round((1 + staleness_threshold) * self.window))  # groups that may still start
        self.max_staleness = max_staleness
        self.partial_rollout = partial_rollout
        self.one_batch_at_a_time = one_batch_at_a_time
        self.meta_info = dict(meta_info or {})
        self.queue: list[Group] = []
        self.inflight: dict[tuple[int, int], asyncio.Task[None]] = {}
        self.loaded_version = server.version
        self._handed = 0  # prompts handed out so far (each group's `seq`)
        self._batch_fill = 0  # groups started in the current batch (one-step-off)
        self._allowed_batches = 1  # one-step-off: batches that may start (the first, then one per take)
        self._hold = 0
        self._pending: tuple[Callable[[], Awaitable[None]], int] | None = None
        self._changed = asyncio.Condition()
        self._producer: asyncio.Task[None] | None = None
        self._syncer: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self.counters = {"dropped_stale_groups": 0, "stale_samples_processed": 0, "stale_trajectory_processed": 0}
        self._idle_since: float | None = None
        self.rollout_idle_s = 0.0

    # -- the producer ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start producing (call on the event loop)."""
        self._producer = asyncio.ensure_future(self._produce())

    async def _produce(self) -> None:
        try:
            while True:
                async with self._changed:
                    await self._changed.wait_for(self._may_start)
                    self._mark_busy()
                    key = self.cursor.next()
                    self.budget -= 1
                    self._batch_fill += 1
                    self._handed += 1
                    self.inflight[key] = asyncio.ensure_future(self._run_group(key, self._handed))
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # noqa: BLE001 - surfaced to the trainer by take()
            await self._fail(err)

    def _may_start(self) -> bool:
        """Whether another group may start now (a `wait_for` predicate: also keeps the idle clock)."""
        if self.one_batch_at_a_time:  # one-step-off: a batch may start per take (`_allowed_batches`)
            if self._batch_fill >= self.groups_per_step:
                self._allowed_batches -= 1
                self._batch_fill = 0
            blocked = self._hold or self._allowed_batches <= 0
        else:
            blocked = self._hold or self._pending is not None or self.budget <= 0
        if blocked:
            self._mark_idle()
        return not blocked

    async def _run_group(self, key: tuple[int, int], seq: int) -> None:
        try:
            prompts = self.cursor.sample(key).repeat(self.n, interleave=True)
            prompts.non_tensor_batch["uid"] = np.array([f"{key[0]}:{key[1]}"] * self.n, dtype=object)
            prompts.meta_info.update(self.meta_info)
            batch = await self.manager.generate_sequences_async(prompts)
            versions = batch.batch["rollout_versions"]
            model = versions[versions >= 0]
            low = int(model.min()) if model.numel() else self.server.version
            high = int(model.max()) if model.numel() else self.server.version
            async with self._changed:
                self.queue.append(Group(key, batch, low, high, seq))
                self.inflight.pop(key, None)
                self._changed.notify_all()
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # noqa: BLE001
            await self._fail(err)

    async def _fail(self, err: BaseException) -> None:
        async with self._changed:
            self._error = err
            self._changed.notify_all()

    def _mark_idle(self) -> None:
        if not self.inflight and self._idle_since is None:
            self._idle_since = time.perf_counter()

    def _mark_busy(self) -> None:
        if self._idle_since is not None:
            self.rollout_idle_s += time.perf_counter() - self._idle_since
            self._idle_since = None

    # -- the trainer's side ---------------------------------------------------------------------------
    async def take(self, groups: int, trainer_version: int) -> tuple[DataProto, dict[str, float]]:
        """The `groups` oldest complete groups within the staleness bound, as one batch, and the step's metrics."""
        started = time.perf_counter()
        async with self._changed:
            while True:
                await self._changed.wait_for(lambda: self._error is not None or len(self.queue) >= groups)
                self._raise_error()
                self.queue.sort(key=lambda g: (g.min_version, g.seq))
                stale = [g for g in self.queue if g.lag(trainer_version) > self.max_staleness]
                for group in stale:  # generate these prompts again, first
                    self.queue.remove(group)
                    self.cursor.front.appendleft(group.key)
                    self.budget += 1
                    self.counters["dropped_stale_groups"] += 1
                if stale:
                    self._changed.notify_all()
                    continue
                chosen, self.queue = self.queue[:groups], self.queue[groups:]
                break
        if self.one_batch_at_a_time:  # the take is the sync point: latest weights in, the next batch starts
            await self._apply_pending()
            async with self._changed:
                self._allowed_batches += 1
                self._changed.notify_all()
        else:
            async with self._changed:
                self._changed.notify_all()
        waited = time.perf_counter() - started
        batch = DataProto.concat([g.batch for g in chosen])
        return batch, self._metrics(chosen, batch, trainer_version, waited)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the rollout stream failed: {self._error}") from self._error

    def _metrics(self, chosen: list[Group], batch: DataProto, version: int, waited: float) -> dict[str, float]:
        """verl's fully_async/* names, plus queue depth and the rollout's idle time."""
        lags = [g.lag(version) for g in chosen]
        versions = batch.batch["rollout_versions"]
        mask = batch.batch["response_mask"].bool() & (versions >= 0)
        token_lag = (version - versions)[mask].float()
        stale = [g for g in chosen if g.lag(version) > 0]
        self.counters["stale_samples_processed"] += len(stale)
        self.counters["stale_trajectory_processed"] += len(stale) * self.n
        partial = [g for g in chosen if g.max_version != g.min_version]
        idle = self.rollout_idle_s + (time.perf_counter() - self._idle_since if self._idle_since else 0.0)
        self.rollout_idle_s, self._idle_since = 0.0, (time.perf_counter() if self._idle_since else None)
        return {
            "fully_async/policy_version": float(version),
            "fully_async/trajectory_staleness/mean": float(token_lag.mean()) if token_lag.numel() else 0.0,
            "fully_async/trajectory_staleness/max": float(max(lags)) if lags else 0.0,
            "fully_async/count/stale_samples_processed": float(self.counters["stale_samples_processed"]),
            "fully_async/count/stale_trajectory_processed": float(self.counters["stale_trajectory_processed"]),
            "fully_async/count/dropped_stale_groups": float(self.counters["dropped_stale_groups"]),
            "fully_async/partial/total_partial_num": float(len(partial)),
            "fully_async/partial/partial_ratio": len(partial) / max(len(chosen), 1),
            "fully_async/partial/max_partial_span": float(max((g.max_version - g.min_version for g in chosen),
                                                              default=0)),
            "fully_async/queue_depth": float(len(self.queue)),
            "fully_async/inflight_groups": float(len(self.inflight)),
            "timing_s/trainer_idle": waited,
            "timing_s/rollouter_idle": idle,
        }

    async def publish(self, load: Callable[[], Awaitable[None]], version: int) -> None:
        """New weights of `version`: `load()` puts them on the replicas once the stream reaches a sync point
        (one-step-off: the next take; fully async: now, after the requests in flight finish or pause)."""
        async with self._changed:
            self._pending = (load, version)
            if not self.one_batch_at_a_time and (self._syncer is None or self._syncer.done()):
                self._syncer = asyncio.ensure_future(self._sync())

    async def _apply_pending(self) -> None:
        """One-step-off: load the last published weights (nothing is in flight at a take)."""
        if self._pending is None:
            return
        load, version = self._pending
        await self.server.pause(abort=False)
        try:
            await load()
        finally:
            self.server.resume(version)
        self._pending = None
        self.loaded_version = version

    async def _sync(self) -> None:
        try:
            while True:
                async with self._changed:
                    if self._pending is None:
                        return
                    load, version = self._pending
                await self.server.pause(abort=self.partial_rollout)
                await load()
                self.server.resume(version)
                async with self._changed:
                    if self._pending is not None and self._pending[1] == version:
                        self._pending = None
                    if version > self.loaded_version:  # one window of groups per sync the trainer made
                        self.budget += self.window * max(1, (version - self.loaded_version) // self.sync_every)
                        self.loaded_version = version
                    self._changed.notify_all()
        except BaseException as err:  # noqa: BLE001
            self.server.resume(self.server.version)
            await self._fail(err)

    async def wait_synced(self) -> None:
        """Until the last published weights are on the replicas, so validation reads the trainer's policy.
        One-step-off loads them once the batch in flight is done (the next batch gets them either way)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._error is not None or (
                not self.inflight if self.one_batch_at_a_time else self._pending is None))
            self._raise_error()
        if self.one_batch_at_a_time:
            await self._apply_pending()

    # -- checkpoints ----------------------------------------------------------------------------------
    async def snapshot(self) -> tuple[dict[str, Any], list[DataProto]]:
        """Quiesce (no new group, every group in flight finished, published weights loaded) and return the
        state to resume from plus the finished groups' batches; call `release()` after saving."""
        async with self._changed:
            self._hold += 1
            await self._changed.wait_for(lambda: self._error is not None or (
                not self.inflight and (self._pending is None or self.one_batch_at_a_time)))
            self._raise_error()
            groups = sorted(self.queue, key=lambda g: g.seq)
            state = {
                "cursor": self.cursor.state_dict(),
                "budget": self.budget,
                "allowed_batches": self._allowed_batches,
                "batch_fill": self._batch_fill,
                "counters": dict(self.counters),
                "handed": self._handed,
                "queue": [{"key": list(g.key), "min_version": g.min_version, "max_version": g.max_version,
                           "seq": g.seq} for g in groups],
            }
            return state, [g.batch for g in groups]

    async def release(self) -> None:
        """Produce again after `snapshot`."""
        async with self._changed:
            self._hold = max(0, self._hold - 1)
            self._changed.notify_all()

    def restore(self, state: dict[str, Any], batches: list[DataProto]) -> None:
        """Continue from a `snapshot` (before `start`): the same position, budget, queue and counters."""
        self.cursor.load_state_dict(state["cursor"])
        self.budget = int(state["budget"])
        self._allowed_batches, self._batch_fill = int(state["allowed_batches"]), int(state["batch_fill"])
        self.counters.update({k: int(v) for k, v in state["counters"].items()})
        if len(batches) != len(state["queue"]):
            raise ValueError(f"the checkpoint's rollout queue holds {len(batches)} groups but its state lists "
                             f"{len(state['queue'])}; the step folder is damaged, resume from an earlier one")
        self._handed = int(state["handed"])
        for entry, batch in zip(state["queue"], batches, strict=True):
            self.queue.append(Group((int(entry["key"][0]), int(entry["key"][1])), batch, int(entry["min_version"]),
                                    int(entry["max_version"]), int(entry["seq"])))

    @property
    def epoch(self) -> int:
        """The epoch of the prompts being handed out."""
        return self.cursor.epoch

    async def close(self) -> None:
        """Stop producing and cut the generations in flight short."""
        for task in (self._producer, self._syncer):
            if task is not None:
                task.cancel()
        if self.inflight:  # a replica that no longer answers must not keep the run from ending
            try:
                await asyncio.wait_for(self.server.pause(abort=True), timeout=60)
            except asyncio.TimeoutError:
                logger.warning("rollout requests still in flight 60 s after an abort; shutting down anyway")
        tasks = [*self.inflight.values(), *(t for t in (self._producer, self._syncer) if t is not None)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.server.resume(self.server.version)


def versions_tensor(outputs_versions: list[list[int]], response_mask: torch.Tensor) -> torch.Tensor:
    """(b, R) policy version of every model token (-1 elsewhere): the recorded versions in generation order on
    the positions where `response_mask` is 1; when a loop's tokens do not line up (truncation, a custom loop),
    its oldest version on all of them."""
    out = torch.full(response_mask.shape, -1, dtype=torch.long)
    for i, versions in enumerate(outputs_versions):
        positions = response_mask[i].nonzero().flatten()
        if not versions or not positions.numel():
            continue
        if len(versions) == positions.numel():
            out[i, positions] = torch.tensor(versions)
        else:
            out[i, positions] = min(versions)
    return out
