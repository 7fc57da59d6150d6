"""Render the rljob-operator chart with the real `helm` binary, and validate what it renders.

The chart has no dependencies (KubeRay is installed on its own), so tests render the chart folder of
the repository itself, exactly as a clone has it. `run_helm` gives helm an empty home and a proxy that
refuses every connection: a chart that needed the network (a dependency to fetch) fails here as it
would in an air-gapped cluster.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "rljob-operator"
K8S_VERSION = "1.37"
#: Nothing listens there: any download helm tried would fail at once instead of reaching the network.
_NO_NETWORK = "http://127.0.0.1:9"


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run helm offline, with a private, empty home so no user config or repository cache leaks in."""
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HELM_CACHE_HOME": "/tmp/rljob-helm-test/cache",
                               "HELM_CONFIG_HOME": "/tmp/rljob-helm-test/config",
                               "HELM_DATA_HOME": "/tmp/rljob-helm-test/data",
                               "HTTP_PROXY": _NO_NETWORK, "HTTPS_PROXY": _NO_NETWORK, "NO_PROXY": ""})  # fmt: skip


def template(helm: Path, chart: Path = CHART, values: Mapping[str, Any] | None = None, *extra: str,
             namespace: str = "rljob-system") -> subprocess.CompletedProcess[str]:
    """`helm template rljob CHART -n NAMESPACE --include-crds` with `values` written to a temporary values file."""
    args = ["template", "rljob", str(chart), "--namespace", namespace, "--include-crds", *extra]
    with tempfile.TemporaryDirectory(prefix="rljob-helm-values-") as tmp:
        if values:
            values_file = Path(tmp) / "values.yaml"
            values_file.write_text(yaml.safe_dump(dict(values)))
            args += ["--values", str(values_file)]
        return run_helm(helm, *args)


def render(helm: Path, chart: Path = CHART, values: Mapping[str, Any] | None = None,
           *extra: str) -> list[dict[str, Any]]:
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
