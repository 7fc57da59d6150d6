"""The filter for vLLM's spurious "Failed to load weights" on buffer-only layers (issue 17), without vLLM."""

from __future__ import annotations

import logging

import pytest
import torch

from hybridflow.rollout.vllm_reload_log import (
    NO_WEIGHTS_MESSAGE,
    RELOAD_LOGGER,
    BufferOnlyReloadFilter,
    find_buffer_only_layers,
    quiet_buffer_only_reload_warnings,
)


class RotaryEmbedding(torch.nn.Module):
    """Like vLLM's: a cos/sin cache no checkpoint carries."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cos_sin_cache", torch.zeros(4, 2), persistent=False)


class Norm(torch.nn.Module):
    def __init__(self, persistent_stat: bool) -> None:
        super().__init__()
        if persistent_stat:
            self.register_buffer("stat", torch.zeros(2))
        else:
            self.weight = torch.nn.Parameter(torch.ones(2))


class Scaled(torch.nn.Module):
    """One instance buffer-only, another with a weight: the class is not buffer-only."""

    def __init__(self, with_weight: bool) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(2), persistent=False)
        if with_weight:
            self.weight = torch.nn.Parameter(torch.ones(2))


def toy_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        RotaryEmbedding(), Norm(persistent_stat=True), Norm(persistent_stat=False),
        Scaled(with_weight=False), Scaled(with_weight=True), torch.nn.Linear(2, 2),
    )


def test_only_classes_with_nothing_a_state_dict_names_are_buffer_only() -> None:
    assert find_buffer_only_layers(toy_model()) == frozenset({"RotaryEmbedding"})


def record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(RELOAD_LOGGER, logging.WARNING, "layerwise.py", 266, msg, args, None)


@pytest.mark.parametrize(
    ("msg", "args", "kept"),
    [
        (NO_WEIGHTS_MESSAGE, ("RotaryEmbedding",), False),
        (NO_WEIGHTS_MESSAGE, ("RowParallelLinear",), True),  # a real layer that got no weights
        ("%s: Excessive loading", ("RotaryEmbedding",), True),  # any other message
        ("RotaryEmbedding: Failed to load weights", (), True),  # not vLLM's format string
    ],
)
def test_filter_drops_exactly_the_buffer_only_message(msg: str, args: tuple[object, ...], kept: bool) -> None:
    assert BufferOnlyReloadFilter(frozenset({"RotaryEmbedding"})).filter(record(msg, *args)) is kept


def test_install_is_idempotent_and_widens_the_names() -> None:
    logger = logging.getLogger(RELOAD_LOGGER)
    before = list(logger.filters)
    try:
        quiet_buffer_only_reload_warnings(toy_model())
        quiet_buffer_only_reload_warnings(torch.nn.Sequential(Scaled(with_weight=False)))
        ours = [f for f in logger.filters if isinstance(f, BufferOnlyReloadFilter)]
        assert len(ours) == 1 and ours[0].layer_names == {"RotaryEmbedding", "Scaled"}
        assert not logger.filter(record(NO_WEIGHTS_MESSAGE, "RotaryEmbedding"))
    finally:
        logger.filters[:] = before
