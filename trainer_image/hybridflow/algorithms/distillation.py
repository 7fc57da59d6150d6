"""On-policy distillation (OPD): a teacher's per-token log-probs on the student's own samples as the signal.

Policy-gradient OPD, verl's `distillation.distillation_loss.use_policy_gradient=true`: the per-token
divergence D_t between student and teacher at the sampled token, estimated from the two log-probs
(k1: log pi(y_t|s_t) - log nu(y_t|s_t), the single-sample reverse KL), is a cost; its negative is the
per-token reward and, with no discounting and no baseline, the per-token advantage:

    A_t = -sg(D_t)                                   use_task_rewards=false
    A_t = A_t(task) - coef * sg(D_t)                 use_task_rewards=true

Sources: Agarwal et al. 2024, "On-Policy Distillation of Language Models" (GKD, arXiv 2306.13649), for
learning from the student's own samples with a reverse KL; Lu & Thinking Machines Lab 2025, "On-Policy
Distillation" (blog), for the negative per-token reverse KL as the advantage (discount 0) of an
importance-sampled policy gradient. Estimators k1/k2/k3: Schulman 2020, "Approximating KL divergence".

Pure torch, no Ray: the trainer calls these on the driver between the teacher's forward and the update.
"""

from __future__ import annotations

import torch

from .kl import kl_penalty_forward
from .torch_functional import masked_mean

#: Single-sample estimators of the reverse KL(student || teacher) at the sampled token, verl's names.
DISTILLATION_LOSS_MODES: tuple[str, ...] = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def compute_distillation_loss(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    loss_mode: str = "k1",
    log_prob_min_clamp: float | None = None,
    loss_max_clamp: float | None = None,
) -> torch.Tensor:
    """Per-token divergence D_t (b, R) between student and teacher at the sampled tokens, without gradient.

    `log_prob_min_clamp` floors both log-probs first (a token the teacher finds nearly impossible would
    otherwise dominate the batch); `loss_max_clamp` then bounds D_t to [-clamp, clamp] (k1 is signed).
    The same clamps and their order as verl's `distillation_loss` keys of these names.
    """
    if loss_mode not in DISTILLATION_LOSS_MODES:
        raise ValueError(
            f"unknown distillation loss_mode {loss_mode!r}; valid: {', '.join(DISTILLATION_LOSS_MODES)}. "
            "Fix distillation.distillation_loss.loss_mode"
        )
    with torch.no_grad():
        student, teacher = student_log_probs.float(), teacher_log_probs.float()
        if log_prob_min_clamp is not None:
            student = student.clamp(min=log_prob_min_clamp)
            teacher = teacher.clamp(min=log_prob_min_clamp)
        losses = kl_penalty_forward(student, teacher, loss_mode)
        if loss_max_clamp is not None:
            losses = losses.clamp(min=-loss_max_clamp, max=loss_max_clamp)
    return losses


def compute_distillation_advantages(
    distillation_losses: torch.Tensor,
    response_mask: torch.Tensor,
    task_advantages: torch.Tensor | None = None,
    distillation_loss_coef: float = 1.0,
) -> torch.Tensor:
    """The advantages the policy loss sees: -D_t alone (no task advantages given), else A_task - coef * D_t.

    Zero outside `response_mask` (prompt padding, tool-output tokens of multi-turn trajectories).
    """
    mask = response_mask.to(distillation_losses.dtype)
    if task_advantages is None:
        return -distillation_losses * mask
    return (task_advantages - distillation_loss_coef * distillation_losses) * mask


def distillation_metrics(distillation_losses: torch.Tensor, response_mask: torch.Tensor) -> dict[str, float]:
    """verl's `actor/distillation/*` metrics of one batch: token-mean loss, its absolute value, min and max."""
    mask = response_mask.bool()
    if not mask.any():
        return {}
    values = distillation_losses[mask]
    return {
        "actor/distillation/loss": float(masked_mean(distillation_losses, response_mask)),
        "actor/distillation/abs_loss": float(values.abs().mean()),
        "actor/distillation/loss_min": float(values.min()),
        "actor/distillation/loss_max": float(values.max()),
    }
