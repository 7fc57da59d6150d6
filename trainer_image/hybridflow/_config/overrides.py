"""Hydra-style command-line overrides (`a.b=v`, `+a.b=v`, `++a.b=v`, `~a.b`) applied to a mapping."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .. import yamlio
from .errors import ConfigError

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z_][A-Za-z0-9_\-]*)*$")  # Hydra: a dash after the first character
# PyYAML follows YAML 1.1, where "1e-6" (no dot) is a string; Hydra and verl users mean a float.
_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def load_yaml(text: str) -> Any:
    """Parse YAML text the way config files are read (hybridflow.yamlio: no timestamps, limits)."""
    return yamlio.load(text, "<override value>")


def too_deep_problem(path: str) -> str:
    """The problem line for a value nested deeper than yamlio's depth limit."""
    return (f"{path}: nested deeper than {yamlio.DEFAULT_LIMITS.max_depth} levels; flatten it (no config needs "
            "that many)")


HOW_TO = "write key=value, +key=value (add), ++key=value (add or replace) or ~key (remove)"


def parse_value(text: str) -> Any:
    """Read an override's value as YAML (lists, bools, null, numbers); fall back to the raw text."""
    if text == "":
        return ""
    try:
        value = load_yaml(text)
    except yamlio.YamlError:  # not YAML (or over a limit): the text itself, as Hydra keeps a plain string
        return text
    if isinstance(value, str) and _FLOAT.match(value.strip()):
        return float(value)
    return value


def apply_overrides(
    mapping: Mapping[str, Any] | None, overrides: Iterable[str], defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Return a copy of `mapping` with the overrides applied in order; ConfigError lists every bad one.

    `a.b=v` sets a key, creating missing parent groups; `+a.b=v` adds a key that must not exist yet, in
    `mapping` nor in `defaults` (the schema's defaults: Hydra composes them first, so it refuses `+` on a
    default key too); `++a.b=v` adds or replaces; `~a.b` removes a key (a missing key is already at its
    default, so that is not an error); `~a.b=v` removes it only if it currently equals v. A key `+` or `++`
    adds is validated like any other afterwards: an unknown key stays unknown.
    """
    deep = yamlio.find_too_deep(mapping or {})
    if deep is not None:  # copy.deepcopy below recurses once per level
        raise ConfigError([too_deep_problem(deep)])
    result: dict[str, Any] = copy.deepcopy(dict(mapping or {}))
    problems: list[str] = []
    removed: set[tuple[str, ...]] = set()  # `~a.b` then `+a.b=v` adds it again, as in Hydra
    for raw in overrides:
        try:
            _apply_one(result, raw, defaults or {}, removed)
        except _OverrideError as exc:
            problems.append(f"{yamlio.shorten_repr(raw)}: {exc}")
    if problems:
        raise ConfigError(problems)
    return result


class _OverrideError(Exception):
    """One override that cannot be applied."""


def _apply_one(tree: dict[str, Any], raw: str, defaults: Mapping[str, Any], removed: set[tuple[str, ...]]) -> None:
    """Apply one override to `tree` in place (`removed`: the keys `~` removed so far, updated)."""
    text = raw.strip()
    if text.startswith("~"):
        key, sep, value_text = text[1:].partition("=")
        parts = _split_key(key)
        _remove(tree, parts, parse_value(value_text) if sep else _NO_VALUE)
        removed.add(tuple(parts))
        return
    mode = "++" if text.startswith("++") else "+" if text.startswith("+") else ""
    key, sep, value_text = text[len(mode) :].partition("=")
    if not sep:
        raise _OverrideError(f"missing '='; {HOW_TO}")
    parts = _split_key(key)
    parent = _parent(tree, parts, create=True)
    if mode == "+" and not any(tuple(parts[:n]) in removed for n in range(1, len(parts) + 1)):
        _refuse_append_to_existing(key.strip(), parts, parent, defaults)
    parent[parts[-1]] = parse_value(value_text)


def _refuse_append_to_existing(key: str, parts: list[str], parent: dict[str, Any], defaults: Mapping[str, Any]) -> None:
    """`+key=v` on a key that is set (in the file, an earlier override or the defaults): Hydra's "Could not append
    to config. An item is already at ...", with the fix."""
    if parts[-1] in parent:
        where, value = "set", parent[parts[-1]]
    else:
        default = _lookup(defaults, parts)
        if default is _NO_VALUE:
            return
        where, value = "a default key", default
    raise _OverrideError(
        f"{key} already exists ({where}, value {yamlio.shorten_repr(value, 80)}), and '+' only adds a key that is not "
        f"there (Hydra refuses it too: \"Could not append to config\"); drop the '+' to replace it ({key}=...), or "
        f"write ++{key}=... (add or replace)"
    )


def _lookup(tree: Mapping[str, Any], parts: list[str]) -> Any:
    """The value at `parts` in nested mappings, or _NO_VALUE when absent."""
    node: Any = tree
    for part in parts:
        if not isinstance(node, Mapping) or part not in node:
            return _NO_VALUE
        node = node[part]
    return node


_NO_VALUE: Any = object()


def _remove(tree: dict[str, Any], parts: list[str], expected: Any) -> None:
    """Delete the key at `parts`, if present (and equal to `expected` when given)."""
    parent = _parent(tree, parts, create=False)
    if parent is None or parts[-1] not in parent:
        return
    if expected is not _NO_VALUE and parent[parts[-1]] != expected:
        raise _OverrideError(
            f"current value {yamlio.shorten_repr(parent[parts[-1]], 80)} differs from "
            f"{yamlio.shorten_repr(expected, 80)}; nothing removed"
        )
    del parent[parts[-1]]


def _split_key(key: str) -> list[str]:
    """Check and split a dotted key."""
    key = key.strip()
    if not _KEY.match(key):
        raise _OverrideError(f"{yamlio.shorten_repr(key, 80)} is not a dotted key like trainer.nnodes; {HOW_TO}")
    return key.split(".")


def _parent(tree: dict[str, Any], parts: list[str], *, create: bool) -> Any:
    """The mapping that holds the last key of `parts`; None when absent and not creating."""
    node: Any = tree
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            if not create:
                return None
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise _OverrideError(
                f"{where} holds {yamlio.shorten_repr(child, 80)}, not a group, so it has no key {parts[i + 1]!r}"
            )
        node = child
    return node
