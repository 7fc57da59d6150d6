"""Choosing the rollout engine by actor_rollout_ref.rollout.name, and the advice when one is missing."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from hybridflow.config import load_config
from hybridflow.rollout import registry
from hybridflow.rollout.registry import (
    RolloutEngineUnavailable,
    build_rollout_engine,
    engine_available,
    require_engine,
)


def hide_packages(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name in names else real(name, *args, **kwargs)

    monkeypatch.setattr(registry.importlib.util, "find_spec", find_spec)


def test_unknown_engine_lists_the_valid_names() -> None:
    with pytest.raises(ValueError, match=r"rollout.name.*\['hf', 'sglang', 'vllm'\]"):
        require_engine("trtllm")


@pytest.mark.parametrize(
    ("name", "advice"),
    [("vllm", "make vllm"), ("sglang", "pip install -c constraints.txt '.[sglang]'")],
)
def test_missing_engine_says_how_to_install_and_how_to_fall_back(
    monkeypatch: pytest.MonkeyPatch, name: str, advice: str
) -> None:
    hide_packages(monkeypatch, name)
    assert not engine_available(name)
    with pytest.raises(RolloutEngineUnavailable) as err:
        require_engine(name)
    msg = str(err.value)
    assert f"rollout.name={name}" in msg and advice in msg and "rollout.name=hf" in msg


def test_build_checks_before_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_packages(monkeypatch, "vllm")
    cfg = load_config(None, ["actor_rollout_ref.model.path=/nowhere", "actor_rollout_ref.rollout.name=vllm"])
    with pytest.raises(RolloutEngineUnavailable, match="make vllm"):
        build_rollout_engine(cfg)


def test_build_requires_a_model_path() -> None:
    cfg = load_config(None, ["actor_rollout_ref.rollout.name=hf"])
    with pytest.raises(ValueError, match="actor_rollout_ref.model.path"):
        build_rollout_engine(cfg)


def test_build_hf_engine_from_the_trainer_config(tmp_path: Path) -> None:
    from hybridflow.models.tiny import build_tiny_model
    from hybridflow.rollout.hf_rollout import HFRollout

    model = build_tiny_model(tmp_path / "m", hidden=64, layers=1)
    cfg = load_config(
        None,
        [
            f"actor_rollout_ref.model.path={model}",
            "actor_rollout_ref.rollout.name=hf",
            "data.max_response_length=5",
            "trainer.device=cpu",
        ],
    )
    engine = build_rollout_engine(cfg)
    assert isinstance(engine, HFRollout) and engine.response_length == 5
    assert engine.device.type == "cpu"


def test_vllm_is_the_default_engine_name() -> None:
    assert load_config(None, []).actor_rollout_ref.rollout.name == "vllm"


def test_weights_for_vllm_workers_keep_tied_tensors_as_copies() -> None:
    """A model's own state_dict() ties the LM head to the embedding (one storage); the blob shipped to vLLM's
    workers holds each name with its values (safetensors refuses shared storage)."""
    import torch
    from safetensors.torch import load

    from hybridflow.rollout.vllm_rollout import _state_dict_to_bytes

    embed = torch.arange(6.0).reshape(3, 2)
    weights = [("model.embed_tokens.weight", embed), ("lm_head.weight", embed), ("row", embed[1]),
               ("bias", torch.ones(2))]
    back = load(_state_dict_to_bytes(weights))
    assert set(back) == {"model.embed_tokens.weight", "lm_head.weight", "row", "bias"}
    assert torch.equal(back["lm_head.weight"], embed) and torch.equal(back["row"], embed[1])
