"""Generate the RLJob CustomResourceDefinition from the pydantic models in api.py.

`python -m rljob_operator.crdgen --out crds` writes `crds/rl.hybridflow.dev_rljobs.yaml` (`make crds`).
pydantic emits JSON Schema 2020-12; Kubernetes wants a *structural* OpenAPI v3 schema
(https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/
#specifying-a-structural-schema): every node typed, no $ref, anyOf only for value validation,
`nullable` instead of a null type, maps as additionalProperties, free-form objects marked with
x-kubernetes-preserve-unknown-fields. to_structural() does that translation and refuses (raises
CRDGenerationError) anything it cannot express faithfully rather than loosening the schema.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from rljob_operator import api, celrules

CRD_FILENAME = f"{api.GROUP}_{api.PLURAL}.yaml"
INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]
# Keys of apiextensions.k8s.io/v1 JSONSchemaProps passed through unchanged.
_PASSTHROUGH = {
    "description", "type", "format", "default", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "multipleOf", "enum",
    "maxProperties", "minProperties", "required", "nullable",
}  # fmt: skip
# JSON Schema annotations with no place (or no meaning) in a CRD.
_DROPPED = {"title", "examples", "deprecated", "readOnly", "writeOnly", "discriminator"}


class _NoAliasDumper(yaml.SafeDumper):
    """A YAML dumper that writes repeated sub-schemas out in full (no &anchors, as kubectl users expect)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


class CRDGenerationError(ValueError):
    """A model uses a construct that has no faithful structural-schema translation."""


def to_structural(schema: dict[str, Any]) -> dict[str, Any]:
    """Translate a pydantic JSON schema (with $defs) into a Kubernetes structural schema."""
    defs = schema.get("$defs", {})
    root = {k: v for k, v in schema.items() if k != "$defs"}
    return _convert(root, defs, path="")


def _resolve(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:
    """Inline a $ref (keeping sibling keys such as description/default, which win)."""
    if "$ref" not in node:
        return node
    name = node["$ref"].rsplit("/", 1)[-1]
    if name not in defs:
        raise CRDGenerationError(f"{path or '<root>'}: unresolvable $ref {node['$ref']}")
    merged = copy.deepcopy(defs[name])
    merged.update({k: v for k, v in node.items() if k != "$ref"})
    return _resolve(merged, defs, path)


def _is_null(node: dict[str, Any]) -> bool:
    return node.get("type") == "null"


def _is_int_or_string(options: list[dict[str, Any]]) -> bool:
    types = sorted(str(o.get("type")) for o in options)
    return types == ["integer", "string"] and all(set(o) <= {"type", "pattern"} for o in options)


def _convert(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:
    node = _resolve(node, defs, path)
    if "allOf" in node and len(node["allOf"]) == 1:  # pydantic wraps a described $ref this way
        inner = node["allOf"][0]
        node = {**_resolve(inner, defs, path), **{k: v for k, v in node.items() if k != "allOf"}}
    out: dict[str, Any] = {}
    if "anyOf" in node:
        options = [_resolve(o, defs, path) for o in node["anyOf"]]
        nullable = any(_is_null(o) for o in options)
        options = [o for o in options if not _is_null(o)]
        if nullable:
            out["nullable"] = True
        if _is_int_or_string(options):
            out["x-kubernetes-int-or-string"] = True
            out["anyOf"] = copy.deepcopy(INT_OR_STRING)
            patterns = [o["pattern"] for o in options if "pattern" in o]
            if patterns:
                out["pattern"] = patterns[0]
        elif len(options) == 1:
            out.update(_convert(options[0], defs, path))
        elif sorted(str(o.get("type")) for o in options) == ["integer", "number"]:
            out["type"] = "number"
        else:
            raise CRDGenerationError(f"{path or '<root>'}: union {options} has no structural equivalent")
    for key, value in node.items():
        if key in ("anyOf", "$ref", "allOf") or key in _DROPPED:
            continue
        if key == "default" and value is None:
            continue  # null defaults are implicit (and would need nullable everywhere)
        if key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out["properties"] = {k: _convert(v, defs, f"{path}.{k}") for k, v in value.items()}
        elif key == "items":
            out["items"] = _convert(value, defs, f"{path}[]")
        elif key == "additionalProperties":
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                out["additionalProperties"] = _convert(value, defs, f"{path}.*")
            # False: structural schemas prune unknown fields already (and forbid it beside properties).
        elif key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"], out["exclusiveMinimum"] = value, True  # OpenAPI 3.0 spelling
        elif key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key in _PASSTHROUGH or key.startswith("x-kubernetes-"):
            out[key] = copy.deepcopy(value)
        else:
            raise CRDGenerationError(f"{path or '<root>'}: JSON Schema keyword {key!r} is not supported in a CRD")
    if "enum" in out and "type" not in out:
        out["type"] = _enum_type(out["enum"], path)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True  # a free-form object, e.g. dict[str, Any]
    if "type" not in out and not (out.get("x-kubernetes-int-or-string") or out.get(
        "x-kubernetes-preserve-unknown-fields"
    )):
        raise CRDGenerationError(f"{path or '<root>'}: no type (structural schemas need one on every node)")
    return out


def _enum_type(values: list[Any], path: str) -> str:
    kinds = {type(v) for v in values}
    if kinds <= {str}:
        return "string"
    if kinds <= {int}:
        return "integer"
    if kinds <= {int, float}:
        return "number"
    if kinds <= {bool}:
        return "boolean"
    raise CRDGenerationError(f"{path}: enum {values} mixes types")


def with_cel_rules(schema: dict[str, Any], root_model: type[Any]) -> dict[str, Any]:
    """A pydantic JSON schema with celrules.RULES attached to the models they belong to."""
    schema = copy.deepcopy(schema)
    defs = schema.setdefault("$defs", {})
    for model, rules in celrules.RULES.items():
        node = schema if model is root_model else defs.get(model.__name__)
        if node is None:
            if any(model.__name__ in str(d) for d in defs):
                raise CRDGenerationError(f"celrules: model {model.__name__} is named differently in the schema")
            continue  # not part of this schema (e.g. a spec model, when generating status)
        node["x-kubernetes-validations"] = [r.as_crd() for r in rules]
    return schema


def openapi_schema() -> dict[str, Any]:
    """The openAPIV3Schema of RLJob: apiVersion/kind/metadata plus spec and status from the models."""
    spec = to_structural(with_cel_rules(api.RLJobSpec.model_json_schema(mode="validation"), api.RLJobSpec))
    status = to_structural(api.RLJobStatus.model_json_schema(mode="serialization"))
    return {
        "type": "object",
        "description": "RLJob runs an RL post-training job (HybridFlow trainer) on a KubeRay RayJob per attempt.",
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "required": ["spec"],
        "x-kubernetes-validations": [r.as_crd() for r in celrules.ROOT_RULES],
    }


def printer_columns() -> list[dict[str, Any]]:
    """Columns of `kubectl get rljobs`."""
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Summary of the state."},
        {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step", "description": "Training step."},
        {"name": "Total", "type": "integer", "jsonPath": ".status.progress.totalSteps",
         "description": "Total training steps."},
        {"name": "Reward", "type": "number", "jsonPath": ".status.metrics.rewardMean",
         "description": "Mean reward of the latest step."},
        {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt", "description": "Attempt number."},
        {"name": "Version", "type": "integer", "jsonPath": ".status.metrics.policyVersion", "priority": 1,
         "description": "Asynchronous training: the policy version being trained."},
        {"name": "Staleness", "type": "number", "jsonPath": ".status.metrics.stalenessMax", "priority": 1,
         "description": "Asynchronous training: versions the oldest sample of the latest step was behind."},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]  # fmt: skip


def build_crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object for RLJob."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": list(api.SHORT_NAMES),
                "categories": ["all"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer_columns(),
                }
            ],
        },
    }


def render_crd() -> str:
    """The CRD as YAML text, exactly as committed under crds/."""
    header = "# Generated by `make crds` (python -m rljob_operator.crdgen) from operator/rljob_operator/api.py.\n"
    header += "# Do not edit: change the models and regenerate.\n"
    return header + yaml.dump(build_crd(), Dumper=_NoAliasDumper, sort_keys=True, width=110)


def main(argv: list[str] | None = None) -> int:
    """Write the CRD file into --out (a folder)."""
    parser = argparse.ArgumentParser(prog="python -m rljob_operator.crdgen", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("crds"), help=f"folder to write {CRD_FILENAME} into")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / CRD_FILENAME
    target.write_text(render_crd())
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
