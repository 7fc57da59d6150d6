"""CRD openAPIV3Schema handling like the API server: defaulting, pruning and validation.

The API server applies a CRD's structural schema in this order: prune unknown fields (or reject them
with `fieldValidation=Strict`), apply `default`s, then validate. Top-level `apiVersion`, `kind` and
`metadata` are handled by the server itself, not by the schema.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema

_KEEP = {
    "type", "properties", "items", "required", "enum", "minimum", "maximum", "minLength", "maxLength",
    "pattern", "minItems", "maxItems", "uniqueItems", "multipleOf", "minProperties", "maxProperties",
    "additionalProperties", "anyOf", "oneOf", "allOf", "not",
}
_ROOT_FIELDS = ("apiVersion", "kind", "metadata")


def to_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Translate an OpenAPI v3 (Kubernetes structural) schema into a JSON Schema (draft 7)."""
    if schema.get("x-kubernetes-int-or-string"):
        return {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key not in _KEEP:
            continue
        if key == "properties":
            out[key] = {name: to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "not") or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = to_json_schema(value)
        elif key in ("anyOf", "oneOf", "allOf"):
            out[key] = [to_json_schema(sub) for sub in value]
        else:
            out[key] = value
    # OpenAPI 3.0 spells exclusive bounds as booleans next to minimum/maximum.
    if schema.get("exclusiveMinimum") is True and "minimum" in schema:
        out["exclusiveMinimum"] = out.pop("minimum")
    if schema.get("exclusiveMaximum") is True and "maximum" in schema:
        out["exclusiveMaximum"] = out.pop("maximum")
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


def _allows_unknown(schema: dict[str, Any]) -> bool:
    return bool(schema.get("x-kubernetes-preserve-unknown-fields")) or "additionalProperties" in schema


def prune_and_default(value: Any, schema: dict[str, Any], path: str, unknown: list[str]) -> Any:
    """Return `value` with unknown fields removed (their paths appended to `unknown`) and defaults set."""
    if schema.get("x-kubernetes-embedded-resource") and isinstance(value, dict):
        schema = {**schema, "properties": {**{f: {"x-kubernetes-preserve-unknown-fields": True}
                                              for f in _ROOT_FIELDS}, **schema.get("properties", {})}}
    if isinstance(value, dict):
        props: dict[str, Any] = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        result: dict[str, Any] = {}
        for key, sub in value.items():
            if key in props:
                result[key] = prune_and_default(sub, props[key], f"{path}.{key}", unknown)
            elif isinstance(extra, dict):
                result[key] = prune_and_default(sub, extra, f"{path}.{key}", unknown)
            elif _allows_unknown(schema) or not props and schema.get("type") != "object":
                result[key] = sub
            else:
                unknown.append(f"{path}.{key}")
        for key, sub in props.items():
            if key not in result and "default" in sub:
                result[key] = copy.deepcopy(sub["default"])
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune_and_default(v, schema["items"], f"{path}[{i}]", unknown) for i, v in enumerate(value)]
    return value


class SchemaChecker:
    """Prune, default and validate custom objects against one CRD version's openAPIV3Schema."""

    def __init__(self, openapi_schema: dict[str, Any]) -> None:
        """Prepare the validator for `openapi_schema` (the CRD's `schema.openAPIV3Schema`)."""
        self.openapi = openapi_schema
        body = {k: v for k, v in openapi_schema.get("properties", {}).items() if k not in _ROOT_FIELDS}
        json_schema = to_json_schema({**openapi_schema, "properties": body})
        if "required" in json_schema:
            json_schema["required"] = [r for r in json_schema["required"] if r not in _ROOT_FIELDS]
        self._validator = jsonschema.Draft7Validator(json_schema)

    def apply(self, obj: dict[str, Any], strict: bool = False) -> tuple[dict[str, Any], list[str]]:
        """Return the pruned, defaulted object and a list of problems (empty when it is valid)."""
        body = {k: v for k, v in obj.items() if k not in _ROOT_FIELDS}
        schema = {**self.openapi,
                  "properties": {k: v for k, v in self.openapi.get("properties", {}).items()
                                 if k not in _ROOT_FIELDS}}
        unknown: list[str] = []
        cleaned = prune_and_default(body, schema, "", unknown)
        problems = [f'{p.lstrip(".")}: Invalid value: field not declared in schema' for p in unknown] \
            if strict else []
        for error in sorted(self._validator.iter_errors(cleaned), key=lambda e: list(e.absolute_path)):
            where = ".".join(str(p) for p in error.absolute_path) or "<root>"
            problems.append(f"{where}: Invalid value: {error.message}")
        result = {k: obj[k] for k in _ROOT_FIELDS if k in obj}
        result.update(cleaned)
        return result, problems
