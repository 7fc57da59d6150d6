"""Data: verl-format parquet prompts, the collate function, a resumable loader, and toy tasks.

`RLHFDataset`, `collate_fn` and `StatefulDataLoader` need torch and are imported on first access, so
`python -m hybridflow.data.toy` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "RLHFDataset": "hybridflow.data.dataset",
    "collate_fn": "hybridflow.data.dataset",
    "read_parquet_rows": "hybridflow.data.dataset",
    "StatefulDataLoader": "hybridflow.data.sampler",
    "build_toy_tokenizer": "hybridflow.data.toy",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    """Import the public names lazily from their modules."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
