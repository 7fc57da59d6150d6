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


def get_rollout_cls(name: str) -> type[RolloutEngine]:
    """The engine class for `actor_rollout_ref.rollout.name`, imported on demand."""
    if name not in ROLLOUT_ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; choose one of {sorted(ROLLOUT_ENGINES)}")
    module_name, cls_name = ROLLOUT_ENGINES[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ImportError(
            f"rollout engine {name!r} is not available here ({err}); install it (vllm on CPU: `make vllm`; "
            f"on a CUDA machine: pip install -c constraints.txt '.[{name}]') or set actor_rollout_ref.rollout.name=hf"
        ) from err
    cls: Any = getattr(module, cls_name)
    return cls


__all__ = ["ROLLOUT_ENGINES", "RolloutEngine", "get_rollout_cls"]
