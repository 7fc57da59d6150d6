"""Semantic validation of RLJob objects: every problem at once, each saying what to change.

`validate_rljob(obj)` returns the errors (an empty list means valid); `check_rljob(obj)` also returns
warnings (things that run but probably not as intended). The operator reports errors as a
`Validated=False` condition and schedules nothing; `rljob validate` prints both. Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import ValidationError

from hybridflow.config import ConfigError, HybridFlowConfig, parse_config
from rljob_operator import api, names
from rljob_operator.builders import merged_config

# An extended resource name: a DNS-1123 subdomain prefix, "/", then a name (k8s qualified-name rules).
_RESOURCE_NAME = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SUFFIXES: dict[str, Decimal | int] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_BUILTIN_ENV = ("RLJOB_NAME", "RLJOB_NAMESPACE", "HYBRIDFLOW_ATTEMPT", "HYBRIDFLOW_METRICS_PORT")
_CHECKPOINT_SCHEMES = ("s3://", "gs://", "file://")
#: Larger than any GPU node sold today: a pod asking for more GPUs than this can never be scheduled.
_MAX_GPUS_PER_NODE = 16


@dataclass
class ValidationReport:
    """Errors (the job must not run) and warnings (it runs, probably not as intended)."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def parse_quantity(value: int | str) -> Decimal:
    """A Kubernetes resource quantity ("500m", "16Gi", "1e3", 4) as a number (cores or bytes)."""
    match = _QUANTITY.match(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 4, 500m, 16Gi)")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number) * (Decimal(10) ** int(suffix[1:]))
        return Decimal(number) * Decimal(_SUFFIXES[suffix])
    except (InvalidOperation, KeyError) as err:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 4, 500m, 16Gi)") from err


def validate_rljob(obj: Any) -> list[str]:
    """Every error that makes `obj` an invalid RLJob (empty when it is valid)."""
    return check_rljob(obj).errors


def check_rljob(obj: Any) -> ValidationReport:
    """Errors and warnings for one RLJob object (a dict as read from YAML or the API server)."""
    report = ValidationReport()
    if not isinstance(obj, dict):
        report.errors.append(f"<document>: expected a mapping (an RLJob object), got {type(obj).__name__}")
        return report
    # Status is observation written by controllers (kopf may keep its own keys there): not user input.
    obj = {k: v for k, v in obj.items() if k != "status"}
    try:
        rljob = api.RLJob.model_validate(obj)
    except ValidationError as err:
        report.errors.extend(_describe_all(err.errors()))
        spec = obj.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("config"), dict):
            _check_config(spec["config"], report)  # still report config problems in the same pass
        return report
    _check_metadata(rljob, report)
    config = _check_config(merged_config(rljob), report)
    _check_resources(rljob, config, report)
    _check_pod(rljob, report)
    _check_checkpoint(rljob, config, report)
    return report


# pydantic tags errors inside `int | str` unions with the member; the user only needs the field path.
_UNION_TAGS = ("int", "str", "constrained-str")


def _describe_all(errors: list[Any]) -> list[str]:
    """pydantic errors on the RLJob model as problem lines, one per field (union branches merged)."""
    lines: dict[str, str] = {}
    for error in errors:
        loc = list(error["loc"])
        union = bool(loc) and loc[-1] in _UNION_TAGS
        path = ".".join(str(p) for p in (loc[:-1] if union else loc)) or "<root>"
        if union and error["type"] in ("string_pattern_mismatch", "int_parsing", "int_type", "string_type"):
            lines[path] = f"{path}: {error['input']!r} is not a Kubernetes quantity; write e.g. 4, 500m, 16Gi (quote fractions: \"1.5\")"
        elif path not in lines:
            lines[path] = _describe(path, error)
    return list(lines.values())


def _describe(path: str, error: Any) -> str:
    """One pydantic error on the RLJob model as `path: what is wrong; what to do`."""
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{path}: unknown field; remove it or check its spelling (see `kubectl explain rljob.spec`)"
    if kind == "missing":
        return f"{path}: required; set it"
    if kind == "literal_error":
        return f"{path}: {error['input']!r} is not allowed; use {error['ctx']['expected']}"
    return f"{path}: {error['msg']} (got {error['input']!r})"


def _check_config(config: dict[str, Any], report: ValidationReport) -> HybridFlowConfig | None:
    """The trainer's own rules (hybridflow.config, run checks included), with paths under spec.config."""
    try:
        parsed = parse_config(config)
        parsed.validate_for_run()
    except ConfigError as err:
        report.errors.extend(_yaml11_hint(f"spec.config.{p}") for p in err.problems)
        return None
    return parsed


_BOOLEAN_KEY = re.compile(r"\.(true|false): unknown key")


def _yaml11_hint(problem: str) -> str:
    """Explain keys named true/false: kubectl reads YAML 1.1, where an unquoted `n:` or `y:` is a boolean."""
    if not _BOOLEAN_KEY.search(problem):
        return problem
    return (f"{problem}. kubectl and other YAML 1.1 readers turn an unquoted key n, y, no, yes, on or off "
            f"into a boolean (verl's rollout.n is the usual victim): quote it in the manifest, e.g. \"n\": 4")


def _check_metadata(rljob: api.RLJob, report: ValidationReport) -> None:
    name = rljob.metadata.name
    max_attempt = rljob.spec.run_policy.backoff_limit + 1
    if not names.DNS1035_LABEL.match(name):
        report.errors.append(
            f"metadata.name: {name!r} must be a DNS-1035 label (lower-case letters, digits and '-', starting "
            "with a letter): KubeRay rejects other RayJob names; rename the RLJob"
        )
    limit = names.max_rljob_name_length(max_attempt)
    if len(name) > limit:
        report.errors.append(
            f"metadata.name: {name!r} is {len(name)} characters; with backoffLimit "
            f"{rljob.spec.run_policy.backoff_limit} its RayJobs are named up to "
            f"{names.ray_job_name(name, max_attempt)!r}, over KubeRay's {names.MAX_RAYJOB_NAME_LENGTH}-character "
            f"limit; use a name of at most {limit} characters"
        )


def _quantity(path: str, value: int | str, report: ValidationReport) -> Decimal | None:
    try:
        amount = parse_quantity(value)
    except ValueError as err:
        report.errors.append(f"{path}: {err}")
        return None
    if amount <= 0:
        report.errors.append(f"{path}: must be positive, got {value!r}")
        return None
    return amount


def _check_resources(rljob: api.RLJob, config: HybridFlowConfig | None, report: ValidationReport) -> None:
    res = rljob.spec.resources
    if not _RESOURCE_NAME.match(res.gpu_resource_name):
        report.errors.append(
            f"spec.resources.gpuResourceName: {res.gpu_resource_name!r} is not an extended resource name; "
            "use a domain-prefixed name such as nvidia.com/gpu or amd.com/gpu"
        )
    cpu = _quantity("spec.resources.cpu", res.cpu, report)
    memory = _quantity("spec.resources.memory", res.memory, report)
    shm = _quantity("spec.resources.sharedMemory", res.shared_memory, report)
    _quantity("spec.resources.head.cpu", res.head.cpu, report)
    _quantity("spec.resources.head.memory", res.head.memory, report)
    if memory is not None and shm is not None and shm >= memory:
        report.errors.append(
            f"spec.resources.sharedMemory: {res.shared_memory} is not below the worker memory {res.memory}; "
            "/dev/shm is memory-backed and counts against the pod's memory limit: lower it or raise memory"
        )
    if config is None:
        return  # the cluster-fit checks below need a valid trainer config
    device, gpus = config.trainer.device, config.trainer.n_gpus_per_node
    if device != "cpu" and gpus <= 0:
        report.errors.append(
            f"spec.config.trainer.n_gpus_per_node: is {gpus} with trainer.device={device}; set the number of "
            "GPUs per node (or trainer.device: cpu)"
        )
    if device != "cpu" and gpus > _MAX_GPUS_PER_NODE:
        report.errors.append(
            f"spec.config.trainer.n_gpus_per_node: {gpus} GPUs do not fit on one node (at most "
            f"{_MAX_GPUS_PER_NODE}); use more nodes (trainer.nnodes) with fewer GPUs each"
        )
    if device == "npu" and res.gpu_resource_name == "nvidia.com/gpu":
        report.warnings.append(
            "spec.resources.gpuResourceName: trainer.device is npu but pods request nvidia.com/gpu; set your "
            "NPU device plugin's resource name (e.g. huawei.com/Ascend910)"
        )
    if device == "cpu" and cpu is not None and cpu < gpus:
        report.warnings.append(
            f"spec.resources.cpu: {res.cpu} CPUs per worker for {gpus} trainer processes per node "
            "(trainer.n_gpus_per_node on CPU); give each process at least one CPU"
        )


def _check_pod(rljob: api.RLJob, report: ValidationReport) -> None:
    report.errors.extend(pod_problems(rljob.spec.pod))
    queue = rljob.spec.queue_name
    if queue is not None and (not queue or not _LABEL_VALUE.match(queue) or len(queue) > 63):
        report.errors.append(f"spec.queueName: {queue!r} must be a LocalQueue name (a valid label value)")


def pod_problems(pod: api.PodSpec, where: str = "spec.pod") -> list[str]:
    """What is wrong with pod settings (an RLJob's spec.pod, or the operator's pod defaults at `where`)."""
    problems: list[str] = []
    seen: set[str] = set()
    for i, env in enumerate(pod.env):
        path = f"{where}.env[{i}]"
        if env.name in _BUILTIN_ENV:
            problems.append(f"{path}.name: {env.name} is set by the operator; remove it")
        if env.name in seen:
            problems.append(f"{path}.name: {env.name} is defined twice; keep one")
        seen.add(env.name)
        if env.value is not None and env.value_from is not None:
            problems.append(f"{path}: set value or valueFrom, not both")
        if env.value_from is not None and len(env.value_from.model_dump(exclude_none=True)) != 1:
            problems.append(f"{path}.valueFrom: set exactly one source (secretKeyRef, configMapKeyRef, ...)")
    for i, source in enumerate(pod.env_from):
        if (source.secret_ref is None) == (source.config_map_ref is None):
            problems.append(f"{where}.envFrom[{i}]: set exactly one of secretRef or configMapRef")
    for i, tol in enumerate(pod.tolerations):
        if tol.operator == "Exists" and tol.value:
            problems.append(f"{where}.tolerations[{i}].value: must be empty with operator Exists; remove it")
        if tol.toleration_seconds is not None and tol.effect != "NoExecute":
            problems.append(f"{where}.tolerations[{i}].tolerationSeconds: only applies to effect NoExecute")
    for key, value in pod.labels.items():
        if key in names.attempt_labels("any", 1) or key == names.LABEL_KUEUE_QUEUE:
            problems.append(f"{where}.labels.{key}: set by the operator (it selects pods by it); remove it")
        elif not _LABEL_VALUE.match(value) or len(value) > 63:
            problems.append(f"{where}.labels.{key}: {value!r} is not a valid label value (<= 63 chars)")
    return problems


def _check_checkpoint(rljob: api.RLJob, config: HybridFlowConfig | None, report: ValidationReport) -> None:
    # Without a valid config only an explicit spec.checkpoint.uri can be checked.
    uri = (config.trainer.default_local_dir if config else rljob.spec.checkpoint.uri) or ""
    nnodes = config.trainer.nnodes if config else None
    path = "spec.checkpoint.uri" if rljob.spec.checkpoint.uri else "spec.config.trainer.default_local_dir"
    scheme = uri.split("://", 1)[0] + "://" if "://" in uri else ""
    if scheme and scheme not in _CHECKPOINT_SCHEMES:
        report.errors.append(
            f"{path}: {uri!r} uses an unsupported scheme; use s3://bucket/prefix, gs://bucket/prefix, "
            "file:///path or a plain path"
        )
        return
    if scheme in ("s3://", "gs://") and not uri[len(scheme) :].split("/", 1)[0]:
        report.errors.append(f"{path}: {uri!r} names no bucket; use {scheme}bucket/prefix")
    if scheme in ("s3://", "gs://") and rljob.spec.checkpoint.secret_ref is None:
        report.warnings.append(
            f"spec.checkpoint.secretRef: unset with {uri!r}; pods need credentials from elsewhere "
            "(IRSA / workload identity), or set a Secret with the storage credentials"
        )
    if scheme in ("", "file://") and uri and nnodes is not None:
        # Every attempt runs on a fresh RayCluster and each node has its own disk: a local path is only
        # shared between nodes if it is a network mount, which the RLJob API cannot declare. Decision:
        # multi-node with a local path is an error; single-node is a warning (retries start over).
        if nnodes > 1:
            report.errors.append(
                f"{path}: {uri!r} is a local path but the job spans {nnodes} nodes, each with "
                "its own disk; use object storage (s3://bucket/prefix or gs://bucket/prefix)"
            )
        else:
            report.warnings.append(
                f"{path}: {uri!r} is local to the pod: checkpoints are lost with the cluster and a retry starts "
                "over; use s3:// or gs:// on a cluster (local paths suit `rljob run`)"
            )
