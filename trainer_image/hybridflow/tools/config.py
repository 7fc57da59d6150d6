"""Tools from verl's tool-config YAML (`actor_rollout_ref.rollout.multi_turn.tool_config_path`).

    tools:
      - class_name: hybridflow.tools.gsm8k_tool.Gsm8kTool      # or verl's own class path, see VERL_ALIASES
        config: {type: native}
        tool_schema:                                             # OpenAI function format; optional for
          type: function                                         # tools that define a default
          function: {name: calc_gsm8k_reward, description: ..., parameters: {...}}

verl's class paths for the tools built here are mapped to ours, so a verl tool config loads unchanged;
any other `module.Class` is imported (a user tool subclassing `hybridflow.tools.BaseTool`).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hybridflow import yamlio
from hybridflow.tools.base import BaseTool, OpenAIFunctionToolSchema

VERL_ALIASES = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "hybridflow.tools.gsm8k_tool.Gsm8kTool",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "hybridflow.tools.code_interpreter.CodeInterpreterTool",
}


class ToolConfigError(ValueError):
    """The tool config file is unusable; the message names the entry and the fix."""


def read_entries(path: str | Path, what: str, key: str, config_key: str, error: type[ValueError]) -> Any:
    """The value under `key` of the YAML mapping at `path` (None when the file is not such a mapping); a missing
    or unreadable file raises `error` naming `config_key` (shared by tool and interaction configs)."""
    try:
        raw = yamlio.read(path, what=what)
    except yamlio.YamlError as err:
        if not Path(path).exists():
            raise error(f"{what} {str(path)!r} not found; fix {config_key}") from None
        raise error(f"{what} {err}") from None
    return raw.get(key) if isinstance(raw, dict) else None


def load_tools(path: str | Path) -> list[BaseTool]:
    """Instantiate every tool listed in the YAML file at `path` (names must be unique)."""
    where = str(path)
    entries = read_entries(path, "tool config", "tools", "actor_rollout_ref.rollout.multi_turn.tool_config_path",
                           ToolConfigError)
    if not isinstance(entries, list):
        raise ToolConfigError(f"tool config {where!r} must be a mapping with a 'tools' list")
    tools = [build_tool(entry, f"{where}: tools[{i}]") for i, entry in enumerate(entries)]
    names = [t.name for t in tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ToolConfigError(f"tool config {where!r}: tool names {duplicates} appear more than once; rename them")
    return tools


def build_tool(entry: Any, where: str) -> BaseTool:
    """One tool from its config entry {class_name, config, tool_schema}."""
    if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
        raise ToolConfigError(f"{where}: each tool needs a string class_name (module.Class)")
    unknown = sorted(set(entry) - {"class_name", "config", "tool_schema"})
    if unknown:
        raise ToolConfigError(f"{where}: unknown keys {unknown}; a tool has class_name, config and tool_schema")
    cls = import_class(VERL_ALIASES.get(entry["class_name"], entry["class_name"]), where)
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ToolConfigError(f"{where}.config must be a mapping")
    schema = None
    if entry.get("tool_schema") is not None:
        try:
            schema = OpenAIFunctionToolSchema.model_validate(entry["tool_schema"])
        except ValidationError as err:
            raise ToolConfigError(f"{where}.tool_schema is not an OpenAI function schema: {err}") from err
    try:
        return cls(config, schema)
    except (TypeError, ValueError) as err:
        raise ToolConfigError(f"{where}: {entry['class_name']} could not be built: {err}") from err


def import_class(path: str, where: str) -> type[BaseTool]:
    """`module.Class` imported; it must subclass BaseTool."""
    return import_subclass(path, BaseTool, "hybridflow.tools.BaseTool", where, ToolConfigError)


def import_subclass(path: str, base: type, base_name: str, where: str, error: type[ValueError]) -> Any:
    """`module.Class` imported; it must subclass `base` (else `error`, naming `where` and the fix)."""
    module_name, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise error(f"{where}: cannot import {path!r} ({err}); check class_name") from err
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise error(f"{where}: {path} is not a subclass of {base_name}")
    return cls
