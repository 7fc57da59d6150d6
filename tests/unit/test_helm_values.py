"""Bad chart values are rejected by values.schema.json before anything renders, naming the value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import binaries
from tests.support.helm import CHART, template

BAD_VALUES: dict[str, tuple[dict[str, Any], str]] = {
    "six replicas (one is active, five standbys are plenty)": ({"replicaCount": 6}, "/replicaCount': maximum"),
    "peering lifetime below kopf's minimum": ({"operator": {"peering": {"lifetime": 1}}},
                                              "/operator/peering/lifetime': minimum"),
    "unknown RBAC scope": ({"rbac": {"scope": "global"}}, "/rbac/scope': value must be one of 'cluster', 'namespaced'"),
    "namespaced RBAC without namespaces": ({"rbac": {"scope": "namespaced"}}, "/watchNamespaces': minItems"),
    "bad pull policy": ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy'"),
    "typo at the top level": ({"replicas": 1}, "additional properties 'replicas' not allowed"),
    "typo in a nested key": ({"serviceMonitor": {"enable": True}}, "additional properties 'enable' not allowed"),
    "trainer defaults (the operator has none; set them in each RLJob)": ({"trainer": {"image": "x"}},
                                                                         "additional properties 'trainer' not allowed"),
    "trainer image with a space": ({"trainerImage": "registry.local/trainer :1"}, "/trainerImage'"),
    "metrics port 0 (the probes need it)": ({"operator": {"metricsPort": 0}}, "/operator/metricsPort': minimum"),
    "namespace is not a DNS label": ({"watchNamespaces": ["Team-A"]}, "/watchNamespaces/0': 'Team-A' does not match"),
    "scrape interval without unit": ({"serviceMonitor": {"interval": 30}}, "/serviceMonitor/interval'"),
    "PDB that allows no disruption": ({"podDisruptionBudget": {"maxUnavailable": 0}}, "/podDisruptionBudget/maxUnavailable'"),
    "resync of zero seconds": ({"operator": {"resyncSeconds": 0}}, "/operator/resyncSeconds'"),
    "KubeRay through this chart (install it on its own)": ({"kuberay-operator": {"enabled": True}},
                                                           "additional properties 'kuberay-operator' not allowed"),
}  # fmt: skip


@pytest.fixture(scope="module")
def chart() -> Path:
    """The chart folder of the repository, as a clone has it."""
    return CHART


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_values_are_rejected_by_the_schema(chart: Path, case: str) -> None:
    values, expected = BAD_VALUES[case]
    result = template(binaries.ensure("helm"), chart, values)
    assert result.returncode != 0, f"{case}: helm rendered {values} instead of rejecting it"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert expected in result.stderr, result.stderr


def test_good_non_default_values_pass_the_schema(chart: Path) -> None:
    values = {
        "replicaCount": 5,
        "watchNamespaces": ["team-a"],
        "image": {"tag": "0.2.0-rc1", "pullPolicy": "Always"},
        "operator": {"peering": {"lifetime": 15}},
        "podDisruptionBudget": {"enabled": True, "maxUnavailable": "50%"},
    }
    result = template(binaries.ensure("helm"), chart, values)
    assert result.returncode == 0, result.stderr
