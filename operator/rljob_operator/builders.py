"""Pure builders: the child manifests of an RLJob (one ConfigMap, one KubeRay RayJob per attempt, and the
smoke run's RayJob when spec.runPolicy.smokeRun is set, see smoke.py).

No I/O, no environment, no clock: the same RLJob and attempt always give the same dicts, so the
operator can create-or-patch them at any time and `rljob render` shows exactly what would be applied.
"""

from __future__ import annotations

import copy
import json
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from hybridflow.recipes import TrainerConfigTree, get_recipe
from rljob_operator import api, names, roles, scheduling, smoke

RAY_API_VERSION = "ray.io/v1"
#: Ray version inside the trainer image (KubeRay uses it to pick compatible behaviour).
RAY_VERSION = "2.60.0"
METRICS_PORT = 8000
#: The RL trainer's module; spec.recipe picks another (hybridflow.recipes: sft, dpo).
TRAINER_MODULE = get_recipe("ppo").module
_SHM_VOLUME = "dshm"
_CONFIG_VOLUME = "hybridflow-config"


def merged_config(rljob: api.RLJob) -> dict[str, Any]:
    """spec.config with the operator's overrides applied, not yet validated (verl's nested shape).

    `spec.checkpoint` wins over `trainer.default_local_dir` / `trainer.max_*_ckpt_to_keep`, and
    `trainer.resume_mode` is `auto` so that every attempt resumes from the latest committed checkpoint.
    """
    merged: dict[str, Any] = copy.deepcopy(dict(rljob.spec.config))
    trainer = merged.setdefault("trainer", {})
    if not isinstance(trainer, dict):
        return merged  # not a mapping: validation reports it, nothing is silently replaced
    trainer.update(operator_trainer_values(rljob))
    return merged


def operator_trainer_values(rljob: api.RLJob) -> dict[str, Any]:
    """The `trainer.*` values the operator decides for an RLJob (merged_config writes them over spec.config).

    Validation refuses a user value for any of these keys (and for trainer.metrics_port, which the
    pods' $HYBRIDFLOW_METRICS_PORT decides): the RLJob field named in the message is the one to set.
    """
    values: dict[str, Any] = {"resume_mode": "auto"}
    if rljob.spec.checkpoint.uri:
        values["default_local_dir"] = rljob.spec.checkpoint.uri
    if rljob.spec.checkpoint.keep is not None:
        for key in get_recipe(rljob.spec.recipe).keep_keys:  # RL: actor and critic; SFT/DPO: max_ckpt_to_keep
            values[key] = rljob.spec.checkpoint.keep
    if rljob.spec.export is not None and rljob.spec.export.enabled and rljob.spec.recipe == "ppo":
        # the folder goes under the checkpoint location (trainer.export.dir unset), where status.export points
        values["export"] = {"enable": True, "max_shard_size": rljob.spec.export.max_shard_size}
    return values


def trainer_config(rljob: api.RLJob) -> TrainerConfigTree:
    """The validated trainer config of an RLJob (operator overrides applied), parsed by its recipe's models;
    raises ConfigError."""
    return get_recipe(rljob.spec.recipe).parse(merged_config(rljob))


def cluster_shape(config: TrainerConfigTree) -> tuple[int, int]:
    """(worker pods, GPUs per worker pod) of a trainer config; GPUs are 0 when trainer.device is cpu.

    Split placement gives the rollout its own pool of the training pool's shape
    (hybridflow.trainer.main_ppo.build_worker_groups), so it needs twice the nodes (in one worker group
    without spec.roles; with a rollout role, half of them are the rollout group's, see roles.py).
    """
    trainer = config.trainer
    pools = 2 if trainer.placement == "split" else 1
    return trainer.nnodes * pools, (0 if trainer.device == "cpu" else trainer.n_gpus_per_node)


def entrypoint(rljob: api.RLJob) -> str:
    """The RayJob entrypoint: the recipe's trainer CLI on the mounted config, resuming from checkpoints."""
    argv = ["python", "-m", get_recipe(rljob.spec.recipe).module, names.CONFIG_PATH]
    if rljob.spec.checkpoint.uri:
        argv.append(f"trainer.default_local_dir={rljob.spec.checkpoint.uri}")
    argv.append("trainer.resume_mode=auto")
    return shlex.join(argv)


def owner_reference(rljob: api.RLJob) -> dict[str, Any]:
    """The controller ownerReference every child carries (garbage collection, watch routing)."""
    if not rljob.metadata.uid:
        raise ValueError(
            f"RLJob {rljob.metadata.name!r} has no metadata.uid: children need it for their ownerReference; "
            "read the RLJob from the API server (or give a placeholder uid when rendering offline)"
        )
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": rljob.metadata.name,
        "uid": rljob.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(rljob: api.RLJob, name: str, labels: dict[str, str],
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if rljob.metadata.namespace:
        meta["namespace"] = rljob.metadata.namespace
    meta["labels"] = labels
    if annotations:
        meta["annotations"] = dict(annotations)
    meta["ownerReferences"] = [owner_reference(rljob)]
    return meta


#: libyaml's emitter when PyYAML was built with it (the same YAML, several times faster than the pure-Python one).
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _dump(config: TrainerConfigTree) -> str:
    return yaml.dump(config.to_dict(), Dumper=_DUMPER, sort_keys=False, default_flow_style=False)


def build_configmap(rljob: api.RLJob) -> dict[str, Any]:
    """The ConfigMap `<rljob>-config` with the full resolved trainer config under `config.yaml` (and the smoke
    run's under `smoke-config.yaml` when spec.runPolicy.smokeRun is set).

    Raises hybridflow.config.ConfigError (smoke.SmokeRunError) for an invalid config: validate first (validation.py).
    """
    data = {names.CONFIG_KEY: _dump(trainer_config(rljob))}
    if rljob.spec.run_policy.smoke_run is not None:
        data[names.SMOKE_CONFIG_KEY] = _dump(smoke.derive(rljob).config)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(rljob, names.config_map_name(rljob.metadata.name), names.base_labels(rljob.metadata.name)),
        "data": data,
    }


def _env(rljob: api.RLJob, attempt: int, job_roles: list[roles.Role]) -> list[dict[str, Any]]:
    builtin: list[dict[str, Any]] = [
        {"name": "RLJOB_NAME", "value": rljob.metadata.name},
        {"name": "RLJOB_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "HYBRIDFLOW_ATTEMPT", "value": str(attempt)},
        {"name": "HYBRIDFLOW_METRICS_PORT", "value": str(METRICS_PORT)},
    ]
    if job_roles:  # the driver's resource pools ask for each role's Ray custom resource (resource_pool.py)
        builtin.append({"name": roles.ROLE_RESOURCES_ENV, "value": roles.role_resources_env(job_roles)})
    user = [e.model_dump(mode="json", exclude_none=True) for e in rljob.spec.pod.env]
    return builtin + user


def _env_from(rljob: api.RLJob) -> list[dict[str, Any]]:
    sources = [e.model_dump(mode="json", exclude_none=True) for e in rljob.spec.pod.env_from]
    secret = rljob.spec.checkpoint.secret_ref
    if secret is not None:
        # Credentials reach the trainer only by reference: the operator never reads secret values.
        sources.append({"secretRef": {"name": secret.name}})
    return sources


def _resources(cpu: api.Quantity, memory: api.Quantity, gpu_name: str, gpus: int) -> dict[str, Any]:
    amounts = {"cpu": str(cpu), "memory": str(memory)}
    if gpus > 0:
        amounts[gpu_name] = str(gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


@dataclass(frozen=True)
class _Placement:
    """What a pod template takes from a role rather than from spec.resources / spec.pod."""

    shared_memory: api.Quantity
    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]

    @staticmethod
    def of_spec(rljob: api.RLJob) -> _Placement:
        pod = rljob.spec.pod
        return _Placement(rljob.spec.resources.shared_memory, dict(pod.node_selector),
                          [t.model_dump(mode="json", exclude_none=True) for t in pod.tolerations])

    @staticmethod
    def of_role(role: roles.Role) -> _Placement:
        return _Placement(role.shared_memory, dict(role.node_selector), list(role.tolerations))


def _pod_template(
    rljob: api.RLJob, run: _Run, container: str, resources: dict[str, Any], ports: list[dict[str, Any]],
    default_image: str, placement: _Placement, labels: dict[str, str],
) -> dict[str, Any]:
    spec, pod = rljob.spec, rljob.spec.pod
    main: dict[str, Any] = {
        "name": container,
        "image": spec.image or default_image,
        "imagePullPolicy": spec.image_pull_policy,
        "env": _env(rljob, run.attempt, run.roles),
    }
    env_from = _env_from(rljob)
    if env_from:
        main["envFrom"] = env_from
    if ports:
        main["ports"] = ports
    main["resources"] = resources
    main["volumeMounts"] = [
        {"name": _CONFIG_VOLUME, "mountPath": names.CONFIG_MOUNT_DIR, "readOnly": True},
        {"name": _SHM_VOLUME, "mountPath": "/dev/shm"},
    ]
    pod_spec: dict[str, Any] = {
        "containers": [main],
        "volumes": [
            {"name": _CONFIG_VOLUME, "configMap": {"name": names.config_map_name(rljob.metadata.name)}},
            # NCCL and Ray's object store need a /dev/shm much larger than the 64 MiB container default.
            {"name": _SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": str(placement.shared_memory)}},
        ],
    }
    optional: dict[str, Any] = {
        "nodeSelector": dict(placement.node_selector) or None,
        "tolerations": list(placement.tolerations) or None,
        "affinity": copy.deepcopy(pod.affinity) if pod.affinity else None,
        "priorityClassName": pod.priority_class_name,
        "schedulerName": pod.scheduler_name,
        "serviceAccountName": pod.service_account_name,
        "imagePullSecrets": [{"name": s.name} for s in spec.image_pull_secrets] or None,
    }
    pod_spec.update({k: v for k, v in optional.items() if v is not None})
    metadata: dict[str, Any] = {"labels": {**pod.labels, **labels}}
    if pod.annotations:
        metadata["annotations"] = dict(pod.annotations)
    return {"metadata": metadata, "spec": pod_spec}


def build_rayjob(rljob: api.RLJob, attempt: int, annotations: dict[str, str] | None = None, *,
                 default_image: str = api.DEFAULT_IMAGE) -> dict[str, Any]:
    """The KubeRay v1 RayJob of one attempt: a fresh RayCluster running the trainer, torn down after.

    `annotations` go on the RayJob's metadata (the operator records there which spec the attempt was
    built from, see changes.attempt_annotations). `default_image` runs the pods when `spec.image` is unset.
    Its labels hand it to the scheduler of `spec.scheduling` (scheduling.build_scheduling_labels). Raises hybridflow.config.ConfigError for an invalid config: validate first (validation.py).
    """
    name = rljob.metadata.name
    config = trainer_config(rljob)
    return _rayjob(rljob, _Run(names.ray_job_name(name, attempt), attempt, names.attempt_labels(name, attempt),
                               config, entrypoint(rljob), roles.derive(rljob, config)), annotations, default_image)


def smoke_entrypoint(rljob: api.RLJob, shape: smoke.SmokeShape) -> str:
    """The smoke run's entrypoint: its own config file and checkpoint folder, never resuming (smoke.py)."""
    argv = ["python", "-m", get_recipe(rljob.spec.recipe).module, names.SMOKE_CONFIG_PATH,
            f"trainer.default_local_dir={shape.location}", "trainer.resume_mode=disable"]
    return shlex.join(argv)


def build_smoke_rayjob(rljob: api.RLJob, annotations: dict[str, str] | None = None, *,
                       default_image: str = api.DEFAULT_IMAGE) -> dict[str, Any]:
    """The RayJob `<rljob>-smoke` of the smoke run: the same pods as an attempt's, at the smoke run's size.

    Raises smoke.SmokeRunError when the RLJob sets no smoke run or an impossible one: validate first.
    """
    shape = smoke.derive(rljob)
    name = rljob.metadata.name
    return _rayjob(rljob, _Run(names.smoke_run_name(name), 0, names.smoke_run_labels(name), shape.config,
                               smoke_entrypoint(rljob, shape), roles.derive(rljob, shape.config)),
                   annotations, default_image)


@dataclass(frozen=True)
class _Run:
    """What differs between the RayJobs of an RLJob: an attempt's, or the smoke run's (attempt 0)."""

    name: str
    attempt: int
    labels: dict[str, str]
    config: TrainerConfigTree
    entrypoint: str
    #: The run's roles (roles.derive of `config`); empty: one worker group for everything.
    roles: list[roles.Role]


def _worker_groups(rljob: api.RLJob, run: _Run, default_image: str) -> list[dict[str, Any]]:
    """One worker group of identical pods, or (spec.roles) one per role advertising the role's Ray resource."""
    if not run.roles:
        nnodes, gpus = cluster_shape(run.config)
        res = rljob.spec.resources
        worker = _pod_template(
            rljob, run, "ray-worker", _resources(res.cpu, res.memory, res.gpu_resource_name, gpus), [],
            default_image, _Placement.of_spec(rljob), run.labels,
        )
        return [_worker_group(names.WORKER_GROUP, nnodes, {}, worker)]
    groups = []
    for role in run.roles:
        template = _pod_template(
            rljob, run, "ray-worker", _resources(role.cpu, role.memory, role.gpu_resource_name, role.gpus_per_pod),
            [], default_image, _Placement.of_role(role), {**run.labels, roles.LABEL_ROLE: role.name},
        )
        # KubeRay puts the value on the `ray start --resources=...` shell line, and also parses it itself
        # (pod.go, getResourcesMap: surrounding quotes trimmed, then JSON): a JSON object in single quotes
        # suits both, and is the form KubeRay writes (the docs' '"{\"A\": 1}"' form fails its JSON parse).
        advertised = json.dumps({role.resource: role.slots_per_pod})
        start_params = {"resources": f"'{advertised}'"}
        if role.exclusive:  # Ray sees no CPUs there: only actors asking for the role's resource are placed on it
            start_params["num-cpus"] = "0"
        groups.append(_worker_group(role.group_name, role.pods, start_params, template))
    return groups


def _worker_group(name: str, pods: int, start_params: dict[str, str], template: dict[str, Any]) -> dict[str, Any]:
    return {
        "groupName": name,
        "replicas": pods,
        "minReplicas": pods,
        "maxReplicas": pods,
        "rayStartParams": start_params,
        "template": template,
    }


def _rayjob(rljob: api.RLJob, run: _Run, annotations: dict[str, str] | None, default_image: str) -> dict[str, Any]:
    res = rljob.spec.resources
    head = _pod_template(
        rljob,
        run,
        "ray-head",
        _resources(res.head.cpu, res.head.memory, res.gpu_resource_name, 0),
        [{"name": "trainer-metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        default_image,
        _Placement.of_spec(rljob),
        run.labels,
    )
    labels = {**run.labels, **scheduling.build_scheduling_labels(rljob, run.name)}
    queued = scheduling.admitted_by_kueue(rljob)
    return {
        "apiVersion": RAY_API_VERSION,
        "kind": "RayJob",
        "metadata": _metadata(rljob, run.name, labels, annotations),
        "spec": {
            "entrypoint": run.entrypoint,
            "shutdownAfterJobFinishes": True,
            # Kueue admits a queued RayJob by unsuspending it, so it must be created suspended.
            "suspend": bool(rljob.spec.suspend or queued),
            "rayClusterSpec": {
                "rayVersion": RAY_VERSION,
                # num-cpus 0: no training actors on the head; it only runs the driver (single controller).
                "headGroupSpec": {"rayStartParams": {"num-cpus": "0"}, "template": head},
                "workerGroupSpecs": _worker_groups(rljob, run, default_image),
            },
        },
    }


def with_pod_defaults(rljob: api.RLJob, defaults: api.PodSpec) -> api.RLJob:
    """A copy of `rljob` whose spec.pod is the operator's pod defaults under the job's own settings.

    The job wins wherever it sets something: single values (affinity, priorityClassName, schedulerName,
    serviceAccountName) are the job's when set; nodeSelector, labels and annotations merge key by key;
    env merges by variable name; tolerations and envFrom are the defaults' followed by the job's own
    (a default toleration cannot be taken away by a job, only added to).
    """
    pod, base = rljob.spec.pod, defaults
    own_env = {e.name for e in pod.env}
    merged = api.PodSpec(
        node_selector={**base.node_selector, **pod.node_selector},
        tolerations=_union(base.tolerations, pod.tolerations),
        affinity=pod.affinity if pod.affinity is not None else copy.deepcopy(base.affinity),
        priority_class_name=pod.priority_class_name or base.priority_class_name,
        scheduler_name=pod.scheduler_name or base.scheduler_name,
        service_account_name=pod.service_account_name or base.service_account_name,
        env=[e for e in base.env if e.name not in own_env] + list(pod.env),
        env_from=_union(base.env_from, pod.env_from),
        labels={**base.labels, **pod.labels},
        annotations={**base.annotations, **pod.annotations},
    )
    return rljob.model_copy(update={"spec": rljob.spec.model_copy(update={"pod": merged})})


def _union(first: list[Any], second: list[Any]) -> list[Any]:
    return first + [item for item in second if item not in first]


def build_children(rljob: api.RLJob, attempt: int, annotations: dict[str, str] | None = None, *,
                   default_image: str = api.DEFAULT_IMAGE,
                   pod_defaults: api.PodSpec | None = None) -> list[dict[str, Any]]:
    """Every child of an RLJob for one attempt, in apply order: the ConfigMap, then the RayJob (`annotations`).

    `default_image` and `pod_defaults` are the operator's defaults for what the RLJob leaves unset."""
    if pod_defaults is not None:
        rljob = with_pod_defaults(rljob, pod_defaults)
    return [build_configmap(rljob), build_rayjob(rljob, attempt, annotations, default_image=default_image)]


def build_smoke_children(rljob: api.RLJob, annotations: dict[str, str] | None = None, *,
                         default_image: str = api.DEFAULT_IMAGE,
                         pod_defaults: api.PodSpec | None = None) -> list[dict[str, Any]]:
    """The children of the smoke run, in apply order: the ConfigMap (with both configs), the smoke RayJob."""
    if pod_defaults is not None:
        rljob = with_pod_defaults(rljob, pod_defaults)
    return [build_configmap(rljob), build_smoke_rayjob(rljob, annotations, default_image=default_image)]
