"""CRD openAPIV3Schema handling like the API server: defaulting, pruning and validation.

The API server applies a CRD's structural schema in this order: prune unknown fields (or reject them
with `fieldValidation=Strict`), apply `default`s, then validate. Top-level `apiVersion`, `kind` and
`metadata` are handled by the server itself, not by the schema.

CEL rules (`x-kubernetes-validations`) are evaluated with cel-python (the dev extra) at every node
where the object has a value, `self` bound to it (at the root, `self.metadata` holds name and
generateName only, as in the API server), once the object passed the OpenAPI checks. Not evaluated
(listed in `SchemaChecker.skipped`): transition rules (those naming `oldSelf`: the emulator has no
old object at this point), rules cel-python cannot compile (Kubernetes' extension libraries such as
quantity(), url(), ip(), the lists/sets/strings extensions beyond standard CEL), and
`messageExpression` (its `message`, or "failed rule: <rule>", is reported instead). Cost limits are
not estimated.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema

try:  # cel-python: the dev extra; without it no CEL rule is evaluated (each is listed as skipped)
    import celpy
except ImportError:  # pragma: no cover - the dev extra installs it
    celpy = None

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


#: No stored value at this path (a create, or a field the stored object lacks).
_ABSENT = object()
_OLD_SELF = re.compile(r"\boldSelf\b")
#: One CEL environment and one compiled program per rule text, for the whole process: building the
#: environment (its parser) takes ~2 s, so it is built once, on the first rule evaluated.
_ENV: Any = None
_PROGRAMS: dict[str, Any] = {}


def _program(rule: str) -> Any:
    """The compiled rule (cached); raises what cel-python raises for a rule it cannot compile."""
    global _ENV
    if rule not in _PROGRAMS:
        if _ENV is None:
            _ENV = celpy.Environment()
        try:
            _PROGRAMS[rule] = _ENV.program(_ENV.compile(rule))
        except Exception as err:  # noqa: BLE001 - celpy raises its own error types
            _PROGRAMS[rule] = err
    found = _PROGRAMS[rule]
    if isinstance(found, Exception):
        raise found
    return found


def cel_activation(expression: str, variables: dict[str, Any]) -> dict[str, Any]:
    """The CEL variables an expression reads, converted for cel-python, with only the parts it reads.

    A variable the expression never names is left out. For one it names, the field paths it reads
    (`self.spec.runPolicy.backoffLimit`, `has(self.queueName)`, `self.tolerations.all(...)`) are kept whole and
    the rest of the object is dropped; a bare use (`size(self)`, `self[...]` on the variable itself) keeps it
    all. Converting a whole RLJob (its trainer config has hundreds of values) for a rule that reads one field
    was most of the emulator's CPU per create; what a rule sees of the paths it reads is unchanged.
    """
    activation = {}
    for name, value in variables.items():
        paths: list[list[str]] = []
        for match in re.finditer(rf"\b{name}((?:\.[A-Za-z_][A-Za-z0-9_]*)*)(\s*\()?", expression):
            segments = match.group(1).split(".")[1:]
            if match.group(2):  # the last segment is a method or macro (`.matches(`, `.all(`): not a field
                segments = segments[:-1]
            paths.append(segments)
        if paths:
            activation[name] = celpy.json_to_cel(_keep_paths(value, paths))
    return activation


def _keep_paths(value: Any, paths: list[list[str]]) -> Any:
    """`value` with only the given field paths (an empty path keeps everything below it)."""
    if not isinstance(value, dict) or any(not p for p in paths):
        return value
    kept: dict[str, Any] = {}
    for key in dict.fromkeys(p[0] for p in paths):
        if key in value:
            kept[key] = _keep_paths(value[key], [p[1:] for p in paths if p[0] == key])
    return kept


class CelRules:
    """The compiled x-kubernetes-validations of one schema, evaluated like the API server does."""

    def __init__(self, openapi_schema: dict[str, Any]) -> None:
        """Find every rule; they are compiled when first needed (see `skipped`)."""
        self._rules: list[tuple[str, str]] = []
        self._compiled: dict[str, Any] | None = None
        self._skipped: list[tuple[str, str, str]] = []
        self._collect(openapi_schema, "")

    @property
    def skipped(self) -> list[tuple[str, str, str]]:
        """(path, rule, why) of every rule that is not evaluated."""
        self._compile()
        return self._skipped

    def _compile(self) -> dict[str, Any]:
        if self._compiled is None:
            self._compiled = {}
            for path, rule in self._rules:
                if celpy is None:
                    self._skipped.append((path, rule, "cel-python is not installed (pip install -e '.[dev]')"))
                elif _OLD_SELF.search(rule):
                    self._skipped.append((path, rule, "transition rule (oldSelf)"))
                else:
                    try:
                        self._compiled[rule] = _program(rule)
                    except Exception as err:  # noqa: BLE001 - celpy raises its own error types
                        self._skipped.append((path, rule, f"cel-python cannot compile it: {err}"))
        return self._compiled

    def _collect(self, schema: dict[str, Any], path: str) -> None:
        for entry in schema.get("x-kubernetes-validations") or []:
            self._rules.append((path, entry["rule"]))
        for key, sub in (schema.get("properties") or {}).items():
            self._collect(sub, f"{path}.{key}")
        if isinstance(schema.get("additionalProperties"), dict):
            self._collect(schema["additionalProperties"], f"{path}.*")
        if isinstance(schema.get("items"), dict):
            self._collect(schema["items"], f"{path}[]")

    def problems(self, value: Any, schema: dict[str, Any], path: str = "", old: Any = _ABSENT) -> list[str]:
        """Each failed rule as `<path>: Invalid value: "<type>": <message>` (the API server's wording).

        `old`: the stored object on an update. As with the API server's validation ratcheting (GA in Kubernetes
        1.33), a subtree equal to the stored one is not checked again: a status write re-checks no spec rule.
        """
        out: list[str] = []
        if not self._rules or (old is not _ABSENT and value == old):
            return out
        for entry in schema.get("x-kubernetes-validations") or []:
            program = self._compile().get(entry["rule"])
            if program is None:
                continue
            try:
                result = program.evaluate(cel_activation(entry["rule"], {"self": value}))
                ok, detail = bool(result) if isinstance(result, celpy.celtypes.BoolType) else False, ""
            except Exception as err:  # noqa: BLE001 - a runtime error fails the rule, as in the API server
                ok, detail = False, f" (evaluation error: {err})"
            if not ok:
                kind = {dict: "object", list: "array", str: "string"}.get(type(value), type(value).__name__)
                message = entry.get("message") or f"failed rule: {entry['rule']}"
                out.append(f'{path.lstrip(".") or "<nil>"}: Invalid value: "{kind}": {message}{detail}')
        if isinstance(value, dict):
            props = schema.get("properties") or {}
            extra = schema.get("additionalProperties")
            olds = old if isinstance(old, dict) else {}
            for key, sub in value.items():
                if key in props:
                    out += self.problems(sub, props[key], f"{path}.{key}", olds.get(key, _ABSENT))
                elif isinstance(extra, dict):
                    out += self.problems(sub, extra, f"{path}.{key}", olds.get(key, _ABSENT))
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                out += self.problems(item, schema["items"], f"{path}[{i}]")
        return out


def _cel_view(body: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """What CEL sees at the root: the object, with metadata.name and generateName only (the API server's rule)."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    return {**body, "metadata": {k: meta[k] for k in ("name", "generateName") if k in meta}}


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
        self.cel = CelRules(openapi_schema)

    def apply(self, obj: dict[str, Any], strict: bool = False,
              old: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
        """Return the pruned, defaulted object and a list of problems (empty when it is valid).

        `old`: the stored object on an update (CEL rules ratchet: unchanged subtrees are not re-checked)."""
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
        if not problems:
            # At the root CEL sees metadata.name and generateName only (the API server's rule).
            problems = self.cel.problems(_cel_view(result, obj), self.openapi,
                                         old=_ABSENT if old is None else _cel_view(old, old))
        return result, problems
