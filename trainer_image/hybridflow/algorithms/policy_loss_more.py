"""verl's other registered policy losses: sapo, geo_mean, clip_cov, kl_cov, up, dppo_tv, dppo_kl, dro, bypass_mode.

Same call and return as ``policy_loss`` (``fn(old_log_prob, log_prob, advantages, response_mask,
loss_agg_mode, config, rollout_log_probs=None, rollout_is_weights=None)`` -> ``(loss, metrics)``), the
same config keys as verl (actor config: ``clip_ratio*``, ``clip_ratio_c``, ``tau_pos`` / ``tau_neg``;
``policy_loss``: ``clip_cov_ratio`` / ``clip_cov_lb`` / ``clip_cov_ub``, ``kl_cov_ratio``, ``ppo_kl_coef``,
``dro_beta``, ``rollout_correction``) and verl's numbers. Metrics are verl's per loss: kl_cov reports only
``actor/ppo_kl`` (the mean |log ratio|), clip_cov no ``actor/pg_clipfrac_lower``.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ._compat import cfg_get
from .aggregation import agg_loss
from .policy_loss import (
    _clip_range,
    _dual_clip_bound,
    _metrics,
    _rollout_correction,
    compute_policy_loss_vanilla,
    register_policy_loss,
)
from .rollout_corr import correction_metrics, importance_weights, rejection_mask
from .torch_functional import masked_mean


def _warn_forced_mode(name: str, loss_agg_mode: str) -> None:
    if loss_agg_mode != "seq-mean-token-mean":
        warnings.warn(
            f"{name} ignores loss_agg_mode={loss_agg_mode!r} and reduces per sequence (as verl); set "
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean, so that gradient accumulation over "
            "micro-batches also counts sequences (exact global mean), and to silence this.",
            stacklevel=3,
        )


def _log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor, clamp: bool = True) -> torch.Tensor:
    log_ratio = log_prob - old_log_prob
    return torch.clamp(log_ratio, min=-20.0, max=20.0) if clamp else log_ratio


def _policy_loss_cfg(config: Any) -> Any:
    return cfg_get(config, "policy_loss", None)


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_log_probs: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """SAPO: a smooth sigmoid gate of the ratio replaces the hard clip; per-sequence reduction."""
    _warn_forced_mode("sapo", loss_agg_mode)
    tau_pos = float(cfg_get(config, "tau_pos", 1.0))
    tau_neg = float(cfg_get(config, "tau_neg", 1.05))
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    # SAPO: Gao et al. 2025 (arXiv 2511.20347) f(r, tau) = sigmoid(tau (r - 1)) * 4 / tau, with
    # tau_pos for A > 0 and tau_neg otherwise; its gradient at r = 1 equals the plain policy gradient.
    tau = torch.where(advantages > 0, torch.full_like(advantages, tau_pos), torch.full_like(advantages, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = _rollout_correction(-gate * advantages, old_log_prob, config, rollout_log_probs, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean")
    return pg_loss, _metrics(torch.zeros(()), masked_mean(-log_ratio, response_mask), 0.0)


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_log_probs: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """GMPO: the geometric mean of the token ratios (each clipped in log space) times the sequence advantage.

    Reduced as a mean over sequences whatever ``loss_agg_mode`` says. verl divides by every row; here rows
    without a valid token do not count (the same number whenever every row has a token).
    """
    _warn_forced_mode("geo_mean", loss_agg_mode)
    clip_low, clip_high = _clip_range(config)
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob  # unclamped, as verl: the clip below bounds it
    ppo_kl = masked_mean(-log_ratio, response_mask)
    # GMPO: Zhao et al. 2025 (arXiv 2507.20673): per token clip log r to [-eps_low, eps_high] on the side
    # the advantage's sign pushes (min of sgn(A) log r and sgn(A) clip(log r)), then
    # r_seq = exp(mean_t log r_t) and L = -A_seq r_seq.
    sign = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -clip_low, clip_high)
    log_ratio_min = sign * torch.minimum(sign * log_ratio, sign * clamped)
    lengths = mask.sum(dim=-1)
    seq_ratio = torch.exp((log_ratio_min * mask).sum(dim=-1) / (lengths + 1e-8))
    seq_adv = (advantages * mask).sum(dim=-1) / (lengths + 1e-8)
    pg_losses = -seq_adv * seq_ratio
    if rollout_is_weights is not None:  # token weights -> one per sequence, by their geometric mean
        log_w = (torch.log(rollout_is_weights.detach() + 1e-10) * mask).sum(dim=-1) / (lengths + 1e-8)
        pg_losses = pg_losses * torch.exp(log_w)
    cap = float(cfg_get(config, "tis_imp_ratio_cap", -1.0))
    if rollout_log_probs is not None and cap > 0:
        log_w = (torch.exp(old_log_prob - rollout_log_probs).clamp(max=cap).log() * mask).sum(dim=-1)
        pg_losses = pg_losses * torch.exp(log_w / (lengths + 1e-8)).detach()
    valid = (lengths > 0).to(pg_losses.dtype)
    pg_loss = (pg_losses * valid).sum() / valid.sum().clamp(min=1)
    clipped = torch.ne(log_ratio, clamped)
    pg_clipfrac = masked_mean((clipped & (advantages > 0)).float(), response_mask)
    pg_clipfrac_lower = masked_mean((clipped & (advantages < 0)).float(), response_mask)
    return pg_loss, _metrics(pg_clipfrac, ppo_kl, pg_clipfrac_lower)


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_log_probs: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Clip-Cov: PPO clip, plus a random few tokens whose advantage-log-prob covariance is in [lb, ub] get no gradient."""
    pl = _policy_loss_cfg(config)
    ratio_k = float(cfg_get(pl, "clip_cov_ratio", 0.0002))
    lower_bound = float(cfg_get(pl, "clip_cov_lb", 1.0))
    upper_bound = float(cfg_get(pl, "clip_cov_ub", 5.0))
    if ratio_k <= 0:
        raise ValueError(f"clip_cov_ratio={ratio_k} must be > 0; fix actor_rollout_ref.actor.policy_loss.clip_cov_ratio.")
    clip_low, clip_high = _clip_range(config)
    log_ratio = log_prob - old_log_prob  # unclamped, as verl
    ratio = torch.exp(log_ratio)
    valid = response_mask > 0
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clipped_by_ppo = (loss_clipped > loss_unclipped) & valid
    # Clip-Cov: Cui et al. 2025 (arXiv 2505.22617) centred covariance per token
    # (A - mean A)(log pi - mean log pi); a random clip_cov_ratio share of the tokens not already
    # clipped and inside (lb, ub) are cut from the gradient.
    with torch.no_grad():
        cov = (advantages - masked_mean(advantages, response_mask)) * (
            log_prob.detach() - masked_mean(log_prob.detach(), response_mask)
        )
        eligible = torch.nonzero((cov > lower_bound) & (cov < upper_bound) & valid & ~clipped_by_ppo)
        n_clip = max(int(ratio_k * response_mask.sum().item()), 1)
        chosen = eligible[torch.randperm(len(eligible))[:n_clip]] if len(eligible) else eligible
        keep = torch.ones_like(advantages)
        keep[chosen[:, 0], chosen[:, 1]] = 0
    pg_losses = torch.maximum(loss_unclipped, loss_clipped) * keep
    pg_losses = _rollout_correction(pg_losses, old_log_prob, config, rollout_log_probs, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, {
        "actor/pg_clipfrac": masked_mean((keep == 0).float(), response_mask).item(),
        "actor/ppo_kl": masked_mean(-log_ratio, response_mask).detach().item(),
    }


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_log_probs: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """KL-Cov: unclipped ratio loss; the kl_cov_ratio share of tokens with the largest covariance add ppo_kl_coef |log r|."""
    pl = _policy_loss_cfg(config)
    ratio_k = float(cfg_get(pl, "kl_cov_ratio", 0.0002))
    coef = float(cfg_get(pl, "ppo_kl_coef", 0.1))
    if ratio_k <= 0:
        raise ValueError(f"kl_cov_ratio={ratio_k} must be > 0; fix actor_rollout_ref.actor.policy_loss.kl_cov_ratio.")
    log_ratio = log_prob - old_log_prob  # unclamped, as verl
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio
    valid = response_mask > 0
    # KL-Cov: Cui et al. 2025 (arXiv 2505.22617): the top-k tokens by centred covariance of advantage and
    # log-prob over the valid tokens get an extra |log r| penalty, k = max(1, int(ratio x tokens)).
    n_valid = int(valid.sum().item())
    if n_valid:
        with torch.no_grad():
            adv_v, logp_v = advantages[valid].detach(), log_prob[valid].detach()
            cov = (adv_v - adv_v.mean()) * (logp_v - logp_v.mean())
            top = torch.topk(cov, max(1, int(n_valid * ratio_k))).indices
            penalised = torch.zeros(n_valid, dtype=torch.bool, device=cov.device)
            penalised[top] = True
            selected = torch.zeros_like(valid)
            selected[valid] = penalised
        pg_losses = torch.where(selected, pg_losses + coef * log_ratio.abs(), pg_losses)
    pg_losses = _rollout_correction(pg_losses, old_log_prob, config, rollout_log_probs, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, {"actor/ppo_kl": masked_mean(log_ratio.abs(), response_mask).detach().item()}


@register_policy_loss("up")
def compute_policy_loss_up(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_log_probs: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """UP-GRPO: unclipped self-anchored REINFORCE for A > 0, PPO clip with dual clip for A <= 0."""
    clip_low, clip_high = _clip_range(config)
    clip_ratio_c = _dual_clip_bound(config)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    # UP (arXiv 2607.06987, eq. 15): for A > 0 the ratio pi / sg[pi] (value 1, gradient of log pi) drops the
    # pi_old anchor and the clip; A <= 0 keeps the symmetric clip and the dual clip.
    positive = -advantages * torch.exp(log_prob - log_prob.detach())
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_loss = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = -advantages * clip_ratio_c
    negative = torch.where(advantages < 0, torch.minimum(loss_dual, clip_loss), clip_loss)
    pg_losses = torch.where(advantages > 0, positive, negative)
    pg_losses = _rollout_correction(pg_losses, old_log_prob, config, rollout_log_probs, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    non_positive = response_mask * (advantages <= 0).to(response_mask.dtype)
    clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), non_positive)
    clipfrac_lower = masked_mean((torch.gt(clip_loss, loss_dual) & (advantages < 0)).float(), response_mask)
    return pg_loss, _metrics(clipfrac, masked_mean(-log_ratio, response_mask), clipfrac_lower)


def _dppo_loss(
    valid_positive: torch.Tensor,
    valid_negative: torch.Tensor,
    ratio: torch.Tensor,
    log_ratio: torch.Tensor,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_log_probs: torch.Tensor | None,
    rollout_is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """DPPO's shared tail: drop tokens outside the divergence trust region, TIS-truncated ratio, -w A log pi."""
    # DPPO: arXiv 2602.04879 (section 5.4): the truncation cap is clip_ratio_c (large, so its bias is small).
    cap = float(cfg_get(config, "clip_ratio_c", 20.0))
    truncated = torch.clamp(ratio, max=cap).detach()
    keep = torch.where(advantages > 0, valid_positive, valid_negative).detach().float()
    pg_losses = -advantages * truncated * log_prob * keep
    pg_losses = _rollout_correction(pg_losses, old_log_prob, config, rollout_log_probs, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    clipfrac = masked_mean(1.0 - keep, response_mask)
    clipfrac_lower = masked_mean((ratio > cap).float() * keep, response_mask)
    return pg_loss, _metrics(clipfrac, masked_mean(-log_ratio, response_mask), clipfrac_lower)


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_log_probs: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """DPPO-Binary-TV: a token leaves the loss when pi - pi_old passes clip_ratio_high (A > 0) or -clip_ratio_low."""
    low, high = _clip_range(config)  # here total-variation thresholds, not ratio epsilons
    log_ratio = _log_ratio(log_prob, old_log_prob)
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    return _dppo_loss(
        (prob - old_prob) <= high, (prob - old_prob) >= -low, torch.exp(log_ratio), log_ratio, old_log_prob,
        log_prob, advantages, response_mask, loss_agg_mode, config, rollout_log_probs, rollout_is_weights,
    )


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_log_probs: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """DPPO-Binary-KL: as dppo_tv with the KL of the two Bernoulli(pi of the token) distributions as divergence."""
    low, high = _clip_range(config)  # here binary-KL thresholds
    log_ratio = _log_ratio(log_prob, old_log_prob)
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    # KL(Bern(p_old) || Bern(p)) = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p)).
    binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
    )
    return _dppo_loss(
        (binary_kl <= high) | (prob <= old_prob), (binary_kl <= low) | (prob >= old_prob), torch.exp(log_ratio),
        log_ratio, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_log_probs,
        rollout_is_weights,
    )


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_log_probs: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """DRO: -(A log pi - beta/2 (log pi - log pi_old)^2) per token, a quadratic proximal penalty instead of a clip."""
    beta = cfg_get(_policy_loss_cfg(config), "dro_beta", None)
    if beta is None or float(beta) <= 0:
        raise ValueError(
            f"dro needs a positive dro_beta (got {beta}); set actor_rollout_ref.actor.policy_loss.dro_beta, e.g. 0.1."
        )
    log_ratio = log_prob - old_log_prob
    # DRO: Richemond et al. 2024 (arXiv 2405.19107); Kimi k1.5 (arXiv 2501.12599) section 2.3.
    pg_losses = -(advantages * log_prob - 0.5 * float(beta) * log_ratio.square())
    pg_losses = _rollout_correction(pg_losses, old_log_prob, config, rollout_log_probs, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, _metrics(torch.zeros(()), masked_mean(-log_ratio, response_mask), 0.0)


def _threshold(value: float | str) -> tuple[float | None, float]:
    """verl's IS threshold: an upper bound, or 'lower_upper' (weights outside the band are zeroed)."""
    if isinstance(value, str) and "_" in value:
        low, high = value.split("_", 1)
        return float(low), float(high)
    return None, float(value)


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """REINFORCE with optional importance weights: -sg[w] A log pi; no ratio, no clip (bypass mode's reinforce)."""
    pg_losses = -advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.detach()
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, {"actor/ppo_kl": masked_mean(rollout_log_prob - log_prob, response_mask).detach().item()}


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_log_probs: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Bypass mode (``old_log_prob`` is the rollout's): rollout correction against the current policy, then
    PPO clip (``loss_type=ppo_clip``, the ratio already is pi / pi_rollout: weights only logged) or
    REINFORCE with the weights (``loss_type=reinforce``). Settings: ``config.policy_loss.rollout_correction``.
    """
    correction = cfg_get(_policy_loss_cfg(config), "rollout_correction", None)
    if correction is None:
        raise ValueError(
            "loss_mode=bypass_mode reads actor.policy_loss.rollout_correction, which the config fills from "
            "algorithm.rollout_correction when algorithm.rollout_correction.bypass_mode=true; set that instead."
        )
    rollout_log_prob = old_log_prob
    level = cfg_get(correction, "rollout_is", None)
    lower, upper = _threshold(cfg_get(correction, "rollout_is_threshold", 2.0))
    with torch.no_grad():
        log_ratio = (log_prob.detach() - rollout_log_prob) * response_mask
        weights = keep = None
        if level is not None:
            weights = importance_weights(log_ratio, response_mask, level, lower, upper,
                                         bool(cfg_get(correction, "rollout_is_batch_normalize", False)))
        mask = response_mask
        if cfg_get(correction, "rollout_rs", None):
            if not hasattr(correction, "rs_options"):
                raise ValueError("bypass_mode with rollout_rs needs the parsed config (algorithm.rollout_correction).")
            keep = rejection_mask(log_ratio, response_mask, correction.rs_options())
            mask = response_mask * keep
        corr_metrics = correction_metrics(log_prob.detach(), rollout_log_prob, response_mask, weights, keep,
                                          upper if lower is None else None)
    if cfg_get(correction, "loss_type", "ppo_clip") == "reinforce":
        pg_loss, metrics = compute_policy_loss_reinforce(rollout_log_prob, log_prob, advantages, mask,
                                                         loss_agg_mode, weights)
    else:  # ppo_clip
        pg_loss, metrics = compute_policy_loss_vanilla(rollout_log_prob, log_prob, advantages, mask,
                                                       loss_agg_mode, config)
    metrics.update(corr_metrics)
    return pg_loss, metrics
