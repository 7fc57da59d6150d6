"""Tests for the pure child builders (operator/rljob_operator/builders.py) and names.py."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from rljob_operator import api, builders, names

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
CRD_VALIDATE = SHARED / "tools" / "crd-validate"
RAYJOB_CRD = SHARED / "kuberay" / "ray.io_rayjobs.yaml"

GPU_CONFIG = {"trainer": {"nnodes": 2, "n_gpus_per_node": 8, "device": "cuda"}}
CPU_CONFIG = {"trainer": {"nnodes": 1, "n_gpus_per_node": 2, "device": "cpu"}}
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu.type", "operator": "In", "values": ["h100"]}]}]
        }
    }
}


def _rljob(config: dict, **spec: Any) -> api.RLJob:
    return api.RLJob.model_validate(
        {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": "demo", "namespace": "ml", "uid": "6f1c-uid"},
            "spec": {"config": copy.deepcopy(config), **spec},
        }
    )


# name -> (spec overrides, config, expected replicas, expected GPUs per worker, suspend, queue label)
VARIANTS: dict[str, tuple[dict, dict, int, int, bool, str | None]] = {
    "cpu": ({"resources": {"cpu": 4, "memory": "8Gi", "sharedMemory": "1Gi"}}, CPU_CONFIG, 1, 0, False, None),
    "multi-node-gpu": ({"checkpoint": {"uri": "s3://b/ckpt"}}, GPU_CONFIG, 2, 8, False, None),
    "queued": ({"queueName": "team-a"}, GPU_CONFIG, 2, 8, True, "team-a"),
    "suspended": ({"suspend": True}, GPU_CONFIG, 2, 8, True, None),
    "scheduling": (
        {
            "resources": {"gpuResourceName": "amd.com/gpu"},
            "pod": {
                "nodeSelector": {"pool": "gpu"},
                "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": AFFINITY,
                "priorityClassName": "high",
                "schedulerName": "volcano",
                "serviceAccountName": "trainer",
                "labels": {"team": "rl"},
                "annotations": {"note": "x"},
            },
            "imagePullSecrets": [{"name": "regcred"}],
        },
        GPU_CONFIG, 2, 8, False, None,
    ),  # fmt: skip
    "secret-ref": (
        {
            "checkpoint": {"uri": "s3://bucket/runs/demo", "secretRef": {"name": "s3-creds"}, "keep": 3},
            "pod": {
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
                "envFrom": [{"configMapRef": {"name": "extra"}}],
            },
        },
        GPU_CONFIG, 2, 8, False, None,
    ),  # fmt: skip
}


# name -> (spec overrides, the RayJob's labels beyond the attempt labels, spec.suspend of the RayJob).
# Label names: KubeRay v1.7 ray-operator (batchscheduler/*, utils/constant.go) and Kueue's RayJob integration.
SCHEDULING: dict[str, tuple[dict, dict[str, str], bool]] = {
    "none": ({}, {}, False),
    "default scheduler": ({"scheduling": {"scheduler": "default"}}, {}, False),
    "kueue": ({"scheduling": {"scheduler": "kueue", "queue": "team-a"}},
              {"kueue.x-k8s.io/queue-name": "team-a"}, True),
    "kueue, deprecated queueName": ({"queueName": "team-a"}, {"kueue.x-k8s.io/queue-name": "team-a"}, True),
    "kueue, suspended": ({"scheduling": {"scheduler": "kueue", "queue": "q"}, "suspend": True},
                         {"kueue.x-k8s.io/queue-name": "q"}, True),
    "volcano with queue and priority": (
        {"scheduling": {"scheduler": "volcano", "queue": "training"}, "pod": {"priorityClassName": "rl-high"}},
        {"ray.io/scheduler-name": "volcano", "volcano.sh/queue-name": "training",
         "ray.io/priority-class-name": "rl-high"}, False),
    "volcano, default queue": ({"scheduling": {"scheduler": "volcano"}}, {"ray.io/scheduler-name": "volcano"}, False),
    "yunikorn": ({"scheduling": {"scheduler": "yunikorn", "queue": "root.team-a"}},
                 {"yunikorn.apache.org/queue": "root.team-a", "yunikorn.apache.org/app-id": "ml-demo-a1",
                  "ray.io/gang-scheduling-enabled": "true"}, False),
    "yunikorn, placement rules": ({"scheduling": {"scheduler": "yunikorn"}},
                                  {"yunikorn.apache.org/app-id": "ml-demo-a1",
                                   "ray.io/gang-scheduling-enabled": "true"}, False),
    "kai-scheduler": ({"scheduling": {"scheduler": "kai-scheduler", "queue": "team-a"}},
                      {"kai.scheduler/queue": "team-a"}, False),
}  # fmt: skip


@pytest.mark.parametrize("case", SCHEDULING)
def test_scheduling_labels_and_suspend(case: str) -> None:
    spec, labels, suspend = SCHEDULING[case]
    rayjob = builders.build_rayjob(_rljob(GPU_CONFIG, **spec), 1)
    own = {k: v for k, v in rayjob["metadata"]["labels"].items() if k not in names.attempt_labels("demo", 1)}
    assert own == labels
    assert rayjob["spec"]["suspend"] is suspend
    for template in (_worker(rayjob)["template"], rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]):
        # KubeRay's plugins set the pods' schedulerName and queue labels from the RayCluster's labels.
        assert "schedulerName" not in template["spec"]
        assert not set(template["metadata"]["labels"]) & set(labels)


def test_yunikorn_app_id_is_unique_per_namespace_and_a_label_value() -> None:
    from rljob_operator.scheduling import yunikorn_app_id

    assert yunikorn_app_id("ml", "demo-a1") == "ml-demo-a1"
    assert yunikorn_app_id(None, "demo-a1") == "demo-a1"
    long_ns, rayjob = "n" * 63, "x" * names.MAX_RAYJOB_NAME_LENGTH
    ids = {yunikorn_app_id(long_ns, rayjob), yunikorn_app_id(long_ns[:-1] + "m", rayjob)}
    assert len(ids) == 2 and all(len(i) <= 63 for i in ids)


def test_volcano_priority_comes_from_the_pod_defaults_too() -> None:
    rljob = _rljob(GPU_CONFIG, scheduling={"scheduler": "volcano"})
    (_, rayjob) = builders.build_children(rljob, 1, pod_defaults=api.PodSpec(priority_class_name="batch"))
    assert rayjob["metadata"]["labels"]["ray.io/priority-class-name"] == "batch"


def _worker(rayjob: dict) -> dict:
    return rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]


def _container(template: dict) -> dict:
    return template["spec"]["containers"][0]


@pytest.mark.parametrize("variant", VARIANTS)
def test_rayjob_shape(variant: str) -> None:
    spec, config, replicas, gpus, suspend, queue = VARIANTS[variant]
    rljob = _rljob(config, **spec)
    rayjob = builders.build_rayjob(rljob, 2)
    gpu_name = rljob.spec.resources.gpu_resource_name
    assert rayjob["apiVersion"] == "ray.io/v1" and rayjob["kind"] == "RayJob"
    assert rayjob["metadata"]["name"] == "demo-a2"
    assert rayjob["metadata"]["namespace"] == "ml"
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True
    assert rayjob["spec"]["suspend"] is suspend
    assert rayjob["metadata"]["labels"].get(names.LABEL_KUEUE_QUEUE) == queue
    worker = _worker(rayjob)
    assert worker["groupName"] == "workers"
    assert worker["replicas"] == worker["minReplicas"] == worker["maxReplicas"] == replicas
    limits = _container(worker["template"])["resources"]["limits"]
    assert limits.get(gpu_name) == (str(gpus) if gpus else None)
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"] == {"num-cpus": "0"}
    assert gpu_name not in _container(head["template"])["resources"]["limits"]


def test_labels_and_owner_reference_on_every_child() -> None:
    rljob = _rljob(GPU_CONFIG)
    for child in builders.build_children(rljob, 1):
        meta = child["metadata"]
        assert meta["ownerReferences"] == [
            {"apiVersion": "rl.hybridflow.dev/v1alpha1", "kind": "RLJob", "name": "demo", "uid": "6f1c-uid",
             "controller": True, "blockOwnerDeletion": True}
        ]  # fmt: skip
        assert meta["labels"][names.LABEL_INSTANCE] == "demo"
        assert meta["labels"][names.LABEL_MANAGED_BY] == "rljob-operator"
        assert meta["labels"][names.LABEL_RLJOB] == "demo"
    rayjob = builders.build_rayjob(rljob, 3)
    assert rayjob["metadata"]["labels"][names.LABEL_ATTEMPT] == "3"
    for template in (_worker(rayjob)["template"], rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]):
        assert template["metadata"]["labels"][names.LABEL_ATTEMPT] == "3"


def test_pod_template_carries_env_volumes_and_scheduling() -> None:
    spec, config, *_ = VARIANTS["scheduling"]
    rayjob = builders.build_rayjob(_rljob(config, **spec), 1)
    template = _worker(rayjob)["template"]
    pod, main = template["spec"], _container(template)
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["affinity"] == AFFINITY
    assert (pod["priorityClassName"], pod["schedulerName"], pod["serviceAccountName"]) == ("high", "volcano", "trainer")
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert template["metadata"]["labels"]["team"] == "rl"
    assert template["metadata"]["annotations"] == {"note": "x"}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
    assert {"name": "hybridflow-config", "configMap": {"name": "demo-config"}} in pod["volumes"]
    mounts = {m["mountPath"] for m in main["volumeMounts"]}
    assert mounts == {"/dev/shm", "/etc/hybridflow"}
    env = {e["name"]: e for e in main["env"]}
    assert env["RLJOB_NAME"]["value"] == "demo"
    assert env["RLJOB_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["HYBRIDFLOW_ATTEMPT"]["value"] == "1"
    assert env["HYBRIDFLOW_METRICS_PORT"]["value"] == "8000"
    assert main["image"] == api.DEFAULT_IMAGE


@pytest.mark.parametrize(("image", "default", "expected"), [
    (None, "mirror.local/trainer:0.1.0", "mirror.local/trainer:0.1.0"),  # the operator's default
    ("team/trainer:dev", "mirror.local/trainer:0.1.0", "team/trainer:dev"),  # the RLJob's own wins
])
def test_image_is_the_rljobs_or_the_operators_default(image: str | None, default: str, expected: str) -> None:
    spec = {"image": image} if image else {}
    rayjob = builders.build_rayjob(_rljob({"trainer": {"nnodes": 2}}, **spec), 1, default_image=default)
    cluster = rayjob["spec"]["rayClusterSpec"]
    for template in (cluster["headGroupSpec"]["template"], _worker(rayjob)["template"]):
        assert _container(template)["image"] == expected


POD_DEFAULTS = api.PodSpec.model_validate({
    "serviceAccountName": "rl-trainer",
    "priorityClassName": "rl-batch",
    "nodeSelector": {"pool": "gpu", "zone": "a"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "HF_HOME", "value": "/cache"}],
    "envFrom": [{"secretRef": {"name": "team-s3"}}],
    "labels": {"team": "rl", "cost-center": "42"},
})  # fmt: skip


def test_pod_defaults_sit_under_the_rljobs_own_pod_settings() -> None:
    own = {
        "serviceAccountName": "special",
        "nodeSelector": {"zone": "b"},
        "tolerations": [{"key": "spot", "operator": "Exists"}],
        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
        "labels": {"team": "search"},
    }
    children = builders.build_children(_rljob({}, pod=own), 1, pod_defaults=POD_DEFAULTS)
    rayjob = next(c for c in children if c["kind"] == "RayJob")
    for template in (_worker(rayjob)["template"], rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]):
        pod, main = template["spec"], _container(template)
        assert pod["serviceAccountName"] == "special"  # the job's own value wins
        assert pod["priorityClassName"] == "rl-batch"  # unset in the job: the default
        assert pod["nodeSelector"] == {"pool": "gpu", "zone": "b"}  # merged key by key
        assert pod["tolerations"] == [  # the defaults', then the job's
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "spot", "operator": "Exists"},
        ]
        env = {e["name"]: e.get("value") for e in main["env"]}
        assert env["NCCL_DEBUG"] == "INFO" and env["HF_HOME"] == "/cache"
        assert [e["name"] for e in main["env"]].count("NCCL_DEBUG") == 1
        assert main["envFrom"] == [{"secretRef": {"name": "team-s3"}}]
        assert template["metadata"]["labels"]["team"] == "search"
        assert template["metadata"]["labels"]["cost-center"] == "42"


def test_without_pod_defaults_the_pods_are_the_jobs_alone() -> None:
    rljob = _rljob({})
    assert builders.build_children(rljob, 1, pod_defaults=api.PodSpec()) == builders.build_children(rljob, 1)
    assert builders.with_pod_defaults(rljob, POD_DEFAULTS).spec.pod.service_account_name == "rl-trainer"
    assert rljob.spec.pod.service_account_name is None  # the RLJob itself is not changed


def test_secret_ref_is_passed_by_reference_only() -> None:
    spec, config, *_ = VARIANTS["secret-ref"]
    rayjob = builders.build_rayjob(_rljob(config, **spec), 1)
    for template in (_worker(rayjob)["template"], rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]):
        main = _container(template)
        assert main["envFrom"] == [{"configMapRef": {"name": "extra"}}, {"secretRef": {"name": "s3-creds"}}]
        assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in main["env"]


@pytest.mark.parametrize(
    "checkpoint, expected",
    [
        ({}, "python -m hybridflow.trainer.main_ppo /etc/hybridflow/config.yaml trainer.resume_mode=auto"),
        (
            {"uri": "s3://b/run 1"},
            "python -m hybridflow.trainer.main_ppo /etc/hybridflow/config.yaml "
            "'trainer.default_local_dir=s3://b/run 1' trainer.resume_mode=auto",
        ),
    ],
)
def test_entrypoint(checkpoint: dict, expected: str) -> None:
    rayjob = builders.build_rayjob(_rljob(GPU_CONFIG, checkpoint=checkpoint), 1)
    assert rayjob["spec"]["entrypoint"] == expected


def test_configmap_holds_the_resolved_config() -> None:
    rljob = _rljob(GPU_CONFIG, checkpoint={"uri": "s3://b/ckpt", "keep": 2})
    cm = builders.build_configmap(rljob)
    assert cm["metadata"]["name"] == "demo-config"
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["trainer"]["default_local_dir"] == "s3://b/ckpt"
    assert config["trainer"]["max_actor_ckpt_to_keep"] == 2
    assert config["trainer"]["resume_mode"] == "auto"
    assert config["trainer"]["nnodes"] == 2
    assert GPU_CONFIG["trainer"].get("resume_mode") is None  # the spec is not mutated


def test_builders_are_deterministic_and_pure() -> None:
    spec, config, *_ = VARIANTS["secret-ref"]
    rljob = _rljob(config, **spec)
    before = rljob.model_dump()
    assert builders.build_children(rljob, 1) == builders.build_children(_rljob(config, **spec), 1)
    assert rljob.model_dump() == before
    first = yaml.safe_dump_all(builders.build_children(rljob, 1))
    assert first == yaml.safe_dump_all(builders.build_children(rljob, 1))


def test_missing_uid_is_an_actionable_error() -> None:
    rljob = _rljob(GPU_CONFIG)
    rljob.metadata.uid = None
    with pytest.raises(ValueError, match="metadata.uid"):
        builders.build_configmap(rljob)


def test_names() -> None:
    assert names.config_map_name("demo") == "demo-config"
    assert [names.ray_job_name("demo", a) for a in (1, 2, 10)] == ["demo-a1", "demo-a2", "demo-a10"]
    with pytest.raises(ValueError, match="start at 1"):
        names.ray_job_name("demo", 0)
    assert len(names.ray_job_name("x" * names.max_rljob_name_length(4), 4)) == names.MAX_RAYJOB_NAME_LENGTH


def test_configmap_passes_the_core_schema() -> None:
    for variant in VARIANTS:
        spec, config, *_ = VARIANTS[variant]
        kubernetes_validate.validate(builders.build_configmap(_rljob(config, **spec)), "1.37", strict=True)


@pytest.mark.skipif(
    not (CRD_VALIDATE.exists() and RAYJOB_CRD.exists()),
    reason=f"{SHARED} (KubeRay CRDs and crd-validate) is absent: only CI and dev boxes have ../shared",
)
def test_rayjobs_pass_kuberays_crd(tmp_path: Path) -> None:
    docs = []
    for i, (spec, config, *_) in enumerate(VARIANTS.values(), start=1):
        rayjob = builders.build_rayjob(_rljob(config, **spec), i)
        docs.append(rayjob)
    for i, (spec, *_) in enumerate(SCHEDULING.values(), start=1):
        docs.append(builders.build_rayjob(_rljob(GPU_CONFIG, **spec), i))
    manifest = tmp_path / "rayjobs.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    result = subprocess.run(
        [sys.executable, str(CRD_VALIDATE), str(RAYJOB_CRD), "--", str(manifest)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(docs)} passed, 0 failed" in result.stdout
