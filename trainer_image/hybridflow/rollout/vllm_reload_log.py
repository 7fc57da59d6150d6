"""Silence vLLM's one spurious warning on every in-place weight reload, and nothing else.

vLLM 0.32's layerwise reload (`vllm/model_executor/model_loader/reload/layerwise.py`,
`finalize_layerwise_processing`) counts every parameter *and buffer* of a layer as loadable, then warns
"<Layer>: Failed to load weights" for each layer that received none. vLLM's `RotaryEmbedding` holds only
`cos_sin_cache`, a non-persistent buffer computed from the config at start-up: no checkpoint carries it
(HF's `rotary_emb.inv_freq` is non-persistent too, so our state dicts do not contain it either), so the
line appears on every push, and also when vLLM reloads the model's own files from disk
(`collective_rpc("reload_weights", kwargs={"weights_path": ...})`). vLLM then puts the layer's original
tensors back, so the cache is unchanged and correct (tests/integration/test_vllm_rollout.py checks the
engine's log-probs against transformers on the pushed weights).

The filter below drops that message only for layer classes that, in the running model, own tensors
but no parameter and no persistent buffer, i.e. nothing a state dict could name. A layer with real
weights that failed to load still warns, and vLLM's own check of checkpoint names it did not load
(`inplace.py`, "weights not loaded") is untouched. docs/troubleshooting.md explains the line for
engines this filter does not reach.
"""

from __future__ import annotations

import logging

import torch

RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
NO_WEIGHTS_MESSAGE = "%s: Failed to load weights"  # vLLM's format string, matched exactly


def _own_tensors(module: torch.nn.Module) -> tuple[bool, bool]:
    """(holds something a state dict names, holds a non-persistent buffer), direct tensors only."""
    transient = module._non_persistent_buffers_set
    named = any(p is not None for p in module._parameters.values()) or any(
        b is not None and k not in transient for k, b in module._buffers.items()
    )
    unnamed = any(b is not None and k in transient for k, b in module._buffers.items())
    return named, unnamed


def find_buffer_only_layers(model: torch.nn.Module) -> frozenset[str]:
    """Class names whose every instance in `model` holds tensors, all of them non-persistent buffers.

    A class with at least one instance that owns a parameter or a persistent buffer is left out: its
    "Failed to load weights" may be real.
    """
    buffer_only: set[str] = set()
    loadable: set[str] = set()
    for module in model.modules():
        named, unnamed = _own_tensors(module)
        if named:
            loadable.add(type(module).__name__)
        elif unnamed:
            buffer_only.add(type(module).__name__)
    return frozenset(buffer_only - loadable)


class BufferOnlyReloadFilter(logging.Filter):
    """Drops vLLM's "Failed to load weights" for the named buffer-only layer classes only."""

    def __init__(self, layer_names: frozenset[str]) -> None:
        super().__init__()
        self.layer_names = layer_names

    def filter(self, record: logging.LogRecord) -> bool:
        """False (drop) only for the exact message about one of `layer_names`."""
        if record.msg != NO_WEIGHTS_MESSAGE or not isinstance(record.args, tuple) or len(record.args) != 1:
            return True
        return record.args[0] not in self.layer_names


def quiet_buffer_only_reload_warnings(model: torch.nn.Module) -> None:
    """Install (or widen) the filter on vLLM's layerwise-reload logger for `model`'s buffer-only layers.

    Idempotent: one filter per logger; a second model's names are added to it. Call it in the process
    that runs the reload (the vLLM worker), before `reload_weights`.
    """
    names = find_buffer_only_layers(model)
    logger = logging.getLogger(RELOAD_LOGGER)
    for existing in logger.filters:
        if isinstance(existing, BufferOnlyReloadFilter):
            existing.layer_names = existing.layer_names | names
            return
    logger.addFilter(BufferOnlyReloadFilter(names))
