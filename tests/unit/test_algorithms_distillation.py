"""On-policy distillation math (hybridflow.algorithms.distillation) and how batch_ops folds it into the advantages."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from hybridflow._config.distillation import DISTILLATION_LOSS_MODES as CONFIG_MODES
from hybridflow.algorithms import get_policy_loss_fn
from hybridflow.algorithms.distillation import (
    DISTILLATION_LOSS_MODES,
    compute_distillation_advantages,
    compute_distillation_loss,
    distillation_metrics,
)
from hybridflow.config import load_config
from hybridflow.protocol import DataProto
from hybridflow.trainer import batch_ops


def test_the_config_and_the_algorithms_know_the_same_loss_modes() -> None:
    assert DISTILLATION_LOSS_MODES == CONFIG_MODES


def test_k1_is_student_minus_teacher_log_prob_and_carries_no_gradient() -> None:
    student = torch.tensor([[-0.5, -2.0]], requires_grad=True)
    teacher = torch.tensor([[-1.5, -0.5]])
    losses = compute_distillation_loss(student, teacher, "k1")
    assert losses.tolist() == [[1.0, -1.5]]
    assert not losses.requires_grad


def test_log_probs_are_floored_before_the_loss_is_clamped() -> None:
    student, teacher = torch.tensor([[-1.0, -30.0, -1.0]]), torch.tensor([[-40.0, -1.0, -1.0]])
    floored = compute_distillation_loss(student, teacher, "k1", log_prob_min_clamp=-10.0)
    assert floored.tolist() == [[9.0, -9.0, 0.0]]
    both = compute_distillation_loss(student, teacher, "k1", log_prob_min_clamp=-10.0, loss_max_clamp=5.0)
    assert both.tolist() == [[5.0, -5.0, 0.0]]


@pytest.mark.parametrize("mode", ["abs", "k2", "k3"])
def test_other_estimators_are_non_negative_and_zero_when_the_models_agree(mode: str) -> None:
    student = torch.tensor([[-0.5, -2.0, -1.0]])
    teacher = torch.tensor([[-1.5, -0.5, -1.0]])
    losses = compute_distillation_loss(student, teacher, mode)
    assert (losses >= 0).all() and losses[0, 2] == 0


def test_an_unknown_mode_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="forward_kl_topk.*k1.*distillation.distillation_loss.loss_mode"):
        compute_distillation_loss(torch.zeros(1, 1), torch.zeros(1, 1), "forward_kl_topk")


def test_the_advantage_is_minus_the_loss_or_added_to_the_task_advantage() -> None:
    losses = torch.tensor([[1.0, -2.0, 3.0]])
    mask = torch.tensor([[1, 1, 0]])
    alone = compute_distillation_advantages(losses, mask)
    assert alone.tolist() == [[-1.0, 2.0, 0.0]]
    task = torch.tensor([[0.5, 0.5, 0.5]])
    mixed = compute_distillation_advantages(losses, mask, task_advantages=task, distillation_loss_coef=2.0)
    assert mixed.tolist() == [[-1.5, 4.5, 0.0]]


def test_the_policy_gradient_of_minus_k1_is_the_gradient_of_the_reverse_kl() -> None:
    """PG OPD's premise (Thinking Machines 2025): E_{y~pi}[grad log pi(y) * -(log pi(y) - log nu(y))] = -grad KL.

    Every token of a 6-token vocabulary is one row, weighted by pi(y), so the vanilla PPO loss on-policy (ratio 1)
    is the exact expectation; its gradient must equal autograd's gradient of KL(pi || nu).
    """
    torch.manual_seed(0)
    logits = torch.randn(6, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(6), -1)
    log_pi = torch.log_softmax(logits, -1)
    exact = torch.autograd.grad((log_pi.exp() * (log_pi - teacher)).sum(), logits)[0]

    log_pi = torch.log_softmax(logits, -1)
    losses = compute_distillation_loss(log_pi.detach()[:, None], teacher[:, None], "k1")
    weights = log_pi.detach().exp()[:, None] * 6  # pi(y), times 6 rows undoing the token mean: a sum over y
    advantages = compute_distillation_advantages(losses, torch.ones(6, 1)) * weights
    loss, _ = get_policy_loss_fn("vanilla")(
        old_log_prob=log_pi.detach()[:, None],
        log_prob=log_pi[:, None],
        advantages=advantages,
        response_mask=torch.ones(6, 1),
        loss_agg_mode="token-mean",
    )
    (grad,) = torch.autograd.grad(loss, logits)
    assert torch.allclose(grad, exact, atol=1e-6)


def test_minus_k3_as_a_reward_does_not_follow_the_reverse_kl() -> None:
    """Why the config refuses k3 with the policy gradient: its expected gradient is grad KL(pi||nu) - grad KL(nu||pi)."""
    torch.manual_seed(0)
    logits = torch.randn(6, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(6), -1)

    def grad(objective: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return torch.autograd.grad(objective(torch.log_softmax(logits, -1)), logits)[0]

    reverse = grad(lambda lp: (lp.exp() * (lp - teacher)).sum())
    forward = grad(lambda lp: (teacher.exp() * (teacher - lp)).sum())
    k3 = grad(lambda lp: (lp.exp().detach() * compute_distillation_loss(lp.detach(), teacher, "k3") * lp).sum())
    assert torch.allclose(k3, reverse - forward, atol=1e-6)
    assert not torch.allclose(k3, reverse, atol=1e-2)


def test_metrics_are_over_response_tokens_only() -> None:
    losses = torch.tensor([[1.0, -3.0, 100.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert distillation_metrics(losses, mask) == {
        "actor/distillation/loss": 0.0,
        "actor/distillation/abs_loss": 2.0,
        "actor/distillation/loss_min": -3.0,
        "actor/distillation/loss_max": 2.0,
    }
    assert distillation_metrics(losses, torch.zeros(2, 3)) == {}


def _scored_batch() -> DataProto:
    """Two prompts x two samples of 2 response tokens (the first sample one token shorter), GRPO-scored."""
    mask = torch.tensor([[1, 0], [1, 1], [1, 1], [1, 1]])
    scores = torch.zeros(4, 2)
    scores[:, 0] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    return DataProto.from_dict(
        {
            "responses": torch.ones(4, 2, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(4, 2, dtype=torch.long), mask], dim=1),
            "token_level_scores": scores,
            "token_level_rewards": scores.clone(),
            "old_log_probs": torch.tensor([[-1.0, -1.0], [-2.0, -0.5], [-0.1, -0.2], [-3.0, -3.0]]),
            "teacher_log_prob": torch.tensor([[-0.5, -9.0], [-1.0, -0.5], [-0.1, -4.0], [-1.0, -2.0]]),
        },
        {"uid": np.array(["a", "a", "b", "b"], dtype=object)},
    )


def _distillation_config(*overrides: str):  # noqa: ANN202 - the config's loss section
    return load_config(
        None,
        [
            "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "distillation.enabled=true",
            "distillation.distillation_loss.use_policy_gradient=true", "distillation.distillation_loss.loss_mode=k1",
            *overrides,
        ],
    )


def test_without_task_rewards_the_advantages_are_minus_k1_on_response_tokens() -> None:
    cfg = _distillation_config("distillation.distillation_loss.use_task_rewards=false")
    batch = _scored_batch()
    metrics = batch_ops.apply_distillation(batch, cfg.distillation.distillation_loss)
    batch = batch_ops.compute_advantage(batch, cfg.algorithm)
    expected = -(batch.batch["old_log_probs"] - batch.batch["teacher_log_prob"]) * batch_ops.response_mask_of(batch)
    assert torch.equal(batch.batch["advantages"], expected)
    assert metrics["actor/distillation/loss"] == pytest.approx((-0.5 - 1.0 + 0.0 + 0.0 + 3.8 - 2.0 - 1.0) / 7)


def test_with_task_rewards_the_scaled_distillation_term_is_added_to_grpo() -> None:
    cfg = _distillation_config("distillation.distillation_loss.distillation_loss_coef=0.5")
    grpo = batch_ops.compute_advantage(_scored_batch(), cfg.algorithm).batch["advantages"]
    batch = _scored_batch()
    batch_ops.apply_distillation(batch, cfg.distillation.distillation_loss)
    combined = batch_ops.compute_advantage(batch, cfg.algorithm).batch["advantages"]
    mask = batch_ops.response_mask_of(batch)
    k1 = batch.batch["old_log_probs"] - batch.batch["teacher_log_prob"]
    assert torch.allclose(combined, (grpo - 0.5 * k1) * mask)
