"""Tests of hybridflow._config.values: numbers are numbers (finite, not booleans), ranges, locations (issue 12)."""

from __future__ import annotations

import math
import typing
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from hybridflow._config.values import check_location, location_scheme
from hybridflow.config import ConfigError, HybridFlowConfig, parse_config


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    """Every model class reachable from `model`."""
    seen.add(model)
    for field in model.model_fields.values():
        for arg in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel) and arg not in seen:
                _models(arg, seen)
    return seen


def _fields_of_type(kind: type) -> list[tuple[type[BaseModel], str]]:
    """(model, field) for every config field whose type is `kind` or `kind | None`."""
    found = []
    for model in _models(HybridFlowConfig, set()) - {HybridFlowConfig}:
        for name, field in model.model_fields.items():
            if field.annotation is kind or field.annotation == kind | None:
                found.append((model, name))
    return sorted(found, key=lambda mf: (mf[0].__name__, mf[1]))


NUMBER_FIELDS = _fields_of_type(int) + _fields_of_type(float)
FLOAT_FIELDS = _fields_of_type(float)


def test_the_field_tables_are_not_empty() -> None:
    """The generic tests below really cover the config (lr, grad_clip, temperature, nnodes, ...)."""
    names = {name for _, name in NUMBER_FIELDS}
    assert {"lr", "grad_clip", "temperature", "top_p", "kl_coef", "entropy_coeff", "nnodes"} <= names
    assert len(FLOAT_FIELDS) > 20


@pytest.mark.parametrize(("model", "name"), NUMBER_FIELDS, ids=lambda v: getattr(v, "__name__", v))
def test_no_number_field_takes_a_boolean(model: type[BaseModel], name: str) -> None:
    """pydantic would read `true` as 1; every number field refuses it (one validator on Section)."""
    section = model()
    with pytest.raises(ValidationError, match="true/false is not a number"):
        setattr(section, name, True)


@pytest.mark.parametrize(("model", "name"), FLOAT_FIELDS, ids=lambda v: getattr(v, "__name__", v))
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, "inf", "nan"])
def test_no_float_field_takes_inf_or_nan(model: type[BaseModel], name: str, value: Any) -> None:
    """A rate, coefficient or length is finite (Section's allow_inf_nan=False)."""
    section = model()
    with pytest.raises(ValidationError, match="finite number"):
        setattr(section, name, value)


def _problems(mapping: dict[str, Any]) -> list[str]:
    """The problems parse_config finds in `mapping` (empty when valid)."""
    try:
        parse_config(mapping)
    except ConfigError as exc:
        return exc.problems
    return []


ARR = "actor_rollout_ref"


@pytest.mark.parametrize(
    ("mapping", "expected"),
    [
        ({ARR: {"actor": {"optim": {"lr": math.inf}}}},
         "actor_rollout_ref.actor.optim.lr: expected a finite number, not inf or nan (got inf); fix the value"),
        ({ARR: {"actor": {"grad_clip": "nan"}}}, "actor_rollout_ref.actor.grad_clip: expected a finite number"),
        ({ARR: {"rollout": {"temperature": True}}},
         "actor_rollout_ref.rollout.temperature: expected a number, not true or false (got True); fix the value"),
        ({"trainer": {"nnodes": False}}, "trainer.nnodes: expected a number, not true or false (got False)"),
        ({"algorithm": {"kl_ctrl": {"kl_coef": -math.inf}}}, "algorithm.kl_ctrl.kl_coef: expected a finite number"),
        ({ARR: {"actor": {"optim": {"betas": [0.9, 1.0]}}}},
         "actor_rollout_ref.actor.optim.betas[1]: must be < 1.0 (got 1.0); change the value"),
        ({ARR: {"actor": {"optim": {"betas": [-0.1, 0.999]}}}}, "actor_rollout_ref.actor.optim.betas[0]: must be >= 0"),
        ({ARR: {"actor": {"optim": {"betas": [0.9, True]}}}}, "actor_rollout_ref.actor.optim.betas: expected a number"),
        ({ARR: {"actor": {"optim": {"betas": [0.9]}}}}, "actor_rollout_ref.actor.optim.betas: must have at least 2"),
        ({ARR: {"rollout": {"top_p": 0}}}, "actor_rollout_ref.rollout.top_p: must be > 0"),
        ({"trainer": {"seed": -1}}, "trainer.seed: must be >= 0 (got -1)"),
        ({"data": {"seed": 2**32}}, "data.seed: must be <= 4294967295"),
        ({ARR: {"actor": {"tis_imp_ratio_cap": -2}}},
         "actor_rollout_ref.actor.tis_imp_ratio_cap: must be -1 (off) or a positive cap (got -2.0)"),
        ({ARR: {"actor": {"tis_imp_ratio_cap": 0}}}, "actor_rollout_ref.actor.tis_imp_ratio_cap: must be -1 (off)"),
        ({"trainer": {"max_actor_ckpt_to_keep": -1}}, "trainer.max_actor_ckpt_to_keep: must be > 0"),
        ({"trainer": {"n_gpus_per_node": 1000000001}}, "trainer.n_gpus_per_node: must be <= 1024 (got 1000000001)"),
        ({"trainer": {"nnodes": 10**9}}, "trainer.nnodes: must be <= 65536"),
    ],
)
def test_numbers_out_of_range_are_refused_naming_the_field(mapping: dict[str, Any], expected: str) -> None:
    assert any(p.startswith(expected) for p in _problems(mapping)), _problems(mapping)


@pytest.mark.parametrize(
    "mapping",
    [
        {ARR: {"actor": {"optim": {"betas": [0.0, 0.95], "lr": "1e-6"}, "tis_imp_ratio_cap": 2}}},
        {ARR: {"actor": {"tis_imp_ratio_cap": -1}}},
        {"trainer": {"seed": 0, "n_gpus_per_node": 1024}, "data": {"train_batch_size": 1024},
         ARR: {"actor": {"ppo_mini_batch_size": 1024}}},
        {"data": {"seed": 2**32 - 1}},
    ],
)
def test_numbers_in_range_are_accepted(mapping: dict[str, Any]) -> None:
    assert _problems(mapping) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", "'' is blank; set a path, s3://bucket/prefix, gs://bucket/prefix or file:///absolute/path"),
        ("   ", "'   ' is blank"),
        ("s3:/b", "'s3:/b' is not a valid URI ('://' after the scheme); write e.g. s3://b, or ./s3:/b for a local path"),
        ("gs:bucket/x", "write e.g. gs://bucket/x"),
        ("file:/tmp/x", "write e.g. file:///tmp/x"),
        ("file://", "'file://' is not an absolute file URI; write file:///absolute/path (three slashes)"),
        ("file://host/x", "is not an absolute file URI"),
        ("ftp://x", "'ftp://x' uses an unsupported scheme (ftp://); use a path, s3://bucket/prefix"),
        ("hdfs://nn/ckpt", "uses an unsupported scheme (hdfs://)"),
        ("s3://", "'s3://' names no bucket; use s3://bucket/prefix"),
        ("gs:///prefix", "names no bucket; use gs://bucket/prefix"),
        ("/data/ckpt\n", "has leading or trailing spaces or a control character (a newline?); remove them"),
        (" /data/ckpt", "has leading or trailing spaces"),
    ],
)
def test_bad_locations_are_refused_with_the_fix(value: str, expected: str) -> None:
    with pytest.raises(ValueError) as info:
        check_location(value)
    assert str(info.value).startswith(expected) or expected in str(info.value), info.value


@pytest.mark.parametrize(
    ("value", "scheme"),
    [("s3://bucket/run", "s3"), ("GS://bucket", "gs"), ("file:///tmp/ckpt", "file"), ("/data/ckpt", ""),
     ("checkpoints/run:1", ""), ("outputs/demo/data/train.parquet", ""), ("C:/data", "")],
)  # fmt: skip
def test_good_locations_are_accepted(value: str, scheme: str) -> None:
    assert check_location(value) == value
    assert location_scheme(value) == scheme


@pytest.mark.parametrize(
    ("mapping", "expected"),
    [
        ({"data": {"train_files": ""}}, "data.train_files[0]: '' is blank"),
        ({"data": {"train_files": ["s3://b/t.parquet", " "]}}, "data.train_files[1]: ' ' is blank"),
        ({"data": {"val_files": "ftp://x/v.parquet"}}, "data.val_files[0]: 'ftp://x/v.parquet' uses an unsupported"),
        ({"trainer": {"default_local_dir": "s3:/b"}}, "trainer.default_local_dir: 's3:/b' is not a valid URI"),
        ({"trainer": {"default_local_dir": "file://"}}, "trainer.default_local_dir: 'file://' is not an absolute"),
        ({"trainer": {"resume_from_path": "s3://"}}, "trainer.resume_from_path: 's3://' names no bucket"),
    ],
)
def test_config_locations_are_checked_by_scheme(mapping: dict[str, Any], expected: str) -> None:
    assert any(p.startswith(expected) for p in _problems(mapping)), _problems(mapping)
