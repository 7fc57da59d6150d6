"""Semantic validation of RLJob objects: every problem at once, each saying what to change.

`validate_rljob(obj)` returns the errors (an empty list means valid); `check_rljob(obj)` also returns
warnings (things that run but probably not as intended). The operator reports errors as a
`Validated=False` condition and schedules nothing; `rljob validate` prints both. Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from hybridflow._config.errors import describe_error, dotted, shorten
from hybridflow._config.values import location_scheme
from hybridflow.config import ConfigError, HybridFlowConfig
from hybridflow.recipes import RECIPE_NAMES, TrainerConfigTree, get_recipe
from rljob_operator import api, names, roles, scheduling, smoke
from rljob_operator.builders import METRICS_PORT, merged_config, operator_trainer_values

# Patterns below are used with fullmatch: `$` would also match before a final newline ("demo\n").
# An extended resource name: a DNS-1123 subdomain prefix, "/", then a name (k8s qualified-name rules).
_RESOURCE_NAME = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_SUFFIXES: dict[str, Decimal | int] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?")
#: Kubernetes keeps a quantity as an int64 (of milli-units at the finest): anything larger cannot be meant.
_MAX_QUANTITY = Decimal(2**63 - 1)
_MAX_EXPONENT_DIGITS = 3
_QUANTITY_EXAMPLES = "e.g. 4, 500m, 16Gi"
_BUILTIN_ENV = ("RLJOB_NAME", "RLJOB_NAMESPACE", "HYBRIDFLOW_ATTEMPT", "HYBRIDFLOW_METRICS_PORT", roles.ROLE_RESOURCES_ENV)
#: Larger than any GPU node sold today: a pod asking for more GPUs than this can never be scheduled.
_MAX_GPUS_PER_NODE = 16


@dataclass
class ValidationReport:
    """Errors (the job must not run) and warnings (it runs, probably not as intended)."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def parse_quantity(value: int | str) -> Decimal:
    """A Kubernetes resource quantity ("500m", "16Gi", "1e3", 4) as a number (cores or bytes).

    Bounded like Kubernetes' own (an int64): `1e1000000` is refused, not computed.
    """
    match = _QUANTITY.fullmatch(str(value))
    if not match:
        raise ValueError(f"{shorten(value)} is not a Kubernetes quantity ({_QUANTITY_EXAMPLES})")
    number, suffix = match.group(1), match.group(2) or ""
    too_large = ValueError(f"{shorten(value)} is too large for a Kubernetes quantity; write {_QUANTITY_EXAMPLES}")
    try:
        if suffix not in _SUFFIXES:  # an exponent, e.g. e3 (not Ei, the binary exa suffix)
            if len(suffix.lstrip("eE+-")) > _MAX_EXPONENT_DIGITS:
                raise too_large
            amount = Decimal(number) * (Decimal(10) ** int(suffix[1:]))
        else:
            amount = Decimal(number) * Decimal(_SUFFIXES[suffix])
    except (ArithmeticError, KeyError) as err:  # decimal's InvalidOperation and Overflow are ArithmeticErrors
        raise ValueError(f"{shorten(value)} is not a Kubernetes quantity ({_QUANTITY_EXAMPLES})") from err
    if abs(amount) > _MAX_QUANTITY:
        raise too_large
    return amount


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
            recipe = spec.get("recipe", "ppo")
            if recipe in RECIPE_NAMES:  # still report config problems in the same pass
                _check_config(spec["config"], report, recipe)
        return report
    _check_metadata(rljob, report)
    report.errors.extend(_operator_key_problems(rljob))
    report.errors.extend(_export_problems(rljob))
    config = _check_config(merged_config(rljob), report, rljob.spec.recipe)
    _check_resources(rljob, config, report)
    _check_pod(rljob, report)
    _check_roles(rljob, config, report)
    _check_checkpoint(rljob, config, report)
    if config is not None and rljob.spec.run_policy.smoke_run is not None:
        report.errors.extend(smoke_run_problems(rljob))
    return report


def smoke_run_problems(rljob: api.RLJob) -> list[str]:
    """Why spec.runPolicy.smokeRun cannot run (smoke.derive, by the trainer's own rules); empty when it can."""
    try:
        smoke.derive(rljob)
    except smoke.SmokeRunError as err:
        return err.problems
    return []


# pydantic tags errors inside `int | str` unions with the member; the user only needs the field path.
_UNION_TAGS = ("int", "str", "constrained-str")
_QUANTITY_ERRORS = ("string_pattern_mismatch", "int_parsing", "int_type", "string_type")


def _describe_all(errors: list[Any]) -> list[str]:
    """pydantic errors on the RLJob model as problem lines, one per field (union branches merged).

    The wording is the trainer config's (one translation, hybridflow._config.errors), with "field"
    for what Kubernetes calls fields and a "did you mean" from the RLJob's own field names.
    """
    lines: dict[str, str] = {}
    for error in errors:
        loc = tuple(error["loc"])
        union = bool(loc) and loc[-1] in _UNION_TAGS
        if union:
            loc = loc[:-1]
        path = dotted(loc)
        if union and error["type"] in _QUANTITY_ERRORS:
            lines[path] = (f"{path}: {shorten(error['input'])} is not a Kubernetes quantity; write "
                           f"{_QUANTITY_EXAMPLES} (quote fractions: \"1.5\")")
        elif path not in lines:
            lines[path] = describe_error(error, api.RLJob, loc=loc, noun="field")
    return list(lines.values())


#: What a user value of an operator-decided trainer key is replaced by, and so what to set instead.
_OPERATOR_KEY_FIXES = {
    "resume_mode": ": every attempt resumes from the latest committed checkpoint (resume_mode=auto); remove it "
    "(to start over, point spec.checkpoint.uri at a new location)",
    "default_local_dir": " from spec.checkpoint.uri, which replaces it; remove it and keep spec.checkpoint.uri",
    "max_actor_ckpt_to_keep": " from spec.checkpoint.keep, which replaces it; remove it and keep spec.checkpoint.keep",
    "max_critic_ckpt_to_keep": " from spec.checkpoint.keep, which replaces it; remove it and keep spec.checkpoint.keep",
    "max_ckpt_to_keep": " from spec.checkpoint.keep, which replaces it; remove it and keep spec.checkpoint.keep",
    "metrics_port": f" through $HYBRIDFLOW_METRICS_PORT (port {METRICS_PORT}, which the pods expose), which the "
    "trainer prefers; remove it",
    "export": " from spec.export, which replaces it; remove it and keep spec.export",
}


def _export_problems(rljob: api.RLJob) -> list[str]:
    """spec.export asks the RL trainer (recipe ppo) to export its final actor checkpoint."""
    if rljob.spec.export is None or not rljob.spec.export.enabled or rljob.spec.recipe == "ppo":
        return []
    return [
        f"spec.export: exporting at the end of the run is built for the RL trainer (spec.recipe ppo), not for "
        f"spec.recipe {rljob.spec.recipe}; remove spec.export and export a checkpoint with `python -m "
        "hybridflow.model_merger merge --backend fsdp --local_dir <step folder> --target_dir <dir>`"
    ]


def _operator_key_problems(rljob: api.RLJob) -> list[str]:
    """Refuse spec.config.trainer values the operator would silently overwrite, naming what to set instead."""
    trainer = rljob.spec.config.get("trainer")
    if not isinstance(trainer, dict):
        return []  # absent, or not a mapping (the trainer config check reports that)
    decided = [*operator_trainer_values(rljob), "metrics_port"]
    return [
        f"spec.config.trainer.{key}: set by the operator{_OPERATOR_KEY_FIXES[key]}"
        for key in decided
        if key in trainer
    ]


def _check_config(config: dict[str, Any], report: ValidationReport, recipe: str) -> TrainerConfigTree | None:
    """The recipe's trainer's own rules (hybridflow.config for ppo, run checks included), with paths under spec.config."""
    try:
        parsed = get_recipe(recipe).parse(config)
        parsed.validate_for_run()
    except ConfigError as err:
        report.errors.extend(_yaml11_hint(f"spec.config.{p}") for p in err.problems)
        offline_groups = sorted({"model", "optim", "dpo"} & set(config))
        if recipe == "ppo" and offline_groups:
            report.errors.append(
                f"spec.recipe: is ppo (the default, the RL trainer) but spec.config has {', '.join(offline_groups)}, "
                "groups of the offline trainers; set spec.recipe: sft (or dpo for preference pairs)"
            )
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
    if not names.DNS1035_LABEL.fullmatch(name):
        report.errors.append(
            f"metadata.name: {shorten(name)} must be a DNS-1035 label (lower-case letters, digits and '-', starting "
            "with a letter): KubeRay rejects other RayJob names; rename the RLJob"
        )
    smoke_run = rljob.spec.run_policy.smoke_run is not None
    limit = names.max_rljob_name_length(max_attempt, smoke_run=smoke_run)
    if len(name) > limit:
        longest = max(names.ray_job_name(name, max_attempt), names.smoke_run_name(name) if smoke_run else "", key=len)
        report.errors.append(
            f"metadata.name: {shorten(name)} is {len(name)} characters; with backoffLimit "
            f"{rljob.spec.run_policy.backoff_limit}{' and a smoke run' if smoke_run else ''} its RayJobs are named "
            f"up to {shorten(longest)}, over KubeRay's {names.MAX_RAYJOB_NAME_LENGTH}-character "
            f"limit; use a name of at most {limit} characters"
        )


def _quantity(path: str, value: int | str, report: ValidationReport) -> Decimal | None:
    try:
        amount = parse_quantity(value)
    except ValueError as err:
        report.errors.append(f"{path}: {err}")
        return None
    if amount <= 0:
        report.errors.append(f"{path}: must be positive (got {shorten(value)}); write {_QUANTITY_EXAMPLES}")
        return None
    return amount


def _check_resources(rljob: api.RLJob, config: TrainerConfigTree | None, report: ValidationReport) -> None:
    res = rljob.spec.resources
    if not _RESOURCE_NAME.fullmatch(res.gpu_resource_name):
        report.errors.append(
            f"spec.resources.gpuResourceName: {shorten(res.gpu_resource_name)} is not an extended resource name; "
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
    if queue is not None and not _is_label_value(queue):
        report.errors.append(
            f"spec.queueName: {shorten(queue)} must be a LocalQueue name (a valid label value: up to 63 letters, "
            "digits, '-', '_' or '.'); use the name of a LocalQueue in this namespace"
        )
    report.errors.extend(scheduling_problems(rljob.spec))


def _is_label_value(value: str) -> bool:
    return bool(value) and bool(_LABEL_VALUE.fullmatch(value)) and len(value) <= 63


def scheduling_problems(spec: api.RLJobSpec) -> list[str]:
    """What is wrong with spec.scheduling (a queue the scheduler needs, settings KubeRay would override)."""
    chosen = spec.scheduling
    if chosen is None:
        return []
    if spec.queue_name is not None:
        return ["spec.queueName: is the deprecated form of spec.scheduling (scheduler kueue); with "
                "spec.scheduling set, remove spec.queueName (put the LocalQueue in spec.scheduling.queue)"]
    kind, name, problems = scheduling.SCHEDULERS[chosen.scheduler], chosen.scheduler, []
    if chosen.queue is None and kind.needs_queue:
        problems.append(f"spec.scheduling.queue: required with scheduler {name} (it admits no job without one); "
                        f"name {kind.queue_kind}")
    elif chosen.queue is not None and kind.queue_label is None:
        others = ", ".join(s for s in api.SCHEDULERS if s != "default")
        problems.append(f"spec.scheduling.queue: has no effect with scheduler default; remove it, or choose a "
                        f"scheduler with queues ({others})")
    elif chosen.queue is not None and not _is_label_value(chosen.queue):
        problems.append(f"spec.scheduling.queue: {shorten(chosen.queue)} must be {kind.queue_kind} whose name is a "
                        "valid label value (up to 63 letters, digits, '-', '_' or '.', starting and ending with a "
                        "letter or digit): the operator passes it as a label")
    own = spec.pod.scheduler_name
    if kind.kuberay_batch and own is not None and own != name:
        problems.append(f"spec.pod.schedulerName: KubeRay's {name} integration sets the pods' schedulerName to "
                        f"{name}, so {shorten(own)} would be overridden; remove spec.pod.schedulerName")
    priority = spec.pod.priority_class_name
    if name == "volcano" and priority is not None and not _is_label_value(priority):
        problems.append(f"spec.pod.priorityClassName: {shorten(priority)} is passed to Volcano's PodGroup as the "
                        f"label {scheduling.LABEL_RAY_PRIORITY_CLASS}, and is longer than a label value may be "
                        "(63 characters); use a PriorityClass with a shorter name")
    return problems


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
    problems.extend(toleration_problems(pod.tolerations, f"{where}.tolerations"))
    for key, value in pod.labels.items():
        if key in names.attempt_labels("any", 1) or key in (names.LABEL_SMOKE_RUN, roles.LABEL_ROLE):
            problems.append(f"{where}.labels.{key}: set by the operator (it selects pods by it); remove it")
        elif key in scheduling.SCHEDULING_LABELS:
            problems.append(f"{where}.labels.{key}: set by the operator and KubeRay from spec.scheduling; remove "
                            "it and choose the scheduler and queue in spec.scheduling")
        elif not _LABEL_VALUE.fullmatch(value) or len(value) > 63:
            problems.append(
                f"{where}.labels.{dotted((key,))}: {shorten(value)} is not a valid label value (up to 63 letters, "
                "digits, '-', '_' or '.', starting and ending with a letter or digit); fix the value"
            )
    return problems


def toleration_problems(tolerations: list[api.Toleration], where: str) -> list[str]:
    """What is wrong with a list of tolerations at `where` (e.g. spec.pod.tolerations)."""
    problems: list[str] = []
    for i, tol in enumerate(tolerations):
        if tol.operator == "Exists" and tol.value:
            problems.append(f"{where}[{i}].value: must be empty with operator Exists; remove it")
        if tol.toleration_seconds is not None and tol.effect != "NoExecute":
            problems.append(f"{where}[{i}].tolerationSeconds: only applies to effect NoExecute")
    return problems


def _check_roles(rljob: api.RLJob, config: TrainerConfigTree | None, report: ValidationReport) -> None:
    """spec.roles: each role's own pod settings, and that spec.config gives the role its pool (roles.py)."""
    _check_sandbox_replicas_without_role(rljob, config, report)
    if rljob.spec.roles is None:
        return
    for name, own in (("rollout", rljob.spec.roles.rollout), ("sandbox", rljob.spec.roles.sandbox)):
        if own is not None:
            _check_role_pods(f"spec.roles.{name}", name, own, rljob.spec.resources, report)
    report.errors.extend(roles.config_problems(rljob, config))
    if rljob.spec.roles.sandbox is not None and config is not None and roles.sandbox_replicas(config):
        _check_sandbox_cpus(rljob.spec.roles.sandbox, rljob.spec.resources, config, report)


def _check_sandbox_cpus(own: api.SandboxRoleSpec, defaults: api.ResourcesSpec, config: TrainerConfigTree,
                        report: ValidationReport) -> None:
    """Each sandbox pod should have a CPU for every program its server runs at once."""
    cpu = own.resources.cpu if own.resources.cpu is not None else defaults.cpu
    if not isinstance(config, HybridFlowConfig):
        return  # sandbox_replicas > 0 only for the RL trainer's config
    at_once = config.trainer.sandbox.max_concurrency
    try:
        short = parse_quantity(cpu) < at_once
    except ValueError:
        return  # reported by the quantity checks
    if short:
        where = "spec.roles.sandbox.resources.cpu" if own.resources.cpu is not None else "spec.resources.cpu"
        report.warnings.append(
            f"{where}: {cpu} CPUs per sandbox pod for spec.config.trainer.sandbox.max_concurrency {at_once} programs "
            "at once: they share the CPUs and may hit their wall-clock timeouts; raise the sandbox pods' cpu or lower "
            "max_concurrency"
        )


def _check_role_pods(where: str, name: str, own: api.RolloutRoleSpec | api.SandboxRoleSpec,
                     defaults: api.ResourcesSpec, report: ValidationReport) -> None:
    """A role's resources, tolerations and nodeSelector are well formed."""
    res = own.resources
    if res.gpu_resource_name is not None and not _RESOURCE_NAME.fullmatch(res.gpu_resource_name):
        report.errors.append(
            f"{where}.resources.gpuResourceName: {shorten(res.gpu_resource_name)} is not an extended resource name; "
            "use a domain-prefixed name such as nvidia.com/gpu or amd.com/gpu"
        )
    amounts = {}
    for key, value in (("cpu", res.cpu), ("memory", res.memory), ("sharedMemory", res.shared_memory)):
        if value is not None:
            amounts[key] = _quantity(f"{where}.resources.{key}", value, report)
    memory, shm = res.memory if res.memory is not None else defaults.memory, (
        res.shared_memory if res.shared_memory is not None else defaults.shared_memory)
    if (res.memory is not None or res.shared_memory is not None) and None not in amounts.values():
        try:
            too_big = parse_quantity(shm) >= parse_quantity(memory)
        except ValueError:
            too_big = False  # the spec.resources check reports the unparsable default
        if too_big:
            report.errors.append(
                f"{where}.resources.sharedMemory: {shm} is not below the {name} pods' memory {memory}; /dev/shm is "
                "memory-backed and counts against the pod's memory limit: lower it or raise memory"
            )
    report.errors.extend(toleration_problems(own.tolerations, f"{where}.tolerations"))
    for key, value in own.node_selector.items():
        if not _is_label_value(value) and value != "":
            report.errors.append(
                f"{where}.nodeSelector.{dotted((key,))}: {shorten(value)} is not a valid label value (up to 63 "
                "letters, digits, '-', '_' or '.'); use the value of the node label to match"
            )


def _check_sandbox_replicas_without_role(rljob: api.RLJob, config: TrainerConfigTree | None,
                                         report: ValidationReport) -> None:
    """trainer.sandbox.replicas only acts through a sandbox role: without one, say so."""
    replicas = roles.sandbox_replicas(config) if config is not None else 0
    if replicas and (rljob.spec.roles is None or rljob.spec.roles.sandbox is None):
        report.warnings.append(
            f"spec.config.trainer.sandbox.replicas: {replicas} starts no sandbox servers without spec.roles.sandbox "
            "(code then runs in the trainer's processes); add spec.roles.sandbox to give them pods, or remove the key"
        )


def _check_checkpoint(rljob: api.RLJob, config: TrainerConfigTree | None, report: ValidationReport) -> None:
    """Where checkpoints go suits a cluster (its form is checked by the models: api.Location)."""
    # Without a valid config only an explicit spec.checkpoint.uri can be checked.
    uri = (config.trainer.default_local_dir if config else rljob.spec.checkpoint.uri) or ""
    nnodes = config.trainer.nnodes if config else None
    path = "spec.checkpoint.uri" if rljob.spec.checkpoint.uri else "spec.config.trainer.default_local_dir"
    scheme = location_scheme(uri)
    if scheme in ("s3", "gs") and rljob.spec.checkpoint.secret_ref is None:
        report.warnings.append(
            f"spec.checkpoint.secretRef: unset with {shorten(uri)}; pods need credentials from elsewhere "
            "(IRSA / workload identity), or set a Secret with the storage credentials"
        )
    if scheme in ("", "file") and uri and nnodes is not None:
        # Every attempt runs on a fresh RayCluster and each node has its own disk: a local path is only
        # shared between nodes if it is a network mount, which the RLJob API cannot declare. Decision:
        # multi-node with a local path is an error; single-node is a warning (retries start over).
        if nnodes > 1:
            report.errors.append(
                f"{path}: {shorten(uri)} is a local path but the job spans {nnodes} nodes, each with "
                "its own disk; use object storage (s3://bucket/prefix or gs://bucket/prefix)"
            )
        else:
            report.warnings.append(
                f"{path}: {shorten(uri)} is local to the pod: checkpoints are lost with the cluster and a retry "
                "starts over; use s3:// or gs:// on a cluster (local paths suit `rljob run`)"
            )
