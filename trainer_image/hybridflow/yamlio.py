"""The one YAML reader of the project: RLJob manifests, trainer configs, override values, tool configs.

PyYAML's `safe_load` is safe from code execution but not from hostile or broken input (issue 12):
500 nested brackets raise RecursionError, an alias bomb ("billion laughs") expands to gigabytes, a
duplicate key silently keeps the last value, `!!float abc` raises ValueError. Here every input either
loads into plain JSON-like data (dict, list, str, int, float, bool, None) or raises `YamlError` whose
message says where the problem is and what to do. Limits (`Limits`): input size, nesting depth, values
added by aliases, documents per stream. They are checked on the event stream before any object is
built, so the recursive composer never sees a document deeper than `max_depth`.

Reading rules, the same for every caller: YAML 1.1 scalars as kubectl reads them (`yes`/`on` are
booleans), except that dates stay strings (as in OmegaConf, and as the trainer re-reads them) and a
bare `=` is a string; duplicate mapping keys are refused (kubectl refuses them too); only JSON types
are built (`!!binary`, `!!set`, `!!omap`, `!!timestamp` and the like are refused).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    Event,
    NodeEvent,
    ScalarEvent,
)

__all__ = [
    "Limits",
    "YamlError",
    "find_too_deep",
    "load",
    "load_all",
    "load_mapping",
    "read",
    "read_all",
    "read_mapping",
    "read_text",
    "shorten",
    "shorten_repr",
]

SHORTEN_AT = 200
"""Values longer than this are cut in messages (a 4 MB string is not echoed back)."""


@dataclass(frozen=True)
class Limits:
    """What a YAML input may take; far above any real manifest or config, far below a blow-up."""

    max_bytes: int = 8 * 1024 * 1024
    """Input size (the API server takes at most 3 MiB per request; etcd 1.5 MiB per object)."""
    max_depth: int = 100
    """Nested mappings/lists (verl's deepest config key is 5 levels; an RLJob's is about 10)."""
    max_alias_values: int = 100_000
    """Values that aliases (`*name`) add, counted as if expanded (kubectl refuses alias bombs too)."""
    max_documents: int = 1000
    """Documents in one multi-document stream."""


DEFAULT_LIMITS = Limits()


class YamlError(ValueError):
    """Input that is not YAML this project accepts; the message says where, what and how to fix it."""

    def __init__(self, source: str, problem: str, *, line: int | None = None, column: int | None = None) -> None:
        self.source = source
        self.problem = problem
        self.line = line
        where = f"line {line}" + (f", column {column}" if column is not None else "") + ": " if line else ""
        super().__init__(f"{source}: {where}{problem}")


def shorten(text: str, limit: int = SHORTEN_AT) -> str:
    """`text` cut to about `limit` characters, saying how long it was (for messages)."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 1]}… ({len(text):,} characters)"


def shorten_repr(value: Any, limit: int = SHORTEN_AT) -> str:
    """`repr(value)` cut like `shorten`; survives values too deep or too large to repr."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # a 300-deep dict; an int over 4,300 digits
        text = f"<{type(value).__name__}, too large to show>"
    return shorten(text, limit)


# ------------------------------------------------------------------------------------------- reading


def read_text(path: str | Path, limits: Limits = DEFAULT_LIMITS, *, what: str = "file") -> str:
    """The text of a file (`-`: standard input), size-checked and decoded as UTF-8; else YamlError.

    `what` names the file in the message when it cannot be opened ("cannot read the config file").
    """
    source = str(path)
    try:
        if source == "-":
            data = _read_stdin(limits.max_bytes + 1)
        else:
            with open(path, "rb") as handle:
                data = handle.read(limits.max_bytes + 1)
    except OSError as err:
        raise YamlError(source, f"cannot read the {what} ({err.strerror or err}); check the path") from None
    return decode(data, source, limits)


def _read_stdin(size: int) -> bytes | str:
    """Up to `size` bytes of stdin (text when stdin is a text stream without a buffer, as in tests)."""
    buffer: BinaryIO | None = getattr(sys.stdin, "buffer", None)
    if buffer is not None:
        return buffer.read(size)
    return sys.stdin.read(size)


def decode(data: bytes | str, source: str, limits: Limits = DEFAULT_LIMITS) -> str:
    """UTF-8 text of `data` (a BOM is dropped), within the size limit; else YamlError."""
    size = len(data.encode("utf-8", "surrogatepass")) if isinstance(data, str) else len(data)
    if size > limits.max_bytes:
        raise YamlError(source, f"larger than {limits.max_bytes:,} bytes; split it into smaller files "
                                "(one object per file is usual)")
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise YamlError(source, f"not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); "
                                "save the file as UTF-8", line=line) from None


def read(path: str | Path, limits: Limits = DEFAULT_LIMITS, *, what: str = "file") -> Any:
    """The single YAML document of a file (None when empty); `what` names the file in messages."""
    return load(read_text(path, limits, what=what), str(path), limits)


def read_all(path: str | Path, limits: Limits = DEFAULT_LIMITS) -> list[Any]:
    """Every document of a multi-document YAML file (None for empty ones)."""
    return load_all(read_text(path, limits), str(path), limits)


def read_mapping(path: str | Path, what: str = "keys to values", limits: Limits = DEFAULT_LIMITS, *,
                 file: str = "file") -> dict[str, Any]:
    """The YAML mapping of a file ({} when empty); YamlError when the top level is no mapping.

    `what` says what the mapping holds; `file` names the file for "cannot read the ..." messages.
    """
    return load_mapping(read_text(path, limits, what=file), str(path), what, limits)


# ------------------------------------------------------------------------------------------- loading


def load(text: str | bytes, source: str = "<input>", limits: Limits = DEFAULT_LIMITS) -> Any:
    """The single document of YAML `text` (None when empty); YamlError for anything else."""
    docs = load_all(text, source, limits)
    if len(docs) > 1:
        raise YamlError(source, f"holds {len(docs)} YAML documents where one is expected; remove the `---` "
                                "separators or split the file")
    return docs[0] if docs else None


def load_mapping(text: str | bytes, source: str = "<input>", what: str = "keys to values",
                 limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The YAML mapping in `text` ({} when empty); YamlError when the top level is a list or a scalar."""
    data = load(text, source, limits)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise YamlError(source, f"the top level must be a mapping of {what}, not {_kind(data)} "
                                f"({shorten_repr(data, 60)}); write `key: value` lines")
    return data


def load_all(text: str | bytes, source: str = "<input>", limits: Limits = DEFAULT_LIMITS) -> list[Any]:
    """Every document of YAML `text` (None for empty ones); YamlError for anything not accepted."""
    text = decode(text, source, limits)
    check_events(text, source, limits)  # before building: the composer recurses per nesting level
    try:
        return list(yaml.load_all(text, Loader=_Loader))  # noqa: S506 - a SafeLoader with fewer types
    except yaml.MarkedYAMLError as err:
        raise _from_marked(err, source) from None
    except yaml.YAMLError as err:
        raise YamlError(source, f"not valid YAML ({shorten(str(err))}); fix the syntax") from None
    except (ValueError, TypeError, AttributeError, OverflowError, RecursionError) as err:
        # Constructors that raise plain Python errors (a value PyYAML's resolver let through).
        raise YamlError(source, f"a value cannot be read ({shorten(str(err))}); fix or quote it") from None


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), f"a {type(value).__name__}")


def _from_marked(err: yaml.MarkedYAMLError, source: str) -> YamlError:
    """PyYAML's error as a one-line YamlError (PyYAML's own text adds a multi-line excerpt of the input)."""
    mark = err.problem_mark or err.context_mark
    problem = err.problem or err.context or "not valid YAML"
    if err.context and err.problem and err.context_mark is not None:
        problem = f"{problem} ({err.context} at line {err.context_mark.line + 1})"
    if "; " not in problem:  # PyYAML's own wording: say what kind of problem it is, and the fix
        problem = f"not valid YAML: {problem}; fix the syntax"
    line, column = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
    return YamlError(source, shorten(problem, 400), line=line, column=column)


# ------------------------------------------------------------------------------------- event checks


@dataclass
class _Frame:
    """An open mapping or list while scanning events."""

    anchor: str | None
    values: int = 1
    height: int = 1


def check_events(text: str, source: str, limits: Limits = DEFAULT_LIMITS) -> None:
    """Refuse too deep nesting, alias bombs, self-referencing aliases and too many documents.

    Scans the parser's event stream (no recursion, no objects built). Syntax errors are left to the
    loader, which reports them with the same marks.
    """
    try:
        _scan(yaml.parse(text, Loader=_EventLoader), source, limits)
    except yaml.YAMLError:
        return  # the loader reports it (the events up to the error passed the checks)


def _scan(events: Iterator[Event], source: str, limits: Limits) -> None:
    stack: list[_Frame] = []
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (values, height) of the finished node
    lines: dict[str, int] = {}  # anchor -> the line it is defined on
    aliased = documents = 0
    for event in events:
        if isinstance(event, DocumentStartEvent):
            documents += 1
            anchors, lines, aliased = {}, {}, 0
            if documents > limits.max_documents:
                raise YamlError(source, f"more than {limits.max_documents:,} YAML documents; split the file")
            continue
        if isinstance(event, DocumentEndEvent) or not isinstance(event, (NodeEvent, CollectionEndEvent)):
            continue
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        anchor = getattr(event, "anchor", None) if not isinstance(event, AliasEvent) else None
        if anchor is not None:
            if anchor in lines:
                raise YamlError(source, f"anchor &{anchor} is defined twice (first at line {lines[anchor]}); "
                                        "rename one of them", line=line)
            lines[anchor] = line or 0
        if isinstance(event, CollectionStartEvent):
            if len(stack) >= limits.max_depth:
                raise YamlError(source, f"nested deeper than {limits.max_depth} levels; flatten the data "
                                        "(no config or manifest needs that many)", line=line)
            stack.append(_Frame(event.anchor))
            continue
        if isinstance(event, CollectionEndEvent):
            done = stack.pop()
            values, height = done.values, done.height
            if done.anchor is not None:
                anchors[done.anchor] = (values, height)
        elif isinstance(event, AliasEvent):
            if event.anchor not in anchors:
                if any(f.anchor == event.anchor for f in stack):
                    raise YamlError(source, f"alias *{event.anchor} is used inside its own anchor "
                                            f"&{event.anchor} (a structure that contains itself); write "
                                            "the values out", line=line)
                raise YamlError(source, f"alias *{event.anchor} is not defined before this point; define "
                                        f"&{event.anchor} first or write the value out", line=line)
            values, height = anchors[event.anchor]
            aliased += values
            if aliased > limits.max_alias_values:
                raise YamlError(source, f"aliases (*name) expand to more than {limits.max_alias_values:,} "
                                        "values (an alias bomb?); write the values out or use fewer aliases",
                                line=line)
            if len(stack) + height - 1 >= limits.max_depth:
                raise YamlError(source, f"alias *{event.anchor} nests the data deeper than "
                                        f"{limits.max_depth} levels; flatten the data", line=line)
        else:
            values, height = 1, 0
            if isinstance(event, ScalarEvent) and event.anchor is not None:
                anchors[event.anchor] = (1, 0)
        if stack:
            stack[-1].values += values
            stack[-1].height = max(stack[-1].height, height + 1)


# ------------------------------------------------------------------------------------------- loader

_BaseLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser and composer when installed (fast; its composer is C code), else PyYAML's."""


class _EventLoader(_BaseLoader):
    """Only used for its parser (events)."""


_JSON_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float", "str", "seq", "map")}
_DROPPED = ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:value")


class _Checks:
    """Mixed into the loader, before SafeConstructor: duplicate keys, non-JSON tags, unreadable values."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """A mapping, refusing a key given twice (merge keys `<<` may still override)."""
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue  # a non-scalar key is refused by SafeConstructor (unhashable)
            key = self.construct_object(key_node)
            if key in seen:
                raise ConstructorError(
                    None, None,
                    f"duplicate key {shorten_repr(key, 80)} (first at line {seen[key]}); keep one of them "
                    "(kubectl refuses duplicate keys too)",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """Build one node; a plain Python error from a constructor becomes a marked YAML error."""
        try:
            return super().construct_object(node, deep=deep)  # type: ignore[misc]
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, AttributeError, OverflowError) as err:
            value = node.value if isinstance(node, yaml.ScalarNode) else node.tag
            kind = str(node.tag).rsplit(":", 1)[-1]
            raise ConstructorError(
                None, None,
                f"{shorten_repr(value, 80)} cannot be read as {kind} ({shorten(str(err).split('; ')[0], 120)}); "
                "fix the value, or quote it to keep it as text",
                node.start_mark,
            ) from None

    def construct_undefined(self, node: yaml.Node) -> Any:
        """Refuse tags outside JSON's types (`!!binary`, `!!set`, `!custom`, `!!python/...`)."""
        raise ConstructorError(
            None, None,
            f"the tag {shorten(str(node.tag).replace('tag:yaml.org,2002:', '!!'), 80)} is not supported; write a plain string, number, list or "
            "mapping (quote the value to keep it as text)",
            node.start_mark,
        )


class _Loader(_Checks, _BaseLoader):
    """The project's loader: the fast parser and composer, `_Checks`, no dates and no `=` values."""

    yaml_constructors: dict[str | None, Any] = {
        **{tag: c for tag, c in SafeConstructor.yaml_constructors.items() if tag in _JSON_TAGS},
        None: _Checks.construct_undefined,
    }
    yaml_multi_constructors: dict[str, Any] = {}
    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _DROPPED]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


# ------------------------------------------------------------------------------- data already loaded


def find_too_deep(value: Any, max_depth: int = DEFAULT_LIMITS.max_depth) -> str | None:
    """The path (`a.b[0].c`) of the first value nested deeper than `max_depth`, else None.

    For data that did not come through this loader (an RLJob from the API server, a mapping built
    in code): walked without recursion, so it cannot raise RecursionError itself.
    """
    todo: list[tuple[Any, str, int]] = [(value, "", 0)]
    while todo:
        node, path, depth = todo.pop()
        if not isinstance(node, (dict, list)):
            continue
        if depth >= max_depth:
            return path or "<root>"
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            child_path = f"{path}[{key}]" if isinstance(node, list) else (f"{path}.{key}" if path else str(key))
            todo.append((child, child_path, depth + 1))
    return None
