"""Per-token KL estimators (``kl_penalty``) and the KL-in-reward penalty (``apply_kl_penalty``)."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from .torch_functional import masked_mean

_BASE_KL: tuple[str, ...] = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
# Accepted names: the estimators plus the straight-through "+" forms of k1/k2/k3 (see kl_penalty).
# Kept equal to hybridflow.config.KL_PENALTIES (a unit test checks it).
KL_PENALTIES: tuple[str, ...] = (*_BASE_KL, "k1+", "k2+", "k3+", "low_var_kl+")


class KLController(Protocol):
    """What ``apply_kl_penalty`` needs from a KL controller: a ``value`` and an ``update``."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...


def _unknown(name: str) -> ValueError:
    valid = ", ".join(KL_PENALTIES)
    return ValueError(
        f"Unknown KL penalty {name!r}. Valid names: {valid} ('+': the value of that estimator with the "
        "gradient of k2). Fix algorithm.kl_penalty or actor_rollout_ref.actor.kl_loss_type."
    )


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Value of the per-token KL estimator ``kl_penalty`` (without a "+" suffix) between policy and reference."""
    # Estimators k1/k2/k3: Schulman 2020, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        # k3 = r - log r - 1 with r = pi_ref / pi; clamps as verl to keep exp() and the value bounded.
        log_r = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
        k3 = torch.exp(log_r) - log_r - 1
        return torch.clamp(k3, min=-10.0, max=10.0)
    raise _unknown(kl_penalty)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate; a "+" suffix (e.g. ``k3+``) keeps the value but takes k2's gradient.

    k1 and k3 are unbiased for the KL value but their expected gradients are not the KL gradient;
    k2's gradient is. ``x+`` therefore returns ``k2 - sg[k2] + sg[x]`` (straight-through), as verl
    does, following Liu et al. 2025 (arXiv 2505.17508).
    """
    if kl_penalty not in KL_PENALTIES:
        raise _unknown(kl_penalty)
    straight_through = kl_penalty.endswith("+")
    base = kl_penalty[:-1] if straight_through else kl_penalty
    value = kl_penalty_forward(logprob, ref_logprob, base)
    if not straight_through or base in ("mse", "k2"):
        return value
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + value.detach()


# Alias so functions whose verl-compatible keyword is also called `kl_penalty` can reach the estimator.
_kl_estimate = kl_penalty


def compute_rewards(
    token_level_scores: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_ratio: float
) -> torch.Tensor:
    """Token rewards with a k1 KL penalty: ``scores - kl_ratio * (log pi_old - log pi_ref)``."""
    # KL-shaped reward: Ziegler et al. 2019 (arXiv 1909.08593) R = r - beta * log(pi / pi_ref).
    return token_level_scores - kl_ratio * (old_log_prob - ref_log_prob)


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: KLController,
    kl_penalty: str = "kl",
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Subtract ``beta * KL`` from the token scores, then let the controller adapt ``beta``.

    Returns ``(token_level_rewards, metrics)`` with ``actor/reward_kl_penalty`` (the mean per-sequence
    KL used to update the controller) and ``actor/reward_kl_penalty_coeff`` (the beta applied), the
    metric names verl logs. The controller is updated with ``n_steps`` = batch size, as verl does.
    """
    with torch.no_grad():  # rewards carry no gradient, so a "+" suffix changes nothing here
        kld = _kl_estimate(old_log_prob, ref_log_prob, kl_penalty) * response_mask
    beta = float(kl_ctrl.value)
    token_level_rewards = token_level_scores - beta * kld
    current_kl = masked_mean(kld, response_mask, axis=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
