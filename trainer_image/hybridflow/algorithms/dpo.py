"""Offline preference losses: DPO (sigmoid) and IPO, from policy and reference log-probs of response pairs.

Pure torch. Every loss in `DPO_LOSS_REGISTRY` takes the same arguments: `logits`, the difference of the
chosen and rejected log-ratios h = (log pi(y_w|x) - log ref(y_w|x)) - (log pi(y_l|x) - log ref(y_l|x)),
and `beta`; it returns one loss per pair. `compute_dpo_loss` adds the implicit rewards
beta * (log pi - log ref) of each side, which the trainer logs (TRL's `rewards/*`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

DpoLossFn = Callable[[torch.Tensor, float], torch.Tensor]


def sigmoid_loss(logits: torch.Tensor, beta: float) -> torch.Tensor:
    """DPO: -log sigmoid(beta h) (Rafailov et al. 2023, arXiv:2305.18290, eq. 7)."""
    return -F.logsigmoid(beta * logits)


def ipo_loss(logits: torch.Tensor, beta: float) -> torch.Tensor:
    """IPO: (h - 1 / (2 beta))^2, regressing the margin onto a fixed target (Azar et al. 2023, arXiv:2310.12036, eq. 17).

    Here beta plays the paper's tau: a larger beta asks for a smaller margin, i.e. stays closer to the reference.
    """
    return (logits - 1.0 / (2.0 * beta)) ** 2


DPO_LOSS_REGISTRY: dict[str, DpoLossFn] = {"sigmoid": sigmoid_loss, "ipo": ipo_loss}

#: Losses whose sequence log-probs are averaged over the response's tokens, not summed (TRL does so for IPO:
#: the squared loss's target margin is then independent of the response length).
LENGTH_NORMALIZED = frozenset({"ipo"})


def get_dpo_loss_fn(name: str) -> DpoLossFn:
    """The loss called `name`; ValueError listing the valid names otherwise."""
    if name not in DPO_LOSS_REGISTRY:
        raise ValueError(f"unknown DPO loss_type {name!r}; use one of {', '.join(sorted(DPO_LOSS_REGISTRY))}")
    return DPO_LOSS_REGISTRY[name]


def sequence_log_prob(token_log_probs: torch.Tensor, mask: torch.Tensor, loss_type: str) -> torch.Tensor:
    """Per-row log-prob of the response: the sum over its tokens, or the mean for a length-normalised loss."""
    mask = mask.to(token_log_probs.dtype)
    total = (token_log_probs * mask).sum(-1)
    if loss_type in LENGTH_NORMALIZED:
        return total / mask.sum(-1).clamp(min=1)
    return total


@dataclass
class DpoOutput:
    """Per-pair losses and implicit rewards beta * (log pi - log ref) (the rewards detached)."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor


def compute_dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
) -> DpoOutput:
    """The preference loss of each pair from sequence log-probs (b,) of the policy and the frozen reference."""
    chosen_ratio = policy_chosen_logps - reference_chosen_logps
    rejected_ratio = policy_rejected_logps - reference_rejected_logps
    losses = get_dpo_loss_fn(loss_type)(chosen_ratio - rejected_ratio, beta)
    return DpoOutput(losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach())
