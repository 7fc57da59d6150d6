"""World-size-independent engine checkpoints written and read through fsspec (local paths, s3://, ...).

Files under the engine's folder (e.g. `<root>/global_step_N/actor/`):

- `model.pt`: the full state dict, HF parameter names (full fine-tuning), or with LoRA
  `lora_adapter/` instead: the adapter alone in peft's layout (`adapter_config.json`, whose
  `base_model_name_or_path` names the frozen base model, and `adapter_model.safetensors`), loadable by
  `PeftModel.from_pretrained` and by `model.lora_adapter_path`;
- `optimizer.pt`: the full optimizer state keyed by parameter name (with LoRA: the adapter's only);
- `extra_state.pt`: lr scheduler, world size that wrote it;
- `huggingface/`, always: `config.json` (architectures = the trained class), `generation_config.json` when the
  model folder has one, and the tokenizer, so the checkpoint alone can be exported
  (`python -m hybridflow.model_merger merge`); with `hf_model` in the contents also `model.safetensors`
  (LoRA: the merged weights), loadable by `from_pretrained`.

Gathers and broadcasts are collectives: every rank calls these functions at the same time.
"""

from __future__ import annotations

import copy
import io
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fsspec
import torch

from hybridflow.data.vision import save_processor
from hybridflow.engines import lora
from hybridflow.engines.fsdp_engine import FSDPEngine

MODEL_FILE = "model.pt"
OPTIM_FILE = "optimizer.pt"
EXTRA_FILE = "extra_state.pt"
HF_DIR = "huggingface"
ADAPTER_DIR = lora.ADAPTER_DIR

logger = logging.getLogger(__name__)


def _write(fs: Any, path: str, obj: Any) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    with fs.open(path, "wb") as f:
        f.write(buf.getvalue())


def _read(fs: Any, path: str) -> Any:
    with fs.open(path, "rb") as f:
        return torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=False)


def _put_dir(fs: Any, local: str, remote: str) -> None:
    fs.makedirs(remote, exist_ok=True)
    for file in sorted(Path(local).iterdir()):
        fs.put_file(str(file), f"{remote}/{file.name}")


def write_hf_metadata(engine: FSDPEngine, folder: str) -> None:
    """config.json (architectures: the class trained), generation_config.json and the tokenizer into `folder`.

    What a checkpoint needs to become a Hugging Face folder without the original model folder. A model
    without a generation config or a loadable tokenizer (a bare value model) still gets its config.
    """
    from transformers import AutoTokenizer, GenerationConfig

    config = copy.deepcopy(engine.hf_config)
    config.architectures = [engine.hf_class_name]
    config.save_pretrained(folder)
    try:
        GenerationConfig.from_pretrained(engine.model_path).save_pretrained(folder)
    except OSError:
        pass  # the model folder has none; `from_pretrained` then derives one from the config
    try:
        AutoTokenizer.from_pretrained(engine.tokenizer_path).save_pretrained(folder)
    except (OSError, ValueError) as exc:
        logger.warning("checkpoint without a tokenizer: %s could not be loaded (%s); an export needs "
                       "--hf_model_path then", engine.tokenizer_path, exc)
    save_processor(engine.tokenizer_path, folder)


def save_engine_checkpoint(engine: FSDPEngine, dir_uri: str, contents: Sequence[str]) -> None:
    """Gather full states on all ranks; rank 0 writes the files of `contents` under `dir_uri`."""
    wanted = set(contents)
    model_sd = engine.trainable_state_dict(rank0_only=True) if "model" in wanted else {}
    # hf_model holds loadable weights: the full (LoRA: merged) ones; without LoRA model_sd already is that.
    # Decided from the contents alone, the same on every rank: the gather is a collective.
    gather_full = "hf_model" in wanted and (engine.lora or "model" not in wanted)
    hf_sd = engine.full_state_dict(rank0_only=True) if gather_full else model_sd
    optim_sd = engine.optimizer_state_dict() if "optimizer" in wanted else {}
    if engine.rank != 0:
        return
    fs, root = fsspec.core.url_to_fs(dir_uri)
    fs.makedirs(root, exist_ok=True)
    if "model" in wanted and engine.lora:
        with tempfile.TemporaryDirectory() as tmp:
            lora.write_adapter_folder(tmp, lora.to_adapter_file(model_sd), lora.adapter_config_dict(engine.module))
            _put_dir(fs, tmp, f"{root}/{ADAPTER_DIR}")
    elif "model" in wanted:
        _write(fs, f"{root}/{MODEL_FILE}", model_sd)
    if "optimizer" in wanted and engine.optimizer is not None:
        _write(fs, f"{root}/{OPTIM_FILE}", optim_sd)
    if "extra" in wanted:
        scheduler = engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None
        _write(fs, f"{root}/{EXTRA_FILE}", {"lr_scheduler": scheduler, "world_size": engine.world_size,
                                            "lora": engine.lora})
    with tempfile.TemporaryDirectory() as tmp:
        write_hf_metadata(engine, tmp)
        if "hf_model" in wanted:
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in hf_sd.items()}, str(Path(tmp) / "model.safetensors"))
        _put_dir(fs, tmp, f"{root}/{HF_DIR}")


def _model_file(fs: Any, root: str, engine: FSDPEngine, dir_uri: str) -> str:
    """The model part to read: the adapter with LoRA, model.pt without; a mismatch is explained, not loaded."""
    adapter = f"{root}/{ADAPTER_DIR}/{lora.ADAPTER_WEIGHTS_FILE}"
    full = f"{root}/{MODEL_FILE}"
    if engine.lora and not fs.exists(adapter) and fs.exists(full):
        raise ValueError(
            f"checkpoint {dir_uri} holds full model weights ({MODEL_FILE}), but this run trains LoRA "
            "(actor_rollout_ref.model.lora_rank > 0): resume with lora_rank=0, or start the LoRA run fresh "
            "(trainer.resume_mode=disable, or another trainer.default_local_dir)"
        )
    if not engine.lora and fs.exists(adapter) and not fs.exists(full):
        raise ValueError(
            f"checkpoint {dir_uri} holds a LoRA adapter ({ADAPTER_DIR}/), but this run trains all weights "
            "(lora_rank=0): resume with the LoRA settings it was trained with, or start fresh "
            "(trainer.resume_mode=disable)"
        )
    return adapter if engine.lora else full


def load_engine_checkpoint(engine: FSDPEngine, dir_uri: str, contents: Sequence[str]) -> None:
    """Load `contents` from `dir_uri`: rank 0 reads model/optimizer and broadcasts; all read extra.

    A LoRA adapter is small: every rank reads it (and checks it fits before any collective starts).
    """
    fs, root = fsspec.core.url_to_fs(dir_uri)
    names = {"model": _model_file(fs, root, engine, dir_uri) if "model" in contents else "",
             "optimizer": f"{root}/{OPTIM_FILE}", "extra": f"{root}/{EXTRA_FILE}"}
    wanted = [
        (part, names[part])
        for part in ("model", "optimizer", "extra")
        if part in contents and (part != "optimizer" or engine.optimizer is not None)
    ]
    # Every rank checks before any collective starts, so a missing file fails everywhere, not in a hang.
    missing = [path for _, path in wanted if not fs.exists(path)]
    if missing:
        raise FileNotFoundError(
            f"checkpoint {dir_uri} lacks {missing}; it was saved without these parts or is incomplete. "
            "Resume from another step, or narrow checkpoint.load_contents"
        )
    for part, path in wanted:
        if part == "model" and engine.lora:
            from safetensors.torch import load as load_safetensors

            with fs.open(path, "rb") as f:
                tensors = load_safetensors(f.read())
            engine.load_adapter_state_dict(lora.from_adapter_file(tensors, engine.trainable_shapes()))
        elif part == "model":
            engine.load_full_state_dict(_read(fs, path) if engine.rank == 0 else {})
        elif part == "optimizer":
            engine.load_optimizer_state_dict(_read(fs, path) if engine.rank == 0 else {})
        elif part == "extra" and engine.lr_scheduler is not None:
            extra = _read(fs, path)
            if extra.get("lr_scheduler") is not None:
                engine.lr_scheduler.load_state_dict(extra["lr_scheduler"])
