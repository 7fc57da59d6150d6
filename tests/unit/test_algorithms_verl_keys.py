"""The config keys of verl's further estimators and losses: fields, cross-field rules, bypass-mode routing,
the advantage call's new inputs, and the actor's sum of pi^2 (tiny model, one process)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.config import ConfigError, load_config
from hybridflow.protocol import DataProto
from hybridflow.trainer import batch_ops

BASE = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4", "data.train_batch_size=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8"]


def problems(*overrides: str) -> list[str]:
    try:
        load_config(None, [*BASE, *overrides])
    except ConfigError as exc:
        return exc.problems
    return []


def test_verls_sapo_and_otb_command_lines_set_real_fields() -> None:
    cfg = load_config(None, [*BASE, "actor_rollout_ref.actor.policy_loss.loss_mode=sapo",
                             "actor_rollout_ref.actor.tau_pos=1.0", "actor_rollout_ref.actor.tau_neg=1.05"])
    assert (cfg.actor_rollout_ref.actor.tau_pos, cfg.actor_rollout_ref.actor.tau_neg) == (1.0, 1.05)
    cfg = load_config(None, [*BASE, "algorithm.adv_estimator=optimal_token_baseline",
                             "actor_rollout_ref.actor.calculate_sum_pi_squared=True"])
    assert cfg.actor_rollout_ref.actor.calculate_sum_pi_squared is True
    assert cfg.verl_notes == []  # a real field: no "accepted without effect" note


@pytest.mark.parametrize(("overrides", "expected"), [
    (["algorithm.adv_estimator=optimal_token_baseline"], "actor_rollout_ref.actor.calculate_sum_pi_squared: "),
    (["algorithm.adv_estimator=tir_optimal_token_baseline", "actor_rollout_ref.actor.calculate_sum_pi_squared=true",
      "algorithm.rollout_correction.bypass_mode=true"], "algorithm.rollout_correction.bypass_mode: "),
    (["algorithm.adv_estimator=gdpo"], "algorithm.gdpo_reward_keys: "),
    (["algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[a,b]", "algorithm.gdpo_reward_weights=[1.0]"],
     "algorithm.gdpo_reward_weights: 1 weights for 2"),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=dro"], "actor_rollout_ref.actor.policy_loss.dro_beta: "),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode"], "actor_rollout_ref.actor.policy_loss.loss_mode: "),
    (["algorithm.rollout_correction.loss_type=reinforce"], "algorithm.rollout_correction.loss_type: "),
    (["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_is=token",
      "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean"], "actor_rollout_ref.actor.policy_loss.loss_mode: "),
    (["actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is=token"],
     "actor_rollout_ref.actor.policy_loss.rollout_correction: filled from algorithm.rollout_correction"),
])
def test_rules_name_the_key_and_the_fix(overrides: list[str], expected: str) -> None:
    found = problems(*overrides)
    assert any(p.startswith(expected) for p in found), found


def test_bypass_mode_with_correction_routes_to_verls_bypass_loss() -> None:
    """verl's apply_bypass_mode: loss_mode becomes bypass_mode and the actor's policy_loss gets the settings."""
    rs = ["algorithm.rollout_correction.rollout_rs='token_k1,seq_max_k2'",
          "algorithm.rollout_correction.rollout_rs_threshold='0.6_1.6,2.5'"]
    cfg = load_config(None, [*BASE, "algorithm.rollout_correction.bypass_mode=true",
                             "algorithm.rollout_correction.rollout_is=token", *rs])
    policy_loss = cfg.actor_rollout_ref.actor.policy_loss
    assert policy_loss.loss_mode == "bypass_mode"
    assert policy_loss.rollout_correction == cfg.algorithm.rollout_correction
    assert load_config(None, [*BASE]).actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    from hybridflow.config import parse_config

    assert parse_config(cfg.to_dict()) == cfg  # the filled settings survive a round trip
    plain = load_config(None, [*BASE, "algorithm.rollout_correction.bypass_mode=true"])  # no IS/RS: the user's loss
    assert plain.actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    reinforce = load_config(None, [*BASE, "algorithm.rollout_correction.bypass_mode=true",
                                   "algorithm.rollout_correction.loss_type=reinforce"])
    assert reinforce.actor_rollout_ref.actor.policy_loss.loss_mode == "bypass_mode"


def test_compute_advantage_hands_gdpo_the_reward_components_and_otb_sum_pi_squared() -> None:
    rows, resp = 4, 3
    mask = torch.ones(rows, resp)
    batch = DataProto.from_dict(
        tensors={"token_level_rewards": torch.zeros(rows, resp), "response_mask": mask,
                 "prompts": torch.zeros(rows, 2, dtype=torch.long),
                 "attention_mask": torch.ones(rows, 2 + resp, dtype=torch.long),
                 "old_log_probs": torch.full((rows, resp), -1.0), "sum_pi_squared": torch.full((rows, resp), 0.3)},
        non_tensors={"uid": np.array(["u", "u", "v", "v"], dtype=object),
                     "reward_extra/fmt": np.array([1.0, 0.0, 0.0, 1.0], dtype=object)},
    )
    cfg = load_config(None, [*BASE, "algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[fmt]"]).algorithm
    adv = batch_ops.compute_advantage(batch, cfg).batch["advantages"]
    assert adv[0, -1] > 0 > adv[1, -1] and adv[3, -1] > 0 > adv[2, -1]  # the component, not the zero reward
    cfg = load_config(None, [*BASE, "algorithm.adv_estimator=optimal_token_baseline",
                             "actor_rollout_ref.actor.calculate_sum_pi_squared=true"]).algorithm
    batch.batch["token_level_rewards"] = torch.tensor([[0, 0, 1.0], [0, 0, 0], [0, 0, 1.0], [0, 0, 1.0]])
    adv = batch_ops.compute_advantage(batch, cfg).batch["advantages"]
    torch.testing.assert_close(adv[0], torch.full((resp,), 0.5), atol=1e-6, rtol=1e-6)  # equal weights: mean baseline


def test_actor_sum_pi_squared_equals_the_softmax_squares(tmp_path) -> None:
    from hybridflow.engines.actor import PPOActor, response_logits
    from hybridflow.engines.fsdp_engine import FSDPEngine
    from hybridflow.models.tiny import build_tiny_model

    engine = FSDPEngine(str(build_tiny_model(tmp_path / "model")))
    vocab, prompt, resp, rows = engine.hf_config.vocab_size, 4, 3, 4
    ids = torch.randint(0, vocab, (rows, prompt + resp), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(rows, prompt + resp, dtype=torch.long)
    mask[0, 0] = 0
    data = DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
                 "responses": ids[:, prompt:].clone()},
        meta_info={"temperature": 0.7},
    )
    got = PPOActor(engine).compute_sum_pi_squared(data, micro_batch_size=3)
    with torch.no_grad():
        expected = torch.softmax(response_logits(engine, data, 0.7).float(), -1).square().sum(-1)
    torch.testing.assert_close(got, expected.cpu(), atol=1e-6, rtol=1e-5)
