"""Masked statistics and log-prob/entropy helpers (pure torch, names follow ``verl.utils.torch_functional``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

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


RowsFn = Callable[..., torch.Tensor]


def entropy_from_logits(logits: torch.Tensor, chunk_rows: int | None = None, rows_fn: RowsFn | None = None) -> torch.Tensor:
    """Entropy of the categorical distribution given by ``logits`` over the last dimension.

    Computed `chunk_rows` positions at a time (default: ~64 MiB of fp32 per temporary); each row is
    independent, so the result equals the one-shot formula. `rows_fn` replaces the per-chunk formula
    (a compiled `entropy_rows`, see `CompiledOrEager`).
    """
    return _by_row_chunks(rows_fn or _entropy_rows, logits, chunk_rows=chunk_rows)


entropy_rows = _entropy_rows
"""The per-chunk entropy formula (what `use_torch_compile` compiles)."""

VERL_ENTROPY_CHUNK_ROWS = 2048
"""Rows per chunk of verl's `entropy_from_logits_with_chunking`."""


def entropy_checkpointed(logits: torch.Tensor, entropy_fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`entropy_fn(logits)` that keeps no softmax for backward: it is recomputed there (verl's entropy_checkpointing).

    With autograd on, each chunk of the plain entropy saves its (rows x vocab) softmax; checkpointed,
    only the logits (already kept by the log-prob) are saved. Same values and gradients.
    """
    if not torch.is_grad_enabled() or not logits.requires_grad:
        return entropy_fn(logits)
    from torch.utils.checkpoint import checkpoint

    return checkpoint(entropy_fn, logits, use_reentrant=False)


COMPILE_BACKEND = "inductor"
"""torch.compile's backend for use_torch_compile (inductor: Triton on GPU, C++ on CPU)."""


class CompiledOrEager:
    """`torch.compile(fn, dynamic=True)` (verl's use_torch_compile), or `fn` itself if compilation fails.

    The first failure is logged once, with the reason, and every later call runs `fn` eagerly (same
    results). An error `fn` itself raises (a shape mismatch) surfaces from the eager call as usual.
    """

    def __init__(self, fn: RowsFn, what: str, backend: Any = None) -> None:
        self.fn = fn
        self.what = what
        self.failure: str | None = None
        self._compiled = torch.compile(fn, dynamic=True, backend=backend or COMPILE_BACKEND)

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        if self.failure is None:
            try:
                return self._compiled(*args)
            except Exception as exc:  # noqa: BLE001 - any compiler failure falls back; fn re-raises real errors
                self.failure = _failure_reason(exc)
                logger.warning(
                    "use_torch_compile: torch.compile of %s failed (%s); computing it without compilation from now "
                    "on (same results, slower). Set use_torch_compile=false to skip the attempt.",
                    self.what, self.failure,
                )
        return self.fn(*args)


def _fp32_logprob_rows(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


logprob_rows = _fp32_logprob_rows
"""The per-chunk fp32 log-prob formula (what `use_torch_compile` compiles)."""


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int = 1024, rows_fn: RowsFn | None = None
) -> torch.Tensor:
    """Log-probability of each ``labels`` token under ``logits`` (shape ``labels.shape``).

    fp32/fp64 use ``z_label - logsumexp(z)`` without materialising the softmax, a chunk of rows at a
    time (`vocab_chunk_rows`: logsumexp's exp temporary stays ~64 MiB); `rows_fn` replaces that
    per-chunk formula (a compiled `logprob_rows`). Half precision is upcast to fp32 a chunk of rows at
    a time (log-softmax in bf16 loses ~2 digits) and cast back.
    """
    if logits.dtype in (torch.float32, torch.float64):
        return _by_row_chunks(rows_fn or _fp32_logprob_rows, logits, labels, chunk_rows=None)
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


def _failure_reason(exc: BaseException) -> str:
    """One line naming an exception and its innermost cause (a compiler's own error, not dynamo's wrapper)."""
    root = exc
    for _ in range(10):  # dynamo wraps a backend's error (BackendCompilerFailed.inner_exception, or __cause__)
        inner = getattr(root, "inner_exception", None) or root.__cause__
        if not isinstance(inner, BaseException) or inner is root:
            break
        root = inner
    first = next((line.strip() for line in str(root).splitlines() if line.strip()), "")
    where = type(exc).__name__ if root is exc else f"{type(exc).__name__} <- {type(root).__name__}"
    return f"{where}: {first}"[:300]
