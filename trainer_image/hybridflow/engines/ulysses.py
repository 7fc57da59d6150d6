"""Ulysses sequence parallelism for the FSDP engine (DeepSpeed-Ulysses, arXiv:2309.14509; verl's design).

`ulysses_sequence_parallel_size = sp` splits the world into groups of `sp` consecutive ranks; the
`world // sp` groups are the data-parallel ranks. The ranks of one group hold the same rows (the worker
all-gathers the rows the dispatch gave them, see `gather_rows`) and each computes 1/sp of every
sequence: embeddings, MLPs and norms run on the local slice of the positions, and each attention layer
exchanges (all-to-all) its queries, keys and values from (local positions, all heads) to (all
positions, heads / sp), attends over the whole sequence, and exchanges the output back. After the
last layer the slices are all-gathered, so the head (LM head or value head) and every caller see the
full sequence, exactly as without sequence parallelism.

Gradients: every rank of a group computes the same loss from the same gathered hidden states, and
its backward keeps only the gradient of its own slice, scaled by `sp` (`_GatherSequence`). Summed
over the group that is `sp` x the gradient of the loss; FSDP averages over all `dp x sp` ranks, so
the result is the data-parallel mean, which is what the callers' loss scaling (written for plain
data parallelism over `world_size` ranks, whose token counts here count each row `sp` times) expects.

Requirements (checked, with a message saying what to change): the attention heads and the key/value
heads divide by `sp`, the world size divides by `sp`, every decoder layer uses full causal attention
(no sliding window), and the model's attention is `sdpa` or a flash-attention implementation.
Under torch.distributed's gloo backend `all_to_all_single` works on CPU (torch >= 2.x), so the same
exchange runs in CPU tests and on GPUs (NCCL).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

#: Attention implementations the exchange wraps (HF's names); `eager` is per-model code HF does not register.
SUPPORTED_ATTENTION = ("sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4")

_names = itertools.count()


# ----------------------------------------------------------------------------------------------- checks


def check_sequence_parallel(sp: int, world_size: int, hf_config: Any, where: str = "ulysses_sequence_parallel_size") -> None:
    """Raise ValueError (what is wrong and what to set) unless `sp` can split this model over these ranks."""
    if sp < 1:
        raise ValueError(f"{where}={sp}: must be a positive whole number (1 turns sequence parallelism off)")
    if sp == 1:
        return
    if world_size % sp:
        raise ValueError(
            f"{where}={sp} does not divide the {world_size} ranks (trainer.nnodes x trainer.n_gpus_per_node); "
            f"use a divisor of {world_size} (data-parallel size = world size // {where})"
        )
    heads = int(getattr(hf_config, "num_attention_heads", 0) or 0)
    kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    for count, what in ((heads, "attention heads (num_attention_heads)"), (kv_heads, "key/value heads (num_key_value_heads)")):
        if count <= 0 or count % sp:
            raise ValueError(
                f"{where}={sp}: the model has {count} {what}, which do not split over {sp} ranks (Ulysses gives "
                f"each rank heads / {sp}); use a size that divides both {heads} and {kv_heads}, or 1"
            )
    layer_types = set(getattr(hf_config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise ValueError(
            f"{where}={sp}: the model has {sorted(layer_types - {'full_attention'})} layers; Ulysses here supports "
            "full causal attention only; set it to 1 for this model"
        )
    impl = getattr(hf_config, "_attn_implementation", None) or "eager"
    if impl not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"{where}={sp}: the model's attention implementation is {impl!r}; Ulysses wraps one of "
            f"{', '.join(SUPPORTED_ATTENTION)}: load the model with sdpa (the default) or set it to 1"
        )


# ------------------------------------------------------------------------------------------ collectives


def _all_to_all(x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Split `x` into group-size chunks along `scatter_dim`, send chunk j to rank j, concatenate what
    arrives along `gather_dim` (in rank order)."""
    size = dist.get_world_size(group)
    send = torch.stack([c.contiguous() for c in x.chunk(size, dim=scatter_dim)])
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """`_all_to_all` with its inverse exchange as the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _all_to_all(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None


class _GatherSequence(torch.autograd.Function):
    """All-gather the sequence slices (dim 1); backward: this rank's slice of the gradient, times the group size.

    Every rank of the group computes the same loss from the gathered tensor, so the gradient arriving here is
    the same on every rank; keeping this rank's slice x size makes the group's sum sp x the true gradient,
    which FSDP's average over dp x sp ranks turns into the data-parallel mean (module docstring).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.size, ctx.rank, ctx.local = size, rank, x.shape[1]
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        start = ctx.rank * ctx.local
        return grad[:, start : start + ctx.local] * ctx.size, None


# -------------------------------------------------------------------------------------------- the model


@dataclass
class _Step:
    """What one forward's attention layers and final gather need: the full-sequence mask and the length."""

    mask: Any = None
    length: int = 0
    active: bool = False


class UlyssesModel:
    """Sequence parallelism installed on one HF model: a registered attention wrapper and a gather hook.

    `prepare(input_ids, attention_mask, position_ids)` returns this rank's slice of the inputs (padded to a
    multiple of sp on the right) and arms the attention wrapper with the full-sequence mask; the model
    then runs on the slice and its backbone's output is gathered back to the full (unpadded) length.
    The mask stays armed until the next `prepare`, so activation checkpointing can recompute a layer in
    the backward of the same micro-batch (callers run each forward's backward before the next forward).
    """

    def __init__(self, module: nn.Module, hf_config: Any, group: Any, sp: int) -> None:
        from transformers import AttentionInterface
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.group, self.sp, self.rank = group, sp, dist.get_rank(group)
        self.inner = hf_config._attn_implementation
        self._inner_fn = ALL_ATTENTION_FUNCTIONS[self.inner]
        # The full-sequence mask is built by HF's own mask function for the wrapped implementation (the one
        # a plain forward uses); the model's own mask step returns None for the wrapper's unregistered name.
        self._mask_config = copy.copy(hf_config)
        self._mask_config._attn_implementation_internal = self.inner
        self.name = f"hybridflow_ulysses_{next(_names)}"
        AttentionInterface.register(self.name, self._attention)
        hf_config._attn_implementation_internal = self.name
        self._step = _Step()
        backbone = _backbone(module)
        backbone.register_forward_hook(self._gather_hidden)

    # ------------------------------------------------------------------ inputs
    def prepare(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's slice of (input_ids, position_ids); arms the attention wrapper for the whole sequence."""
        from transformers.masking_utils import create_causal_mask

        length = input_ids.shape[1]
        pad = -length % self.sp
        if pad:  # right padding: masked as keys, its outputs trimmed after the gather
            input_ids, attention_mask, position_ids = (
                nn.functional.pad(t, (0, pad)) for t in (input_ids, attention_mask, position_ids)
            )
        local = input_ids.shape[1] // self.sp
        cut = slice(self.rank * local, (self.rank + 1) * local)
        probe = torch.empty(input_ids.shape[0], input_ids.shape[1], 0, device=input_ids.device)
        mask = create_causal_mask(
            config=self._mask_config, inputs_embeds=probe, attention_mask=attention_mask,
            past_key_values=None, position_ids=position_ids,
        )
        self._step = _Step(mask=mask, length=length, active=True)
        return input_ids[:, cut], position_ids[:, cut]

    # ------------------------------------------------------------------ attention
    def _attention(
        self, module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        attention_mask: Any, **kwargs: Any,
    ) -> tuple[torch.Tensor, Any]:
        """(b, heads, S/sp, d) in, attention over all S positions for heads/sp, (b, S/sp, heads, d) out."""
        if not self._step.active:
            raise RuntimeError("Ulysses attention ran without FSDPEngine.forward preparing the inputs")
        if kwargs.get("sliding_window") is not None:
            raise RuntimeError("Ulysses supports full causal attention only; this layer has a sliding window")
        # The caller's position_ids are this slice's; the flash path would read them as packed sequences.
        kwargs.pop("position_ids", None)
        q, k, v = (_AllToAll.apply(t, self.group, 1, 2) for t in (query, key, value))
        out, weights = self._inner_fn(module, q, k, v, self._step.mask, **kwargs)
        # HF attention functions return (b, S, heads/sp, d): back to this slice's positions, all heads.
        return _AllToAll.apply(out, self.group, 1, 2), weights

    # ------------------------------------------------------------------ output
    def _gather_hidden(self, _module: nn.Module, _args: Any, output: Any) -> Any:
        """Backbone forward hook: the full sequence's last hidden states, trimmed to the unpadded length."""
        hidden = _GatherSequence.apply(output.last_hidden_state, self.group)
        output.last_hidden_state = hidden[:, : self._step.length]
        return output


def _backbone(module: nn.Module) -> nn.Module:
    """The decoder stack of an HF causal LM or token classifier (under a peft wrapper too)."""
    hf: nn.Module = module.get_base_model() if hasattr(module, "get_base_model") else module  # type: ignore[operator]
    backbone = getattr(hf, "base_model", None)
    if backbone is None or backbone is hf:
        raise ValueError(
            f"{type(hf).__name__} exposes no decoder stack (base_model) for Ulysses to gather; set "
            "ulysses_sequence_parallel_size=1 for this model"
        )
    return backbone


# ---------------------------------------------------------------------------------------- groups and rows


@dataclass(frozen=True)
class SequenceGroups:
    """This rank's place in the (dp, sp) layout: groups of `sp` consecutive ranks share one data shard."""

    sp: int
    dp: int
    sp_rank: int
    dp_rank: int
    group: Any


def build_groups(world_size: int, rank: int, sp: int) -> SequenceGroups:
    """The sequence-parallel process group of this rank (a collective: every rank creates every group)."""
    group = None
    for first in range(0, world_size, sp):
        ranks = list(range(first, first + sp))
        created = dist.new_group(ranks)
        if rank in ranks:
            group = created
    return SequenceGroups(sp=sp, dp=world_size // sp, sp_rank=rank % sp, dp_rank=rank // sp, group=group)


def gather_rows(data: Any, group: Any) -> tuple[Any, list[int]]:
    """The rows of every rank of `group`, concatenated in rank order, and each rank's row count.

    verl's sharding manager does the same on entry: the dispatch splits a batch over all ranks, and
    the ranks of a sequence-parallel group then compute their shared data-parallel shard together.
    """
    from hybridflow.protocol import DataProto

    parts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, data, group=group)
    return DataProto.concat(parts), [len(p) for p in parts]


def local_rows(data: Any, sizes: list[int], sp_rank: int) -> Any:
    """This rank's rows of a result computed on `gather_rows` output (the inverse split)."""
    start = sum(sizes[:sp_rank])
    return data.slice(start, start + sizes[sp_rank])


def shared_rows(sp: SequenceGroups | None, data: Any) -> tuple[Any, list[int] | None]:
    """What a worker method computes on: its sequence-parallel group's rows (`gather_rows`), or `data` as it is."""
    if sp is None:
        return data, None
    return gather_rows(data, sp.group)


def own_rows(sp: SequenceGroups | None, data: Any, sizes: list[int] | None) -> Any:
    """The inverse of `shared_rows` on a per-row result: this rank's rows again."""
    if sp is None or sizes is None:
        return data
    return local_rows(data, sizes, sp.sp_rank)
