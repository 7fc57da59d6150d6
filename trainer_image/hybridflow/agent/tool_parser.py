"""Tool calls read from the model's text: the Hermes format Qwen's chat templates use.

    <tool_call>
    {"name": "lookup", "arguments": {"key": "a"}}
    </tool_call>

A malformed call (bad JSON, no name, arguments not an object) becomes a `ToolCallError` the loop
reports back to the model as the tool's message; it never raises.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN = "<tool_call>"


@dataclass
class FunctionCall:
    """One parsed call: the function name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class ToolCallError:
    """A call the model tried to make but wrote wrongly; `message` is shown to the model."""

    message: str


def parse_hermes(text: str) -> tuple[str, list[FunctionCall | ToolCallError]]:
    """The text outside the tool-call blocks, and each block parsed (or the reason it is unusable)."""
    calls: list[FunctionCall | ToolCallError] = []
    for block in _HERMES.findall(text):
        calls.append(_parse_block(block.strip()))
    content = _HERMES.sub("", text)
    if _OPEN in content:  # an opened call the model never closed
        calls.append(ToolCallError("error: a <tool_call> was opened but not closed with </tool_call>"))
        content = content[: content.index(_OPEN)]
    return content.strip(), calls


def _parse_block(block: str) -> FunctionCall | ToolCallError:
    try:
        payload = json.loads(block)
    except (json.JSONDecodeError, RecursionError) as err:
        return ToolCallError(f"error: the tool call is not valid JSON ({err}); write "
                             '{"name": <tool name>, "arguments": {...}} inside <tool_call></tool_call>')
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
        return ToolCallError('error: a tool call needs a JSON object with a string "name"')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return ToolCallError(f'error: the "arguments" of {payload["name"]} are not a JSON object')
    if not isinstance(arguments, dict):
        return ToolCallError(f'error: the "arguments" of {payload["name"]} must be a JSON object')
    return FunctionCall(payload["name"], arguments)


PARSERS = {"hermes": parse_hermes}


def get_tool_parser(name: str) -> Any:
    """The parser for `multi_turn.format`; a wrong name lists the known ones."""
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call format {name!r} (multi_turn.format); choose one of {sorted(PARSERS)}")
    return PARSERS[name]
