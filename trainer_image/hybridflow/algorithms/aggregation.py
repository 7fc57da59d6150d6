"""Loss aggregation: reduce a (bs, response_length) loss matrix to a scalar (``agg_loss``)."""

from __future__ import annotations

import torch

from .torch_functional import masked_sum

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def _safe_denominator(value: torch.Tensor | float | int, like: torch.Tensor) -> torch.Tensor:
    """Turn a count into a tensor that is never 0, so an empty batch reduces to 0 instead of NaN."""
    denom = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    return torch.where(denom > 0, denom, torch.ones_like(denom))


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | float | torch.Tensor | None = None,
    global_batch_size: int | float | torch.Tensor | None = None,
    loss_scale_factor: int | float | None = None,
) -> torch.Tensor:
    """Aggregate ``loss_mat`` over the tokens selected by ``loss_mask`` into a scalar.

    Modes (verl names):
      - ``token-mean``: sum over all valid tokens / number of valid tokens (DAPO, arXiv 2503.14476).
      - ``seq-mean-token-sum``: per-sequence token sum, then mean over sequences.
      - ``seq-mean-token-mean``: per-sequence token mean, then mean over sequences (original GRPO).
      - ``seq-mean-token-sum-norm``: per-sequence token sum / a constant (``loss_scale_factor``,
        default the padded response length), then mean over sequences: Dr.GRPO's unbiased
        normaliser (Liu et al. 2025, arXiv 2503.20783).

    Sequences without any valid token do not count in the sequence mean. With gradient accumulation
    or data parallelism, pass the global token count (``batch_num_tokens``) or sequence count
    (``global_batch_size``) and ``dp_size`` so that micro-batch losses add up to the global mean
    (the all-reduce averages over ``dp_size`` ranks, hence the multiplication).
    """
    mask = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("agg_loss: pass batch_num_tokens (the global token count) when dp_size > 1.")
            batch_num_tokens = mask.sum()
        return masked_sum(loss_mat, mask) / _safe_denominator(batch_num_tokens, loss_mat) * dp_size

    token_counts = mask.sum(dim=-1)
    seq_valid = (token_counts > 0).to(loss_mat.dtype)
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq_losses = masked_sum(loss_mat, mask, axis=-1)
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = masked_sum(loss_mat, mask, axis=-1) / _safe_denominator(token_counts, loss_mat)
    else:
        raise ValueError(
            f"Unknown loss_agg_mode {loss_agg_mode!r}. Valid modes: {', '.join(LOSS_AGG_MODES)}. "
            "Set actor_rollout_ref.actor.loss_agg_mode (or critic.loss_agg_mode) to one of them."
        )
    if global_batch_size is None:
        if dp_size > 1:
            raise ValueError("agg_loss: pass global_batch_size (the global sequence count) when dp_size > 1.")
        global_batch_size = seq_valid.sum()
    loss = masked_sum(seq_losses, seq_valid) / _safe_denominator(global_batch_size, loss_mat) * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mask.shape[-1])
    return loss
