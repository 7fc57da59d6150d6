"""Masked statistics and log-prob/entropy helpers (pure torch, names follow ``verl.utils.torch_functional``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

Axis = int | tuple[int, ...] | None


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: Axis = None) -> torch.Tensor:
    """Sum of ``values * mask``; entries outside the mask never leak, even when they are NaN or inf."""
    mask = mask.to(values.dtype)
    kept = torch.where(mask.bool(), values, torch.zeros_like(values))
    return (kept * mask).sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: Axis = None) -> torch.Tensor:
    """Mean of ``values`` over the mask; 0 (not NaN) where the mask is empty."""
    mask = mask.to(values.dtype)
    # The 1e-8 keeps an empty mask at 0/1e-8 = 0, the same guard verl uses, so numerics match.
    return masked_sum(values, mask, axis) / (mask.sum(dim=axis) + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over the whole mask (Bessel-corrected when ``unbiased`` and >1 element).

    verl raises when the mask holds 0 or 1 elements; here the variance is then 0 (no correction),
    so a batch that is almost fully masked cannot turn into NaN.
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.to(values.dtype).sum()
        if count > 1:
            variance = variance * count / (count - 1)
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``values`` to zero mean and unit variance over the mask (keep the mean if not ``shift_mean``)."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor, tensor_max: torch.Tensor) -> torch.Tensor:
    """Clamp ``x`` element-wise between two tensors (``torch.clamp`` with tensor bounds)."""
    return torch.max(torch.min(x, tensor_max), tensor_min)


# Vocabulary-wide temporaries (softmax, exp) are built this many bytes at a time: a micro-batch then
# needs one (positions x vocab) tensor, the logits, instead of three or four (issue 17).
CHUNK_BYTES = 64 << 20


def vocab_chunk_rows(vocab: int, itemsize: int = 4, budget: int = CHUNK_BYTES) -> int:
    """Rows of a (rows, vocab) fp32 temporary that fit in `budget` bytes (at least 1)."""
    return max(1, budget // max(1, vocab * itemsize))


def _by_row_chunks(fn: Callable[..., torch.Tensor], logits: torch.Tensor, *others: torch.Tensor, chunk_rows: int | None) -> torch.Tensor:
    """`fn` applied to chunks of the flattened leading dimensions, results joined in `logits.shape[:-1]`."""
    flat = logits.reshape(-1, logits.shape[-1])
    flat_others = [o.reshape(-1) for o in others]
    step = chunk_rows or vocab_chunk_rows(logits.shape[-1])
    if flat.shape[0] <= step:
        return fn(flat, *flat_others).reshape(logits.shape[:-1])
    parts = [fn(flat[i : i + step], *(o[i : i + step] for o in flat_others)) for i in range(0, flat.shape[0], step)]
    return torch.cat(parts).reshape(logits.shape[:-1])


def _entropy_rows(logits: torch.Tensor) -> torch.Tensor:
    # H = logsumexp(z) - sum_i softmax(z)_i * z_i
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def entropy_from_logits(logits: torch.Tensor, chunk_rows: int | None = None) -> torch.Tensor:
    """Entropy of the categorical distribution given by ``logits`` over the last dimension.

    Computed `chunk_rows` positions at a time (default: ~64 MiB of fp32 per temporary); each row is
    independent, so the result equals the one-shot formula.
    """
    return _by_row_chunks(_entropy_rows, logits, chunk_rows=chunk_rows)


def _fp32_logprob_rows(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int = 1024) -> torch.Tensor:
    """Log-probability of each ``labels`` token under ``logits`` (shape ``labels.shape``).

    fp32/fp64 use ``z_label - logsumexp(z)`` without materialising the softmax, a chunk of rows at a
    time (`vocab_chunk_rows`: logsumexp's exp temporary stays ~64 MiB). Half precision is upcast to
    fp32 a chunk of rows at a time (log-softmax in bf16 loses ~2 digits) and cast back.
    """
    if logits.dtype in (torch.float32, torch.float64):
        return _by_row_chunks(_fp32_logprob_rows, logits, labels, chunk_rows=None)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1)
    chunks = [
        torch.gather(
            torch.log_softmax(flat_logits[start : start + chunk_rows].float(), dim=-1),
            -1,
            flat_labels[start : start + chunk_rows].unsqueeze(-1),
        ).squeeze(-1)
        for start in range(0, flat_labels.numel(), chunk_rows)
    ]
    if not chunks:
        return torch.zeros(labels.shape, dtype=logits.dtype, device=logits.device)
    return torch.cat(chunks).to(logits.dtype).reshape(labels.shape)
