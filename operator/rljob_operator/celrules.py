"""CEL validation rules (`x-kubernetes-validations`) that crdgen puts into the RLJob CRD.

The cheap invariants of validation.py that need no trainer config, no quantity arithmetic and no
cluster knowledge, so that an API server refuses the obvious even where the webhook is not installed
(or is down with failurePolicy Ignore). Every rule here mirrors a check in validation.py, which stays
the full source (the webhook and `rljob validate` run it); tests/unit/test_crd_cel.py checks each rule
against that check on a violating manifest. Rules are kept O(1) per object so the API server's cost
estimate stays far below its limits (no iteration over unbounded lists or maps), and use `message`
only (`messageExpression`, `fieldPath` and `reason` need newer API servers than the chart supports).

Pure data: crdgen attaches `RULES[Model]` to the schema of that model wherever it is used, and
`ROOT_RULES` to the openAPIV3Schema root (where `self.metadata.name` is readable).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from rljob_operator import api, names, scheduling
from rljob_operator.validation import _BUILTIN_ENV


@dataclass(frozen=True)
class Rule:
    """One CEL rule and the message the API server returns when it is false."""

    rule: str
    message: str

    def as_crd(self) -> dict[str, str]:
        """The x-kubernetes-validations entry."""
        return {"rule": self.rule, "message": self.message}


def _quoted(values: list[str] | tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


_SOURCES = [f.alias or n for n, f in api.EnvVarSource.model_fields.items()]
_NEEDS_QUEUE = [name for name, kind in scheduling.SCHEDULERS.items() if kind.needs_queue]
_WITH_QUEUES = [name for name, kind in scheduling.SCHEDULERS.items() if kind.queue_label is not None]
_DEFAULT_BACKOFF = api.RunPolicy.model_fields["backoff_limit"].default
_BACKOFF = (f"(has(self.spec.runPolicy) && has(self.spec.runPolicy.backoffLimit) ? "
            f"self.spec.runPolicy.backoffLimit : {_DEFAULT_BACKOFF})")

RULES: dict[type[BaseModel], list[Rule]] = {
    api.Toleration: [
        Rule("!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
             "value: must be empty with operator Exists; remove it"),
        Rule("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
             "tolerationSeconds: only applies to effect NoExecute"),
    ],
    api.EnvVar: [
        Rule("!(has(self.value) && has(self.valueFrom))", "set value or valueFrom, not both"),
        Rule(f"!(self.name in {_quoted(_BUILTIN_ENV)})",
             f"name: {', '.join(_BUILTIN_ENV)} are set by the operator; remove it"),
    ],
    api.EnvVarSource: [
        Rule(" + ".join(f"(has(self.{s}) ? 1 : 0)" for s in _SOURCES) + " == 1",
             f"set exactly one source ({', '.join(_SOURCES)})"),
    ],
    api.EnvFromSource: [
        Rule("has(self.secretRef) != has(self.configMapRef)", "set exactly one of secretRef or configMapRef"),
    ],
    api.SchedulingSpec: [
        Rule(f"!(self.scheduler in {_quoted(_NEEDS_QUEUE)}) || has(self.queue)",
             f"queue: required with scheduler {' and '.join(_NEEDS_QUEUE)} (they admit no job without one); "
             "name the queue"),
        Rule("self.scheduler != 'default' || !has(self.queue)",
             f"queue: has no effect with scheduler default; remove it, or choose a scheduler with queues "
             f"({', '.join(_WITH_QUEUES)})"),
    ],
    api.RLJobSpec: [
        Rule("!(has(self.queueName) && has(self.scheduling))",
             "queueName: is the deprecated form of spec.scheduling (scheduler kueue); with spec.scheduling set, "
             "remove spec.queueName (put the LocalQueue in spec.scheduling.queue)"),
    ],
}

ROOT_RULES: list[Rule] = [
    Rule(f"self.metadata.name.matches('{names.DNS1035_LABEL.pattern}')",
         "metadata.name: must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter): "
         "KubeRay rejects other RayJob names; rename the RLJob"),
    Rule(f"size(self.metadata.name) + size(string({_BACKOFF} + 1)) + 2 <= {names.MAX_RAYJOB_NAME_LENGTH}",
         f"metadata.name: too long: the RayJob of the last attempt is named <name>-a<backoffLimit + 1>, over "
         f"KubeRay's {names.MAX_RAYJOB_NAME_LENGTH}-character limit; use a shorter name (or a lower "
         "spec.runPolicy.backoffLimit)"),
]
