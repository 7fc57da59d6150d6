"""Tool-call formats (`multi_turn.format`): how calls are read from a model turn, and how the turns that
answer them are written back.

`hermes` is the format Qwen's chat templates use (a JSON object per block; `qwen` in verl's configs is read
as it, see `_config/verl_compat.py`)::

    <tool_call>
    {"name": "lookup", "arguments": {"key": "a"}}
    </tool_call>

`gpt-oss` is OpenAI's Harmony format (https://cookbook.openai.com/articles/openai-harmony): each message is
``<|start|>{role}<|channel|>{channel}[ to={recipient}][ <|constrain|>json]<|message|>{body}{end}``, and a
call is a message to ``functions.NAME`` whose body is the JSON arguments, ending in ``<|call|>``::

    <|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{"key": "a"}<|call|>

`qwen3_coder` is the XML format of Qwen3-Coder's and Qwen3.5's chat templates: a function block per call, one
parameter block per argument, every value written as text (a newline after the opening tag and before the closing
one is layout, not value)::

    <tool_call>
    <function=lookup>
    <parameter=key>
    a
    </parameter>
    </function>
    </tool_call>

Its values are read as the tool's JSON schema types them (integer, number, boolean, object, array; strings stay
text), so `read` takes the tool schemas of the conversation.

A malformed call (bad JSON, no name, arguments not an object, a value not of its declared type) becomes a
`ToolCallError` the loop reports back to the model as the tool's message; parsing never raises.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybridflow.agent.chat import turn_ids

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
    name: str = ""
    """The function the call addressed, when the format names it apart from the arguments (Harmony's recipient)."""


Call = FunctionCall | ToolCallError


@dataclass(frozen=True)
class ToolParser:
    """One `multi_turn.format`: reading a model turn, and rendering the tool and user turns that follow it."""

    name: str
    parse: Callable[[str], tuple[str, list[Call]]]
    """(content, calls) of a turn's text; content is the text a reader sees, calls taken out."""
    render_turn: Callable[..., list[int]]
    """`(tokenizer, messages, *, template_kwargs)`: ids of tool / user messages continuing a conversation, ending
    with the next assistant turn's generation prompt (`hybridflow.agent.chat.turn_ids` for template formats)."""
    keep_special_tokens: bool = False
    """Whether `parse` reads the turn decoded with special tokens kept: Harmony's markers are special tokens, so a
    decode that skips them would leave channel names and call headers run together with the text."""
    text_arguments: bool = False
    """Whether the format writes every argument as text (Qwen3-Coder's XML): `read` then types each value as the
    called tool's JSON schema declares it."""

    def read(self, tokenizer: Any, ids: list[int], tools: list[dict[str, Any]] | None = None) -> tuple[str, list[Call]]:
        """(content, calls) of a model turn's token ids, decoded as this format needs; `tools`: the conversation's
        tool schemas (OpenAI's function format), which type a text-arguments format's values."""
        content, calls = self.parse(tokenizer.decode(list(ids), skip_special_tokens=not self.keep_special_tokens))
        if self.text_arguments:
            calls = [typed_by_schema(c, tools or []) for c in calls]
        return content, calls


# -- Hermes -----------------------------------------------------------------------------------------


def parse_hermes(text: str) -> tuple[str, list[Call]]:
    """The text outside the tool-call blocks, and each block parsed (or the reason it is unusable)."""
    calls: list[Call] = []
    for block in _HERMES.findall(text):
        calls.append(_parse_block(block.strip()))
    content = _HERMES.sub("", text)
    if _OPEN in content:  # an opened call the model never closed
        calls.append(ToolCallError("error: a <tool_call> was opened but not closed with </tool_call>"))
        content = content[: content.index(_OPEN)]
    return content.strip(), calls


def _parse_block(block: str) -> Call:
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


# -- Harmony (gpt-oss) ------------------------------------------------------------------------------

_START, _CHANNEL, _CONSTRAIN, _MESSAGE = "<|start|>", "<|channel|>", "<|constrain|>", "<|message|>"
_END, _CALL, _RETURN = "<|end|>", "<|call|>", "<|return|>"
_MARKERS = re.compile(r"<\|(?:start|channel|constrain|message|end|call|return)\|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_FUNCTIONS = "functions."


@dataclass
class _Message:
    """One Harmony message of a model turn."""

    role: str  # empty for the turn's first message: its `<|start|>assistant` is the prompt's generation prompt
    channel: str
    recipient: str
    body: str


def parse_harmony(text: str) -> tuple[str, list[Call]]:
    """The turn's answer and its calls; reasoning (the analysis channel) is neither, whatever it contains.

    content is the final channel's text when there is one, else the text outside calls and reasoning (the
    commentary channel's preambles, text outside any message). A call is a message with a `functions.NAME`
    recipient, in whichever channel; one that ran to the end of the text without `<|call|>` is read as far as it
    goes (its JSON, if cut, is reported as malformed).
    """
    finals: list[str] = []
    other: list[str] = []
    calls: list[Call] = []
    for piece in _harmony_pieces(text):
        if isinstance(piece, str):
            other.append(piece)
        elif piece.role not in ("", "assistant"):
            continue  # the model wrote another author's message (a tool's reply): not its words, not a call
        elif piece.recipient:
            calls.append(_harmony_call(piece))
        elif piece.channel == "final":
            finals.append(piece.body)
        elif piece.channel != "analysis":
            other.append(piece.body)
    content = "".join(finals) if finals else _MARKERS.sub("", "".join(other))
    return content.strip(), calls


def _harmony_pieces(text: str) -> list[_Message | str]:
    """The turn's messages in order, with the text between them (str)."""
    pieces: list[_Message | str] = []
    pos = 0
    while (body_at := text.find(_MESSAGE, pos)) >= 0:
        start = _header_start(text, pos, body_at)
        if start > pos:
            pieces.append(text[pos:start])
        message = _header(text[start:body_at])
        body_at += len(_MESSAGE)
        # Reasoning ends only at <|end|> (how Harmony closes an analysis message), so call-like text inside it
        # is never read as a call; other messages end at whichever end marker comes first.
        ends = (_END,) if message.channel == "analysis" and not message.recipient else (_END, _CALL, _RETURN)
        stop, marker = _first_of(text, ends, body_at)
        message.body = text[body_at:stop]
        pieces.append(message)
        pos = stop + len(marker)
    if pos < len(text):
        pieces.append(text[pos:])
    return pieces


def _header_start(text: str, pos: int, body_at: int) -> int:
    """Where the header of the message whose body starts at `body_at` begins: its `<|start|>`, or its
    `<|channel|>` when the role came with the prompt."""
    start = text.rfind(_START, pos, body_at)
    if start >= 0:
        return start
    channel = text.find(_CHANNEL, pos, body_at)
    return channel if channel >= 0 else body_at


def _header(header: str) -> _Message:
    """Role, channel and recipient of `<|start|>{role}[ to=R]<|channel|>{channel}[ to=R][ <|constrain|>{type}]`."""
    head = header.removeprefix(_START).split(_CONSTRAIN, 1)[0]
    role_part, _, channel_part = head.partition(_CHANNEL)
    found = _RECIPIENT.search(role_part) or _RECIPIENT.search(channel_part)
    role = _RECIPIENT.sub("", role_part).strip()
    words = _RECIPIENT.sub("", channel_part).split()
    return _Message(role=role, channel=words[0] if words else "", recipient=found.group(1) if found else "", body="")


def _first_of(text: str, markers: tuple[str, ...], start: int) -> tuple[int, str]:
    """(index, marker) of the first of `markers` at or after `start`; (len(text), "") when none is."""
    found = [(i, m) for m in markers if (i := text.find(m, start)) >= 0]
    return min(found) if found else (len(text), "")


def _harmony_call(message: _Message) -> Call:
    if not message.recipient.startswith(_FUNCTIONS) or message.recipient == _FUNCTIONS:
        return ToolCallError(f"error: there is no tool {message.recipient!r} here; call a function as "
                             "to=functions.<name> in the commentary channel", name=message.recipient)
    name = message.recipient[len(_FUNCTIONS):]
    body = message.body.strip()
    try:
        arguments = json.loads(body) if body else {}
    except (json.JSONDecodeError, RecursionError) as err:
        return ToolCallError(f"error: the arguments of {name} are not valid JSON ({err}); write a JSON object "
                             "after <|constrain|>json<|message|>", name=name)
    if not isinstance(arguments, dict):
        return ToolCallError(f"error: the arguments of {name} must be a JSON object", name=name)
    return FunctionCall(name, arguments)


def render_harmony_turn(tokenizer: Any, messages: list[dict[str, Any]], *,
                        template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Tool replies and user messages in Harmony, then the next assistant message's `<|start|>assistant`.

    Written here rather than by gpt-oss's chat template, which cannot render them as the middle of a
    conversation: it refuses a tool message unless the same render holds the assistant call before it, and it
    ends a conversation's last assistant message in `<|return|>` where a continued one has `<|end|>`. A tool's
    reply is its text as it is, from `functions.NAME` (the call's name) to the assistant, as the Harmony guide
    writes it. `template_kwargs` are not read: no template renders these.
    """
    parts = []
    for message in messages:
        content = str(message.get("content") or "")
        if message.get("role") == "tool":
            author = f"{_FUNCTIONS}{message.get('name') or 'unknown'}"
            parts.append(f"{_START}{author} to=assistant{_CHANNEL}commentary{_MESSAGE}{content}{_END}")
        elif message.get("role") == "user":
            parts.append(f"{_START}user{_MESSAGE}{content}{_END}")
        else:
            raise ValueError(f"a Harmony turn holds tool and user messages, not {message.get('role')!r}")
    text = "".join(parts) + f"{_START}assistant"
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# -- Qwen3-Coder XML ---------------------------------------------------------------------------------

_XML_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)</function>", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.DOTALL)


def parse_qwen3_xml(text: str) -> tuple[str, list[Call]]:
    """The text outside the tool-call blocks, and each block's function and parameters (values as text)."""
    calls: list[Call] = []
    for block in _HERMES.findall(text):
        calls.append(_xml_call(block))
    content = _HERMES.sub("", text)
    if _OPEN in content:
        calls.append(ToolCallError("error: a <tool_call> was opened but not closed with </tool_call>"))
        content = content[: content.index(_OPEN)]
    return content.strip(), calls


def _xml_call(block: str) -> Call:
    found = _XML_FUNCTION.search(block)
    if found is None or not found.group(1).strip():
        return ToolCallError("error: a tool call needs <function=NAME> ... </function> inside <tool_call></tool_call>")
    name, body = found.group(1).strip(), found.group(2)
    arguments: dict[str, Any] = {}
    for key, value in _XML_PARAMETER.findall(body):
        value = value[1:] if value.startswith("\n") else value
        arguments[key.strip()] = value[:-1] if value.endswith("\n") else value
    if "<parameter=" in _XML_PARAMETER.sub("", body):
        return ToolCallError(f"error: a <parameter=...> of {name} was opened but not closed with </parameter>", name)
    return FunctionCall(name, arguments)


def typed_by_schema(call: Call, tools: list[dict[str, Any]]) -> Call:
    """`call` with each text value converted to the type its tool's JSON schema gives the parameter (a parameter
    the schema does not type stays text); a value that is not of its type becomes a ToolCallError."""
    if not isinstance(call, FunctionCall):
        return call
    properties = _properties(tools, call.name)
    typed: dict[str, Any] = {}
    for key, value in call.arguments.items():
        declared = properties.get(key)
        kind = declared.get("type") if isinstance(declared, dict) else None
        kinds = [k for k in kind if k != "null"] if isinstance(kind, list) else [kind]
        try:
            typed[key] = _as_type(value, kinds[0] if len(kinds) == 1 else None) if isinstance(value, str) else value
        except ValueError:
            return ToolCallError(f"error: parameter {key} of {call.name} must be of type {kind}, got {value!r}",
                                 call.name)
    return FunctionCall(call.name, typed)


def _properties(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The JSON-schema properties of the tool `name` among OpenAI function tools (empty when it is not there)."""
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, dict) else None
            return properties if isinstance(properties, dict) else {}
    return {}


def _as_type(value: str, kind: str | None) -> Any:
    text = value.strip()
    if kind == "integer":
        return int(text)
    if kind == "number":
        number = float(text)
        return int(number) if number.is_integer() and re.fullmatch(r"-?\d+", text) else number
    if kind == "boolean":
        if text.lower() not in ("true", "false"):
            raise ValueError(text)
        return text.lower() == "true"
    if kind in ("object", "array"):
        try:
            parsed = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as err:
            raise ValueError(text) from err
        if not isinstance(parsed, dict if kind == "object" else list):
            raise ValueError(text)
        return parsed
    return value  # string, or untyped: the text as written


# -- the registry ------------------------------------------------------------------------------------

PARSERS: dict[str, ToolParser] = {
    "hermes": ToolParser("hermes", parse_hermes, turn_ids),
    "gpt-oss": ToolParser("gpt-oss", parse_harmony, render_harmony_turn, keep_special_tokens=True),
    "qwen3_coder": ToolParser("qwen3_coder", parse_qwen3_xml, turn_ids, text_arguments=True),
}
"""The formats by `multi_turn.format` name; `hybridflow._config.names.TOOL_FORMATS` lists the same names."""


def get_tool_parser(name: str) -> ToolParser:
    """The format for `multi_turn.format`; a wrong name lists the known ones."""
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call format {name!r} (multi_turn.format); choose one of {sorted(PARSERS)}")
    return PARSERS[name]
