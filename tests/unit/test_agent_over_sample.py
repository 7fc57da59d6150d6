"""rollout.over_sample_rate: once (1 - rate) x the batch's trajectories are complete, the rest are cut.

Against a fake server whose requests emit one token per tick and can be aborted (as vLLM's AsyncLLM): the slow
trajectory's engine request is aborted, it comes back with the tokens it had and response_mask 0, the batch keeps
its shapes, the metrics count it, and the advantage estimator leaves it out of its group.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest
import torch

from hybridflow.agent.base import AgentLoopOutput, TokenOutput
from hybridflow.agent.manager import AgentLoopManager
from hybridflow.agent.over_sample import (
    CUT_KEY,
    CutOffGate,
    cut_output,
    finish_or_cut,
    mark_cut,
    trajectories_to_keep,
)
from hybridflow.config import ConfigError, load_config
from hybridflow.data.dataset import collate_fn
from hybridflow.data.toy import build_toy_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.trainer.batch_ops import advantage_groups, compute_advantage

TOK = build_toy_tokenizer()
R = 8  # response length


def config(*overrides: str) -> Any:
    return load_config(None, [
        "actor_rollout_ref.model.path=/m", "data.train_files=/d", "actor_rollout_ref.rollout.mode=async",
        f"data.max_response_length={R}", "data.max_prompt_length=16", "actor_rollout_ref.rollout.calculate_log_probs=true",
        *overrides,
    ])


class TickServer:
    """One token (5) per tick up to max_tokens; prompts starting with a slow id tick slowly. `abort` cuts a request
    short: it returns the tokens so far with finish_reason abort, as vLLM does."""

    def __init__(self, slow_ids: set[int], tick: float = 0.001, slow_tick: float = 0.5) -> None:
        self.slow_ids, self.tick, self.slow_tick = slow_ids, tick, slow_tick
        self.aborted: set[str] = set()
        self.abort_calls: list[str] = []
        self.requests: list[str] = []

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        self.requests.append(request_id)
        tick = self.slow_tick if prompt_ids[0] in self.slow_ids else self.tick
        tokens: list[int] = []
        for _ in range(int(sampling_params["max_tokens"])):
            await asyncio.sleep(tick)
            if request_id in self.aborted:
                return TokenOutput(tokens, [-0.1] * len(tokens), "abort")
            tokens.append(5)
        return TokenOutput(tokens, [-0.1] * len(tokens), "length")

    async def abort(self, *, request_id: str) -> None:
        self.abort_calls.append(request_id)
        self.aborted.add(request_id)


def prompts(rows: list[list[int]], meta: dict[str, Any] | None = None) -> DataProto:
    batch = collate_fn([{"input_ids": torch.tensor(r), "attention_mask": torch.ones(len(r), dtype=torch.long),
                         "raw_prompt_ids": r} for r in rows])
    batch.meta_info.update(meta or {})
    return batch


ROWS = [[10, 11], [12, 11], [13, 11], [14, 11]]  # the last one is slow


def generate(cfg: Any, server: TickServer, batch: DataProto) -> tuple[DataProto, float]:
    manager = AgentLoopManager(cfg, TOK, server)
    try:
        started = time.perf_counter()
        out = manager.generate_sequences(batch)
        return out, time.perf_counter() - started
    finally:
        manager.events.close()


def test_the_slowest_trajectory_is_cut_once_the_others_are_complete() -> None:
    server = TickServer(slow_ids={14})
    out, elapsed = generate(config("actor_rollout_ref.rollout.over_sample_rate=0.25"), server, prompts(ROWS))
    assert elapsed < 0.5 * R / 2  # the slow request (R ticks of 0.5 s) was not waited for
    assert len(server.abort_calls) == 1 and server.abort_calls[0] == server.requests[3]  # its engine request aborted
    b = out.batch
    assert b["responses"].shape == (4, R) and b["prompts"].shape == (4, 16) and b["input_ids"].shape == (4, 16 + R)
    assert out.non_tensor_batch[CUT_KEY].tolist() == [False, False, False, True]
    assert b["response_mask"][:3].sum(-1).tolist() == [R, R, R]
    assert b["response_mask"][3].sum() == 0  # never trained on
    kept = int(b["attention_mask"][3, 16:].sum())  # the tokens it had when it was cut stay (0 or a few)
    assert kept < R and b["responses"][3, :kept].tolist() == [5] * kept
    assert (b["rollout_log_probs"][3] == 0).all()
    metrics = out.meta_info["metrics"]
    assert metrics["agent/aborted"] == 1.0 and metrics["agent/over_sample_cut/mean"] == 0.25


def test_without_over_sampling_and_in_validation_every_trajectory_finishes() -> None:
    fast = dict(slow_tick=0.02)
    out, _ = generate(config(), TickServer({14}, **fast), prompts(ROWS))
    assert CUT_KEY not in out.non_tensor_batch and out.batch["response_mask"].sum(-1).tolist() == [R] * 4
    for meta in ({"validate": True}, {"do_sample": False}):  # validation; ReMax's greedy baseline
        server = TickServer({14}, **fast)
        out, _ = generate(config("actor_rollout_ref.rollout.over_sample_rate=0.25"), server, prompts(ROWS, meta))
        assert server.abort_calls == [] and CUT_KEY not in out.non_tensor_batch
        assert out.batch["response_mask"].sum(-1).tolist() == [R] * 4


def test_a_cut_trajectory_between_requests_ends_at_its_next_one_and_a_hung_one_is_cancelled() -> None:
    async def main() -> tuple[list[bool], list[Any], TokenOutput]:
        gate = CutOffGate(TickServer(set()))

        async def quick() -> AgentLoopOutput:
            out = await gate.generate(request_id="a", prompt_ids=[1], sampling_params={"max_tokens": 2})
            return AgentLoopOutput([1], out.token_ids, [1] * len(out.token_ids))

        async def tool_then_generate() -> AgentLoopOutput:
            await asyncio.sleep(0.05)  # in a tool call when the cut comes
            out = await gate.generate(request_id="b", prompt_ids=[1], sampling_params={"max_tokens": 2})
            return AgentLoopOutput([1], out.token_ids, [1] * len(out.token_ids), metrics={"seen": float(len(out.token_ids))})

        async def hung() -> AgentLoopOutput:
            await asyncio.sleep(3600)
            raise AssertionError("not cancelled")

        async def fails_on_abort() -> AgentLoopOutput:
            await asyncio.sleep(0.05)
            out = await gate.generate(request_id="d", prompt_ids=[1], sampling_params={"max_tokens": 2})
            raise RuntimeError(f"this loop did not expect {out.finish_reason}")

        tasks = [asyncio.ensure_future(c()) for c in (quick, tool_then_generate, hung, fails_on_abort)]
        cut = await finish_or_cut(tasks, keep=1, gate=gate, grace_s=0.2)
        after = await gate.generate(request_id="c", prompt_ids=[1], sampling_params={"max_tokens": 2})
        return cut, [cut_output(t) if c else t.result() for t, c in zip(tasks, cut, strict=True)], after

    cut, outputs, after = asyncio.run(main())
    assert cut == [False, True, True, True] and outputs[0].response_ids == [5, 5]
    assert outputs[1].response_ids == [] and outputs[2] is None  # answered "abort" at once; cancelled after the grace
    assert outputs[3] is None  # failed once cut: kept empty
    assert after.finish_reason == "abort" and after.token_ids == []  # the gate stays shut until reopened
    empty = mark_cut(outputs[2], [7, 8])
    assert (empty.prompt_ids, empty.response_ids, empty.response_mask) == ([7, 8], [], [])
    assert empty.metrics == {"aborted": 1.0, CUT_KEY: 1.0} and empty.extra_fields[CUT_KEY] is True


@pytest.mark.parametrize(("total", "rate", "keep"), [(4, 0.25, 3), (16, 0.1, 14), (10, 0.1, 9), (1, 0.5, 1), (3, 0.99, 1)])
def test_trajectories_to_keep_rounds_down_as_verl_but_keeps_one(total: int, rate: float, keep: int) -> None:
    assert trajectories_to_keep(total, rate) == keep


def test_a_cut_row_is_left_out_of_its_groups_advantage_baseline() -> None:
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.5])
    mask = torch.ones(6, 3, dtype=torch.long)
    mask[2] = 0  # row 2 was cut: no token trained on, no reward placed
    rewards = torch.zeros(6, 3)
    rewards[:, -1] = scores * mask[:, -1]
    uid = np.array(["g0", "g0", "g0", "g1", "g1", "g1"], dtype=object)
    batch = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                                non_tensors={"uid": uid, CUT_KEY: np.array([False, False, True, False, False, False])})
    assert advantage_groups(batch).tolist() == ["g0", "g0", "g0#over_sample_cut2", "g1", "g1", "g1"]
    grpo = config("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=3").algorithm
    adv = compute_advantage(batch, grpo).batch["advantages"]
    # group g0 is rows 0 and 1 only: scores 1 and 0, mean 0.5, std 0.7071
    torch.testing.assert_close(adv[:2, 0], torch.tensor([0.5, -0.5]) / (0.5**0.5 + 1e-6))
    assert (adv[2] == 0).all()
    uncut = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"uid": uid})
    assert advantage_groups(uncut).tolist() == uid.tolist()
    torch.testing.assert_close(compute_advantage(uncut, grpo).batch["advantages"][3:],
                               adv[3:])  # the other group is untouched


@pytest.mark.parametrize(("overrides", "expected"), [
    (["actor_rollout_ref.rollout.over_sample_rate=1"], "over_sample_rate: 1 is not in [0, 1): it is the share"),
    (["actor_rollout_ref.rollout.over_sample_rate=-0.1"], "over_sample_rate: -0.1 is not in [0, 1)"),
    (["actor_rollout_ref.rollout.over_sample_rate=0.1", "actor_rollout_ref.rollout.mode=sync"],
     "a sync-mode batch is one generate call. Set actor_rollout_ref.rollout.mode=async, or over_sample_rate=0"),
])
def test_over_sample_rate_out_of_range_or_in_sync_mode_is_refused_with_the_fix(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["actor_rollout_ref.model.path=/m", "data.train_files=/d", *overrides])
    assert any(expected in p for p in info.value.problems), info.value.problems
