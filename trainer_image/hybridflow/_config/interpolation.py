"""OmegaConf-style `${...}` references inside a config mapping, resolved without OmegaConf.

verl's YAML uses them (`default_local_dir: checkpoints/${trainer.project_name}/...`), so verl users
write them too. Supported forms:

- `${a.b.c}`: an absolute dotted key;
- `${.x}` / `${..x}`: relative (one dot: a sibling key, each further dot one level up);
- `${x}`: a sibling key when there is no top-level `x`;
- `${oc.select:a.b,default}`: the key, or the default (read as YAML) when it is absent.

A string that is exactly one reference takes the referenced value with its type; references inside a
longer string are substituted as text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import yaml

_REF = re.compile(r"\$\{([^${}]+)\}")

Path = tuple[str, ...]
Fallback = Callable[[Path], Any]
"""Looks up a key the mapping lacks (e.g. a schema default); raises KeyError when there is none."""


class InterpolationError(Exception):
    """A reference that cannot be resolved; the message is a complete `path: problem; fix` line."""


def has_reference(value: Any) -> bool:
    """Whether a value is a string holding at least one `${...}` reference."""
    return isinstance(value, str) and _REF.search(value) is not None


def resolve_tree(
    tree: Mapping[str, Any], fallback: Fallback | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Return a copy of `tree` with every reference resolved, and the problems met on the way."""
    resolver = _Resolver(tree, fallback)
    problems: list[str] = []
    out = resolver.walk(tree, (), problems)
    return out, problems


class _Resolver:
    """Resolves references against one tree, detecting cycles."""

    def __init__(self, tree: Mapping[str, Any], fallback: Fallback | None) -> None:
        self.tree = tree
        self.fallback = fallback
        self.in_progress: list[Path] = []

    def walk(self, node: Any, path: Path, problems: list[str]) -> Any:
        """Copy `node`, resolving references in every string below it."""
        if isinstance(node, Mapping):
            return {k: self.walk(v, (*path, str(k)), problems) for k, v in node.items()}
        if isinstance(node, list):
            return [self.walk(v, (*path, str(i)), problems) for i, v in enumerate(node)]
        if has_reference(node):
            try:
                return self.resolve_string(node, path)
            except InterpolationError as exc:
                problems.append(str(exc))
                return node
        return node

    def resolve_string(self, text: str, path: Path) -> Any:
        """Resolve the references in one string found at `path`."""
        whole = _REF.fullmatch(text)
        if whole is not None:
            return self.resolve_expr(whole.group(1).strip(), path)

        def substitute(match: re.Match[str]) -> str:
            value = self.resolve_expr(match.group(1).strip(), path)
            if isinstance(value, (Mapping, list)):
                raise InterpolationError(
                    f"{_dotted(path)}: ${{{match.group(1)}}} is a mapping or list and cannot be part of a "
                    "string; reference a single value"
                )
            return "null" if value is None else str(value)

        return _REF.sub(substitute, text)

    def resolve_expr(self, expr: str, path: Path) -> Any:
        """Resolve one reference expression (the text between `${` and `}`)."""
        if ":" in expr:
            resolver, _, args = expr.partition(":")
            if resolver.strip() != "oc.select":
                raise InterpolationError(
                    f"{_dotted(path)}: resolver {resolver.strip()!r} is not supported (only oc.select); "
                    "write the value directly"
                )
            key, _, default_text = args.partition(",")
            target = self.locate(key.strip(), path)
            if target is None:
                return yaml.safe_load(default_text) if default_text.strip() else None
            return self.value_at(target, path)
        target = self.locate(expr, path)
        if target is None:
            raise InterpolationError(
                f"{_dotted(path)}: ${{{expr}}} refers to a key that does not exist; "
                "use a full dotted path such as ${trainer.project_name}"
            )
        return self.value_at(target, path)

    def locate(self, key: str, here: Path) -> Path | None:
        """Turn a reference key into the absolute path of an existing key, or None."""
        parent = here[:-1]
        if key.startswith("."):
            dots = len(key) - len(key.lstrip("."))
            base = parent[: len(parent) - (dots - 1)] if dots - 1 <= len(parent) else None
            if base is None:
                return None
            candidates = [(*base, *key[dots:].split("."))]
        else:
            parts = tuple(key.split("."))
            candidates = [parts, (*parent, *parts)]
        for candidate in candidates:
            if self.exists(candidate):
                return candidate
        return None

    def exists(self, path: Path) -> bool:
        """Whether `path` names a value in the tree or in the fallback."""
        try:
            self.raw(path)
        except KeyError:
            return False
        return True

    def raw(self, path: Path) -> Any:
        """The unresolved value at `path`; KeyError when absent from both tree and fallback."""
        node: Any = self.tree
        for part in path:
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                if self.fallback is None:
                    raise KeyError(path)
                return self.fallback(path)
        return node

    def value_at(self, target: Path, here: Path) -> Any:
        """The resolved value at `target`, following chained references."""
        if target in self.in_progress:
            chain = " -> ".join(_dotted(p) for p in (*self.in_progress, target))
            raise InterpolationError(f"{_dotted(here)}: references form a cycle ({chain}); break the cycle")
        self.in_progress.append(target)
        try:
            problems: list[str] = []
            value = self.walk(self.raw(target), target, problems)
            if problems:
                raise InterpolationError(problems[0])
            return value
        finally:
            self.in_progress.pop()


def _dotted(path: Path) -> str:
    """Render a key path as `a.b.c`."""
    return ".".join(path) if path else "<root>"
