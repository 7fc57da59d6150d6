"""Online DPO as an advantage estimator: its weights through the PPO loss give exactly the DPO gradient."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hybridflow.algorithms import (
    compute_online_dpo_advantage,
    compute_policy_loss_vanilla,
    get_adv_estimator_fn,
)
from hybridflow.config import ConfigError, load_config
from hybridflow.protocol import DataProto
from hybridflow.trainer import batch_ops
from hybridflow.trainer.ray_trainer import needs_old_log_prob_pass

BETA = 0.3
# Three prompts x three responses; the third group's responses all score 1 (no preference, no pair).
UID = np.array(["a", "a", "a", "b", "b", "b", "c", "c", "c"], dtype=object)
SCORES = [0.0, 1.0, 0.5, 2.0, -1.0, 2.0, 1.0, 1.0, 1.0]
LENGTHS = [3, 5, 1, 4, 2, 5, 3, 3, 2]
T = 5


def token_level(scores: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in LENGTHS])
    rewards = torch.zeros(len(scores), T)
    for i, (s, n) in enumerate(zip(scores, LENGTHS, strict=True)):
        rewards[i, n - 1] = s  # the score on the last valid token, as the reward manager places it
    return rewards, mask


def test_weights_through_the_ppo_loss_give_the_dpo_gradient() -> None:
    torch.manual_seed(0)
    rewards, mask = token_level(SCORES)
    log_prob = (torch.randn(9, T) - 2).requires_grad_()
    ref = torch.randn(9, T) - 2
    adv, returns = compute_online_dpo_advantage(
        token_level_rewards=rewards,
        response_mask=mask,
        index=UID,
        old_log_probs=log_prob.detach(),
        ref_log_prob=ref,
        beta=BETA,
    )
    assert torch.equal(adv, returns)
    pg_loss, _ = compute_policy_loss_vanilla(
        old_log_prob=log_prob.detach(),
        log_prob=log_prob,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode="seq-mean-token-sum",
    )
    (pg_grad,) = torch.autograd.grad(pg_loss, log_prob)

    # The DPO loss written out: group a prefers row 1 over row 0, group b row 3 (first of the tied
    # best) over row 4; group c has no pair.
    seq = (log_prob * mask).sum(-1)
    ref_seq = (ref * mask).sum(-1)

    def margin(c: int, r: int) -> torch.Tensor:
        return BETA * ((seq[c] - ref_seq[c]) - (seq[r] - ref_seq[r]))

    dpo = -(torch.nn.functional.logsigmoid(margin(1, 0)) + torch.nn.functional.logsigmoid(margin(3, 4))) / 2
    (dpo_grad,) = torch.autograd.grad(dpo, log_prob)
    torch.testing.assert_close(pg_grad, dpo_grad, rtol=1e-5, atol=1e-7)
    assert pg_grad[[2, 5, 6, 7, 8]].abs().max() == 0  # rows outside a pair get no gradient
    assert (adv[1, : LENGTHS[1]] > 0).all() and (adv[0, : LENGTHS[0]] < 0).all()
    assert (adv * (1 - mask)).abs().max() == 0


def test_no_preference_no_update_and_the_registry_name() -> None:
    rewards, mask = token_level([1.0] * 9)
    zeros = torch.zeros(9, T)
    adv, _ = get_adv_estimator_fn("online_dpo")(
        token_level_rewards=rewards, response_mask=mask, index=UID, old_log_probs=zeros, ref_log_prob=zeros
    )
    assert adv.abs().max() == 0


def test_missing_log_probs_are_named() -> None:
    rewards, mask = token_level(SCORES)
    with pytest.raises(ValueError, match="online_dpo needs `old_log_probs` and `ref_log_prob`"):
        compute_online_dpo_advantage(token_level_rewards=rewards, response_mask=mask, index=UID)


def test_step_metrics_before_any_update() -> None:
    """Policy equal to the reference (step 1): margins 0, loss log 2, no pair ranked right yet."""
    rewards, mask = token_level(SCORES)
    lp = torch.full((9, T), -1.5)
    batch = DataProto.from_dict(
        tensors={
            "token_level_rewards": rewards,
            "response_mask": mask,
            "old_log_probs": lp,
            "ref_log_prob": lp,
        },
        non_tensors={"uid": UID},
    )
    metrics = batch_ops.online_dpo_metrics(batch, BETA)
    assert metrics == {
        "dpo/loss": pytest.approx(math.log(2)),
        "dpo/pairs": 2.0,
        "dpo/margin_mean": 0.0,
        "dpo/accuracy": 0.0,
        "dpo/kl": 0.0,
    }
    batch.batch["old_log_probs"] = lp + 0.1 * mask * torch.tensor(SCORES).unsqueeze(-1)  # chosen rows gained
    moved = batch_ops.online_dpo_metrics(batch, BETA)
    assert moved["dpo/accuracy"] == 1.0 and moved["dpo/margin_mean"] > 0 and moved["dpo/loss"] < math.log(2)
    # per-token KL estimate: 0.1 x score on every valid token of each response, averaged over the tokens
    lengths = torch.tensor(LENGTHS, dtype=torch.float32)
    expected_kl = float((0.1 * torch.tensor(SCORES) * lengths).sum() / lengths.sum())
    assert moved["dpo/kl"] == pytest.approx(expected_kl, abs=1e-6)


def online_dpo(*overrides: str):  # noqa: ANN201 - the config model
    base = [
        "algorithm.adv_estimator=online_dpo",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    ]
    return load_config(None, [*base, *overrides])


def test_config_turns_on_the_reference_and_the_old_log_prob_pass() -> None:
    cfg = online_dpo()
    assert cfg.ref_enabled and cfg.algorithm.dpo_beta == 0.1
    assert needs_old_log_prob_pass(cfg)  # on-policy, but the weights read the policy's log-probs


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ("actor_rollout_ref.actor.loss_agg_mode=token-mean", "needs seq-mean-token-sum"),
        ("algorithm.use_kl_in_reward=true", "set use_kl_in_reward=false"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "vanilla policy loss only"),
        ("actor_rollout_ref.rollout.n=1", "online_dpo compares several responses"),
        ("algorithm.dpo_beta=0", "algorithm.dpo_beta: must be > 0"),
    ],
)
def test_config_problems_are_named(override: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        online_dpo(override)
