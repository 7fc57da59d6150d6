"""Fused LM head + log-prob (verl's `model.use_fused_kernels`), and liger kernels (`model.use_liger`).

The plain path projects every response position onto the vocabulary (a rows x R x vocab logits tensor,
fp32) and reads log-probs and entropies from it. The fused path never builds that tensor: hidden states
(rows x R x hidden) go through the LM head a chunk of tokens at a time, each chunk's logits are reduced
to a log-prob and an entropy per token and dropped, and backward recomputes each chunk's logits from
the saved hidden states and head weight. Peak memory is one chunk's logits (~`FUSED_CHUNK_BYTES`)
instead of the whole micro-batch's; the compute is one extra head matmul in backward.

FSDP2 gathers the LM head's weight only inside the root module's forward and backward, so the fused
computation runs there: `install_fused_head` gives the root module a forward that, when the engine
passes `fused_head={...}`, runs the decoder and the fused head and returns `{"log_probs", "entropy"}`
(tensors FSDP2 sees, so its backward hooks gather and reduce the head's gradient as usual).

verl's `fused_kernel_options.impl_backend` picks a torch or a Triton kernel there; here both run the
chunked torch implementation (same numbers; `triton` is noted at start-up).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hybridflow.data.vision import is_vision_config

FUSED_CHUNK_BYTES = 16 << 20
"""Bytes of one chunk's fp32 logits: tokens per chunk = this / (vocab x 4), within the bounds below."""
MIN_CHUNK_ROWS, MAX_CHUNK_ROWS = 16, 4096

# HF config attributes that change logits after the head's matmul: the fused head would ignore them.
_LOGIT_TRANSFORMS = {"final_logit_softcapping": None, "logit_scale": 1.0, "logits_scaling": 1.0}


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    value = cfg.get(key, default) if isinstance(cfg, dict) else getattr(cfg, key, default)
    return default if value is None else value


def fused_chunk_rows(vocab: int, chunk_size: int | None = None) -> int:
    """Tokens per chunk: `chunk_size` when given, else what fits FUSED_CHUNK_BYTES of fp32 logits."""
    if chunk_size:
        return int(chunk_size)
    return max(MIN_CHUNK_ROWS, min(MAX_CHUNK_ROWS, FUSED_CHUNK_BYTES // max(1, vocab * 4)))


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the head's matmul runs in: autocast's when active (as for the plain head), else the inputs'."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _chunk_logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """fp32 logits / temperature of one chunk (n, vocab); the matmul in the operands' dtype."""
    with torch.autocast(h.device.type, enabled=False):
        z = torch.nn.functional.linear(h, w, b).float()
    return z.div_(temperature) if temperature != 1.0 else z


class _FusedLinearLogProbs(torch.autograd.Function):
    """log p(label) and entropy per row of `hidden @ weight.T + bias`, a chunk of rows at a time.

    Backward (recomputing each chunk's logits z = logits / T, p = softmax(z)):
      d log p(y) / dz = onehot(y) - p
      d H / dz        = -p * (log p + H)        (H = -sum p log p)
    and d/dlogits = d/dz / T; the head's matmul gives the hidden and weight gradients.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        temperature: float,
        chunk_rows: int,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = _compute_dtype(hidden, weight)
        w = weight.to(dtype)
        b = bias.to(dtype) if bias is not None else None
        n = hidden.shape[0]
        log_probs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        for start in range(0, n, chunk_rows):
            rows = slice(start, start + chunk_rows)
            z = _chunk_logits(hidden[rows].to(dtype), w, b, temperature)
            lse[rows] = torch.logsumexp(z, dim=-1)
            log_probs[rows] = z.gather(-1, labels[rows].unsqueeze(-1)).squeeze(-1) - lse[rows]
            if with_entropy:
                log_p = z.sub_(lse[rows].unsqueeze(-1))  # in place: z is not needed any more
                entropy[rows] = -(log_p.exp() * log_p).sum(dim=-1)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, entropy)
        ctx.temperature, ctx.chunk_rows, ctx.dtype, ctx.with_entropy = temperature, chunk_rows, dtype, with_entropy
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx: Any, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None) -> tuple[Any, ...]:  # type: ignore[override]
        hidden, weight, bias, labels, lse, entropy = ctx.saved_tensors
        dtype, temperature = ctx.dtype, ctx.temperature
        if not ctx.with_entropy:
            grad_entropy = None
        want_h, want_w, want_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2]
        w = weight.to(dtype)
        b = bias.to(dtype) if bias is not None else None
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if want_b else None
        n = hidden.shape[0]
        for start in range(0, n, ctx.chunk_rows):
            rows = slice(start, start + ctx.chunk_rows)
            h = hidden[rows].to(dtype)
            log_p = _chunk_logits(h, w, b, temperature).sub_(lse[rows].unsqueeze(-1))
            p = log_p.exp()
            dz = torch.zeros_like(p)
            if grad_entropy is not None:
                dz = log_p.add_(entropy[rows].unsqueeze(-1)).mul_(p).mul_(-grad_entropy[rows].unsqueeze(-1))
            if grad_log_probs is not None:
                g = grad_log_probs[rows].unsqueeze(-1)
                dz.sub_(p.mul_(g)).scatter_add_(-1, labels[rows].unsqueeze(-1), g.to(dz.dtype))  # p: last use
            del p, log_p
            if temperature != 1.0:
                dz.div_(temperature)
            d_logits = dz.to(dtype)
            with torch.autocast(hidden.device.type, enabled=False):
                if grad_h is not None:
                    grad_h[rows] = (d_logits @ w).to(hidden.dtype)
                if grad_w is not None:
                    grad_w.add_((d_logits.t() @ h).float())
            if grad_b is not None:
                grad_b.add_(dz.sum(dim=0))
        return (
            grad_h,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None, None, None, None,
        )


def fused_linear_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 log-probs of `labels` and (when asked) entropies under logits `(hidden @ weight.T + bias) / T`.

    `hidden` (..., H), `labels` (...), `weight` (V, H): results have `labels.shape`; equal to
    log_softmax / entropy of the materialised logits, gradients too, with one chunk of
    `chunk_rows` tokens' logits alive at a time (default: `fused_chunk_rows(V)`).
    """
    shape = labels.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = labels.reshape(-1).to(flat_h.device)
    rows = chunk_rows or fused_chunk_rows(weight.shape[0])
    log_probs, entropy = _FusedLinearLogProbs.apply(
        flat_h, weight, bias, flat_labels, float(temperature), int(rows), bool(with_entropy)
    )
    return log_probs.reshape(shape), entropy.reshape(shape) if with_entropy else None


# ------------------------------------------------------------------------------------- the head


class FusedHead:
    """The decoder and LM head of a causal LM, computing response log-probs inside the root's forward."""

    def __init__(self, root: nn.Module, chunk_size: int | None = None, placeholder_bias: torch.Tensor | None = None
                 ) -> None:
        """`placeholder_bias`: a vision-language model's image-token logit bias (FSDPEngine.placeholder_bias)."""
        model = root.get_base_model() if hasattr(root, "get_base_model") else root  # a peft model wraps the LM
        check_fusable(model)
        # a vision-language model's backbone (`model.model`) merges the image features into the text decoder's input
        self.decoder: nn.Module = model.model if is_vision_config(model.config) else model.get_decoder()
        self.head: nn.Linear = model.get_output_embeddings()
        self.chunk_size = chunk_size
        self.placeholder_bias = placeholder_bias

    def compute(self, model_inputs: dict[str, Any], labels: torch.Tensor, temperature: float = 1.0,
                with_entropy: bool = False) -> dict[str, torch.Tensor | None]:
        """{"log_probs", "entropy"} (b, R) of `labels`, the last R tokens but one's predictions."""
        model_inputs.pop("logits_to_keep", None)  # the head picks its positions itself
        hidden = self.decoder(**model_inputs).last_hidden_state
        resp = labels.shape[1]
        # FSDP2 has unsharded the head here (inside the root's forward): read its weight now, not at install.
        bias = self.head.bias
        if self.placeholder_bias is not None:
            extra = self.placeholder_bias.to(self.head.weight.device)
            bias = extra if bias is None else bias + extra
        log_probs, entropy = fused_linear_log_probs(
            hidden[:, -resp - 1 : -1, :], self.head.weight, labels, bias=bias, temperature=temperature,
            with_entropy=with_entropy, chunk_rows=fused_chunk_rows(self.head.weight.shape[0], self.chunk_size),
        )
        return {"log_probs": log_probs, "entropy": entropy}


def check_fusable(model: nn.Module) -> None:
    """Raise when the model's logits are more than a plain Linear head of the last hidden state."""
    name = type(model).__name__
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is not nn.Linear or not hasattr(model, "get_decoder"):
        raise ValueError(
            f"model.use_fused_kernels=true needs a causal LM whose output head is a plain nn.Linear; {name} has "
            f"{type(head).__name__} (a LoRA adapter on lm_head, or a custom head): set use_fused_kernels=false, "
            "or leave lm_head out of model.target_modules"
        )
    cfg = getattr(model, "config", None)
    for attr, neutral in _LOGIT_TRANSFORMS.items():
        value = getattr(cfg, attr, neutral)
        if value is not None and value != neutral:
            raise ValueError(
                f"model.use_fused_kernels=true: {name} transforms its logits after the head ({attr}={value}), which "
                "the fused log-prob head does not apply; set use_fused_kernels=false for this model"
            )


def install_fused_head(root: nn.Module, chunk_size: int | None = None,
                       placeholder_bias: torch.Tensor | None = None) -> FusedHead:
    """Give `root` a forward that runs the fused head when called with `fused_head={labels, temperature, ...}`.

    Without that keyword the model's own forward runs, unchanged. The override is an instance attribute,
    so FSDP2's hooks (registered on the module, run by `__call__`) still wrap it.
    """
    fused = FusedHead(root, chunk_size, placeholder_bias)
    original: Callable[..., Any] = root.forward

    def forward(*args: Any, fused_head: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        if fused_head is None:
            return original(*args, **kwargs)
        if args:
            raise TypeError("the fused log-prob head takes keyword inputs only (input_ids=..., attention_mask=...)")
        return fused.compute(kwargs, **fused_head)

    root.forward = forward  # type: ignore[method-assign]
    return fused


def maybe_install(root: nn.Module, kind: str, model_config: Any,
                  placeholder_bias: torch.Tensor | None = None) -> FusedHead | None:
    """The fused head when `model.use_fused_kernels` is on for a causal LM, else None (`placeholder_bias`: see
    FusedHead)."""
    if kind != "causal_lm" or not bool(_get(model_config, "use_fused_kernels", False)):
        return None
    options = _get(model_config, "fused_kernel_options", None)
    return install_fused_head(root, chunk_size=_get(options, "chunk_size", None), placeholder_bias=placeholder_bias)


# ------------------------------------------------------------------------------------------ liger


def apply_liger(module: nn.Module, model_config: Any, device: torch.device) -> bool:
    """Patch the model with liger-kernel's Triton kernels (RMSNorm, RoPE, SwiGLU, ...) as verl's use_liger does.

    CUDA only, and only when the liger-kernel package is installed; returns whether it patched.
    """
    if not bool(_get(model_config, "use_liger", False)):
        return False
    if device.type != "cuda":
        raise ValueError(
            "model.use_liger=true: liger-kernel's Triton kernels run on CUDA GPUs only, and this engine is on "
            f"{device.type}; set use_liger=false (model.use_fused_kernels=true gives the memory-lean log-prob path "
            "on any device)"
        )
    try:
        patch = importlib.import_module("liger_kernel.transformers.monkey_patch")._apply_liger_kernel_to_instance
    except (ImportError, AttributeError) as exc:
        raise ImportError(
            f"model.use_liger=true needs the liger-kernel package ({exc}); install it in the trainer image "
            "(pip install liger-kernel) or set use_liger=false"
        ) from exc
    patch(model=module)
    return True
