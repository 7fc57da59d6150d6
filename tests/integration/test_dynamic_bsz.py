"""Token-budget micro-batches (verl's use_dynamic_bsz) and trimmed left padding give the same numbers.

Single process: log-probs, values and one update with packed micro-batches equal one micro-batch.
Two gloo ranks whose rows need different micro-batch counts: they agree on one count (FSDP would
otherwise hang in a collective) and train exactly like one process on the whole batch.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from hybridflow.config import ActorConfig, CriticConfig, OptimConfig
from hybridflow.controller.worker import find_free_port
from hybridflow.engines.actor import PPOActor
from hybridflow.engines.batching import padded_cost, plan_micro_batches
from hybridflow.engines.critic import PPOCritic
from hybridflow.engines.fsdp_engine import FSDPEngine
from hybridflow.models.tiny import build_tiny_model
from hybridflow.protocol import DataProto

P, R = 8, 4
# rank 0 holds long prompts, rank 1 short ones: within BUDGET they need 2 and 1 micro-batches
PROMPT_LENS = [8, 7, 8, 6, 2, 1, 3, 2]
RESP_LENS = [4, 1, 3, 2, 4, 3, 1, 2]
BUDGET = 28
# Adam moves every weight by ~lr (1e-2) whatever its gradient's size, so float noise in a near-zero
# gradient (micro-batches of other widths sum in another order) shows in the weights; gradient norms and
# log-probs are compared tightly, weights to 1% of a step.
STEP_NOISE = 1e-4
VOCAB = 30  # below the tiny model's vocabulary


def actor_config() -> ActorConfig:
    return ActorConfig(ppo_mini_batch_size=len(PROMPT_LENS), ppo_epochs=1, optim=OptimConfig(lr=1e-2, weight_decay=0.0))


def make_batch(vocab: int, extra_pad: int = 0) -> DataProto:
    """Left-padded prompts (plus `extra_pad` all-padding columns in front) and right-padded responses."""
    gen = torch.Generator().manual_seed(1)
    n, width = len(PROMPT_LENS), P + extra_pad
    prompts = torch.zeros(n, width, dtype=torch.long)
    pmask = torch.zeros(n, width, dtype=torch.long)
    responses = torch.zeros(n, R, dtype=torch.long)
    rmask = torch.zeros(n, R, dtype=torch.long)
    for i, (pl, rl) in enumerate(zip(PROMPT_LENS, RESP_LENS, strict=True)):
        prompts[i, width - pl :] = torch.randint(3, vocab, (pl,), generator=gen)
        pmask[i, width - pl :] = 1
        responses[i, :rl] = torch.randint(3, vocab, (rl,), generator=gen)
        rmask[i, :rl] = 1
    attention_mask = torch.cat([pmask, rmask], dim=1)
    return DataProto.from_dict(
        tensors={
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp(min=0),
            "response_mask": rmask,
            "advantages": torch.randn(n, R, generator=gen) * rmask,
        }
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def train(engine: FSDPEngine, batch: DataProto, budget: int | None) -> dict[str, Any]:
    actor = PPOActor(engine, actor_config())
    log_probs, entropy = actor.compute_log_prob(batch, None, calculate_entropy=True, max_token_len=budget)
    metrics = actor.update_policy(batch, len(batch), None, max_token_len=budget)
    return {"log_probs": log_probs, "entropy": entropy, "metrics": metrics, "state": engine.full_state_dict()}


def test_the_plan_differs_per_rank_half() -> None:
    """The premise of the two-rank test: each half alone wants a different number of micro-batches."""
    batch = make_batch(VOCAB)
    counts = [len(plan_micro_batches(half, None, BUDGET)) for half in batch.chunk(2)]
    assert counts[0] != counts[1]
    cost = padded_cost(batch.batch["attention_mask"], R)
    assert int(cost.max()) <= BUDGET


def test_packed_micro_batches_equal_one_micro_batch(model_dir: str) -> None:
    cfg = actor_config()
    whole = train(FSDPEngine(model_dir, optim_config=cfg.optim), make_batch(VOCAB), None)
    packed = train(FSDPEngine(model_dir, optim_config=cfg.optim), make_batch(VOCAB), BUDGET)
    torch.testing.assert_close(packed["log_probs"], whole["log_probs"], atol=1e-6, rtol=0)
    torch.testing.assert_close(packed["entropy"], whole["entropy"], atol=1e-5, rtol=0)
    for name, value in whole["state"].items():
        torch.testing.assert_close(packed["state"][name], value, atol=STEP_NOISE, rtol=0)
    assert packed["metrics"]["actor/grad_norm"] == pytest.approx(whole["metrics"]["actor/grad_norm"], rel=1e-5)


def test_leading_padding_columns_change_nothing(model_dir: str) -> None:
    engine = FSDPEngine(model_dir)
    actor = PPOActor(engine)
    plain, _ = actor.compute_log_prob(make_batch(VOCAB), None)
    padded, _ = actor.compute_log_prob(make_batch(VOCAB, extra_pad=5), None)
    torch.testing.assert_close(padded, plain, atol=1e-6, rtol=0)


def test_critic_values_with_a_token_budget(model_dir: str) -> None:
    critic = PPOCritic(FSDPEngine(model_dir, kind="value"), CriticConfig())
    batch = make_batch(VOCAB)
    torch.testing.assert_close(critic.compute_values(batch, max_token_len=BUDGET), critic.compute_values(batch), atol=1e-6, rtol=0)


def _rank_main(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        engine = FSDPEngine(model_dir, optim_config=actor_config().optim)
        half = make_batch(engine.hf_config.vocab_size).chunk(world)[rank]
        result = train(engine, half, BUDGET)
        torch.save(result, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_ranks_agree_on_micro_batches_and_train_like_one_process(model_dir: str, tmp_path: Path) -> None:
    ctx = mp.start_processes(
        _rank_main, args=(2, find_free_port(), model_dir, str(tmp_path)), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 120
    try:
        while not ctx.join(timeout=1):
            assert time.monotonic() < deadline, "the ranks hang: their micro-batch counts differ"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    engine = FSDPEngine(model_dir, optim_config=actor_config().optim)
    single = train(engine, make_batch(engine.hf_config.vocab_size), None)
    torch.testing.assert_close(torch.cat([r["log_probs"] for r in ranks]), single["log_probs"], atol=1e-6, rtol=0)
    for name, value in single["state"].items():
        torch.testing.assert_close(ranks[0]["state"][name], value, atol=STEP_NOISE, rtol=0)
    assert ranks[0]["metrics"]["actor/grad_norm"] == pytest.approx(single["metrics"]["actor/grad_norm"], rel=1e-5)
