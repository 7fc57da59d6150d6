"""Policy losses behind one registry (``register_policy_loss`` / ``get_policy_loss_fn``).

Every loss is called as ``fn(old_log_prob, log_prob, advantages, response_mask,
loss_agg_mode="token-mean", config=None, rollout_log_probs=None)`` with (bs, response_length)
tensors and returns ``(pg_loss, metrics)``: a scalar tensor and a dict of floats with at least
``actor/pg_clipfrac``, ``actor/ppo_kl`` and ``actor/pg_clipfrac_lower`` (verl's current API).
``config`` is the actor config; fields are read with ``cfg_get`` so a pydantic model, a namespace,
an OmegaConf node or a dict all work: ``clip_ratio`` (0.2), ``clip_ratio_low`` / ``clip_ratio_high``
(default ``clip_ratio``), ``clip_ratio_c`` (3.0), ``tis_imp_ratio_cap`` (-1 = off).

Rollout correction (optional):
  - ``rollout_log_probs``: log-probs the inference engine (vLLM/SGLang) reported when sampling. With
    ``tis_imp_ratio_cap > 0`` each token's loss is multiplied by the truncated importance weight
    ``min(exp(old_log_prob - rollout_log_probs), cap)`` (TIS, Yao et al. 2025,
    https://fengyao.notion.site/off-policy-rl), correcting the engine/trainer mismatch.
  - ``rollout_is_weights``: precomputed per-token weights (verl's newer rollout-correction API);
    multiplied in as given. Use one of the two, not both.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from ._compat import cfg_get, lookup, register_in
from .aggregation import agg_loss
from .torch_functional import masked_mean

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, Any]]]

POLICY_LOSS_REGISTRY: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register a policy loss under ``name`` (``actor_rollout_ref.actor.policy_loss.loss_mode``)."""

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        register_in(POLICY_LOSS_REGISTRY, "policy loss", name, fn)
        return fn

    return decorator


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """Return the policy loss registered under ``name``; unknown names raise listing the valid ones."""
    return lookup(POLICY_LOSS_REGISTRY, "policy loss", name, "actor_rollout_ref.actor.policy_loss.loss_mode")


def _clip_range(config: Any) -> tuple[float, float]:
    clip_ratio = float(cfg_get(config, "clip_ratio", 0.2))
    low = float(cfg_get(config, "clip_ratio_low", clip_ratio))
    high = float(cfg_get(config, "clip_ratio_high", clip_ratio))
    return low, high


def _rollout_correction(
    pg_losses: torch.Tensor,
    old_log_prob: torch.Tensor,
    config: Any,
    rollout_log_probs: torch.Tensor | None,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor:
    """Multiply per-token losses by truncated IS weights (TIS) and/or precomputed IS weights."""
    cap = float(cfg_get(config, "tis_imp_ratio_cap", -1.0))
    if rollout_log_probs is not None and cap > 0:
        # TIS (Yao et al. 2025): w = min(pi_old / pi_rollout, C), a constant (no gradient).
        weight = torch.exp(old_log_prob - rollout_log_probs).clamp(max=cap).detach()
        pg_losses = pg_losses * weight
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.detach()
    return pg_losses


def _metrics(clipfrac: torch.Tensor, ppo_kl: torch.Tensor, clipfrac_lower: torch.Tensor | float) -> dict[str, Any]:
    lower = clipfrac_lower.detach().item() if isinstance(clipfrac_lower, torch.Tensor) else float(clipfrac_lower)
    return {
        "actor/pg_clipfrac": clipfrac.detach().item(),
        "actor/ppo_kl": ppo_kl.detach().item(),
        "actor/pg_clipfrac_lower": lower,
    }


def _dual_clip_bound(config: Any) -> float:
    """`clip_ratio_c`, the dual-clip bound for negative advantages (> 1, default 3)."""
    clip_ratio_c = float(cfg_get(config, "clip_ratio_c", 3.0))
    if clip_ratio_c <= 1.0:
        raise ValueError(
            f"clip_ratio_c={clip_ratio_c}: the dual-clip bound must be > 1.0 (default 3.0); "
            "fix actor_rollout_ref.actor.clip_ratio_c."
        )
    return clip_ratio_c


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
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
    """PPO clipped surrogate with asymmetric clip (DAPO clip-higher) and dual clip for negative advantages."""
    clip_low, clip_high = _clip_range(config)
    clip_ratio_c = _dual_clip_bound(config)
    # Clamp the log-ratio so exp() cannot overflow on badly off-policy tokens (as verl).
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)

    # PPO: Schulman et al. 2017 (arXiv 1707.06347) L = max(-A r, -A clip(r, 1-eps_low, 1+eps_high));
    # clip-higher (eps_high > eps_low): DAPO, Yu et al. 2025 (arXiv 2503.14476).
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_loss = torch.maximum(loss_unclipped, loss_clipped)
    pg_clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), response_mask)

    # Dual clip: Ye et al. 2020 (arXiv 1912.09729) for A < 0 also cap the loss at -A * c.
    loss_dual = -advantages * clip_ratio_c
    dual_loss = torch.minimum(loss_dual, clip_loss)
    negative = advantages < 0
    pg_clipfrac_lower = masked_mean((torch.gt(clip_loss, loss_dual) & negative).float(), response_mask)
    pg_losses = torch.where(negative, dual_loss, clip_loss)

    pg_losses = _rollout_correction(pg_losses, old_log_prob, config, rollout_log_probs, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, _metrics(pg_clipfrac, ppo_kl, pg_clipfrac_lower)


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
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
    """GSPO: clip a sequence-level (length-normalised) importance ratio; always aggregated per sequence.

    Like verl, the loss is reduced with ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says
    (the paper's objective is a mean over sequences); another mode triggers a warning.
    """
    if loss_agg_mode != "seq-mean-token-mean":
        warnings.warn(
            f"gspo ignores loss_agg_mode={loss_agg_mode!r} and uses 'seq-mean-token-mean' (as in the GSPO "
            "paper and verl); set actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean to silence this.",
            stacklevel=2,
        )
    clip_low, clip_high = _clip_range(config)
    log_ratio = log_prob - old_log_prob
    mask = response_mask.to(log_ratio.dtype)
    lengths = mask.sum(dim=-1).clamp(min=1)
    # GSPO: Zheng et al. 2025 (arXiv 2507.18071) s_i = (pi(y_i)/pi_old(y_i))^(1/|y_i|); per token
    # s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)] keeps the value s_i and a per-token gradient.
    seq_log_ratio = (torch.where(mask.bool(), log_ratio, 0.0) * mask).sum(dim=-1) / lengths
    log_s = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(torch.clamp(log_s, max=10.0))

    loss_unclipped = -advantages * seq_ratio
    loss_clipped = -advantages * torch.clamp(seq_ratio, 1 - clip_low, 1 + clip_high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    pg_losses = _rollout_correction(pg_losses, old_log_prob, config, rollout_log_probs, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean")
    pg_clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), response_mask)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    return pg_loss, _metrics(pg_clipfrac, ppo_kl, 0.0)


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
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
    """GPG: plain policy gradient -A log pi, no ratio and no clipping (clip metrics are 0)."""
    # GPG: Chu et al. 2025 (arXiv 2504.02546) L = -A * log pi(y_t).
    pg_losses = -advantages * log_prob
    pg_losses = _rollout_correction(pg_losses, old_log_prob, config, rollout_log_probs, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    ppo_kl = masked_mean(old_log_prob - log_prob, response_mask)
    return pg_loss, _metrics(torch.zeros(()), ppo_kl, 0.0)


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
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
    """CISPO: clip the importance weight itself (no gradient through it) instead of the update."""
    clip_low, clip_high = _clip_range(config)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    # CISPO: MiniMax 2025 (arXiv 2506.13585) L = -sg[clip(r, 1-eps_low, 1+eps_high)] * A * log pi.
    pg_losses = -clipped.detach() * advantages * log_prob
    pg_losses = _rollout_correction(pg_losses, old_log_prob, config, rollout_log_probs, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    pg_clipfrac = masked_mean(torch.ne(ratio, clipped).float(), response_mask)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    return pg_loss, _metrics(pg_clipfrac, ppo_kl, 0.0)
