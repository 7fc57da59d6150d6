"""FSDP2 training engine: an HF model sharded with `fully_shard`, its optimizer, schedule and state dicts.

Ray-free: the engine runs in whatever process calls it. When torch.distributed is initialized (the
worker does that: gloo on CPU, NCCL on GPU) every decoder layer and then the root are sharded over a
1-D device mesh of all ranks; otherwise (a single process, unit tests) the model stays a plain module
and the same code paths run unsharded. Gradients are averaged over ranks by FSDP's reduce-scatter;
callers scale losses accordingly (see `PPOActor`).

Full state dicts are collectives: call `full_state_dict` / `load_full_state_dict` and the optimizer
counterparts on every rank at the same time.

LoRA (`model.lora_rank > 0` or `model.lora_adapter_path`, see `hybridflow.engines.lora`): the causal LM is
wrapped as a peft model before sharding (FSDP2 over the peft model), only the adapter is trainable and in
the optimizer, `full_state_dict` returns the merged weights under the base model's names (what every
rollout engine and the exporter load), `trainable_state_dict` the adapter alone (what checkpoints hold),
and `adapter_disabled()` runs the base model: the reference policy without a second copy of the weights.

Ulysses sequence parallelism (`sequence_parallel_size` > 1, see `hybridflow.engines.ulysses`): groups of
that many consecutive ranks hold the same rows and split each sequence's positions between them inside
`forward`, which still returns the whole sequence's outputs; FSDP still shards over all ranks, and the
data-parallel size is `world_size // sequence_parallel_size` (`data_parallel_size`).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from hybridflow.data.vision import VISION_TOWERS, is_vision_config, placeholder_bias, vision_tower
from hybridflow.engines import fused_head, lora
from hybridflow.engines.optim import build_lr_scheduler, build_optimizer
from hybridflow.engines.ulysses import SequenceGroups, UlyssesModel, build_groups, check_sequence_parallel

ModelKind = Literal["causal_lm", "value"]

_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    value = cfg.get(key, default) if isinstance(cfg, dict) else getattr(cfg, key, default)
    return default if value is None else value


def to_dtype(name: str | torch.dtype) -> torch.dtype:
    """`bf16` / `fp32` / ... (verl's config spellings) to a torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def resolve_device(device: str) -> torch.device:
    """`cpu` or `cuda` (the one GPU Ray gave this process) as a torch device."""
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "trainer.device=cuda but this process sees no CUDA device; set trainer.device=cpu or "
                "run on GPU nodes (trainer.n_gpus_per_node counts GPUs there)"
            )
        index = int(os.environ.get("LOCAL_RANK", "0")) if torch.cuda.device_count() > 1 else 0
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    raise ValueError(f"unknown trainer.device {device!r}; use cpu or cuda")


def import_external_lib(name: str | None) -> None:
    """Import `model.external_lib` (verl's hook: a module that registers custom model classes with HF)."""
    if not name:
        return
    import importlib

    try:
        importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(
            f"model.external_lib={name!r} cannot be imported ({exc}); install the package that provides it in "
            "the trainer image (or on PYTHONPATH), or unset external_lib"
        ) from exc


def load_hf_model(
    path: str,
    kind: ModelKind = "causal_lm",
    dtype: torch.dtype = torch.float32,
    override_config: dict[str, Any] | None = None,
    trust_remote_code: bool = False,
) -> nn.Module:
    """Load an HF model folder as a causal LM (a vision-language model's image-text-to-text class when it has a
    vision tower) or as a value model (token classification, 1 label)."""
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForTokenClassification,
    )

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    for key, value in (override_config or {}).items():
        setattr(config, key, value)
    if kind == "causal_lm":
        auto = AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM
        return auto.from_pretrained(path, config=config, dtype=dtype, trust_remote_code=trust_remote_code)
    if kind == "value":
        # A value head: one logit per token; the score layer is new (random, seeded by the caller),
        # dropout off so values are deterministic in training mode.
        config.num_labels = 1
        config.classifier_dropout = 0.0
        return AutoModelForTokenClassification.from_pretrained(
            path, config=config, dtype=dtype, trust_remote_code=trust_remote_code
        )
    raise ValueError(f"unknown model kind {kind!r}; use causal_lm or value")


def _layer_classes(model: nn.Module, wrap_names: list[str] | None) -> set[str]:
    names = set(wrap_names or getattr(model, "_no_split_modules", None) or [])
    if not names:
        raise ValueError(
            f"{type(model).__name__} names no decoder-layer class to shard; set "
            "fsdp_config.wrap_policy.transformer_layer_cls_to_wrap to its layer class name"
        )
    return names


def shard_policies(device_type: str, fsdp_config: Any) -> dict[str, Any]:
    """`fully_shard` keyword arguments for mixed precision and CPU offload on a device type.

    GPU: compute in `mixed_precision.param_dtype`, reduce gradients in `reduce_dtype`. Offload: FSDP2's
    CPU offload policy (parameters, gradients and optimizer state live in host memory, copied to the
    GPU layer by layer; the optimizer steps on the CPU) serves `offload_policy` and verl's FSDP1 keys
    `param_offload` / `optimizer_offload` alike: it frees at least what they free, at the cost of
    host-device copies. CPU: nothing to offload to, and the model computes in its own dtype.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    if device_type != "cuda":
        return {}
    mp = _get(fsdp_config, "mixed_precision", None)
    out: dict[str, Any] = {
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=to_dtype(_get(mp, "param_dtype", "bf16")),
            reduce_dtype=to_dtype(_get(mp, "reduce_dtype", "fp32")),
        )
    }
    if any(_get(fsdp_config, key, False) for key in ("offload_policy", "param_offload", "optimizer_offload")):
        out["offload_policy"] = CPUOffloadPolicy()
    return out


def autocast_dtype(device_type: str, fsdp_config: Any, *, sharded: bool, cpu_mixed_precision: bool) -> torch.dtype | None:
    """The dtype forward passes autocast to, or None when the model computes in its own dtype.

    Mixed precision (`mixed_precision.param_dtype`, bf16 by default) always applies on GPU and, on CPU,
    when `trainer.cpu_mixed_precision` asks for it. Where FSDP2 shards on a GPU its MixedPrecisionPolicy
    casts the parameters (see shard_policies); elsewhere (one process, or CPU) `torch.autocast` runs the
    matrix multiplies in that dtype. Master weights, gradients and optimizer state stay in `model_dtype`.
    """
    if device_type == "cuda" and sharded:
        return None
    if device_type == "cpu" and not cpu_mixed_precision:
        return None
    dtype = to_dtype(_get(_get(fsdp_config, "mixed_precision", None), "param_dtype", "bf16"))
    if dtype not in (torch.bfloat16, torch.float16) or dtype == to_dtype(_get(fsdp_config, "model_dtype", "fp32")):
        return None
    return dtype


def join_multi_modal_inputs(
    rows: Sequence[dict[str, torch.Tensor]] | None, device: torch.device
) -> dict[str, torch.Tensor]:
    """A micro-batch's processor tensors: each key's rows concatenated along the first dimension (images of all
    rows, in row order, as the processor would batch them); {} for text prompts."""
    present = [r for r in (rows if rows is not None else ()) if r]
    if not present:
        return {}
    keys = list(present[0])
    for r in present:
        if list(r) != keys:
            raise ValueError(f"image prompts of one micro-batch carry different processor outputs: {keys} vs {list(r)}")
    return {k: torch.cat([r[k] for r in present], dim=0).to(device) for k in keys}


class FSDPEngine:
    """One model (actor, reference, critic) with optional optimizer, sharded when distributed."""

    def __init__(
        self,
        model_path: str,
        kind: ModelKind = "causal_lm",
        device: str = "cpu",
        model_config: Any = None,
        fsdp_config: Any = None,
        optim_config: Any = None,
        total_steps: int | None = None,
        grad_clip: float | None = 1.0,
        seed: int = 0,
        cpu_mixed_precision: bool = False,
        sequence_parallel_size: int = 1,
        freeze_vision_tower: bool = False,
    ) -> None:
        self.device = resolve_device(device)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.rank = dist.get_rank() if self.distributed else 0
        self.grad_clip = grad_clip
        self.kind = kind
        torch.manual_seed(seed)  # same seed on every rank: new heads start identical everywhere
        import_external_lib(_get(model_config, "external_lib", None))
        module = load_hf_model(
            model_path,
            kind=kind,
            dtype=to_dtype(_get(fsdp_config, "model_dtype", "fp32")),
            override_config=_get(model_config, "override_config", {}),
            trust_remote_code=bool(_get(model_config, "trust_remote_code", False)),
        )
        self.hf_config = module.config
        # Qwen-VL-style models compute 3-D rotary positions from the image grids (their `get_rope_index`)
        self.own_positions = any(hasattr(m, "get_rope_index") for m in (module, getattr(module, "model", None)))
        head = module.get_output_embeddings() if kind == "causal_lm" else None
        self.placeholder_bias = (
            placeholder_bias(self.hf_config, head.weight.shape[0], self.device) if head is not None else None
        )
        fused_head.apply_liger(module, model_config, self.device)  # model.use_liger (CUDA, liger-kernel installed)
        self.model_path = model_path
        self.tokenizer_path = str(_get(model_config, "tokenizer_path", None) or model_path)
        self.hf_class_name = type(module).__name__
        # HF causal LMs can project only the last positions onto the vocabulary (`logits_to_keep`):
        # the actor needs the response positions only, and the LM head is a large share of the
        # compute of a small model.
        self.can_keep_logits = kind == "causal_lm" and "logits_to_keep" in inspect.signature(module.forward).parameters
        if freeze_vision_tower:  # actor.freeze_vision_tower: before LoRA and sharding; the optimizer skips it
            tower = vision_tower(module)
            if tower is None:
                raise ValueError(
                    f"actor.freeze_vision_tower=true: {type(module).__name__} has no vision tower (looked for "
                    f"{', '.join(VISION_TOWERS)}); it is for vision-language models: set it to false"
                )
            tower.requires_grad_(False)
        if optim_config is not None and _get(model_config, "enable_gradient_checkpointing", False):
            module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # model.enable_activation_offload: a trained model's saved activations go to host memory (see training_step)
        self.activation_offload = optim_config is not None and bool(_get(model_config, "enable_activation_offload", False))
        # The decoder-layer classes to shard, named by the HF model (a peft wrapper would hide its attributes).
        wrap = _get(_get(fsdp_config, "wrap_policy", None), "transformer_layer_cls_to_wrap", None)
        layer_names = _layer_classes(module, wrap) if self.distributed else set()
        self.lora = kind == "causal_lm" and optim_config is not None and lora.lora_enabled(model_config)
        self.lora_layout: dict[str, lora.LoraScale] = {}
        if self.lora:
            module = lora.apply_lora(module, model_config, model_path)  # peft keeps the base model's forward
            self.lora_layout = lora.lora_layout(module)
        module.to(self.device)
        # Ulysses sequence parallelism (see hybridflow.engines.ulysses): installed before sharding, on the
        # HF model (a peft wrapper's too); the data-parallel size is then world // sp.
        check_sequence_parallel(sequence_parallel_size, self.world_size, self.hf_config)
        self.sp: SequenceGroups | None = None
        self.ulysses: UlyssesModel | None = None
        if sequence_parallel_size > 1:
            self.sp = build_groups(self.world_size, self.rank, sequence_parallel_size)
            self.ulysses = UlyssesModel(module, self.hf_config, self.sp.group, sequence_parallel_size)
        self.module: nn.Module = self._shard(module, fsdp_config, layer_names) if self.distributed else module
        # model.use_fused_kernels: log-probs from hidden states inside the root's forward (see fused_head)
        self.fused_head = fused_head.maybe_install(self.module, kind, model_config, self.placeholder_bias)
        self.autocast_dtype = autocast_dtype(self.device.type, fsdp_config, sharded=self.distributed,
                                             cpu_mixed_precision=cpu_mixed_precision)
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        if optim_config is not None:
            # LoRA: the frozen base weights have no optimizer state (only the adapter's is kept and saved)
            self.optimizer = build_optimizer([p for p in self.module.parameters() if p.requires_grad], optim_config)
            self.lr_scheduler = build_lr_scheduler(self.optimizer, optim_config, total_steps)
        else:
            self.module.requires_grad_(False)
            self.module.eval()

    # ------------------------------------------------------------------ sharding
    def _shard(self, module: nn.Module, fsdp_config: Any, layer_names: set[str]) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fsdp_size = int(_get(fsdp_config, "fsdp_size", -1))
        if fsdp_size < 0 or fsdp_size >= self.world_size:
            mesh = init_device_mesh(self.device.type, (self.world_size,), mesh_dim_names=("fsdp",))
        elif self.world_size % fsdp_size:
            raise ValueError(
                f"fsdp_config.fsdp_size={fsdp_size} does not divide the {self.world_size} ranks; use a divisor "
                "(e.g. the GPUs per node) or -1 to shard over all ranks"
            )
        else:
            # Hybrid sharding (HSDP): shard within groups of fsdp_size ranks (e.g. one node), replicate
            # across groups, so parameter all-gathers stay inside a group and only gradients cross.
            mesh = init_device_mesh(
                self.device.type, (self.world_size // fsdp_size, fsdp_size), mesh_dim_names=("ddp", "fsdp")
            )
        kwargs: dict[str, Any] = {
            "mesh": mesh,
            "reshard_after_forward": bool(_get(fsdp_config, "reshard_after_forward", True)),
            **shard_policies(self.device.type, fsdp_config),
        }
        for sub in module.modules():
            if type(sub).__name__ in layer_names:
                fully_shard(sub, **kwargs)
        fully_shard(module, **kwargs)
        return module

    # ------------------------------------------------------------------ compute
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        logits_to_keep: int | torch.Tensor = 0,
        fused: dict[str, Any] | None = None,
        multi_modal_inputs: Sequence[dict[str, torch.Tensor]] | None = None,
    ) -> Any:
        """The model's fp32 logits for the last positions (causal LM: (b, T', vocab); value model: (b, T', 1)).

        Computed in the mixed-precision dtype where one applies (see `autocast_dtype`), returned in fp32.
        T' <= T: leading columns that are padding in every row are not computed, and with
        `logits_to_keep` > 0 only that many last positions are guaranteed (all of them when the model
        cannot restrict its head). A 1-D tensor of negative positions (counted from the end) keeps
        exactly those where the model can restrict its head (HF's `logits_to_keep` tensor form), all
        positions otherwise. Callers index from the end. With `fused` ({labels, temperature, with_entropy};
        the fused head installed) the model returns `{"log_probs", "entropy"}` of the labels instead.
        `multi_modal_inputs`: a vision-language model's per-row processor tensors (pixel values, image grids;
        see hybridflow.data.vision), joined along their first dimension; a model that places its positions by
        its images itself (Qwen-VL's 3-D rotary positions) gets no `position_ids` and derives them.
        """
        extra = {"logits_to_keep": logits_to_keep} if self._keeps(logits_to_keep) else {}
        if fused is not None:  # the fused head's inputs (labels, temperature): it returns log-probs, not logits
            if self.fused_head is None:
                raise RuntimeError("forward(fused=...) on an engine without the fused head (model.use_fused_kernels)")
            extra = {"fused_head": fused}
        # Left padding that every row has is dropped: nothing attends to it and its outputs are never
        # read (callers index from the end), so the result is the same with less compute.
        used = attention_mask.bool().any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        if first > 0:
            input_ids, attention_mask, position_ids = (t[:, first:] for t in (input_ids, attention_mask, position_ids))
        input_ids, attention_mask, position_ids = (t.to(self.device) for t in (input_ids, attention_mask, position_ids))
        mask: torch.Tensor | None = attention_mask
        if self.ulysses is not None:
            # This rank's slice of the positions; the Ulysses attention holds the whole sequence's mask
            # and the backbone's output comes back gathered, so the head and callers see every position.
            input_ids, position_ids = self.ulysses.prepare(input_ids, attention_mask, position_ids)
            mask = None
        images = join_multi_modal_inputs(multi_modal_inputs, self.device)
        if images and self.own_positions:
            position_ids = None
        with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
            out = self.module(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=position_ids,
                use_cache=False,
                **images,
                **extra,
            )
        return out if fused is not None else out.logits.float()

    @property
    def sequence_parallel_size(self) -> int:
        """Ranks that split each sequence between them (Ulysses); 1 without sequence parallelism."""
        return self.sp.sp if self.sp is not None else 1

    @property
    def data_parallel_size(self) -> int:
        """Groups of ranks that hold different rows: world_size // sequence_parallel_size."""
        return self.world_size // self.sequence_parallel_size

    def _keeps(self, logits_to_keep: int | torch.Tensor) -> bool:
        """Whether the model is asked to project only some positions onto the vocabulary."""
        if not self.can_keep_logits:
            return False
        return logits_to_keep.numel() > 0 if isinstance(logits_to_keep, torch.Tensor) else logits_to_keep > 0

    def all_reduce_sum(self, value: float | torch.Tensor) -> torch.Tensor:
        """Sum a scalar over all ranks (itself when not distributed)."""
        t = torch.as_tensor(value, dtype=torch.float64, device=self.device).clone()
        if self.distributed:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def max_over_ranks(self, value: int) -> int:
        """The largest `value` over all ranks (itself when not distributed); a collective."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def optimizer_step(self) -> float:
        """Clip the global grad norm, step the optimizer and schedule; skip the update on inf/nan.

        Returns the pre-clip gradient norm (what verl logs as actor/grad_norm).
        """
        if self.optimizer is None or self.lr_scheduler is None:
            raise RuntimeError("optimizer_step on an engine built without optim_config (a reference model?)")
        params = [p for p in self.module.parameters() if p.grad is not None]
        max_norm = self.grad_clip if self.grad_clip and self.grad_clip > 0 else float("inf")
        # On DTensor (sharded) gradients this computes the norm over all shards, i.e. the global norm.
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        grad_norm = float(norm)
        if torch.isfinite(torch.tensor(grad_norm)):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.lr_scheduler.step()
        return grad_norm

    def current_lr(self) -> float:
        """The lr the next optimizer step uses."""
        if self.optimizer is None:
            return 0.0
        return float(self.optimizer.param_groups[0]["lr"])

    def training_step(self) -> contextlib.AbstractContextManager[Any]:
        """Where one micro-batch's forward and backward run: with model.enable_activation_offload on an accelerator,
        the tensors autograd saves for backward are moved to (pinned, on CUDA) host memory as forward saves them and
        brought back as backward needs them (`torch.autograd.graph.save_on_cpu`): device memory for activations
        drops to about one layer's worth, at the cost of host-device copies; the numbers are the same. On CPU the
        activations are in host memory already: nothing to do."""
        if not self.activation_offload or self.device.type == "cpu":
            return contextlib.nullcontext()
        return torch.autograd.graph.save_on_cpu(pin_memory=self.device.type == "cuda")

    @contextlib.contextmanager
    def adapter_disabled(self) -> Iterator[None]:
        """Compute with the base model (LoRA off): the reference policy of a LoRA run; a no-op without LoRA."""
        if not self.lora:
            yield
            return
        with self.module.disable_adapter():  # type: ignore[operator]
            yield

    # ------------------------------------------------------------------ state dicts (collectives)
    def full_state_dict(self, rank0_only: bool = False) -> dict[str, torch.Tensor]:
        """The unsharded model weights under HF names (LoRA: merged); a collective. `rank0_only`: others get {}."""
        if not self.distributed:
            state = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
        else:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            opts = StateDictOptions(full_state_dict=True, cpu_offload=rank0_only)
            state = get_model_state_dict(self.module, options=opts)
        return lora.merge_lora_state_dict(state, self.lora_layout) if self.lora else state

    def trainable_state_dict(self, rank0_only: bool = True) -> dict[str, torch.Tensor]:
        """What a checkpoint's model part holds: the LoRA adapter (engine names) with LoRA, else the full
        weights (`full_state_dict`); a collective. `rank0_only`: others get {}."""
        if not self.lora:
            return self.full_state_dict(rank0_only=rank0_only)
        if not self.distributed:
            return {k: p.detach().clone() for k, p in self.module.named_parameters() if p.requires_grad}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=rank0_only, ignore_frozen_params=True)
        return get_model_state_dict(self.module, options=opts)

    def trainable_shapes(self) -> dict[str, torch.Size]:
        """Name -> global shape of every trainable parameter (sharded ones too); no communication."""
        return {name: p.shape for name, p in self.module.named_parameters() if p.requires_grad}

    def load_adapter_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load the LoRA adapter (engine names, every rank passes the whole dict: it is small); a collective."""
        if not self.lora:
            raise RuntimeError("load_adapter_state_dict on an engine without LoRA; load the full weights instead")
        if not self.distributed:
            self.module.load_state_dict(state_dict, strict=False)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        # Each rank holds the whole (small) adapter: no broadcast, frozen base weights stay as they are.
        set_model_state_dict(self.module, state_dict, options=StateDictOptions(full_state_dict=True, strict=False))

    def load_full_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load unsharded weights; a collective. Rank 0's dict is broadcast, others may pass {}."""
        if self.lora:
            raise RuntimeError(
                "load_full_state_dict on a LoRA engine: its base weights are frozen and come from model.path; "
                "load the adapter with load_adapter_state_dict"
            )
        if not self.distributed:
            self.module.load_state_dict(state_dict)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(self.module, state_dict, options=opts)

    def optimizer_state_dict(self) -> dict[str, Any]:
        """Unsharded optimizer state keyed by parameter name (on rank 0; {} elsewhere); a collective."""
        if self.optimizer is None:
            return {}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        if not self.distributed:
            return get_optimizer_state_dict(
                self.module, self.optimizer, options=StateDictOptions(full_state_dict=True)
            )
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(self.module, self.optimizer, options=opts)

    def load_optimizer_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load unsharded optimizer state (rank 0's is broadcast; others may pass {}); a collective."""
        if self.optimizer is None:
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=self.distributed)
        set_optimizer_state_dict(self.module, self.optimizer, optim_state_dict=state_dict, options=opts)

    def named_full_parameters(self) -> Iterable[tuple[str, torch.Tensor]]:
        """(name, full tensor) pairs of the weights; a collective (see `full_state_dict`)."""
        return self.full_state_dict().items()
