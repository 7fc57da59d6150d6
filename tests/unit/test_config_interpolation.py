"""Limits of the `${...}` resolver (hybridflow/_config/interpolation.py): problems, never tracebacks (issue 12)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from hybridflow.config import ConfigError, parse_config


def _chain(length: int) -> dict[str, Any]:
    """trainer.project_name -> "end" via `length` hops through the free-form model.override_config."""
    hops = {f"k{i}": f"${{actor_rollout_ref.model.override_config.k{i + 1}}}" for i in range(length)}
    hops[f"k{length}"] = "end"
    return {"trainer": {"project_name": "${actor_rollout_ref.model.override_config.k0}"},
            "actor_rollout_ref": {"model": {"override_config": hops}}}


def _fan_out(levels: int) -> dict[str, Any]:
    """Each level is the previous one twice: the last string would be 2**levels characters."""
    env = {"v0": "ab"} | {f"v{i}": f"${{.v{i - 1}}}${{.v{i - 1}}}" for i in range(1, levels)}
    return {"trainer": {"project_name": f"${{actor_rollout_ref.model.override_config.v{levels - 1}}}"},
            "actor_rollout_ref": {"model": {"override_config": env}}}


def _mapping_fan_out(levels: int) -> dict[str, Any]:
    """Each level holds the previous mapping twice: 2**levels values once expanded."""
    env: dict[str, Any] = {"m0": {"x": 1}}
    for i in range(1, levels):
        env[f"m{i}"] = {"a": f"${{actor_rollout_ref.model.override_config.m{i - 1}}}",
                        "b": f"${{actor_rollout_ref.model.override_config.m{i - 1}}}"}
    return {"actor_rollout_ref": {"model": {"override_config": env}}}


PROBLEMS = {
    "chain of 400 references": (_chain(400), "references lead to references more than 32 levels deep"),
    "string fan-out": (_fan_out(60), "references make this string longer than 100,000 characters"),
    "mapping fan-out": (_mapping_fan_out(60), "references copy more than 200,000 values into the config"),
    "bad oc.select default": ({"trainer": {"project_name": "${oc.select:nope,[}"}},
                              "trainer.project_name: the default '[' of oc.select is not valid YAML"),
    "unterminated quote in a default": ({"trainer": {"project_name": '${oc.select:nope,"open}'}},
                                 "of oc.select is not valid YAML"),
    "many references": ({"actor_rollout_ref": {"model": {"override_config": {
        "base": "x", **{f"r{i}": "${.base}" for i in range(10_001)}}}}}, "more than 10,000 ${...} references"),
}


@pytest.mark.parametrize("mapping, message", PROBLEMS.values(), ids=PROBLEMS.keys())
def test_reference_limits_are_config_problems(mapping: dict[str, Any], message: str) -> None:
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        parse_config(mapping)
    assert time.monotonic() - start < 5
    assert any(message in p for p in info.value.problems), info.value.problems
    assert len(info.value.problems) < 50  # one failing target is reported once, not once per reference


def test_short_chains_and_modest_fan_out_still_resolve() -> None:
    cfg = parse_config(_chain(20))
    assert cfg.trainer.project_name == "end"
    cfg = parse_config(_fan_out(10))
    assert cfg.trainer.project_name == "ab" * 2**9
    assert parse_config({"trainer": {"project_name": "${oc.select:nope,'[x'}"}}).trainer.project_name == "[x"
