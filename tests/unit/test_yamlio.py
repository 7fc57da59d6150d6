"""Tests for hybridflow.yamlio: every hostile or broken YAML input is a YamlError with a fix (issue 12)."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest

from hybridflow import yamlio


def _bomb(levels: int = 9) -> str:
    """A "billion laughs" document: each anchor is nine aliases of the previous one."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


REFUSED = {
    "nested 500 levels": ("a: " + "[" * 500 + "]" * 500, "line 1: nested deeper than 100 levels"),
    "nested 100,000 levels": ("[" * 100_000, "not valid YAML"),
    "alias bomb": (_bomb(), "aliases (*name) expand to more than 100,000 values"),
    "alias deeper than the limit": ("a: &a " + "[" * 60 + "]" * 60 + "\nb: " + "[" * 50 + "*a" + "]" * 50,
                                    "nests the data deeper than 100 levels"),
    "alias inside its own anchor": ("a: &a [*a]", "alias *a is used inside its own anchor &a"),
    "undefined alias": ("a: *nope", "alias *nope is not defined before this point"),
    "anchor defined twice": ("a: &x 1\nb: &x 2\n", "line 2: anchor &x is defined twice (first at line 1)"),
    "duplicate key": ("a: 1\nb: 2\na: 3\n", "line 3, column 1: duplicate key 'a' (first at line 1); keep one"),
    "duplicate nested key": ("spec:\n  n: 1\n  n: 2\n", "line 3, column 3: duplicate key 'n' (first at line 2)"),
    "yes and true are one key": ("yes: 1\ntrue: 2\n", "duplicate key True"),
    "!!float abc": ("lr: !!float abc", "'abc' cannot be read as float"),
    "int over 4,300 digits": ("n: " + "9" * 5000, "cannot be read as int (Exceeds the limit (4300 digits)"),
    "!!timestamp": ("t: !!timestamp abc", "the tag !!timestamp is not supported"),
    "!!binary": ("b: !!binary aGk=", "the tag !!binary is not supported"),
    "!!set": ("s: !!set {a}", "the tag !!set is not supported"),
    "python object": ("p: !!python/object/apply:os.system [ls]", "the tag !!python/object/apply:os.system"),
    "custom tag": ("c: !Ref x", "the tag !Ref is not supported"),
    "unhashable key": ("? [a]\n: b\n", "found unhashable key"),
    "syntax": ("a: [unclosed", "line 2, column 1: not valid YAML: did not find expected ',' or ']'"),
    "tab indentation": ("a:\n\tb: 1\n", "not valid YAML: found character that cannot start any token"),
    "two documents where one is expected": ("a: 1\n---\nb: 2\n", "holds 2 YAML documents where one is expected"),
}


@pytest.mark.parametrize("text, message", REFUSED.values(), ids=REFUSED.keys())
def test_refused_inputs_say_where_and_what_to_do(text: str, message: str) -> None:
    start = time.monotonic()
    with pytest.raises(yamlio.YamlError) as info:
        yamlio.load(text, "job.yaml")
    assert time.monotonic() - start < 2
    assert str(info.value).startswith("job.yaml: ")
    assert message in str(info.value)
    assert len(str(info.value)) < 600  # the input is never echoed in full


ACCEPTED = {
    "plain mapping": ("a: 1\nb: [x, {c: 2.5}]\n", {"a": 1, "b": ["x", {"c": 2.5}]}),
    "dates stay strings": ("d: 2024-01-01\n", {"d": "2024-01-01"}),
    "bare = is a string": ("e: =\n", {"e": "="}),
    "YAML 1.1 booleans, as kubectl reads them": ("on: yes\n", {True: True}),
    "merge keys may override": ("b: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n", {"b": {"x": 1, "y": 2},
                                                                           "c": {"x": 3, "y": 2}}),
    "100 levels": ("[" * 100 + "]" * 100, functools.reduce(lambda inner, _: [inner], range(99), [])),
    "a few aliases": ("a: &a [1, 2]\nb: *a\nc: *a\n", {"a": [1, 2], "b": [1, 2], "c": [1, 2]}),
    "BOM": ("\ufeffa: 1\n", {"a": 1}),
    "empty": ("", None),
}


@pytest.mark.parametrize("text, expected", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_accepted_inputs(text: str, expected: object) -> None:
    assert yamlio.load(text) == expected


def test_non_utf8_is_refused_with_the_offset(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"a: 1\nb: caf\xe9\n")
    with pytest.raises(yamlio.YamlError, match=r"line 2: not UTF-8 text \(byte 0xe9 at offset 11\); save the file"):
        yamlio.read(path)


def test_size_limit_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(yamlio.YamlError, match="larger than 10 bytes; split it"):
        yamlio.load("a: 12345678901", limits=yamlio.Limits(max_bytes=10))
    with pytest.raises(yamlio.YamlError, match=r"cannot read the config file \(No such file or directory\); check"):
        yamlio.read_mapping(tmp_path / "missing.yaml", file="config file")


def test_document_limit_and_multi_document_streams() -> None:
    assert yamlio.load_all("a: 1\n---\n---\nb: 2\n") == [{"a": 1}, None, {"b": 2}]
    with pytest.raises(yamlio.YamlError, match="more than 3 YAML documents"):
        yamlio.load_all("---\na: 1\n" * 4, limits=yamlio.Limits(max_documents=3))
    with pytest.raises(yamlio.YamlError, match=r"duplicate key 'x'"):  # a later bad document fails the stream
        yamlio.load_all("a: 1\n---\nx: 1\nx: 2\n")


@pytest.mark.parametrize("text, message", [
    ("- a\n- b\n", "the top level must be a mapping of groups, not a list (['a', 'b']); write `key: value`"),
    ("just text", "not a string ('just text')"),
    ("42", "not a number (42)"),
])
def test_load_mapping_refuses_other_top_levels(text: str, message: str) -> None:
    with pytest.raises(yamlio.YamlError, match="the top level must be a mapping") as info:
        yamlio.load_mapping(text, "c.yaml", "groups")
    assert message in str(info.value)


def test_find_too_deep_names_the_path_without_recursing() -> None:
    value: object = 1
    for _ in range(5000):  # far deeper than Python's recursion limit
        value = {"a": [value]}
    path = yamlio.find_too_deep({"spec": value}, 10)
    assert path == "spec" + ".a[0]" * 4 + ".a"
    assert yamlio.find_too_deep({"a": {"b": [1]}}, 3) is None


def test_shorten() -> None:
    assert yamlio.shorten("abc") == "abc"
    assert yamlio.shorten("x" * 1000, 20) == "x" * 19 + "… (1,000 characters)"
    deep: object = 1
    for _ in range(100_000):
        deep = [deep]
    assert yamlio.shorten_repr(deep) == "<list, too large to show>"
