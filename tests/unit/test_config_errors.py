"""Tests of hybridflow._config.errors: the one translation of pydantic errors, suggestions, short values."""

from __future__ import annotations

import time
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybridflow._config.errors import describe_error, dotted, shorten, suggest, valid_keys


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch_size: int = Field(default=1, gt=0)


class _Root(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["a", "b"] = "a"
    single: Literal["only"] = "only"
    count: int = Field(default=1, ge=1)
    ratio: float = Field(default=0.5, lt=1)
    flag: bool = False
    name: str = Field(default="x", min_length=1)
    pair: list[int] = Field(default_factory=lambda: [1, 2], min_length=2, max_length=2)
    items: list[_Inner] = Field(default_factory=list)
    inner: _Inner = Field(default_factory=_Inner)


def _line(data: dict[str, Any], noun: str = "key") -> str:
    """The one problem line of validating `data` against _Root."""
    with pytest.raises(ValidationError) as info:
        _Root.model_validate(data)
    (item,) = info.value.errors()
    return describe_error(item, _Root, noun=noun)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"mdoe": "a"}, "mdoe: unknown key; did you mean mode?"),
        ({"inner": {"bacth_size": 2}}, "inner.bacth_size: unknown key; did you mean batch_size?"),
        ({"items": [{"batchsize": 2}]}, "items[0].batchsize: unknown key; did you mean batch_size?"),
        ({"zzz": 1}, "zzz: unknown key; valid keys here: count, flag, inner, items, mode, name, pair, ratio, single"),
        ({"mode": "c"}, "mode: 'c' is not valid; use one of 'a' or 'b'"),
        ({"single": "other"}, "single: 'other' is not valid; use 'only'"),
        ({"count": "many"}, "count: expected a whole number (got 'many'); fix the value"),
        ({"count": 1.5}, "count: expected a whole number (got 1.5); fix the value"),
        ({"count": 0}, "count: must be >= 1 (got 0); change the value"),
        ({"ratio": "fast"}, "ratio: expected a number (got 'fast'); fix the value"),
        ({"ratio": 2}, "ratio: must be < 1.0 (got 2); change the value"),
        ({"flag": "maybe"}, "flag: expected true or false (got 'maybe'); fix the value"),
        ({"name": 3}, "name: expected a string (got 3); fix the value"),
        ({"name": ""}, "name: must not be empty; set a value or remove the key"),
        ({"pair": [1]}, "pair: must have at least 2 item(s) (got [1]); fix the value"),
        ({"pair": 1}, "pair: expected a list (got 1); fix the value"),
        ({"inner": 3}, "inner: expected a mapping of keys to values (got 3); fix the value"),
        ({"inner": {"batch_size": 0}}, "inner.batch_size: must be > 0 (got 0); change the value"),
    ],
)
def test_pydantic_errors_read_as_problem_and_fix(data: dict[str, Any], expected: str) -> None:
    assert _line(data) == expected


def test_the_noun_names_fields_in_an_rljob() -> None:
    assert _line({"zzz": 1}, noun="field").startswith("zzz: unknown field; valid fields here: count,")


def test_missing_is_required() -> None:
    class Needs(BaseModel):
        must: int

    with pytest.raises(ValidationError) as info:
        Needs.model_validate({})
    assert describe_error(info.value.errors()[0], Needs) == "must: required; set it"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("short", "'short'"),
        (42, "42"),
        ("x" * 300, "'" + "x" * 199 + "…(302 chars)"),
        (list(range(1000)), "[0, 1, 2, "),
    ],
)
def test_long_values_are_shortened(value: Any, expected: str) -> None:
    shown = shorten(value)
    assert shown.startswith(expected) and len(shown) < 220


def test_a_value_too_deep_to_print_is_named_not_crashed_on() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    assert shorten(deep) == "<a list nested too deeply to show>"


def test_huge_inputs_are_not_echoed_whole() -> None:
    line = _line({"count": "9" * 1_000_000})
    assert len(line) < 400 and "…(1000002 chars)" in line
    key_line = _line({"k" * 1_000_000: 1})
    assert len(key_line) < 400 and key_line.startswith("'kkk")


def test_suggestions_for_a_huge_key_are_instant() -> None:
    start = time.monotonic()
    assert suggest("x" * 3_000_000, ["alpha", "beta"]) == "valid keys here: alpha, beta"
    assert time.monotonic() - start < 1


def test_valid_keys_follow_aliases_and_lists() -> None:
    class Aliased(BaseModel):
        model_config = ConfigDict(extra="forbid", populate_by_name=True)
        some_field: list[_Inner] = Field(default_factory=list, alias="someField")

    assert valid_keys(Aliased, ()) == ["someField"]
    assert valid_keys(Aliased, ("someField", 0)) == ["batch_size"]
    assert valid_keys(Aliased, ("nope",)) == []


def test_dotted_locations() -> None:
    assert dotted(("a", "b", 0, "c")) == "a.b[0].c"
    assert dotted(()) == "<root>"
