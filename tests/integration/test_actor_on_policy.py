"""On-policy actor updates without an old-log-prob pass; rollout/actor mismatch metrics; logits_to_keep."""

from __future__ import annotations

import pytest
import torch

from hybridflow.config import ActorConfig, OptimConfig
from hybridflow.engines.actor import PPOActor
from hybridflow.engines.fsdp_engine import FSDPEngine
from hybridflow.models.tiny import build_tiny_model
from hybridflow.protocol import DataProto
from tests.integration.test_fsdp_engine import B, make_batch


def on_policy_config(**kw: object) -> ActorConfig:
    return ActorConfig(ppo_mini_batch_size=B, ppo_epochs=1, optim=OptimConfig(lr=1e-2, weight_decay=0.0), **kw)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def update(model_dir: str, with_old: bool, cfg: ActorConfig) -> tuple[dict[str, float], dict[str, torch.Tensor], torch.Tensor]:
    engine = FSDPEngine(model_dir, optim_config=cfg.optim, grad_clip=cfg.grad_clip)
    actor = PPOActor(engine, cfg)
    batch = make_batch(engine.hf_config.vocab_size)
    log_probs, entropy = actor.compute_log_prob(batch, micro_batch_size=2, calculate_entropy=True)
    # the engine's sampling log-probs, off by a known amount on every token
    batch = batch.union(DataProto.from_dict(tensors={"rollout_log_probs": log_probs + 0.1}))
    if with_old:
        batch = batch.union(DataProto.from_dict(tensors={"old_log_probs": log_probs}))
    mask = batch.batch["response_mask"].bool()
    metrics = actor.update_policy(batch, mini_batch_size=len(batch), micro_batch_size=2)
    return metrics, engine.full_state_dict(), entropy[mask].mean()


def test_on_policy_update_equals_update_with_recomputed_old_log_probs(model_dir: str) -> None:
    cfg = on_policy_config()
    with_old, state_old, _ = update(model_dir, True, cfg)
    without, state_new, entropy = update(model_dir, False, cfg)
    for name, value in state_old.items():
        torch.testing.assert_close(state_new[name], value, atol=1e-6, rtol=1e-5)
    assert without["actor/grad_norm"] == pytest.approx(with_old["actor/grad_norm"], rel=1e-5)
    assert without["actor/pg_loss"] == pytest.approx(with_old["actor/pg_loss"], rel=1e-5, abs=1e-7)
    # no old-log-prob pass logged the entropy, so the update does (the token mean over the batch)
    assert without["actor/entropy"] == pytest.approx(float(entropy), rel=1e-4)
    assert "actor/entropy" not in with_old  # the trainer logs it from compute_log_prob in that case


def test_rollout_mismatch_metrics(model_dir: str) -> None:
    metrics, _, _ = update(model_dir, False, on_policy_config())
    # |p - p * e^0.1| = p (e^0.1 - 1): positive, below e^0.1 - 1 ~ 0.105 since p < 1
    assert 0 < metrics["training/rollout_probs_diff_mean"] <= metrics["training/rollout_probs_diff_max"] < 0.106


def test_missing_old_log_probs_off_policy_is_refused(model_dir: str) -> None:
    cfg = on_policy_config()
    cfg.ppo_epochs = 2
    engine = FSDPEngine(model_dir, optim_config=cfg.optim)
    batch = make_batch(engine.hf_config.vocab_size)
    with pytest.raises(ValueError, match="on-policy update"):
        PPOActor(engine, cfg).update_policy(batch, mini_batch_size=len(batch), micro_batch_size=2)
    with pytest.raises(ValueError, match="compute_log_prob first"):
        PPOActor(engine, on_policy_config()).update_policy(batch, mini_batch_size=2, micro_batch_size=2)


def test_logits_to_keep_gives_the_full_forward_log_probs(model_dir: str) -> None:
    engine = FSDPEngine(model_dir)
    assert engine.can_keep_logits  # HF Llama restricts its head to the last positions
    batch = make_batch(engine.hf_config.vocab_size)
    kept, _ = PPOActor(engine).compute_log_prob(batch, micro_batch_size=2)
    engine.can_keep_logits = False
    full, _ = PPOActor(engine).compute_log_prob(batch, micro_batch_size=2)
    torch.testing.assert_close(kept, full, atol=1e-6, rtol=0)
