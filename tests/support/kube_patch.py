"""Patch formats the API server accepts: JSON patch (RFC 6902), JSON merge patch (RFC 7386), strategic merge.

Strategic merge patch is treated as a JSON merge patch with its `$`-directives dropped: lists are replaced
wholesale instead of merged by key. That is enough for kubectl's apply/edit/label/annotate on the objects
our tests use (ConfigMaps, Events); the custom resources use JSON merge patch anyway.
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(Exception):
    """A patch that cannot be applied; `status` is the HTTP status the API server would answer."""

    def __init__(self, message: str, status: int = 422) -> None:
        """Keep the message and the HTTP status."""
        super().__init__(message)
        self.status = status


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 JSON merge patch: dicts merge recursively, `null` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strip_directives(patch: Any) -> Any:
    """Drop strategic-merge-patch directives (`$patch`, `$retainKeys`, `$setElementOrder/...`)."""
    if isinstance(patch, dict):
        return {k: strip_directives(v) for k, v in patch.items() if not k.startswith("$")}
    if isinstance(patch, list):
        return [strip_directives(v) for v in patch]
    return patch


def _split_pointer(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"invalid JSON pointer {pointer!r}: it must start with '/'", 400)
    return [part.replace("~1", "/").replace("~0", "~") for part in pointer[1:].split("/")]


def _parent(doc: Any, parts: list[str], op: dict[str, Any]) -> Any:
    node = doc
    for part in parts[:-1]:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise PatchError(f"JSON patch op {op} failed: path {op['path']!r} does not exist") from None
    return node


def _get(doc: Any, pointer: str, op: dict[str, Any]) -> Any:
    parts = _split_pointer(pointer)
    if not parts:
        return doc
    parent = _parent(doc, parts, op)
    try:
        return parent[int(parts[-1])] if isinstance(parent, list) else parent[parts[-1]]
    except (KeyError, IndexError, ValueError, TypeError):
        raise PatchError(f"JSON patch op {op} failed: path {pointer!r} does not exist") from None


def _remove(doc: Any, pointer: str, op: dict[str, Any]) -> Any:
    parts = _split_pointer(pointer)
    parent = _parent(doc, parts, op)
    try:
        return parent.pop(int(parts[-1])) if isinstance(parent, list) else parent.pop(parts[-1])
    except (KeyError, IndexError, ValueError, TypeError):
        raise PatchError(f"JSON patch op {op} failed: path {pointer!r} does not exist") from None


def _add(doc: Any, pointer: str, value: Any, op: dict[str, Any], replace: bool = False) -> Any:
    parts = _split_pointer(pointer)
    if not parts:
        return value
    parent = _parent(doc, parts, op)
    key = parts[-1]
    if isinstance(parent, list):
        index = len(parent) if key == "-" else int(key)
        if index > len(parent) or (replace and index >= len(parent)):
            raise PatchError(f"JSON patch op {op} failed: index {index} is out of range")
        if replace:
            parent[index] = value
        else:
            parent.insert(index, value)
    elif isinstance(parent, dict):
        if replace and key not in parent:
            raise PatchError(f"JSON patch op {op} failed: path {pointer!r} does not exist")
        parent[key] = value
    else:
        raise PatchError(f"JSON patch op {op} failed: parent of {pointer!r} is not an object or a list")
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    """Apply an RFC 6902 JSON patch to a copy of `doc`; a failed `test` op raises PatchError (422)."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations", 400)
    doc = copy.deepcopy(doc)
    for op in ops:
        kind, path = op.get("op"), op.get("path", "")
        if kind == "test":
            if _get(doc, path, op) != op.get("value"):
                raise PatchError(f"the server rejected our request: JSON patch test operation {op} failed")
        elif kind == "remove":
            _remove(doc, path, op)
        elif kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")), op)
        elif kind == "replace":
            doc = _add(doc, path, copy.deepcopy(op.get("value")), op, replace=True)
        elif kind in ("move", "copy"):
            value = _get(doc, op.get("from", ""), op)
            if kind == "move":
                _remove(doc, op["from"], op)
            doc = _add(doc, path, copy.deepcopy(value), op)
        else:
            raise PatchError(f"unknown JSON patch op {kind!r}: use add, remove, replace, move, copy or test", 400)
    return doc
