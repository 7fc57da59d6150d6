"""ConfigError and the one translation of pydantic's errors into `path: problem; fix` lines (configs and RLJobs)."""

from __future__ import annotations

import collections
import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from . import verl_features

RULES_ERROR = "hybridflow_rules"
"""pydantic error type raised by the cross-field rules; its ctx carries the problem list."""
BOOL_AS_NUMBER = "bool_as_number"
"""pydantic error type of `true`/`false` given where a number is expected (see values.py)."""


class ConfigError(ValueError):
    """An invalid config: `problems` lists every problem found, each `path.to.key: what; what to do`."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        count = len(self.problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid HybridFlow config ({count} problem{'s' if count != 1 else ''}):\n{lines}")


def problems_from_validation_error(error: ValidationError, root: type[BaseModel]) -> list[str]:
    """Turn a pydantic ValidationError on `root` into actionable problem lines."""
    problems: list[str] = []
    for item in error.errors():
        if item["type"] == RULES_ERROR:
            problems.extend(item.get("ctx", {}).get("problems", []))
            continue
        problems.append(describe_error(item, root))
    return problems


def describe_error(item: Any, root: type[BaseModel], loc: tuple[Any, ...] | None = None, noun: str = "key") -> str:
    """One pydantic error on `root` as `path: what is wrong; what to do`, in the project's wording.

    The one translation of pydantic's error types, used for trainer configs and RLJobs alike; `loc`
    overrides the error's own location, `noun` names what an unknown key is (`key`, or `field` in an RLJob).
    """
    loc = tuple(item["loc"]) if loc is None else loc
    path = dotted(loc)
    kind = item["type"]
    ctx = item.get("ctx") or {}
    got = f"got {shorten(item.get('input'))}"
    if kind == "extra_forbidden":
        feature = verl_features.key_refusal(loc, item.get("input"))
        if feature:  # a real verl key, not a typo: say it is not supported here and what to do
            return f"{path}: {feature}"
        return f"{path}: unknown {noun}; {suggest(str(loc[-1]), valid_keys(root, loc[:-1]), noun)}"
    if kind == "literal_error":
        feature = verl_features.value_refusal(loc, item.get("input"))
        if feature:
            return f"{path}: {feature} (got {shorten(item.get('input'))})"
        expected = str(ctx.get("expected", ""))
        return f"{path}: {shorten(item.get('input'))} is not valid; use {'one of ' if ' or ' in expected else ''}{expected}"
    if kind == "missing":
        return f"{path}: required; set it"
    message = str(item["msg"]).removeprefix("Value error, ")
    if kind == "value_error":
        return f"{path}: {message}"
    if kind in _BOUNDS:
        relation, key = _BOUNDS[kind]
        return f"{path}: must be {relation} {ctx.get(key)} ({got}); change the value"
    if kind == "string_too_short" and ctx.get("min_length") == 1:
        return f"{path}: must not be empty; set a value or remove the {noun}"
    if kind in _FORMATTED:
        return f"{path}: {_FORMATTED[kind].format_map(collections.defaultdict(str, ctx))} ({got}); fix the value"
    if kind in _EXPECTED:
        return f"{path}: expected {_EXPECTED[kind]} ({got}); fix the value"
    return f"{path}: {message[:1].lower() + message[1:]} ({got}); fix the value"


_BOUNDS = {
    "greater_than": (">", "gt"),
    "greater_than_equal": (">=", "ge"),
    "less_than": ("<", "lt"),
    "less_than_equal": ("<=", "le"),
}
_FORMATTED = {
    "string_too_short": "must have at least {min_length} character(s)",
    "string_too_long": "must have at most {max_length} characters",
    "too_short": "must have at least {min_length} item(s)",
    "too_long": "must have at most {max_length} item(s)",
    "string_pattern_mismatch": "does not have the expected form (pattern {pattern})",
}
_EXPECTED = {
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "int_parsing_size": "a whole number of sensible size",
    "float_parsing": "a number",
    "float_type": "a number",
    "finite_number": "a finite number, not inf or nan",
    BOOL_AS_NUMBER: "a number, not true or false",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping of keys to values",
    "model_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
    "none_required": "null (this key is accepted only for compatibility)",
}


def shorten(value: Any, limit: int = 200) -> str:
    """`repr(value)` for a message, cut after `limit` characters with `…(N chars)`: huge inputs are not echoed."""
    try:
        text = repr(value)
    except RecursionError:
        return f"<a {type(value).__name__} nested too deeply to show>"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…({len(text)} chars)"


#: Longer names are not typos of a key; comparing them would only cost time (difflib is quadratic).
_MAX_SUGGESTED_KEY = 100


def suggest(key: str, valid: list[str], noun: str = "key") -> str:
    """`did you mean ...?` from the closest valid keys, else the list of valid keys."""
    scored = []
    if len(key) <= _MAX_SUGGESTED_KEY:
        scored = sorted(((difflib.SequenceMatcher(None, key, v).ratio(), v) for v in valid), reverse=True)
    # The best match, plus any that are about as close (so ties are not hidden).
    close = [v for score, v in scored if score >= 0.6 and score >= scored[0][0] - 0.05]
    if close:
        return "did you mean " + " or ".join(close[:3]) + "?"
    if valid:
        return f"valid {noun}s here: " + ", ".join(valid)
    return "remove it"


def dotted(loc: tuple[Any, ...]) -> str:
    """Render a pydantic location as `a.b[0].c` (a huge key is shortened like a value)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = str(part)
            out += ("." if out else "") + (name if len(name) <= _MAX_SUGGESTED_KEY else shorten(name, _MAX_SUGGESTED_KEY))
    return out or "<root>"


def valid_keys(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys (aliases where a model has them) of the model found at `loc` below `root`; [] if none."""
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int):
            continue  # a list item: _model_in already stepped into the list's item model
        field = _field(model, part) if model is not None else None
        if field is None:
            return []
        model = _model_in(field.annotation)
    return sorted(f.alias or name for name, f in model.model_fields.items()) if model is not None else []


def _field(model: type[BaseModel], key: Any) -> Any:
    """The field of `model` called `key` (by name or alias), or None."""
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field
    return None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel class inside an annotation such as `M`, `M | None` or `list[M]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None
