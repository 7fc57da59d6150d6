"""Render the rljob-operator chart with the real `helm` binary, and validate what it renders.

The chart declares the official kuberay-operator chart as an optional dependency (disabled by
default). Helm refuses to lint or render a chart whose declared dependencies are missing from
`charts/`, even disabled ones, and the real chart cannot be fetched here (no internet). So tests work
on a copy of the chart with a minimal stand-in `charts/kuberay-operator` (same name and version, one
marker ConfigMap): the real chart's templates, values and schema are what is tested, and the marker
shows whether the dependency's condition switches the subchart on and off.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "rljob-operator"
K8S_VERSION = "1.37"
STAND_IN_MARKER = "kuberay-operator-stand-in"

_STAND_IN_TEMPLATE = f"""apiVersion: v1
kind: ConfigMap
metadata:
  name: {STAND_IN_MARKER}
data:
  note: test double of the kuberay-operator chart (tests/support/helm.py)
"""


def chart_dependency(name: str) -> dict[str, Any]:
    """The dependency entry `name` of the chart's Chart.yaml."""
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return next(d for d in meta.get("dependencies", []) if d["name"] == name)


def copy_chart_with_stand_in(dest: Path) -> Path:
    """Copy the chart to `dest/rljob-operator` with a stand-in kuberay-operator subchart; returns its path."""
    target = dest / CHART.name
    shutil.copytree(CHART, target)
    dep = chart_dependency("kuberay-operator")
    sub = target / "charts" / dep["name"]
    (sub / "templates").mkdir(parents=True)
    (sub / "Chart.yaml").write_text(f"apiVersion: v2\nname: {dep['name']}\nversion: {dep['version']}\n")
    (sub / "templates" / "marker.yaml").write_text(_STAND_IN_TEMPLATE)
    return target


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run helm with a private, empty home so no user config or repository cache leaks in."""
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HELM_CACHE_HOME": "/tmp/rljob-helm-test/cache",
                               "HELM_CONFIG_HOME": "/tmp/rljob-helm-test/config",
                               "HELM_DATA_HOME": "/tmp/rljob-helm-test/data"})  # fmt: skip


def template(helm: Path, chart: Path, values: Mapping[str, Any] | None = None, *extra: str,
             namespace: str = "rljob-system") -> subprocess.CompletedProcess[str]:
    """`helm template rljob CHART -n NAMESPACE --include-crds` with `values` written to a values file."""
    args = ["template", "rljob", str(chart), "--namespace", namespace, "--include-crds", *extra]
    if values:
        values_file = chart.parent / "test-values.yaml"
        values_file.write_text(yaml.safe_dump(dict(values)))
        args += ["--values", str(values_file)]
    return run_helm(helm, *args)


def render(helm: Path, chart: Path, values: Mapping[str, Any] | None = None, *extra: str) -> list[dict[str, Any]]:
    """The objects `helm template` renders; fails with helm's stderr when it does not render."""
    result = template(helm, chart, values, *extra)
    assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


# ------------------------------------------------------------------------------------- validation

#: The fields of prometheus-operator's monitoring.coreos.com/v1 ServiceMonitor and PodMonitor that the
#: chart uses, with unknown fields forbidden (a typo would be pruned by the API server). Not the
#: full upstream schema: those CRDs are not available here.
_SELECTOR = {"type": "object", "additionalProperties": False,
             "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}}
_RELABEL = {"type": "object", "additionalProperties": False, "required": ["sourceLabels", "targetLabel"],
            "properties": {"sourceLabels": {"type": "array", "items": {"type": "string",
                                                                        "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
                           "targetLabel": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}}}
_DURATION = {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_ENDPOINT = {"type": "object", "additionalProperties": False, "required": ["port"],
             "properties": {"port": {"type": "string", "minLength": 1}, "path": {"type": "string"},
                            "interval": _DURATION, "scrapeTimeout": _DURATION,
                            "relabelings": {"type": "array", "items": _RELABEL}}}
_NS_SELECTOR = {"type": "object", "additionalProperties": False,
                "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}}
_META = {"type": "object", "required": ["name", "namespace"],
         "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}}}


def _monitor_schema(endpoints_key: str) -> dict[str, Any]:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"metadata": _META, "spec": {
                "type": "object", "additionalProperties": False, "required": ["selector", endpoints_key],
                "properties": {"selector": _SELECTOR, "namespaceSelector": _NS_SELECTOR,
                               endpoints_key: {"type": "array", "minItems": 1, "items": _ENDPOINT}}}}}


CUSTOM_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _monitor_schema("endpoints"),
    ("monitoring.coreos.com/v1", "PodMonitor"): _monitor_schema("podMetricsEndpoints"),
}  # fmt: skip


def _peering_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """JSON schemas of kopf's peering kinds, from the chart's own CRD file (they are trivially structural)."""
    out = {}
    for crd in yaml.safe_load_all((CHART / "crds" / "kopf.dev_peerings.yaml").read_text()):
        (version,) = crd["spec"]["versions"]
        schema = dict(version["schema"]["openAPIV3Schema"])
        schema["properties"] = {**schema["properties"], "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                "metadata": {"type": "object", "required": ["name"]}}
        schema["additionalProperties"] = False
        out[(f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])] = schema
    return out


def validate_object(obj: dict[str, Any]) -> None:
    """Validate one rendered object strictly: Kubernetes schemas for built-in kinds, ours for the rest."""
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    custom = {**CUSTOM_SCHEMAS, **_peering_schemas()}
    if key in custom:
        jsonschema.validate(obj, custom[key])
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
