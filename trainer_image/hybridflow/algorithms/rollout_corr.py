"""Rollout correction: importance weights and rejection masks for samples the trained policy did not draw.

The behaviour policy pi_rollout (the engine's log-probs, possibly several weight versions old) differs from
pi_old (the trainer's recomputation). Decoupled PPO keeps both: the clipped ratio is taken against pi_old and
each token's loss is weighted by rho = pi_old / pi_rollout (Hilton et al. 2022, "Batch size-invariance for
policy optimization", arXiv 2110.00641; AReaL's decoupled PPO, arXiv 2505.24298). Weights are truncated
(TIS, Yao et al. 2025) or zeroed outside a band (IcePop); rejection sampling drops tokens or whole sequences
whose divergence is too large (Liu, Li et al. 2025, https://richardli.xyz/rl-collapse; k1/k2/k3 are
Schulman's KL estimators, http://joschu.net/blog/kl-approx.html). Metric names follow verl's
`rollout_corr/*`. Pure torch.
"""

from __future__ import annotations

import math

import torch

from .torch_functional import masked_mean

LOG_BOUND = 20.0  # weights are safety-bounded to [e^-20, e^20] before truncation


def _seq_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum(-1)


def importance_weights(
    log_ratio: torch.Tensor, mask: torch.Tensor, level: str, lower: float | None, upper: float, normalize: bool
) -> torch.Tensor:
    """rho per token (b, R): exp(log pi_old - log pi_rollout) per token, or its product over the sequence
    broadcast to every token; truncated at `upper` (or zeroed outside [lower, upper]); 0 off the mask."""
    valid = mask.float()
    if level == "sequence":
        log_w = _seq_sum(log_ratio, valid).clamp(-LOG_BOUND, LOG_BOUND).unsqueeze(-1).expand_as(log_ratio)
    else:
        log_w = log_ratio.clamp(-LOG_BOUND, LOG_BOUND)
    weights = log_w.exp()
    if lower is None:
        weights = weights.clamp(max=upper)
    else:
        weights = weights * ((weights >= lower) & (weights <= upper)).float()
    weights = weights * valid
    if normalize:
        if level == "sequence":
            seq = weights.amax(-1)
            has = valid.amax(-1) > 0
            mean = seq[has].mean() if has.any() else torch.tensor(1.0)
        else:
            mean = masked_mean(weights, valid)
        weights = weights / mean.clamp(min=1e-8)
    return weights.detach()


def _divergence(log_ratio: torch.Tensor, stat: str) -> torch.Tensor:
    if stat == "k1":
        return -log_ratio
    if stat == "k2":
        return 0.5 * log_ratio.square()
    return torch.expm1(log_ratio) - log_ratio  # k3 >= 0


def rejection_mask(
    log_ratio: torch.Tensor, mask: torch.Tensor, options: list[tuple[str, str, float | None, float]]
) -> torch.Tensor:
    """1 where a token survives every option, else 0 (b, R). k1 bounds the ratio (as log-ratio bounds on the
    token, the sequence sum or mean), k2 / k3 bound the divergence from above."""
    valid = mask.bool()
    keep = valid.clone()
    lengths = valid.sum(-1).clamp(min=1)
    for agg, stat, lower, upper in options:
        div = _divergence(log_ratio, stat) * valid
        if stat == "k1":
            lo, hi = -math.log(upper), -math.log(lower if lower is not None else 1.0 / upper)  # -log r in [lo, hi]
        else:
            lo, hi = -math.inf, upper
        if agg == "token":
            ok = (div >= lo) & (div <= hi)
        else:
            if agg == "seq_sum":
                value = div.sum(-1)
            elif agg == "seq_mean":
                value = div.sum(-1) / lengths
            else:
                value = div.masked_fill(~valid, -math.inf).amax(-1)
            ok = ((value >= lo) & (value <= hi)).unsqueeze(-1).expand_as(div)
        keep &= ok
    return keep.long()


def correction_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor,
    weights: torch.Tensor | None = None, keep: torch.Tensor | None = None, upper: float | None = None,
) -> dict[str, float]:
    """verl's `rollout_corr/*` diagnostics: how far pi_rollout is from pi_old, and what the correction did."""
    valid = mask.bool()
    if not valid.any():
        return {}
    log_ratio = (old_log_prob - rollout_log_prob) * valid
    lengths = valid.sum(-1).clamp(min=1).float()
    training_log_ppl = -_seq_sum(old_log_prob, valid) / lengths
    rollout_log_ppl = -_seq_sum(rollout_log_prob, valid) / lengths
    has = valid.any(-1)
    ratio = log_ratio.clamp(-LOG_BOUND, LOG_BOUND).exp()
    seq_ratio = _seq_sum(log_ratio, valid).clamp(-LOG_BOUND, LOG_BOUND).exp()
    out = {
        "kl": float((-log_ratio)[valid].mean()),
        "k3_kl": float(_divergence(log_ratio, "k3")[valid].mean()),
        "training_ppl": float(training_log_ppl[has].exp().mean()),
        "rollout_ppl": float(rollout_log_ppl[has].exp().mean()),
        "log_ppl_diff": float((rollout_log_ppl - training_log_ppl)[has].mean()),
        "log_ppl_abs_diff": float((rollout_log_ppl - training_log_ppl)[has].abs().mean()),
        "chi2_token": float(ratio[valid].square().mean() - 1),
        "chi2_seq": float(seq_ratio[has].square().mean() - 1),
    }
    if weights is not None:
        w = weights[valid]
        normalized = w / w.mean().clamp(min=1e-8)
        out.update({
            "rollout_is_mean": float(w.mean()),
            "rollout_is_std": float(w.std()) if w.numel() > 1 else 0.0,
            "rollout_is_min": float(w.min()),
            "rollout_is_max": float(w.max()),
            "rollout_is_eff_sample_size": float(1.0 / normalized.square().mean().clamp(min=1e-8)),
        })
        if upper is not None:
            out["rollout_is_ratio_fraction_high"] = float((ratio[valid] > upper).float().mean())
            out["rollout_is_ratio_fraction_low"] = float((ratio[valid] < 1.0 / upper).float().mean())
    if keep is not None:
        rejected = valid & ~keep.bool()
        out["rollout_rs_masked_fraction"] = float(rejected.sum() / valid.sum())
        out["rollout_rs_seq_masked_fraction"] = float(rejected.any(-1)[has].float().mean())
    return {f"rollout_corr/{k}": v for k, v in out.items()}
