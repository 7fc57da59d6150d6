"""Rollout engines behind one interface: HF `generate` here; vLLM / SGLang modules load lazily."""

from __future__ import annotations

import importlib
from typing import Any

from hybridflow.rollout.base import RolloutEngine

# engine name -> "module:class"; vLLM and SGLang modules are imported only when chosen.
ROLLOUT_ENGINES = {
    "hf": "hybridflow.rollout.hf_rollout:HFRollout",
    "vllm": "hybridflow.rollout.vllm_rollout:VLLMRollout",
    "sglang": "hybridflow.rollout.sglang_rollout:SGLangRollout",
}

# engine name -> "module:class" of its server replica (rollout.mode=async): async engines, token ids in and out;
# the names are hybridflow._config.names.SERVER_ROLLOUT_NAMES (the config checks them without importing this).
SERVER_ENGINES = {
    "vllm": "hybridflow.rollout.async_vllm:AsyncVLLMEngine",
    "sglang": "hybridflow.rollout.async_sglang:AsyncSGLangEngine",
}


def get_rollout_cls(name: str, server: bool = False) -> Any:
    """The engine class for `actor_rollout_ref.rollout.name`, imported on demand (`server`: its server replica)."""
    table = SERVER_ENGINES if server else ROLLOUT_ENGINES
    if name not in table:
        kind = "server-mode (rollout.mode=async) " if server else ""
        raise ValueError(f"unknown {kind}rollout engine {name!r}; choose one of {sorted(table)}")
    module_name, cls_name = table[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ImportError(
            f"rollout engine {name!r} is not available here ({err}); install it (vllm on CPU: `make vllm`; "
            f"on a CUDA machine: pip install -c constraints.txt '.[{name}]') or set actor_rollout_ref.rollout.name=hf"
        ) from err
    cls: Any = getattr(module, cls_name)
    return cls


__all__ = ["ROLLOUT_ENGINES", "SERVER_ENGINES", "RolloutEngine", "get_rollout_cls"]
