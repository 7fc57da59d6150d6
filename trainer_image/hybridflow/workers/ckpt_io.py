"""World-size-independent engine checkpoints written and read through fsspec (local paths, s3://, ...).

Files under the engine's folder (e.g. `<root>/global_step_N/actor/`):
`model.pt` (full state dict, HF parameter names), `optimizer.pt` (full optimizer state keyed by
parameter name), `extra_state.pt` (lr scheduler, world size that wrote it), and with `hf_model` in the
contents a `huggingface/` folder (config.json + model.safetensors) loadable by `from_pretrained`.
Gathers and broadcasts are collectives: every rank calls these functions at the same time.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fsspec
import torch

from hybridflow.engines.fsdp_engine import FSDPEngine

MODEL_FILE = "model.pt"
OPTIM_FILE = "optimizer.pt"
EXTRA_FILE = "extra_state.pt"
HF_DIR = "huggingface"


def _write(fs: Any, path: str, obj: Any) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    with fs.open(path, "wb") as f:
        f.write(buf.getvalue())


def _read(fs: Any, path: str) -> Any:
    with fs.open(path, "rb") as f:
        return torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=False)


def save_engine_checkpoint(engine: FSDPEngine, dir_uri: str, contents: Sequence[str]) -> None:
    """Gather full states on all ranks; rank 0 writes the files of `contents` under `dir_uri`."""
    model_sd = engine.full_state_dict(rank0_only=True) if {"model", "hf_model"} & set(contents) else {}
    optim_sd = engine.optimizer_state_dict() if "optimizer" in contents else {}
    if engine.rank != 0:
        return
    fs, root = fsspec.core.url_to_fs(dir_uri)
    fs.makedirs(root, exist_ok=True)
    if "model" in contents:
        _write(fs, f"{root}/{MODEL_FILE}", model_sd)
    if "optimizer" in contents and engine.optimizer is not None:
        _write(fs, f"{root}/{OPTIM_FILE}", optim_sd)
    if "extra" in contents:
        scheduler = engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None
        _write(fs, f"{root}/{EXTRA_FILE}", {"lr_scheduler": scheduler, "world_size": engine.world_size})
    if "hf_model" in contents:
        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory() as tmp:
            engine.hf_config.save_pretrained(tmp)
            save_file({k: v.contiguous() for k, v in model_sd.items()}, str(Path(tmp) / "model.safetensors"))
            fs.makedirs(f"{root}/{HF_DIR}", exist_ok=True)
            for file in Path(tmp).iterdir():
                fs.put_file(str(file), f"{root}/{HF_DIR}/{file.name}")


def load_engine_checkpoint(engine: FSDPEngine, dir_uri: str, contents: Sequence[str]) -> None:
    """Load `contents` from `dir_uri`: rank 0 reads model/optimizer and broadcasts; all read extra."""
    fs, root = fsspec.core.url_to_fs(dir_uri)
    wanted = [
        (part, f"{root}/{name}")
        for part, name in (("model", MODEL_FILE), ("optimizer", OPTIM_FILE), ("extra", EXTRA_FILE))
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
        if part == "model":
            engine.load_full_state_dict(_read(fs, path) if engine.rank == 0 else {})
        elif part == "optimizer":
            engine.load_optimizer_state_dict(_read(fs, path) if engine.rank == 0 else {})
        elif part == "extra" and engine.lr_scheduler is not None:
            extra = _read(fs, path)
            if extra.get("lr_scheduler") is not None:
                engine.lr_scheduler.load_state_dict(extra["lr_scheduler"])
