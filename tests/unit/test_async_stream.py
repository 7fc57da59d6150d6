"""The asynchronous-training stream against a fake engine: admission (one-step-off, staleness bound), whole
groups, per-token policy versions across a partial-rollout pause, dropped stale groups, and exact resume
from a snapshot. The engine emits one token per tick, so pauses land mid-generation."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import torch

from hybridflow.agent.base import TokenOutput
from hybridflow.agent.manager import AgentLoopManager, EventLoopThread
from hybridflow.agent.stream import GroupStream, PromptCursor, VersionedServer, versions_tensor
from hybridflow.config import load_config
from hybridflow.data.dataset import collate_fn, left_pad
from hybridflow.data.sampler import StatefulDataLoader
from hybridflow.data.toy import build_toy_tokenizer

TOK = build_toy_tokenizer()
B, N = 2, 2  # prompts per step, samples per prompt


class TickServer:
    """Emits token 5 every `tick` seconds up to max_tokens; `abort` cuts a request short."""

    def __init__(self, tick: float = 0.002) -> None:
        self.tick = tick
        self.aborted: set[str] = set()
        self.requests = 0

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        self.requests += 1
        tokens: list[int] = []
        for _ in range(int(sampling_params["max_tokens"])):
            if request_id in self.aborted:
                self.aborted.discard(request_id)
                return TokenOutput(tokens, [-0.1] * len(tokens), "abort")
            await asyncio.sleep(self.tick)
            tokens.append(5)
        return TokenOutput(tokens, [-0.1] * len(tokens), "length")

    async def abort(self, *, request_id: str) -> None:
        self.aborted.add(request_id)


def dataset(size: int = 8) -> list[dict[str, Any]]:
    items = []
    for i in range(size):
        ids = list(TOK(f"q{i}", add_special_tokens=False)["input_ids"])
        input_ids, mask, pos = left_pad(ids, 8, TOK.pad_token_id)
        items.append({"input_ids": input_ids, "attention_mask": mask, "position_ids": pos, "raw_prompt_ids": ids,
                      "data_source": "toy", "index": i})
    return items


class Harness:
    """A stream over the fake engine, driven like the trainer drives it."""

    def __init__(self, *, threshold: float, one_step_off: bool, partial: bool = False, max_staleness: int = 1,
                 response_length: int = 4, tick: float = 0.002, size: int = 8) -> None:
        cfg = load_config(None, ["actor_rollout_ref.model.path=/m", "data.train_files=/d",
                                 "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.calculate_log_probs=true",
                                 f"data.max_response_length={response_length}", "data.max_prompt_length=8"])
        self.engine = TickServer(tick)
        self.server = VersionedServer(self.engine)
        self.events = EventLoopThread()
        self.manager = AgentLoopManager(cfg, TOK, self.server, events=self.events)
        loader = StatefulDataLoader(dataset(size), B, shuffle=True, seed=3, collate_fn=collate_fn)
        self.stream = GroupStream(self.manager, self.server, PromptCursor(loader), groups_per_step=B, n=N,
                                  staleness_threshold=threshold, sync_every=1, max_staleness=max_staleness,
                                  partial_rollout=partial, one_batch_at_a_time=one_step_off)
        self.loads: list[int] = []
        self.version = 0

    def start(self) -> Harness:
        self.events.run(_call(self.stream.start))
        return self

    def step(self, train_s: float = 0.0) -> tuple[Any, dict[str, float]]:
        """Take a batch, 'train' for `train_s` (the version advances) and publish the new weights."""
        batch, metrics = self.events.run(self.stream.take(B, self.version), timeout=30)
        time.sleep(train_s)
        self.version += 1

        async def load(version: int = self.version) -> None:
            await asyncio.sleep(0.001)
            self.loads.append(version)

        self.events.run(self.stream.publish(load, self.version))
        return batch, metrics

    def close(self) -> None:
        self.events.run(self.stream.close())
        self.manager.close()


async def _call(fn: Any) -> None:
    fn()


def trained(batch: Any) -> list[tuple[str, int]]:
    """(prompt key, oldest token version) per group of a batch."""
    keys = list(dict.fromkeys(batch.non_tensor_batch["prompt_key"]))
    out = []
    for key in keys:
        rows = torch.tensor([k == key for k in batch.non_tensor_batch["prompt_key"]])
        versions = batch.batch["rollout_versions"][rows]
        out.append((str(key), int(versions[versions >= 0].min())))
    return out


def test_one_step_off_trains_batch_k_on_the_weights_of_step_k_minus_2() -> None:
    h = Harness(threshold=1.0, one_step_off=True).start()
    try:
        steps = [h.step() for _ in range(5)]
    finally:
        h.close()
    versions = [sorted({v for _, v in trained(batch)}) for batch, _ in steps]
    assert versions == [[0], [0], [1], [2], [3]]  # step k (trainer at version k-1) trains samples of k-2
    assert [m["fully_async/trajectory_staleness/max"] for _, m in steps] == [0, 1, 1, 1, 1]
    for batch, _ in steps:  # whole groups: n rows per prompt, and the engine's log-probs came along
        keys = list(batch.non_tensor_batch["prompt_key"])
        assert all(keys.count(k) == N for k in keys) and "rollout_log_probs" in batch.batch
    first_epoch = [k for batch, _ in steps[:4] for k, _ in trained(batch)]
    assert len(set(first_epoch)) == 8, "every prompt of an epoch once"


def test_partial_rollout_continues_paused_generations_with_the_new_weights() -> None:
    h = Harness(threshold=1.0, one_step_off=False, partial=True, response_length=40, tick=0.004, max_staleness=2).start()
    try:
        steps = [h.step(train_s=0.05) for _ in range(4)]
    finally:
        h.close()
    spans = [m["fully_async/partial/max_partial_span"] for _, m in steps]
    assert max(spans) >= 1, f"a generation should have crossed a weight push: {spans}"
    batch = next(b for b, m in steps if m["fully_async/partial/max_partial_span"] >= 1)
    row = next(i for i in range(len(batch)) if len(set(batch.batch["rollout_versions"][i].tolist()) - {-1}) > 1)
    versions = batch.batch["rollout_versions"][row]
    model = versions[batch.batch["response_mask"][row].bool()]
    assert bool((model[1:] >= model[:-1]).all()), "versions only grow along a trajectory"
    assert int(batch.batch["response_mask"][row].sum()) == 40, "the continued generation kept its whole budget"
    assert h.server.resumed_requests > 0


def test_groups_beyond_the_staleness_bound_are_generated_again() -> None:
    h = Harness(threshold=2.0, one_step_off=False, max_staleness=0).start()
    try:
        steps = [h.step() for _ in range(4)]
    finally:
        h.close()
    assert steps[-1][1]["fully_async/count/dropped_stale_groups"] > 0
    assert all(m["fully_async/trajectory_staleness/max"] == 0 for _, m in steps)


def test_a_snapshot_resumes_to_the_same_prompts_and_versions() -> None:
    reference = Harness(threshold=1.0, one_step_off=True).start()
    try:
        expected = [trained(reference.step()[0]) for _ in range(6)]
    finally:
        reference.close()

    first = Harness(threshold=1.0, one_step_off=True).start()
    try:
        before = [trained(first.step()[0]) for _ in range(3)]
        state, queued = first.events.run(first.stream.snapshot())
        first.events.run(first.stream.release())
        [trained(first.step()[0]) for _ in range(2)]  # trained after the checkpoint, then "killed"
    finally:
        first.close()
    resumed = Harness(threshold=1.0, one_step_off=True)
    resumed.version = 3
    resumed.stream.restore(state, queued)
    resumed.stream.loaded_version = resumed.server.version = 3  # the checkpoint's weights, loaded at start
    resumed.start()
    try:
        after = [trained(resumed.step()[0]) for _ in range(3)]
    finally:
        resumed.close()
    assert before + after == expected


def test_versions_line_up_with_model_tokens_and_fall_back_to_the_oldest() -> None:
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0]])
    out = versions_tensor([[3, 3, 4], [7, 8]], mask)  # second row: 2 versions for 3 model tokens
    assert out.tolist() == [[3, 3, -1, -1, 4, -1], [7, 7, 7, -1, -1, -1]]


@pytest.mark.parametrize("overrides, message", [
    (["async_training.mode=fully_async", "async_training.staleness_threshold=-1"], "must be >= 0"),
    (["async_training.mode=fully_async"], "set actor_rollout_ref.rollout.mode=async"),
    (["async_training.mode=fully_async", "actor_rollout_ref.rollout.mode=async"], "set trainer.placement=split"),
    (["async_training.mode=one_step_off", "async_training.partial_rollout=true", "actor_rollout_ref.rollout.mode=async",
      "trainer.placement=split"], "one_step_off pushes weights between whole batches"),
    (["async_training.mode=fully_async", "async_training.require_batches=3", "data.train_batch_size=4",
      "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.mode=async",
      "trainer.placement=split"], "set data.train_batch_size=6"),
    (["async_training.mode=fully_async", "actor_rollout_ref.rollout.calculate_log_probs=false",
      "actor_rollout_ref.rollout.mode=async", "trainer.placement=split"], "calculate_log_probs: async_training"),
    (["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.bypass_mode=true",
      "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"], "set loss_mode=vanilla"),
    (["algorithm.rollout_correction.rollout_rs=token_k9", "algorithm.rollout_correction.rollout_rs_threshold=2"],
     "unknown option 'token_k9'"),
    (["algorithm.rollout_correction.rollout_is_threshold=abc"], "'lower_upper'"),
])
def test_bad_async_and_correction_settings_name_the_fix(overrides: list[str], message: str) -> None:
    from hybridflow.config import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(None, ["actor_rollout_ref.model.path=/m", "data.train_files=/d", *overrides])
    assert message in str(err.value)


def test_the_mode_entry_points_refuse_a_contradicting_mode(capsys: pytest.CaptureFixture[str]) -> None:
    from hybridflow.trainer.one_step_off_main import main_in_mode

    assert main_in_mode("fully_async", ["cfg.yaml", "async_training.mode=one_step_off"]) == 2
    assert "contradicts this entry point (fully_async)" in capsys.readouterr().err
