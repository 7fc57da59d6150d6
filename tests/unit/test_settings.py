"""Operator settings: namespaces, peering, ports and timers from flags and RLJOB_* variables (flags win)."""

from __future__ import annotations

from typing import Any

import pytest

from rljob_operator.api import DEFAULT_IMAGE, PodSpec
from rljob_operator.settings import DEFAULT_PEERING, Settings, parse_settings


@pytest.mark.parametrize(("argv", "env", "expected"), [
    ([], {}, {"namespaces": (), "peering": DEFAULT_PEERING, "metrics_port": 8080, "resync_seconds": 60.0,
              "priority": None, "peering_lifetime": 60}),
    (["-n", "a", "-n", "b"], {}, {"namespaces": ("a", "b")}),
    ([], {"RLJOB_NAMESPACES": "a, b,,"}, {"namespaces": ("a", "b")}),
    ([], {"RLJOB_NAMESPACES": "*"}, {"namespaces": ()}),
    (["-A"], {"RLJOB_NAMESPACES": "a"}, {"namespaces": ()}),  # the flag wins over the environment
    (["-n", "x"], {"RLJOB_NAMESPACES": "a"}, {"namespaces": ("x",)}),
    (["--standalone"], {}, {"peering": None}),
    ([], {"RLJOB_STANDALONE": "true"}, {"peering": None}),
    (["--peering", "p"], {"RLJOB_STANDALONE": "1"}, {"peering": "p"}),
    ([], {"RLJOB_PEERING": "team"}, {"peering": "team"}),
    (["--priority", "5", "--peering-lifetime", "10"], {"RLJOB_PEERING_PRIORITY": "9"},
     {"priority": 5, "peering_lifetime": 10}),
    ([], {"RLJOB_PEERING_PRIORITY": "9", "RLJOB_PEERING_LIFETIME": "30"}, {"priority": 9, "peering_lifetime": 30}),
    (["--metrics-port", "0", "--resync-seconds", "2.5", "-v"], {"RLJOB_METRICS_PORT": "9"},
     {"metrics_port": 0, "resync_seconds": 2.5, "verbose": True}),
    ([], {"RLJOB_METRICS_PORT": "9090", "RLJOB_RESYNC_SECONDS": "5"}, {"metrics_port": 9090, "resync_seconds": 5.0}),
    ([], {}, {"trainer_image": DEFAULT_IMAGE}),
    ([], {"RLJOB_TRAINER_IMAGE": "registry.local/trainer:1"}, {"trainer_image": "registry.local/trainer:1"}),
    (["--trainer-image", "a/b:2"], {"RLJOB_TRAINER_IMAGE": "c/d:3"}, {"trainer_image": "a/b:2"}),
    ([], {}, {"pod_defaults": PodSpec()}),
    ([], {"RLJOB_POD_DEFAULTS": '{"serviceAccountName": "rl"}'}, {"pod_defaults": PodSpec(service_account_name="rl")}),
    (["--pod-defaults", "priorityClassName: batch"], {"RLJOB_POD_DEFAULTS": '{"serviceAccountName": "rl"}'},
     {"pod_defaults": PodSpec(priority_class_name="batch")}),
])
def test_parse_settings(argv: list[str], env: dict[str, str], expected: dict[str, Any]) -> None:
    settings = parse_settings(argv, env)
    assert {k: getattr(settings, k) for k in expected} == expected
    assert settings.clusterwide == (settings.namespaces == ())


def test_defaults_match_the_dataclass() -> None:
    assert parse_settings([], {}) == Settings()


@pytest.mark.parametrize(("argv", "env", "needle"), [
    (["--resync-seconds", "0"], {}, "--resync-seconds must be > 0"),
    (["--peering-lifetime", "1"], {}, "--peering-lifetime must be >= 2"),
    ([], {"RLJOB_PEERING_PRIORITY": "high"}, "RLJOB_PEERING_PRIORITY='high' is not an integer"),
    (["--trainer-image", " "], {}, "--trainer-image=' ' is not an image reference"),
    ([], {"RLJOB_TRAINER_IMAGE": "a b"}, "RLJOB_TRAINER_IMAGE='a b' is not an image reference"),
    ([], {"RLJOB_POD_DEFAULTS": "{nodeSelector: [a]}"}, "RLJOB_POD_DEFAULTS: nodeSelector: Input should be a valid"),
    (["--pod-defaults", "{env: [{name: RLJOB_ATTEMPT_X}, {name: A}, {name: A}]}"], {},
     "--pod-defaults.env[2].name: A is defined twice"),
])
def test_bad_settings_say_what_to_change(argv: list[str], env: dict[str, str], needle: str) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(argv, env)
    assert needle in str(exc.value)


def test_namespace_and_all_namespaces_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings(["-n", "a", "-A"], {})
    assert "not allowed with argument" in capsys.readouterr().err
