"""OmegaConf-style `${...}` references inside a config mapping, resolved without OmegaConf.

verl's YAML uses them (`default_local_dir: checkpoints/${trainer.project_name}/...`), so verl users
write them too. Supported forms:

- `${a.b.c}`: an absolute dotted key;
- `${.x}` / `${..x}`: relative (one dot: a sibling key, each further dot one level up);
- `${x}`: a sibling key when there is no top-level `x`;
- `${oc.select:a.b,default}`: the key, or the default (read as YAML) when it is absent.

A string that is exactly one reference takes the referenced value with its type; references inside a
longer string are substituted as text.

Bounded (issue 12): a chain of references may be at most `MAX_CHAIN` deep, one config may resolve at
most `MAX_REFERENCES` references and produce at most `MAX_VALUES` values, and a substituted string is
at most `MAX_TEXT` characters. Each target is resolved once (so `${a}${a}` fan-out costs no more than
its result), and going over a limit is a config problem, never a RecursionError or a hang.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from .. import yamlio

_REF = re.compile(r"\$\{([^${}]+)\}")

Path = tuple[str, ...]
Fallback = Callable[[Path], Any]
"""Looks up a key the mapping lacks (e.g. a schema default); raises KeyError when there is none."""


MAX_CHAIN = 32
"""References that lead to references: verl's deepest chain is 3."""
MAX_REFERENCES = 10_000
"""References resolved in one config (each target once)."""
MAX_VALUES = 200_000
"""Values (scalars, mappings, lists) that references copy into the config."""
MAX_TEXT = 100_000
"""Characters of one string after substitution."""


class InterpolationError(Exception):
    """A reference that cannot be resolved; the message is a complete `path: problem; fix` line."""


class _OverBudget(Exception):
    """The whole config goes over a limit: one problem for the config, not one per reference."""


def has_reference(value: Any) -> bool:
    """Whether a value is a string holding at least one `${...}` reference."""
    return isinstance(value, str) and _REF.search(value) is not None


def resolve_tree(
    tree: Mapping[str, Any], fallback: Fallback | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Return a copy of `tree` with every reference resolved, and the problems met on the way."""
    resolver = _Resolver(tree, fallback)
    problems: list[str] = []
    try:
        out = resolver.walk(tree, (), problems)
    except _OverBudget as exc:
        return dict(tree), [str(exc)]
    return out, list(dict.fromkeys(problems))  # a failing target is reported once, not per reference


class _Resolver:
    """Resolves references against one tree, detecting cycles."""

    def __init__(self, tree: Mapping[str, Any], fallback: Fallback | None) -> None:
        self.tree = tree
        self.fallback = fallback
        self.in_progress: list[Path] = []
        #: Per resolved target: (value, number of values in it) or the problem that stopped it.
        self.done: dict[Path, tuple[Any, int] | InterpolationError] = {}
        self.references = 0
        self.values = 0

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

        size = len(text)

        def substitute(match: re.Match[str]) -> str:
            nonlocal size
            value = self.resolve_expr(match.group(1).strip(), path)
            if isinstance(value, (Mapping, list)):
                raise InterpolationError(
                    f"{_dotted(path)}: ${{{yamlio.shorten(match.group(1), 80)}}} is a mapping or list and cannot "
                    "be part of a string; reference a single value"
                )
            piece = "null" if value is None else str(value)
            size += len(piece)
            if size > MAX_TEXT:
                raise InterpolationError(
                    f"{_dotted(path)}: references make this string longer than {MAX_TEXT:,} characters; "
                    "reference fewer or shorter values"
                )
            return piece

        return _REF.sub(substitute, text)

    def resolve_expr(self, expr: str, path: Path) -> Any:
        """Resolve one reference expression (the text between `${` and `}`)."""
        self.references += 1
        if self.references > MAX_REFERENCES:
            raise _OverBudget(
                f"<root>: more than {MAX_REFERENCES:,} ${{...}} references to resolve; write the values out"
            )
        if ":" in expr:
            resolver, _, args = expr.partition(":")
            if resolver.strip() != "oc.select":
                raise InterpolationError(
                    f"{_dotted(path)}: resolver {yamlio.shorten_repr(resolver.strip(), 80)} is not supported "
                    "(only oc.select); write the value directly"
                )
            key, _, default_text = args.partition(",")
            target = self.locate(key.strip(), path)
            if target is None:
                return _read_default(default_text, path)
            return self.value_at(target, path)
        target = self.locate(expr, path)
        if target is None:
            raise InterpolationError(
                f"{_dotted(path)}: ${{{yamlio.shorten(expr, 80)}}} refers to a key that does not exist; "
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
        """The resolved value at `target`, following chained references (each target resolved once)."""
        if target in self.in_progress:
            chain = " -> ".join(_dotted(p) for p in (*self.in_progress, target))
            raise InterpolationError(f"{_dotted(here)}: references form a cycle ({chain}); break the cycle")
        if target not in self.done:
            self.done[target] = self._resolve_target(target, here)
        found = self.done[target]
        if isinstance(found, InterpolationError):
            raise found
        value, size = found
        self.values += size
        if self.values > MAX_VALUES:
            raise _OverBudget(
                f"<root>: ${{...}} references copy more than {MAX_VALUES:,} values into the config; "
                "reference smaller groups or write the values out"
            )
        return value

    def _resolve_target(self, target: Path, here: Path) -> tuple[Any, int] | InterpolationError:
        """Resolve `target` once: its value and size, or the problem met."""
        if len(self.in_progress) >= MAX_CHAIN:
            return InterpolationError(
                f"{_dotted(here)}: references lead to references more than {MAX_CHAIN} levels deep "
                f"(at {_dotted(target)}); reference the final value directly"
            )
        self.in_progress.append(target)
        try:
            problems: list[str] = []
            value = self.walk(self.raw(target), target, problems)
        except InterpolationError as exc:
            return exc
        finally:
            self.in_progress.pop()
        if problems:
            return InterpolationError(problems[0])
        return value, _count_values(value)


def _read_default(text: str, path: Path) -> Any:
    """The default of `${oc.select:key,default}`, read as YAML (empty: null)."""
    if not text.strip():
        return None
    try:
        return yamlio.load(text, "default")
    except yamlio.YamlError as exc:
        raise InterpolationError(
            f"{_dotted(path)}: the default {yamlio.shorten_repr(text.strip(), 80)} of oc.select is not valid "
            f"YAML ({exc.problem.removeprefix('not valid YAML: ').split('; ')[0]}); quote it or write a plain value"
        ) from None


def _count_values(value: Any) -> int:
    """How many values (scalars, mappings, lists) `value` holds, itself included; no recursion."""
    count, todo = 0, [value]
    while todo:
        node = todo.pop()
        count += 1
        if isinstance(node, Mapping):
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return count


def _dotted(path: Path) -> str:
    """Render a key path as `a.b.c`."""
    return ".".join(path) if path else "<root>"
