"""The router in front of the rollout replicas: least outstanding requests, sticky multi-turn sessions.

A trajectory's turns share a `request_id`; its first turn picks the replica with the fewest requests in
flight and later turns go to the same one, so its prefix cache holds the conversation so far. A replica
that fails (`ReplicaUnavailable`) is taken out of rotation, its request is retried on another, and the
`on_failure` hook (the manager's: wait for the restart, push the current weights) brings it back.
Ray-free: a replica is anything with an async `generate` (a Ray actor client in a run, a fake in tests).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from hybridflow.agent.base import AsyncServerClient, TokenOutput, with_images

logger = logging.getLogger(__name__)
MAX_SESSIONS = 100_000


class ReplicaUnavailable(RuntimeError):
    """A replica died or cannot be reached; its requests should go elsewhere."""


class NoReplicaAvailable(RuntimeError):
    """Every replica is down."""


class Router:
    """Spread `generate` calls over replicas (see the module docstring)."""

    def __init__(self, replicas: Sequence[AsyncServerClient],
                 on_failure: Callable[[int], Awaitable[None]] | None = None) -> None:
        if not replicas:
            raise ValueError("a router needs at least one rollout replica")
        self.replicas = list(replicas)
        self.outstanding = [0] * len(self.replicas)
        self.alive = [True] * len(self.replicas)
        self.requests_served = [0] * len(self.replicas)
        self.failovers = 0  # requests retried elsewhere because their replica failed
        self.sessions: OrderedDict[str, int] = OrderedDict()
        self.on_failure = on_failure
        self._recoveries: dict[int, asyncio.Task[None]] = {}

    def pick(self, request_id: str) -> int:
        """The replica for this request: its session's, else the least loaded live one."""
        index = self.sessions.get(request_id)
        if index is not None and self.alive[index]:
            self.sessions.move_to_end(request_id)
            return index
        live = [i for i, ok in enumerate(self.alive) if ok]
        if not live:
            raise NoReplicaAvailable("every rollout replica is down")
        index = min(live, key=lambda i: (self.outstanding[i], self.requests_served[i]))
        self.sessions[request_id] = index
        if len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        return index

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       multi_modal_data: dict[str, Any] | None = None) -> TokenOutput:
        """Generate on the session's replica; on a replica failure retry on the others (then wait for one)."""
        for _ in range(4 * len(self.replicas)):
            try:
                index = self.pick(request_id)
            except NoReplicaAvailable:
                await self._wait_for_recovery()
                continue
            self.outstanding[index] += 1
            try:
                out = await self.replicas[index].generate(
                    request_id=request_id, prompt_ids=prompt_ids, sampling_params=sampling_params,
                    **with_images(multi_modal_data),
                )
            except ReplicaUnavailable:
                self.failovers += 1
                self.mark_failed(index)
                continue
            finally:
                self.outstanding[index] -= 1
            self.requests_served[index] += 1
            return out
        raise NoReplicaAvailable(
            f"request {request_id} failed on every rollout replica {4 * len(self.replicas)} times; see the replicas' logs"
        )

    async def abort(self, *, request_id: str) -> None:
        """Cancel a request in flight on its session's replica (partial rollout pauses generations this way)."""
        index = self.sessions.get(request_id)
        if index is not None and self.alive[index] and hasattr(self.replicas[index], "abort"):
            try:
                await self.replicas[index].abort(request_id=request_id)
            except ReplicaUnavailable:
                self.mark_failed(index)

    def mark_failed(self, index: int) -> None:
        """Take a replica out of rotation and start its recovery (once)."""
        if not self.alive[index]:
            return
        self.alive[index] = False
        for rid in [rid for rid, i in self.sessions.items() if i == index]:
            del self.sessions[rid]
        if self.on_failure is not None and index not in self._recoveries:
            self._recoveries[index] = asyncio.ensure_future(self._recover(index))

    async def _recover(self, index: int) -> None:
        try:
            assert self.on_failure is not None
            await self.on_failure(index)
            self.alive[index] = True
        except Exception:  # noqa: BLE001 - the replica stays out; the others keep serving
            logger.exception("rollout replica %d could not be recovered; continuing with the others", index)
        finally:
            self._recoveries.pop(index, None)

    async def _wait_for_recovery(self) -> None:
        if not self._recoveries:
            raise NoReplicaAvailable("every rollout replica is down and none is being restarted")
        await asyncio.wait(list(self._recoveries.values()), return_when=asyncio.FIRST_COMPLETED)

    async def wait_recovered(self) -> None:
        """Wait until no recovery is in progress (the trainer calls it before pushing new weights)."""
        while self._recoveries:
            await asyncio.gather(*self._recoveries.values(), return_exceptions=True)

    async def close(self) -> None:
        """Stop recoveries in progress (the service is shutting down)."""
        tasks = list(self._recoveries.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
