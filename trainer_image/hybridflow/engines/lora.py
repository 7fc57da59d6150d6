"""LoRA (peft) for the FSDP engine: wrap an HF model, merge the adapter into base-named weights, adapter files.

With `model.lora_rank > 0` (or `model.lora_adapter_path`) the engine trains a peft `PeftModel`: the base
weights are frozen, only the low-rank A/B matrices of the targeted Linear layers (and their optimizer
state) change (Hu et al. 2021, LoRA, arXiv:2106.09685: W' = W + (alpha / r) B A). Three views of it:

- the trainer's forward: the peft model itself (base path + scaled low-rank path);
- the rollout and the exporter: `merge_lora_state_dict` folds B A into W and returns the plain HF names
  (`model.layers.0.self_attn.q_proj.weight`), so every engine loads them like a full fine-tune's weights;
- checkpoints: the adapter alone, in peft's own file layout (`adapter_config.json`,
  `adapter_model.safetensors`), which `PeftModel.from_pretrained` and `model.lora_adapter_path` read back.

Only LoRA on `nn.Linear` layers is merged here (what `target_modules=all-linear` picks); an adapter with
DoRA, LoRA biases, embedding targets or fully trained `modules_to_save` is refused with a message.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

ADAPTER_NAME = "default"
PEFT_PREFIX = "base_model.model."
ADAPTER_DIR = "lora_adapter"
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    value = cfg.get(key, default) if isinstance(cfg, dict) else getattr(cfg, key, default)
    return default if value is None else value


def lora_enabled(model_config: Any) -> bool:
    """LoRA is on when `lora_rank > 0` or an adapter to start from is given (verl's rule)."""
    return int(_get(model_config, "lora_rank", 0) or 0) > 0 or bool(_get(model_config, "lora_adapter_path", None))


def _as_peft_modules(value: Any) -> Any:
    """A module selection for peft: one string as is (`all-linear`, a regex), a sequence as a list."""
    if value is None or isinstance(value, str):
        return value
    return [str(v) for v in value]


def build_lora_config(model_config: Any, base_path: str, task_type: str = "CAUSAL_LM") -> Any:
    """The peft `LoraConfig` of verl's keys: lora_rank, lora_alpha, target_modules, exclude_modules."""
    from peft import LoraConfig

    return LoraConfig(
        r=int(_get(model_config, "lora_rank", 0)),
        lora_alpha=float(_get(model_config, "lora_alpha", 16)),
        target_modules=_as_peft_modules(_get(model_config, "target_modules", "all-linear")),
        exclude_modules=_as_peft_modules(_get(model_config, "exclude_modules", None)),
        bias="none",
        task_type=task_type,
        base_model_name_or_path=base_path,
    )


def local_adapter_dir(path: str) -> str:
    """A local folder holding the adapter at `path` (an object-storage URI is downloaded to a temporary one)."""
    if "://" not in path or path.startswith("file://"):
        local = path[len("file://"):] if path.startswith("file://") else path
        if not os.path.isfile(os.path.join(local, ADAPTER_CONFIG_FILE)):
            raise FileNotFoundError(
                f"model.lora_adapter_path={path!r} holds no {ADAPTER_CONFIG_FILE}; point it at a peft adapter folder "
                f"(what PeftModel.save_pretrained writes, or a checkpoint's actor/{ADAPTER_DIR})"
            )
        return local
    from hybridflow import storage

    target = tempfile.mkdtemp(prefix="hybridflow-adapter-")
    storage.download_dir(path, target)
    if not os.path.isfile(os.path.join(target, ADAPTER_CONFIG_FILE)):
        raise FileNotFoundError(
            f"model.lora_adapter_path={path!r} holds no {ADAPTER_CONFIG_FILE}; point it at a peft adapter folder"
        )
    return target


def apply_lora(module: nn.Module, model_config: Any, base_path: str) -> nn.Module:
    """The HF model wrapped as a trainable peft model: a new adapter, or the one at `lora_adapter_path`."""
    from peft import PeftModel, get_peft_model

    adapter_path = _get(model_config, "lora_adapter_path", None)
    if adapter_path:
        peft_model = PeftModel.from_pretrained(module, local_adapter_dir(str(adapter_path)), is_trainable=True)
    else:
        try:
            peft_model = get_peft_model(module, build_lora_config(model_config, base_path))
        except ValueError as exc:  # peft: no module matched (or a name it cannot parse)
            raise ValueError(
                f"model.target_modules={_get(model_config, 'target_modules', 'all-linear')!r} with "
                f"model.exclude_modules={_get(model_config, 'exclude_modules', None)!r} selects no layer for LoRA "
                f"({exc}); name Linear layers of {type(module).__name__} (e.g. [q_proj,v_proj]) or use all-linear"
            ) from exc
    check_mergeable(peft_model)
    return peft_model


def check_mergeable(peft_model: nn.Module) -> None:
    """Refuse adapters whose layers `merge_lora_state_dict` cannot fold into the base weights."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    config = peft_model.peft_config[ADAPTER_NAME]  # type: ignore[index]
    problems = []
    if getattr(config, "use_dora", False):
        problems.append("DoRA (use_dora)")
    if getattr(config, "lora_bias", False):
        problems.append("LoRA biases (lora_bias)")
    if getattr(config, "modules_to_save", None):
        problems.append(f"fully trained modules (modules_to_save={sorted(config.modules_to_save)})")
    others = sorted({type(m).__name__ for m in peft_model.modules() if isinstance(m, LoraLayer)
                     and not isinstance(m, LoraLinear)})
    if others:
        problems.append(f"LoRA on non-Linear layers ({', '.join(others)})")
    if not any(isinstance(m, LoraLinear) for m in peft_model.modules()):
        problems.append("no LoRA layer at all (target_modules matched nothing)")
    if problems:
        raise ValueError(
            f"this LoRA adapter uses {'; '.join(problems)}, which HybridFlow cannot merge into the rollout's weights; "
            "target Linear layers only (model.target_modules=all-linear, or a list such as [q_proj,v_proj]) and "
            "leave modules_to_save, DoRA and LoRA biases off"
        )


@dataclass(frozen=True)
class LoraScale:
    """How one LoRA Linear folds into its base weight: W + scaling x B A (transposed for fan-in-fan-out)."""

    scaling: float
    fan_in_fan_out: bool = False


def lora_layout(peft_model: nn.Module) -> dict[str, LoraScale]:
    """Per LoRA layer (HF module name, e.g. `model.layers.0.self_attn.q_proj`) its merge scaling."""
    from peft.tuners.lora import LoraLayer

    out = {}
    for name, sub in peft_model.named_modules():
        if isinstance(sub, LoraLayer) and ADAPTER_NAME in sub.scaling:
            hf_name = name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name
            out[hf_name] = LoraScale(float(sub.scaling[ADAPTER_NAME]), bool(getattr(sub, "fan_in_fan_out", False)))
    return out


def merge_lora_state_dict(state: Mapping[str, torch.Tensor], layout: Mapping[str, LoraScale]) -> dict[str, torch.Tensor]:
    """A peft model's full state dict as the base model's: B A folded into each LoRA layer's weight, HF names.

    `base_model.model.X.base_layer.weight` + `X.lora_A/B.default.weight` -> `X.weight` (merged, in the base
    weight's dtype, computed in fp32); every other tensor keeps its value under its HF name. An empty dict
    (ranks other than 0 of a rank-0-only gather) stays empty.
    """
    out: dict[str, torch.Tensor] = {}
    factors: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        name = key[len(PEFT_PREFIX):] if key.startswith(PEFT_PREFIX) else key
        for part in ("A", "B"):
            marker = f".lora_{part}.{ADAPTER_NAME}."
            if marker in name:
                factors.setdefault(name.split(marker)[0], {})[part] = tensor
                break
        else:
            out[name.replace(".base_layer.", ".")] = tensor
    for module, ab in factors.items():
        if set(ab) != {"A", "B"} or module not in layout or f"{module}.weight" not in out:
            raise ValueError(f"LoRA layer {module} is incomplete in the state dict (have {sorted(ab)}); cannot merge it")
        base = out[f"{module}.weight"]
        delta = (ab["B"].float() @ ab["A"].float()) * layout[module].scaling
        if layout[module].fan_in_fan_out:
            delta = delta.T
        out[f"{module}.weight"] = (base.float() + delta.to(base.device)).to(base.dtype)
    return out


def adapter_file_key(fqn: str) -> str:
    """A trainable parameter's name as peft's adapter file spells it (`.default` dropped, as peft saves)."""
    return fqn.replace(f".{ADAPTER_NAME}.", ".", 1)


def to_adapter_file(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Trainable LoRA weights (engine names) -> the tensors of `adapter_model.safetensors`."""
    return {adapter_file_key(k): v.detach().contiguous().cpu() for k, v in state.items()}


def from_adapter_file(tensors: Mapping[str, torch.Tensor], trainable: Mapping[str, torch.Size]) -> dict[str, torch.Tensor]:
    """`adapter_model.safetensors` tensors -> engine names, checked against the model's trainable parameters.

    Raises ValueError naming what differs (another rank, other target modules) instead of loading a part.
    """
    by_file = {adapter_file_key(name): name for name in trainable}
    missing = sorted(set(by_file) - set(tensors))
    extra = sorted(set(tensors) - set(by_file))
    shapes = [f"{k}: {tuple(tensors[k].shape)} in the file, {tuple(trainable[by_file[k]])} here"
              for k in sorted(set(by_file) & set(tensors)) if tuple(tensors[k].shape) != tuple(trainable[by_file[k]])]
    if missing or extra or shapes:
        detail = "; ".join(filter(None, [
            f"{len(missing)} adapter weights missing (e.g. {missing[0]})" if missing else "",
            f"{len(extra)} unexpected (e.g. {extra[0]})" if extra else "",
            f"shapes differ ({shapes[0]})" if shapes else "",
        ]))
        raise ValueError(
            f"the LoRA adapter does not fit this model's LoRA layers: {detail}. Use the lora_rank, target_modules "
            "and exclude_modules the adapter was trained with, or start fresh (trainer.resume_mode=disable)"
        )
    return {by_file[k]: v for k, v in tensors.items()}


def adapter_config_dict(peft_model: nn.Module) -> dict[str, Any]:
    """The adapter's `adapter_config.json` content (peft's own serialisation, JSON-safe)."""
    config = peft_model.peft_config[ADAPTER_NAME]  # type: ignore[index]
    data = config.to_dict()
    for key, value in list(data.items()):
        if isinstance(value, set):
            data[key] = sorted(value)
        elif hasattr(value, "value"):  # enums (task_type, peft_type)
            data[key] = value.value
    return data


def write_adapter_folder(folder: str, tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> None:
    """Write a peft adapter folder (`adapter_config.json` + `adapter_model.safetensors`) locally."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, ADAPTER_CONFIG_FILE), "w", encoding="utf-8") as handle:
        json.dump(dict(config), handle, indent=2, sort_keys=True)
    save_file(dict(tensors), os.path.join(folder, ADAPTER_WEIGHTS_FILE))


def trainable_parameter_count(module: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts (global shapes, also for sharded DTensor parameters)."""
    trainable = total = 0
    for p in module.parameters():
        n = p.numel()
        total += n
        trainable += n if p.requires_grad else 0
    return trainable, total
