"""Critic (value) loss and entropy bonus."""

from __future__ import annotations

import torch

from .aggregation import agg_loss
from .torch_functional import clip_by_value, entropy_from_logits, masked_mean


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss ``0.5 * max((V - R)^2, (clip(V, V_old +- eps) - R)^2)`` and its clip fraction."""
    # PPO value clipping: Schulman et al. 2017 (arXiv 1707.06347) as in OpenAI baselines' ppo2.
    vpred_clipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.max(loss_unclipped, loss_clipped), response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Mean token entropy of ``logits`` (bs, response_length, vocab) over the mask (subtract it to add a bonus)."""
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)
