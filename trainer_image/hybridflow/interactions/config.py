"""Interactions from verl's interaction-config YAML (`actor_rollout_ref.rollout.multi_turn.interaction_config_path`).

    interaction:
      - name: gsm8k                                                  # what samples name in interaction_kwargs
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction   # verl's path maps to ours
        config: {}

Any other `module.Class` is imported (a user interaction subclassing `hybridflow.interactions.BaseInteraction`).
`name` defaults to the config's `name`, then to the class's default ("interaction_agent").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybridflow.interactions.base import BaseInteraction
from hybridflow.tools.config import import_subclass, read_entries

KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"
VERL_ALIASES = {"verl.interactions.gsm8k_interaction.Gsm8kInteraction": "hybridflow.interactions.gsm8k.Gsm8kInteraction"}


class InteractionConfigError(ValueError):
    """The interaction config file is unusable; the message names the entry and the fix."""


def load_interactions(path: str | Path) -> dict[str, BaseInteraction]:
    """Every interaction listed in the YAML file at `path`, by name (names must be unique)."""
    where = str(path)
    entries = read_entries(path, "interaction config", "interaction", KEY, InteractionConfigError)
    if not isinstance(entries, list) or not entries:
        raise InteractionConfigError(
            f"interaction config {where!r} must be a mapping with a non-empty 'interaction' list "
            "(entries: name, class_name, config)"
        )
    interactions: dict[str, BaseInteraction] = {}
    for i, entry in enumerate(entries):
        interaction = _build(entry, f"{where}: interaction[{i}]")
        if interaction.name in interactions:
            raise InteractionConfigError(
                f"{where}: interaction name {interaction.name!r} appears more than once; give each entry its own name"
            )
        interactions[interaction.name] = interaction
    return interactions


def _build(entry: Any, where: str) -> BaseInteraction:
    if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
        raise InteractionConfigError(f"{where}: each interaction needs a string class_name (module.Class)")
    unknown = sorted(set(entry) - {"name", "class_name", "config"})
    if unknown:
        raise InteractionConfigError(f"{where}: unknown keys {unknown}; an interaction has name, class_name and config")
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise InteractionConfigError(f"{where}.config must be a mapping")
    if entry.get("name") is not None:
        config = {**config, "name": str(entry["name"])}
    path = VERL_ALIASES.get(entry["class_name"], entry["class_name"])
    cls = import_subclass(path, BaseInteraction, "hybridflow.interactions.BaseInteraction", where,
                          InteractionConfigError)
    try:
        return cls(config)
    except (TypeError, ValueError) as err:
        raise InteractionConfigError(f"{where}: {entry['class_name']} could not be built: {err}") from err
