"""Tests for CRD generation (operator/rljob_operator/crdgen.py) and the committed crds/ file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from rljob_operator import crdgen

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / crdgen.CRD_FILENAME
CRD_VALIDATE = REPO.parent / "shared" / "tools" / "crd-validate"
EXAMPLES = sorted((REPO / "examples").glob("rljob_*.yaml"))
needs_shared = pytest.mark.skipif(
    not CRD_VALIDATE.exists(), reason=f"{CRD_VALIDATE} is absent (only CI and dev boxes have ../shared)"
)


def _walk(node: Any, path: str = "") -> Any:
    """Yield (path, schema node) for every sub-schema of a structural schema."""
    if not isinstance(node, dict):
        return
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")


def _schema() -> dict[str, Any]:
    return crdgen.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_matches_the_models() -> None:
    assert CRD_FILE.exists(), f"{CRD_FILE} is missing: run `make crds`"
    assert CRD_FILE.read_text() == crdgen.render_crd(), (
        f"{CRD_FILE.relative_to(REPO)} is out of date with operator/rljob_operator/api.py: run `make crds`"
    )


def test_crd_is_a_valid_apiextensions_v1_object() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    kubernetes_validate.validate(crd, "1.37", strict=True)


def test_crd_identity_subresources_and_columns() -> None:
    crd = crdgen.build_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "rljobs.rl.hybridflow.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["shortNames"] == ["rlj"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["storage"] and version["served"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Step": ".status.progress.step",
        "Total": ".status.progress.totalSteps",
        "Reward": ".status.metrics.rewardMean",
        "Attempt": ".status.attempt",
        "Version": ".status.metrics.policyVersion",  # -o wide (priority 1): asynchronous training
        "Staleness": ".status.metrics.stalenessMax",
        "Age": ".metadata.creationTimestamp",
    }


def test_schema_is_structural() -> None:
    """Rules of https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/ (structural schema)."""
    for path, node in _walk(_schema()):
        where = path or "<root>"
        assert "$ref" not in node and "title" not in node and "$defs" not in node, where
        assert node.get("additionalProperties") is not False, where
        assert not ("properties" in node and "additionalProperties" in node), where
        free = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        assert "type" in node or free, f"{where}: every node needs a type"
        for option in node.get("anyOf", []):
            assert set(option) <= {"type"} and node.get("x-kubernetes-int-or-string"), where
        assert "null" != node.get("type"), where


def test_every_spec_and_status_field_has_a_description() -> None:
    schema = _schema()
    fields = [(p, n) for p, n in _walk(schema) if p.startswith((".spec", ".status")) and not p.endswith(".*")]
    missing = [p for p, n in fields if not n.get("description")]
    assert missing == []


def test_schema_shapes_of_key_fields() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    assert spec["config"]["type"] == "object"
    assert spec["runPolicy"]["properties"]["backoffLimit"]["default"] == 3
    assert spec["suspend"]["default"] is False
    assert spec["imagePullPolicy"]["enum"] == ["Always", "IfNotPresent", "Never"]
    cpu = spec["resources"]["properties"]["cpu"]
    assert cpu["x-kubernetes-int-or-string"] and "pattern" in cpu
    pod = spec["pod"]["properties"]
    assert pod["nodeSelector"]["additionalProperties"] == {"type": "string"}
    assert pod["affinity"]["x-kubernetes-preserve-unknown-fields"] and pod["affinity"]["nullable"]
    assert pod["tolerations"]["items"]["properties"]["effect"]["enum"] == ["NoSchedule", "PreferNoSchedule", "NoExecute"]
    status = _schema()["properties"]["status"]["properties"]
    assert "dashboardURL" in status
    assert "Retrying" in status["phase"]["enum"]
    assert status["conditions"]["items"]["required"] == ["type", "status"]


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}, "no structural"),
        ({"type": "array", "prefixItems": [{"type": "integer"}]}, "prefixItems"),
        ({"properties": {"x": {"$ref": "#/$defs/Missing"}}, "type": "object"}, "unresolvable"),
        ({"description": "no type"}, "no type"),
    ],
)
def test_untranslatable_schemas_are_refused(schema: dict, message: str) -> None:
    with pytest.raises(crdgen.CRDGenerationError, match=message):
        crdgen.to_structural(schema)


def test_translation_rules() -> None:
    out = crdgen.to_structural(
        {
            "type": "object",
            "properties": {
                "n": {"anyOf": [{"type": "integer", "exclusiveMinimum": 0}, {"type": "null"}], "default": None},
                "mode": {"const": "x"},
                "m": {"type": "object", "additionalProperties": {"type": "integer"}},
                "free": {"type": "object", "additionalProperties": True},
                "num": {"anyOf": [{"type": "integer"}, {"type": "number"}]},
            },
            "additionalProperties": False,
        }
    )
    props = out["properties"]
    assert props["n"] == {"nullable": True, "type": "integer", "minimum": 0, "exclusiveMinimum": True}
    assert props["mode"] == {"enum": ["x"], "type": "string"}
    assert props["m"]["additionalProperties"] == {"type": "integer"}
    assert props["free"] == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert props["num"] == {"type": "number"}
    assert "additionalProperties" not in out


def test_crdgen_main_writes_the_file(tmp_path: Path) -> None:
    assert crdgen.main(["--out", str(tmp_path)]) == 0
    assert (tmp_path / crdgen.CRD_FILENAME).read_text() == crdgen.render_crd()


@needs_shared
@pytest.mark.skipif(not EXAMPLES, reason="no examples/rljob_*.yaml yet")
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_pass_the_generated_schema(example: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(CRD_VALIDATE), str(CRD_FILE), "--", str(example)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 failed" in result.stdout and "skip" not in result.stdout


@needs_shared
def test_schema_rejects_unknown_and_mistyped_fields(tmp_path: Path) -> None:
    bad = {
        "apiVersion": "rl.hybridflow.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "bad"},
        "spec": {"config": {}, "resources": {"cpus": 4}, "runPolicy": {"backoffLimit": "three"}},
    }
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    result = subprocess.run(
        [sys.executable, str(CRD_VALIDATE), str(CRD_FILE), "--", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "spec.resources" in result.stdout and "cpus" in result.stdout
    assert "spec.runPolicy.backoffLimit" in result.stdout
