"""ConfigError and the translation of pydantic's errors into `path: problem; fix` lines."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

RULES_ERROR = "hybridflow_rules"
"""pydantic error type raised by the cross-field rules; its ctx carries the problem list."""


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
        loc = tuple(item["loc"])
        if item["type"] == RULES_ERROR:
            problems.extend(item.get("ctx", {}).get("problems", []))
            continue
        problems.append(_describe(item, loc, root))
    return problems


def _describe(item: Any, loc: tuple[Any, ...], root: type[BaseModel]) -> str:
    """One pydantic error as a problem line."""
    path = dotted(loc)
    kind = item["type"]
    if kind == "extra_forbidden":
        return f"{path}: unknown key; {_suggest(str(loc[-1]), valid_keys(root, loc[:-1]))}"
    if kind == "literal_error":
        expected = item.get("ctx", {}).get("expected", "")
        return f"{path}: {item['input']!r} is not valid; use one of {expected}"
    if kind == "missing":
        return f"{path}: required; set it"
    message = str(item["msg"]).removeprefix("Value error, ")
    if kind == "value_error":
        return f"{path}: {message}"
    got = f"got {item['input']!r}"
    bound = _BOUNDS.get(kind)
    if bound is not None:
        relation, key = bound
        return f"{path}: must be {relation} {item['ctx'][key]} ({got}); change the value"
    expected = _EXPECTED.get(kind)
    if expected is not None:
        return f"{path}: expected {expected} ({got}); fix the value"
    return f"{path}: {message[0].lower() + message[1:]} ({got}); fix the value"


_BOUNDS = {
    "greater_than": (">", "gt"),
    "greater_than_equal": (">=", "ge"),
    "less_than": ("<", "lt"),
    "less_than_equal": ("<=", "le"),
}
_EXPECTED = {
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping of keys to values",
    "model_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
    "none_required": "null (this key is accepted only for compatibility)",
}


def _suggest(key: str, valid: list[str]) -> str:
    """`did you mean ...?` from the closest valid keys, else the list of valid keys."""
    scored = sorted(((difflib.SequenceMatcher(None, key, v).ratio(), v) for v in valid), reverse=True)
    # The best match, plus any that are about as close (so ties are not hidden).
    close = [v for score, v in scored if score >= 0.6 and score >= scored[0][0] - 0.05]
    if close:
        return "did you mean " + " or ".join(close[:3]) + "?"
    if valid:
        return "valid keys here: " + ", ".join(valid)
    return "remove it"


def dotted(loc: tuple[Any, ...]) -> str:
    """Render a pydantic location as `a.b[0].c`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<root>"


def valid_keys(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the model found at `loc` below `root` (empty if `loc` is not a model)."""
    model: type[BaseModel] | None = root
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return []
        model = _model_in(model.model_fields[part].annotation)
    return sorted(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel class inside an annotation such as `M`, `M | None` or `Optional[M]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None
