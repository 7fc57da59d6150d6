"""Over-sampling (verl's `rollout.over_sample_rate`): cut a batch's slowest trajectories once enough are complete.

verl's RolloutConfig: "abort remaining requests when (1 - over_sample_rate) * total_requests are completed" (its
SGLang multi-turn rollout, verl PR 2929): a few long trajectories (many tool turns, long answers) hold a whole
batch back. Here, in server mode:

- `CutOffGate` sits between the agent loops (and the OpenAI endpoint) and the router: it knows the engine
  requests in flight, and `cut()` aborts them (the engine returns what it had, finish_reason abort) and answers
  every later request of the batch at once with an empty aborted generation, so a loop between turns (in a tool
  call, an interaction) ends at its next request;
- `finish_or_cut` waits for `keep` trajectories, cuts, gives the others `CUT_GRACE_S` to return what they have,
  then cancels the stragglers (a hung tool): those come back empty;
- `mark_cut` makes a cut trajectory train on nothing: response_mask 0 everywhere (its tokens stay, for
  inspection), counted in `aborted` and `over_sample_cut`.

What a cut row means downstream (documented in RolloutConfig.over_sample_rate): with no unmasked token it gets no
reward (the reward is placed on the last unmasked token) and no loss (every aggregation skips masked tokens), and
the trainer leaves it out of its group's advantage baseline (`trainer.batch_ops.advantage_groups`).
Ray-free.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from typing import Any

from hybridflow.agent.base import AgentLoopOutput, TokenOutput, with_images

logger = logging.getLogger(__name__)

#: How long cut trajectories get to return the tokens they have before their tasks are cancelled.
CUT_GRACE_S = 5.0
#: Non-tensor key of a packed batch: True on the rows over-sampling cut (present on every cut-capable batch).
CUT_KEY = "over_sample_cut"


def trajectories_to_keep(total: int, over_sample_rate: float) -> int:
    """(1 - rate) x total, rounded down as verl does, but at least 1: a batch is never cut before anything finished."""
    return max(1, math.floor(total * (1.0 - over_sample_rate)))


class CutOffGate:
    """An `AsyncServerClient` in front of the router that can cut every request of the current batch short."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.closed = False
        self._inflight: dict[str, int] = {}

    @property
    def failovers(self) -> int:
        """The router's failover count (the manager reports it per step)."""
        return int(getattr(self.server, "failovers", 0))

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       multi_modal_data: dict[str, Any] | None = None) -> TokenOutput:
        """The router's generation, or at once an empty aborted one after `cut()`."""
        if self.closed:
            return TokenOutput([], None, "abort")
        self._inflight[request_id] = self._inflight.get(request_id, 0) + 1
        try:
            return await self.server.generate(request_id=request_id, prompt_ids=prompt_ids,
                                              sampling_params=sampling_params, **with_images(multi_modal_data))
        finally:
            left = self._inflight.pop(request_id) - 1
            if left > 0:
                self._inflight[request_id] = left

    async def abort(self, *, request_id: str) -> None:
        """Pass an abort on to the router (when it can abort)."""
        if hasattr(self.server, "abort"):
            await self.server.abort(request_id=request_id)

    async def cut(self) -> None:
        """Refuse new requests and abort those in flight (their generations return what they have)."""
        self.closed = True
        ids = list(self._inflight)
        await asyncio.gather(*(self.abort(request_id=rid) for rid in ids), return_exceptions=True)

    def reopen(self) -> None:
        """Serve again (the next batch)."""
        self.closed = False


async def finish_or_cut(tasks: Sequence[asyncio.Task[AgentLoopOutput]], keep: int, gate: CutOffGate,
                        grace_s: float = CUT_GRACE_S) -> list[bool]:
    """Wait until `keep` of the trajectory tasks are done, then cut the others (see the module docstring).

    Returns, per task, whether it was cut. A loop's error is raised as soon as its task ends (as `gather` would).
    """
    pending: set[asyncio.Task[AgentLoopOutput]] = set(tasks)
    finished = 0
    while pending and finished < keep:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
        finished += len(done)
    cut = [task in pending for task in tasks]
    if pending:
        await gate.cut()
        _, late = await asyncio.wait(pending, timeout=grace_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    return cut


def cut_output(task: asyncio.Task[AgentLoopOutput]) -> AgentLoopOutput | None:
    """What a cut trajectory's task returned: None when it was cancelled, or failed once cut (a loop that does not
    expect an aborted generation; logged, the trajectory is dropped from training anyway)."""
    if task.cancelled():
        return None
    error = task.exception()
    if error is not None:
        logger.warning("a trajectory cut by rollout.over_sample_rate failed after its cut (%s: %s); it is kept empty",
                       type(error).__name__, error)
        return None
    return task.result()


def mark_cut(out: AgentLoopOutput | None, prompt_ids: list[int]) -> AgentLoopOutput:
    """A cut trajectory: its tokens (none when its task was cancelled) with response_mask 0 everywhere, counted."""
    if out is None:
        out = AgentLoopOutput(prompt_ids=list(prompt_ids), response_ids=[], response_mask=[], response_logprobs=[],
                              num_turns=1)
    out.response_mask = [0] * len(out.response_ids)
    out.metrics = {**out.metrics, "aborted": 1.0, CUT_KEY: 1.0}
    out.extra_fields[CUT_KEY] = True
    return out
