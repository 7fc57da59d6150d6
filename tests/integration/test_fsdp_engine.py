"""FSDP2 engine on CPU: 2 gloo ranks (real sharding) train exactly like 1 process; log-probs match HF."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from hybridflow.config import ActorConfig, CriticConfig, OptimConfig
from hybridflow.controller.worker import find_free_port
from hybridflow.engines.actor import PPOActor
from hybridflow.engines.critic import PPOCritic
from hybridflow.engines.fsdp_engine import FSDPEngine, autocast_dtype
from hybridflow.engines.optim import lr_factor
from hybridflow.models.tiny import build_tiny_model
from hybridflow.protocol import DataProto

B, P, R = 4, 6, 5


def actor_config() -> ActorConfig:
    # one mini-batch, micro-batches of 2 rows: 1 process accumulates 2 micro-batches, each of the 2
    # ranks runs 1; the KL and entropy terms are on so every loss term is compared.
    return ActorConfig(
        ppo_mini_batch_size=B,
        ppo_epochs=2,
        entropy_coeff=0.01,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        optim=OptimConfig(lr=1e-2, weight_decay=0.0),
    )


def make_batch(vocab: int) -> DataProto:
    """Left-padded prompts + right-padded responses with uneven lengths (so token-mean weights differ)."""
    gen = torch.Generator().manual_seed(0)
    prompt_lens, resp_lens = [6, 4, 3, 5], [5, 2, 4, 1]
    prompts = torch.zeros(B, P, dtype=torch.long)
    responses = torch.zeros(B, R, dtype=torch.long)
    pmask = torch.zeros(B, P, dtype=torch.long)
    rmask = torch.zeros(B, R, dtype=torch.long)
    for i in range(B):
        prompts[i, P - prompt_lens[i] :] = torch.randint(3, vocab, (prompt_lens[i],), generator=gen)
        pmask[i, P - prompt_lens[i] :] = 1
        responses[i, : resp_lens[i]] = torch.randint(3, vocab, (resp_lens[i],), generator=gen)
        rmask[i, : resp_lens[i]] = 1
    attention_mask = torch.cat([pmask, rmask], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "response_mask": rmask,
            "advantages": torch.randn(B, R, generator=gen) * rmask,
        },
        meta_info={"temperature": 0.9},
    )


def train_once(engine: FSDPEngine, batch: DataProto, micro: int) -> dict[str, Any]:
    """log-probs (as old and ref), one update, then the full weights: the same code on any world size."""
    actor = PPOActor(engine, actor_config())
    log_probs, entropy = actor.compute_log_prob(batch, micro_batch_size=micro, calculate_entropy=True)
    batch = batch.union(
        DataProto.from_dict(tensors={"old_log_probs": log_probs, "ref_log_prob": log_probs - 0.05})
    )
    metrics = actor.update_policy(batch, mini_batch_size=len(batch), micro_batch_size=micro)
    return {"log_probs": log_probs, "entropy": entropy, "metrics": metrics, "state": engine.full_state_dict()}


def _rank_main(rank: int, world: int, port: int, model_dir: str, out: str, fsdp_config: dict | None = None,
               engine_kwargs: dict | None = None) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cfg = actor_config()
        engine = FSDPEngine(model_dir, optim_config=cfg.optim, grad_clip=cfg.grad_clip, fsdp_config=fsdp_config,
                            **(engine_kwargs or {}))
        batch = make_batch(engine.hf_config.vocab_size).chunk(world)[rank]
        result = train_once(engine, batch, micro=len(batch))
        sharded = [p for p in engine.module.parameters() if hasattr(p, "to_local")]
        result["n_sharded"] = len(sharded)
        result["mesh"] = tuple(sharded[0].device_mesh.mesh_dim_names) if sharded else ()
        result["local_numel"] = sum(p.to_local().numel() for p in engine.module.parameters())
        torch.save(result, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_two_ranks(model_dir: str, out: Path, fsdp_config: dict | None = None, **engine_kwargs: Any) -> list[dict[str, Any]]:
    """`train_once` on 2 gloo ranks (each on its half of the batch); their results."""
    mp.start_processes(
        _rank_main,
        args=(2, find_free_port(), model_dir, str(out), fsdp_config, engine_kwargs),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="module")
def single(model_dir: str) -> dict[str, Any]:
    cfg = actor_config()
    torch.manual_seed(0)
    engine = FSDPEngine(model_dir, optim_config=cfg.optim, grad_clip=cfg.grad_clip)
    batch = make_batch(engine.hf_config.vocab_size)
    initial = engine.full_state_dict()
    result = train_once(engine, batch, micro=2)
    result["initial"] = initial
    return result


@pytest.fixture(scope="module")
def two_ranks(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_two_ranks(model_dir, tmp_path_factory.mktemp("ranks"))


def test_log_probs_match_plain_hf_forward(model_dir: str, single: dict[str, Any]) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    batch = make_batch(model.config.vocab_size).batch
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits
    logp = torch.log_softmax(logits[:, P - 1 : -1].float() / 0.9, dim=-1)
    expected = logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(single["log_probs"], expected, atol=1e-5, rtol=1e-5)
    assert single["entropy"].shape == (B, R) and bool((single["entropy"] > 0).all())


def test_two_ranks_really_shard(two_ranks: list[dict[str, Any]], single: dict[str, Any]) -> None:
    total = sum(v.numel() for v in single["state"].values())
    assert two_ranks[0]["n_sharded"] > 0
    assert two_ranks[0]["local_numel"] < total  # each rank holds about half the weights
    assert two_ranks[0]["local_numel"] + two_ranks[1]["local_numel"] == total


def test_two_ranks_log_probs_equal_single_process(two_ranks: list[dict[str, Any]], single: dict[str, Any]) -> None:
    merged = torch.cat([r["log_probs"] for r in two_ranks])
    torch.testing.assert_close(merged, single["log_probs"], atol=1e-6, rtol=0)


def test_two_ranks_update_equals_single_process(two_ranks: list[dict[str, Any]], single: dict[str, Any]) -> None:
    # every rank gathers the same full weights, equal to the 1-process result, which moved (to float
    # noise: trimmed padding gives each rank's micro-batches their own widths, so sums run in another order)
    for name, value in single["state"].items():
        torch.testing.assert_close(two_ranks[0]["state"][name], value, atol=5e-6, rtol=1e-5)
        assert torch.equal(two_ranks[0]["state"][name], two_ranks[1]["state"][name])
    moved = max((single["state"][k] - single["initial"][k]).abs().max().item() for k in single["initial"])
    assert moved > 1e-3
    g1 = single["metrics"]["actor/grad_norm"]
    assert math.isclose(two_ranks[0]["metrics"]["actor/grad_norm"], g1, rel_tol=1e-5)
    assert math.isclose(two_ranks[1]["metrics"]["actor/grad_norm"], g1, rel_tol=1e-5)
    assert {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/kl_loss", "actor/entropy", "actor/lr"} <= set(
        single["metrics"]
    )


def test_critic_values_masked_and_loss_decreases(model_dir: str) -> None:
    cfg = CriticConfig(ppo_epochs=1, optim=OptimConfig(lr=5e-3, weight_decay=0.0))
    critic = PPOCritic(FSDPEngine(model_dir, kind="value", optim_config=cfg.optim), cfg)
    batch = make_batch(critic.engine.hf_config.vocab_size)
    values = critic.compute_values(batch)
    assert values.shape == (B, R)
    assert bool((values[batch.batch["response_mask"] == 0] == 0).all())
    returns = torch.ones(B, R) * batch.batch["response_mask"]
    batch = batch.union(DataProto.from_dict(tensors={"values": values, "returns": returns}))
    losses = [critic.update_critic(batch, mini_batch_size=B, micro_batch_size=2)["critic/vf_loss"] for _ in range(8)]
    assert losses[-1] < 0.5 * losses[0]


def test_lr_schedule_warmup_then_cosine() -> None:
    assert [lr_factor(s, 2, 10, "constant") for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    assert lr_factor(2, 2, 10, "cosine") == pytest.approx(1.0)
    assert lr_factor(6, 2, 10, "cosine") == pytest.approx(0.5)
    assert lr_factor(10, 2, 10, "cosine", min_lr_ratio=0.1) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="constant or cosine"):
        lr_factor(5, 0, 10, "linear")


@pytest.mark.parametrize(("device", "sharded", "cpu_flag", "mp", "expected"), [
    ("cuda", True, False, {}, None),  # FSDP2's MixedPrecisionPolicy casts instead
    ("cuda", False, False, {}, torch.bfloat16),  # one GPU process: autocast, as verl's bf16 default
    ("cpu", False, False, {}, None),  # CPU computes in model_dtype unless asked
    ("cpu", True, True, {}, torch.bfloat16),
    ("cpu", False, True, {"mixed_precision": {"param_dtype": "fp16"}}, torch.float16),
    ("cpu", False, True, {"mixed_precision": {"param_dtype": "fp32"}}, None),
    ("cpu", False, True, {"model_dtype": "bf16"}, None),  # already computing in bf16
])
def test_autocast_dtype(device: str, sharded: bool, cpu_flag: bool, mp: dict, expected: torch.dtype | None) -> None:
    assert autocast_dtype(device, mp, sharded=sharded, cpu_mixed_precision=cpu_flag) == expected


@pytest.fixture(scope="module")
def single_bf16(model_dir: str) -> dict[str, Any]:
    cfg = actor_config()
    engine = FSDPEngine(model_dir, optim_config=cfg.optim, grad_clip=cfg.grad_clip, cpu_mixed_precision=True)
    assert engine.autocast_dtype == torch.bfloat16
    return train_once(engine, make_batch(engine.hf_config.vocab_size), micro=2)


def test_cpu_mixed_precision_computes_in_bf16_and_keeps_fp32_weights(
    single_bf16: dict[str, Any], single: dict[str, Any]
) -> None:
    result = single_bf16
    assert result["log_probs"].dtype == torch.float32
    gap = (result["log_probs"] - single["log_probs"]).abs().max().item()
    # bf16 matmuls (8-bit mantissa) move the log-probs of this model by ~2e-3, fp32 would by ~1e-7
    assert 1e-5 < gap < 5e-2, gap
    assert {v.dtype for v in result["state"].values()} == {torch.float32}
    moved = max((result["state"][k] - single["initial"][k]).abs().max().item() for k in single["initial"])
    assert moved > 1e-3 and math.isfinite(result["metrics"]["actor/grad_norm"])


def test_cpu_mixed_precision_on_two_sharded_ranks(
    model_dir: str, tmp_path: Path, single_bf16: dict[str, Any], single: dict[str, Any]
) -> None:
    ranks = run_two_ranks(model_dir, tmp_path, cpu_mixed_precision=True)
    assert ranks[0]["n_sharded"] > 0
    log_probs = torch.cat([r["log_probs"] for r in ranks])
    # the same bf16 arithmetic per row as one process (seen equal to the bit), not fp32's
    assert (log_probs - single_bf16["log_probs"]).abs().max().item() < 1e-6
    assert (log_probs - single["log_probs"]).abs().max().item() > 1e-5
    state = ranks[0]["state"]
    assert {v.dtype for v in state.values()} == {torch.float32}
    assert max((state[k] - single_bf16["state"][k]).abs().max().item() for k in state) < 1e-5
