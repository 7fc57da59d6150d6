"""Value types shared by the trainer config and the RLJob API: numbers that are numbers, locations.

Two rules hold for every model built on these (hybridflow's `Section`, the operator's API models):

- `true`/`false` is never a number. pydantic's lax mode turns `True` into 1 for an `int` or `float`
  field; `refuse_bool_as_number` runs before every field (a `field_validator("*")` on the base class)
  and refuses it, so no field has to remember.
- a location (checkpoint folder, data file) is a local path or a URI of a scheme we can read, written
  in full: `s3://bucket/key`, `gs://bucket/key`, `file:///absolute/path`. `check_location` says how to
  write a malformed one (`s3:/b`, `file://`, `ftp://x`, a blank string).

No torch, no Ray: the operator imports this.
"""

from __future__ import annotations

import functools
import re
import types
import typing
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationInfo
from pydantic_core import PydanticCustomError

from .errors import BOOL_AS_NUMBER, shorten

#: URI schemes a location may use: what the trainer's storage layer (fsspec) is set up for.
LOCATION_SCHEMES = ("s3", "gs", "file")
_BUCKET_SCHEMES = ("s3", "gs")
#: `name:` at the start of a string: a URI scheme (two letters at least, so `C:` stays a path).
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_EXAMPLES = "a path, s3://bucket/prefix, gs://bucket/prefix or file:///absolute/path"

Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
"""An RNG seed: numpy's `seed` accepts 0 <= seed < 2**32 and nothing else."""


# ------------------------------------------------------------------------------- no bool as number


def refuse_bool_as_number(cls: type, value: Any, info: ValidationInfo) -> Any:
    """Refuse `true`/`false` (also inside a list) for a field whose type is a number.

    Called from a `field_validator("*", mode="before")` on a base model, so it guards every field once.
    """
    if info.field_name is None or not _holds_bool(value):
        return value
    if _numeric_field(cls, info.field_name, isinstance(value, list)):
        raise PydanticCustomError(BOOL_AS_NUMBER, "true/false is not a number", {})
    return value


def _holds_bool(value: Any) -> bool:
    """Whether `value` is a boolean or a list with one."""
    if isinstance(value, list):
        return any(isinstance(v, bool) for v in value)
    return isinstance(value, bool)


@functools.cache
def _numeric_field(cls: type, name: str, in_list: bool) -> bool:
    """Whether field `name` of model `cls` takes numbers and not booleans (`int`, `float | None`, `list[float]`)."""
    field = getattr(cls, "model_fields", {}).get(name)
    if field is None:
        return False
    args = _members(field.annotation)
    if in_list:
        args = tuple(a for arg in args if typing.get_origin(arg) is list for a in _members(typing.get_args(arg)[0]))
    return bool(args) and bool not in args and any(a in (int, float) for a in args)


def _members(annotation: Any) -> tuple[Any, ...]:
    """The types a (possibly Annotated or union) annotation admits."""
    if typing.get_origin(annotation) is Annotated:
        return _members(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(m for arg in typing.get_args(annotation) for m in _members(arg))
    return (annotation,)


# ------------------------------------------------------------------------------------- locations


def location_scheme(location: str) -> str:
    """The URI scheme of a location, lower-case (`s3`, `gs`, `file`), or "" for a plain path."""
    return location.split("://", 1)[0].lower() if "://" in location else ""


def check_location(value: str) -> str:
    """Return `value` if it is a usable path or URI; raise ValueError saying how to write it otherwise."""
    problem = location_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def location_problem(value: str) -> str | None:
    """What is wrong with a path or URI, with the fix (None when it is fine)."""
    shown = shorten(value)
    if not value.strip():
        return f"{shown} is blank; set {_EXAMPLES}"
    if value != value.strip() or _CONTROL.search(value):
        return f"{shown} has leading or trailing spaces or a control character (a newline?); remove them"
    scheme = location_scheme(value)
    if not scheme:
        match = _SCHEME.match(value)
        if match:
            return (f"{shown} is not a valid URI ('://' after the scheme); write e.g. "
                    f"{_fixed_uri(match.group(1), value[match.end():])}, or ./{value} for a local path")
        return None
    if scheme not in LOCATION_SCHEMES:
        return f"{shown} uses an unsupported scheme ({scheme}://); use {_EXAMPLES}"
    rest = value[len(scheme) + 3 :]
    if scheme in _BUCKET_SCHEMES and not rest.split("/", 1)[0]:
        return f"{shown} names no bucket; use {scheme}://bucket/prefix"
    if scheme == "file" and not rest.startswith("/"):
        return f"{shown} is not an absolute file URI; write file:///absolute/path (three slashes) or a plain path"
    return None


def _fixed_uri(scheme: str, rest: str) -> str:
    """A best guess at the URI a malformed one meant (`s3:/b` -> `s3://b`)."""
    scheme = scheme.lower()
    if scheme == "file":
        return "file:///" + rest.lstrip("/")
    tail = rest.lstrip("/") or "bucket/prefix"
    return f"{scheme if scheme in LOCATION_SCHEMES else 's3'}://{tail}"


Location = Annotated[str, AfterValidator(check_location)]
"""A path or URI a checkpoint or data file can live at, checked by scheme."""
