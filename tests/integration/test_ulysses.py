"""Ulysses sequence parallelism: 2 gloo ranks splitting every sequence compute what 1 process computes.

One spawn of 2 ranks runs the real FSDP workers (actor + reference, and the critic) with
ulysses_sequence_parallel_size=2, each rank given half the batch as the dispatch would; the same
workers in this process (1 rank, no sequence parallelism) are the reference. Compared: old and
reference log-probs, entropies, values, and the weights after a PPO update of actor and critic.
The model has grouped-query attention (4 heads, 2 KV heads) and the sequence length is odd, so the
exchange splits KV heads and pads the sequence.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from hybridflow.algorithms import logprobs_from_logits
from hybridflow.config import load_config
from hybridflow.controller.worker import find_free_port
from hybridflow.engines.actor import response_logits
from hybridflow.engines.ulysses import check_sequence_parallel
from hybridflow.models.tiny import build_tiny_config, build_tiny_model
from hybridflow.protocol import DataProto
from hybridflow.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

B, P, R = 4, 6, 5  # sequence length P + R = 11: odd, padded to 12 for 2 ranks


def worker_config(model_dir: str, ranks: int, sp: int) -> Any:
    return load_config(None, [
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={ranks}",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.ppo_epochs=2",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_coef=0.1",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.actor.optim.lr=0.01",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}",
        f"critic.ulysses_sequence_parallel_size={sp}",
        "critic.optim.lr=0.01",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "algorithm.adv_estimator=gae",
        f"data.train_batch_size={B}",
        f"data.max_prompt_length={P}",
        f"data.max_response_length={R}",
    ])


def make_batch(vocab: int) -> DataProto:
    """Left-padded prompts, right-padded responses of uneven lengths, advantages and returns."""
    gen = torch.Generator().manual_seed(0)
    prompt_lens, resp_lens = [6, 4, 3, 5], [5, 2, 4, 1]
    prompts, responses = torch.zeros(B, P, dtype=torch.long), torch.zeros(B, R, dtype=torch.long)
    pmask, rmask = torch.zeros(B, P, dtype=torch.long), torch.zeros(B, R, dtype=torch.long)
    for i in range(B):
        prompts[i, P - prompt_lens[i]:] = torch.randint(3, vocab, (prompt_lens[i],), generator=gen)
        pmask[i, P - prompt_lens[i]:] = 1
        responses[i, : resp_lens[i]] = torch.randint(3, vocab, (resp_lens[i],), generator=gen)
        rmask[i, : resp_lens[i]] = 1
    attention_mask = torch.cat([pmask, rmask], dim=1)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp(min=0),
            "response_mask": rmask,
            "advantages": torch.randn(B, R, generator=gen) * rmask,
            "returns": torch.randn(B, R, generator=gen) * rmask,
        },
        meta_info={"temperature": 0.9},
    )


def policy_gradient(engine: Any, batch: DataProto) -> dict[str, torch.Tensor]:
    """d/dtheta of sum(advantage x log-prob) over the whole batch (what a sequence-parallel group shares)."""
    logits = response_logits(engine, batch, temperature=1.0)
    log_probs = logprobs_from_logits(logits, batch.batch["responses"])
    (log_probs * batch.batch["advantages"]).sum().backward()
    grads = {}
    for name, p in engine.module.named_parameters():
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        grads[name] = grad.detach().clone()
    engine.optimizer.zero_grad(set_to_none=True)
    return grads


def run_workers(model_dir: str, rank: int, ranks: int, sp: int) -> dict[str, Any]:
    """Log-probs, values and one update of actor and critic on this rank's share of the batch."""
    cfg = worker_config(model_dir, ranks, sp)
    actor, critic = ActorRolloutRefWorker(cfg, role="actor_ref"), CriticWorker(cfg)
    actor.init_model()
    critic.init_model()
    seen: list[int] = []  # the sequence length each embedding call sees on this rank
    actor.actor.engine.module.get_input_embeddings().register_forward_hook(lambda m, a, o: seen.append(o.shape[1]))
    grads = policy_gradient(actor.actor.engine, make_batch(actor.actor.engine.hf_config.vocab_size))
    batch = make_batch(actor.actor.engine.hf_config.vocab_size).chunk(ranks)[rank]
    batch = batch.union(actor.compute_log_prob(batch))
    batch = batch.union(actor.compute_ref_log_prob(batch))
    batch = batch.union(critic.compute_values(batch))
    actor_metrics = actor.update_actor(batch).meta_info["metrics"]
    critic_metrics = critic.update_critic(batch).meta_info["metrics"]
    return {
        "batch": batch,
        "actor_metrics": actor_metrics,
        "critic_metrics": critic_metrics,
        "actor_state": actor.actor.engine.full_state_dict(),
        "critic_state": critic.critic.engine.full_state_dict(),
        "grads": grads,
        "seen_lengths": sorted(set(seen)),
        "dp": actor.actor.engine.data_parallel_size,
    }


def _rank_main(rank: int, port: int, model_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import torch.distributed as dist

    try:
        torch.save(run_workers(model_dir, rank, ranks=2, sp=2), Path(out) / f"rank{rank}.pt")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # grouped-query attention: 4 query heads, 2 KV heads (head_dim 32), split 2 + 1 per rank
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden=128, heads=4, kv_heads=2))


@pytest.fixture(scope="module")
def single(model_dir: str) -> dict[str, Any]:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        assert key not in os.environ, f"{key} is set: the reference must run as a single process"
    return run_workers(model_dir, 0, ranks=1, sp=1)


@pytest.fixture(scope="module")
def two_ranks(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ulysses")
    mp.start_processes(_rank_main, args=(find_free_port(), model_dir, str(out)), nprocs=2, join=True,
                       start_method="spawn")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_ranks_really_split_each_sequence(two_ranks: list[dict[str, Any]], single: dict[str, Any]) -> None:
    # micro-batches drop the left padding all their rows share: 11 or 10 positions in one process
    assert single["seen_lengths"] == [P + R - 1, P + R]
    for result in two_ranks:
        assert result["dp"] == 1  # 2 ranks / ulysses 2: one data-parallel shard, held by both
        assert result["seen_lengths"] == [5, 6]  # 10 -> 5 per rank; 11 padded to 12 -> 6 per rank


@pytest.mark.parametrize("key", ["old_log_probs", "entropys", "ref_log_prob", "values"])
def test_forward_outputs_equal_single_process(two_ranks: list[dict[str, Any]], single: dict[str, Any], key: str) -> None:
    # each rank returns its own rows, as the dispatch expects; together they are the whole batch
    got = torch.cat([r["batch"].batch[key] for r in two_ranks])
    torch.testing.assert_close(got, single["batch"].batch[key], atol=2e-5, rtol=1e-5)


def test_gradients_equal_single_process(two_ranks: list[dict[str, Any]], single: dict[str, Any]) -> None:
    # FSDP's average over the 2 ranks of (2 x each rank's slice of the gradient) is the 1-process gradient
    ref = single["grads"]
    assert max(float(g.abs().max()) for g in ref.values()) > 1e-2
    for result in two_ranks:
        assert result["grads"].keys() == ref.keys()
        for name, value in ref.items():
            torch.testing.assert_close(result["grads"][name], value, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_update_equals_single_process(two_ranks: list[dict[str, Any]], single: dict[str, Any], role: str) -> None:
    # Adam (lr 0.01) turns rounding noise on gradients that are zero in exact arithmetic (a key bias:
    # softmax ignores a shift shared by all keys) into steps of up to lr, and attention sums run in
    # another order here; so weights are compared to 1% of a step, the gradients above exactly.
    ref = single[f"{role}_state"]
    for result in two_ranks:
        state = result[f"{role}_state"]
        assert state.keys() == ref.keys()
        for name, value in ref.items():
            torch.testing.assert_close(state[name], value, atol=1e-4, rtol=1e-4, msg=f"{role} {name}")
    for name in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm") if role == "actor" else \
            ("critic/vf_loss", "critic/grad_norm"):
        for result in two_ranks:
            assert result[f"{role}_metrics"][name] == pytest.approx(single[f"{role}_metrics"][name], rel=1e-4, abs=1e-6)


def test_update_moved_the_weights(model_dir: str, single: dict[str, Any]) -> None:
    """The comparison above is not of two untouched models: one update changes the actor's weights."""
    from safetensors.torch import load_file

    initial = load_file(str(Path(model_dir) / "model.safetensors"))
    changed = [k for k, v in single["actor_state"].items() if k in initial and not torch.equal(v, initial[k])]
    assert len(changed) > len(initial) // 2


@pytest.mark.parametrize(
    ("sp", "world", "heads", "kv", "message"),
    [
        (2, 3, 4, 2, "does not divide the 3 ranks"),
        (4, 4, 4, 2, "2 key/value heads (num_key_value_heads), which do not split over 4 ranks"),
        (4, 4, 2, 2, "2 attention heads (num_attention_heads), which do not split over 4 ranks"),
    ],
)
def test_refuses_what_cannot_split(sp: int, world: int, heads: int, kv: int, message: str) -> None:
    config = build_tiny_config("qwen2", vocab_size=32, hidden=64 * heads // 2, heads=heads, kv_heads=kv)
    config._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match=re.escape(message)):
        check_sequence_parallel(sp, world, config)
    check_sequence_parallel(1, world, config)  # 1: off, always fine


def test_refuses_eager_attention() -> None:
    config = build_tiny_config("qwen2", vocab_size=32)
    config._attn_implementation = "eager"
    with pytest.raises(ValueError, match="attention implementation is 'eager'.*sdpa"):
        check_sequence_parallel(2, 2, config)
