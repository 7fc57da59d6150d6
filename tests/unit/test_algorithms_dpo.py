"""Offline DPO / IPO losses (pure torch): values at known points, the registry, length normalisation."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.algorithms.dpo import compute_dpo_loss, get_dpo_loss_fn, sequence_log_prob

BETA = 0.5


def test_sigmoid_loss_is_log_two_at_equal_margins_and_falls_as_chosen_gains() -> None:
    zero = torch.zeros(3)
    out = compute_dpo_loss(zero, zero, zero, zero, beta=BETA)
    assert torch.allclose(out.losses, torch.full((3,), math.log(2)))
    better = compute_dpo_loss(torch.tensor([1.0]), torch.tensor([-1.0]), zero[:1], zero[:1], beta=BETA)
    assert better.losses.item() == pytest.approx(-math.log(1 / (1 + math.exp(-BETA * 2))))
    assert better.chosen_rewards.item() == pytest.approx(BETA) and better.rejected_rewards.item() == pytest.approx(-BETA)


def test_ipo_loss_is_zero_at_the_target_margin() -> None:
    target = torch.tensor([1 / (2 * BETA)])
    zero = torch.zeros(1)
    assert compute_dpo_loss(target, zero, zero, zero, beta=BETA, loss_type="ipo").losses.item() == pytest.approx(0.0)
    assert compute_dpo_loss(zero, zero, zero, zero, beta=BETA, loss_type="ipo").losses.item() == pytest.approx(1.0)


def test_unknown_loss_type_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="use one of ipo, sigmoid"):
        get_dpo_loss_fn("hinge")


def test_ipo_averages_log_probs_over_tokens_and_sigmoid_sums_them() -> None:
    logp = torch.tensor([[-1.0, -2.0, -3.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert sequence_log_prob(logp, mask, "sigmoid").item() == pytest.approx(-6.0)
    assert sequence_log_prob(logp, mask, "ipo").item() == pytest.approx(-2.0)
