"""FSDP workers under Ray on CPU: colocated actor+rollout+ref (2 ranks), critic, split rollout, checkpoints."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.controller import RayResourcePool, RayWorkerGroup
from hybridflow.protocol import DataProto
from hybridflow.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker
from hybridflow.workers.weight_sync import sync_weights
from tests.support.tiny_workers import RESPONSE_LENGTH, make_prompts, max_log_prob_gap, tiny_worker_session

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with tiny_worker_session(
        tmp_path_factory,
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "critic.optim.lr=0.01",
    ) as session:
        pool = RayResourcePool([2], cpus_per_process=1.0, max_colocate_count=2, name_prefix="global")
        rollout_pool = RayResourcePool([1], cpus_per_process=1.0, name_prefix="rollout")
        actor = session.group(pool, ActorRolloutRefWorker, role="actor_rollout_ref")
        critic = session.group(pool, CriticWorker)
        rollout = session.group(rollout_pool, ActorRolloutRefWorker, role="rollout")
        for wg in (actor, critic, rollout):
            wg.init_model()
        yield {"model_dir": session.model_dir, "actor": actor, "critic": critic, "rollout": rollout}


def add_training_fields(gen: DataProto, actor: RayWorkerGroup) -> DataProto:
    gen = gen.union(actor.compute_log_prob(gen))
    gen = gen.union(actor.compute_ref_log_prob(gen))
    adv = torch.randn(gen.batch["response_mask"].shape, generator=torch.Generator().manual_seed(1))
    return gen.union(DataProto.from_dict(tensors={"advantages": adv * gen.batch["response_mask"]}))


def test_generate_shapes_masks_and_greedy(env: dict[str, Any]) -> None:
    actor = env["actor"]
    prompts = make_prompts(env["model_dir"], 2)  # n=2, repeated by the caller
    gen = actor.generate_sequences(prompts)
    b = gen.batch
    assert b["responses"].shape == (8, RESPONSE_LENGTH) and b["input_ids"].shape == (8, 8 + RESPONSE_LENGTH)
    assert torch.equal(b["input_ids"][:, :8], prompts.batch["input_ids"])
    assert list(gen.non_tensor_batch["uid"]) == list("aabbccdd")
    mask = b["response_mask"]
    assert bool((mask[:, 1:] <= mask[:, :-1]).all())  # ones then zeros
    assert torch.equal(b["attention_mask"][:, 8:], mask)
    assert torch.equal(b["position_ids"][:, 8:], b["position_ids"][:, 7:8] + torch.arange(1, RESPONSE_LENGTH + 1))
    greedy = {"do_sample": False}
    g1 = actor.generate_sequences(DataProto.from_dict(tensors=dict(prompts.batch), meta_info=greedy))
    g2 = actor.generate_sequences(DataProto.from_dict(tensors=dict(prompts.batch), meta_info=greedy))
    assert torch.equal(g1.batch["responses"], g2.batch["responses"])
    assert torch.equal(g1.batch["responses"][0::2], g1.batch["responses"][1::2])  # same prompt, same output
    # meta_info n: the worker repeats (odd row count pads the dispatch; collect drops the padding)
    three = DataProto.from_dict(tensors=dict(make_prompts(env["model_dir"], 1)[:3].batch), meta_info={"n": 2})
    assert len(actor.generate_sequences(three)) == 6


def test_colocated_update_syncs_rollout_and_keeps_ref(env: dict[str, Any]) -> None:
    actor = env["actor"]
    gen = actor.generate_sequences(make_prompts(env["model_dir"], 2))
    assert max_log_prob_gap(actor, gen) < 1e-4
    batch = add_training_fields(gen, actor)
    torch.testing.assert_close(batch.batch["ref_log_prob"], batch.batch["old_log_probs"])
    out = actor.update_actor(batch)
    metrics = out.meta_info["metrics"]
    assert len(metrics["actor/pg_loss"]) == 2 and {"actor/grad_norm", "actor/kl_loss", "actor/lr"} <= set(metrics)
    # the actor moved; the reference did not; the colocated rollout follows the actor
    new_old = actor.compute_log_prob(gen).batch["old_log_probs"]
    assert float((new_old - batch.batch["old_log_probs"]).abs().max()) > 1e-3
    torch.testing.assert_close(actor.compute_ref_log_prob(gen).batch["ref_log_prob"], batch.batch["ref_log_prob"])
    assert max_log_prob_gap(actor, actor.generate_sequences(make_prompts(env["model_dir"], 2))) < 1e-4


def test_split_rollout_gets_weights_through_object_store(env: dict[str, Any]) -> None:
    actor, rollout = env["actor"], env["rollout"]
    prompts = make_prompts(env["model_dir"], 1)
    # the actor was updated in the previous test (or here), so the split rollout is stale until synced
    batch = add_training_fields(actor.generate_sequences(prompts.repeat(2)), actor)
    actor.update_actor(batch)
    assert max_log_prob_gap(actor, rollout.generate_sequences(prompts)) > 1e-3
    sync_weights(actor, rollout)
    assert max_log_prob_gap(actor, rollout.generate_sequences(prompts)) < 1e-4


def test_critic_values_and_update(env: dict[str, Any]) -> None:
    actor, critic = env["actor"], env["critic"]
    gen = actor.generate_sequences(make_prompts(env["model_dir"], 2))
    values = critic.compute_values(gen).batch["values"]
    assert values.shape == (8, RESPONSE_LENGTH)
    assert bool((values[gen.batch["response_mask"] == 0] == 0).all())
    returns = gen.batch["response_mask"].float()
    batch = gen.union(DataProto.from_dict(tensors={"values": values, "returns": returns}))
    metrics = critic.update_critic(batch).meta_info["metrics"]
    assert {"critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm"} <= set(metrics)
    assert float((critic.compute_values(gen).batch["values"] - values).abs().max()) > 1e-4


def test_checkpoint_roundtrip_is_world_size_independent(env: dict[str, Any], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    actor = env["actor"]
    gen = actor.generate_sequences(make_prompts(env["model_dir"], 2))
    before = actor.compute_log_prob(gen).batch["old_log_probs"]
    ckpt = str(tmp_path / "global_step_1" / "actor")
    actor.save_checkpoint(ckpt)
    assert {"model.pt", "optimizer.pt", "extra_state.pt"} <= set(os.listdir(ckpt))
    actor.update_actor(add_training_fields(gen, actor))
    assert float((actor.compute_log_prob(gen).batch["old_log_probs"] - before).abs().max()) > 1e-3
    actor.load_checkpoint(ckpt)
    torch.testing.assert_close(actor.compute_log_prob(gen).batch["old_log_probs"], before)
    # the colocated rollout was refreshed from the restored weights too
    assert max_log_prob_gap(actor, actor.generate_sequences(make_prompts(env["model_dir"], 2))) < 1e-4
    # the file written by 2 ranks loads into a single unsharded HF model
    model = AutoModelForCausalLM.from_pretrained(env["model_dir"])
    model.load_state_dict(torch.load(Path(ckpt) / "model.pt", weights_only=False))


def test_response_mask_stops_after_first_eos() -> None:
    from hybridflow.rollout.base import response_mask_from

    responses = torch.tensor([[5, 1, 7, 0], [5, 6, 7, 8], [1, 1, 0, 0], [5, 6, 0, 0]])
    mask = response_mask_from(responses, eos_token_id=1, gen_len=4)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert response_mask_from(responses, eos_token_id=[1, 8], gen_len=3).tolist()[1] == [1, 1, 1, 0]
