"""Roles (spec.roles, operator/rljob_operator/roles.py): one KubeRay worker group per role, sizes derived from
spec.config, impossible combinations refused, and the trainer's pools asking for each role's Ray resource."""

from __future__ import annotations

import copy
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hybridflow.controller.resource_pool import (
    ROLE_RESOURCES_ENV,
    RayResourcePool,
    ResourcePoolManager,
    role_resources_from_env,
)
from hybridflow.recipes import get_recipe
from rljob_operator import api, builders, roles, validation

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
CRD_VALIDATE = SHARED / "tools" / "crd-validate"
RAYJOB_CRD = SHARED / "kuberay" / "ray.io_rayjobs.yaml"

CONFIG: dict[str, Any] = {
    "data": {"train_files": "s3://b/train.parquet", "train_batch_size": 32},
    "actor_rollout_ref": {
        "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
        "actor": {"ppo_mini_batch_size": 16},
        "rollout": {"mode": "async"},
    },
    "trainer": {"nnodes": 2, "n_gpus_per_node": 4, "device": "cuda", "placement": "split"},
}
ROLLOUT_ROLE: dict[str, Any] = {
    "resources": {"gpuResourceName": "amd.com/gpu", "cpu": 16, "memory": "128Gi", "sharedMemory": "32Gi"},
    "nodeSelector": {"gpu.type": "mi300x"},
    "tolerations": [{"key": "inference", "operator": "Exists", "effect": "NoSchedule"}],
}
POD = {
    "nodeSelector": {"pool": "gpu", "gpu.type": "h100"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}


def _obj(config: dict | None = None, rollout: dict | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"config": copy.deepcopy(config or CONFIG), "checkpoint": {"uri": "s3://b/ckpt"},
                            "pod": copy.deepcopy(POD), **spec}
    if rollout is not None:
        body["roles"] = {"rollout": copy.deepcopy(rollout)}
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": "demo", "namespace": "ml", "uid": "6f1c-uid"}, "spec": body}


def _rljob(**kwargs: Any) -> api.RLJob:
    return api.RLJob.model_validate(_obj(**kwargs))


def _groups(rayjob: dict) -> dict[str, dict]:
    return {g["groupName"]: g for g in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]}


def _advertised(group: dict) -> dict[str, float]:
    """The custom resources `ray start` sees: KubeRay puts the value on a shell command line."""
    raw = group["rayStartParams"]["resources"]
    (value,) = shlex.split(raw)
    # KubeRay also reads the value itself (ray-operator pod.go, getResourcesMap, before adding num-gpus): it
    # trims quotes, backticks and spaces at both ends and parses JSON; a value it cannot parse loses num-gpus.
    assert json.loads(raw.strip("'\"` ")) == json.loads(value)
    return json.loads(value)


def _env(template: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}


# ------------------------------------------------------------------------------------------- builders


def test_each_role_is_its_own_worker_group_sized_from_the_config() -> None:
    rayjob = builders.build_rayjob(_rljob(rollout=ROLLOUT_ROLE), 1)
    groups = _groups(rayjob)
    assert list(groups) == ["trainer", "rollout"]
    for name, group in groups.items():
        # split placement: the rollout pool has the trainer's shape, trainer.nnodes x n_gpus_per_node
        assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
        assert _advertised(group) == {f"rljob.role/{name}": 4}
        assert group["template"]["metadata"]["labels"][roles.LABEL_ROLE] == name
    trainer, rollout = (groups[n]["template"]["spec"] for n in ("trainer", "rollout"))
    assert trainer["containers"][0]["resources"]["limits"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"}
    assert rollout["containers"][0]["resources"]["limits"] == {"cpu": "16", "memory": "128Gi", "amd.com/gpu": "4"}
    assert rollout["containers"][0]["resources"]["requests"] == rollout["containers"][0]["resources"]["limits"]
    assert trainer["nodeSelector"] == {"pool": "gpu", "gpu.type": "h100"}
    assert rollout["nodeSelector"] == {"pool": "gpu", "gpu.type": "mi300x"}  # the role's key wins, others merge
    assert trainer["tolerations"] == POD["tolerations"]
    assert rollout["tolerations"] == POD["tolerations"] + ROLLOUT_ROLE["tolerations"]
    shm = {v["name"]: v for v in rollout["volumes"]}["dshm"]["emptyDir"]["sizeLimit"]
    assert shm == "32Gi"
    # the driver (head) and every worker know which resource each role's pool must ask for
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert "resources" not in head["rayStartParams"]
    for template in (head["template"], groups["trainer"]["template"], groups["rollout"]["template"]):
        assert json.loads(_env(template)[ROLE_RESOURCES_ENV]) == {
            "trainer": "rljob.role/trainer", "rollout": "rljob.role/rollout"}


def test_without_roles_nothing_changes() -> None:
    rayjob = builders.build_rayjob(_rljob(), 1)
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["groupName"] == "workers" and group["replicas"] == 4  # split: 2 pools x 2 nodes, all alike
    assert group["rayStartParams"] == {}
    assert ROLE_RESOURCES_ENV not in _env(group["template"])
    assert roles.LABEL_ROLE not in group["template"]["metadata"]["labels"]


def test_role_resources_default_to_spec_resources_and_cpu_jobs_request_no_gpus() -> None:
    config = copy.deepcopy(CONFIG)
    config["trainer"].update(device="cpu", nnodes=1, n_gpus_per_node=2)
    rayjob = builders.build_rayjob(_rljob(config=config, rollout={}, resources={"cpu": 6, "memory": "16Gi",
                                                                                "sharedMemory": "2Gi"}), 1)
    for group in _groups(rayjob).values():
        assert group["replicas"] == 1
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {"cpu": "6", "memory": "16Gi"}
        assert _advertised(group) == {f"rljob.role/{group['groupName']}": 2}  # one unit per process


def test_the_smoke_run_has_every_role_at_its_size() -> None:
    rljob = _rljob(rollout=ROLLOUT_ROLE, runPolicy={"smokeRun": {"steps": 1}})
    smoke = _groups(builders.build_smoke_rayjob(rljob))
    assert list(smoke) == ["trainer", "rollout"]
    assert {g["replicas"] for g in smoke.values()} == {1}
    gpus = {n: g["template"]["spec"]["containers"][0]["resources"]["limits"] for n, g in smoke.items()}
    assert gpus["rollout"]["amd.com/gpu"] == gpus["trainer"]["nvidia.com/gpu"]
    assert {json.dumps(_advertised(g)) for g in smoke.values()} == {
        json.dumps({f"rljob.role/{n}": int(gpus[n].get("amd.com/gpu") or gpus[n]["nvidia.com/gpu"])})
        for n in smoke}


@pytest.mark.skipif(
    not (CRD_VALIDATE.exists() and RAYJOB_CRD.exists()),
    reason=f"{SHARED} (KubeRay CRDs and crd-validate) is absent: only CI and dev boxes have ../shared",
)
def test_multi_role_rayjobs_pass_kuberays_crd(tmp_path: Path) -> None:
    docs = [builders.build_rayjob(_rljob(rollout=ROLLOUT_ROLE), 1),
            builders.build_rayjob(_rljob(rollout={}, scheduling={"scheduler": "kueue", "queue": "q"}), 2),
            builders.build_smoke_rayjob(_rljob(rollout=ROLLOUT_ROLE, runPolicy={"smokeRun": {}}))]
    manifest = tmp_path / "rayjobs.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    result = subprocess.run([sys.executable, str(CRD_VALIDATE), str(RAYJOB_CRD), "--", str(manifest)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(docs)} passed, 0 failed" in result.stdout


# ----------------------------------------------------------------------------------------- validation


def _errors(obj: dict) -> list[str]:
    return validation.validate_rljob(obj)


def test_a_consistent_multi_role_job_is_valid() -> None:
    assert _errors(_obj(rollout={**ROLLOUT_ROLE, "replicas": 8, "gpusPerReplica": 1})) == []


def _with(path: str, value: Any, config: dict | None = None) -> dict:
    config = copy.deepcopy(config or CONFIG)
    *parents, leaf = path.split(".")
    node = config
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return config


@pytest.mark.parametrize(
    ("config", "rollout", "spec", "expected"),
    [
        (_with("trainer.placement", "colocate"), {}, {},
         "spec.roles.rollout: needs spec.config.trainer.placement: split (it is colocate)"),
        (CONFIG, {"replicas": 3}, {},
         "spec.roles.rollout.replicas: 3 contradicts spec.config, which gives 8 replicas (one per tensor-parallel "
         "group: 2 node(s) x 4 GPUs / tensor_model_parallel_size 1); set "
         "spec.config.actor_rollout_ref.rollout.replicas: 3, or remove"),
        (_with("actor_rollout_ref.rollout.replicas", 2), {"replicas": 4}, {},
         "spec.roles.rollout.replicas: 4 contradicts spec.config, which gives 2 replicas "
         "(spec.config.actor_rollout_ref.rollout.replicas)"),
        (CONFIG, {"replicas": 16}, {},
         "since 16 replicas x 1 GPUs need 16 and the pool has 8, trainer.nnodes: 4"),
        (_with("actor_rollout_ref.rollout.mode", "sync"), {"replicas": 8}, {},
         "spec.roles.rollout.replicas: counts rollout server replicas (actor_rollout_ref.rollout.mode: async), but "
         "the mode is sync"),
        (CONFIG, {"gpusPerReplica": 2}, {},
         "spec.roles.rollout.gpusPerReplica: 2 contradicts spec.config.actor_rollout_ref.rollout."
         "tensor_model_parallel_size 1"),
        (CONFIG, {"resources": {"gpuResourceName": "gpu"}}, {},
         "spec.roles.rollout.resources.gpuResourceName: 'gpu' is not an extended resource name"),
        (CONFIG, {"resources": {"cpu": "0"}}, {}, "spec.roles.rollout.resources.cpu: must be positive"),
        (CONFIG, {"resources": {"memory": "16Gi"}}, {},
         "spec.roles.rollout.resources.sharedMemory: 16Gi is not below the rollout pods' memory 16Gi"),
        (CONFIG, {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, {},
         "spec.roles.rollout.tolerations[0].value: must be empty with operator Exists"),
        (CONFIG, {"nodeSelector": {"gpu": "l40s please"}}, {},
         "spec.roles.rollout.nodeSelector.gpu: 'l40s please' is not a valid label value"),
        (CONFIG, {}, {"pod": {"env": [{"name": ROLE_RESOURCES_ENV, "value": "{}"}]}},
         f"spec.pod.env[0].name: {ROLE_RESOURCES_ENV} is set by the operator"),
        (CONFIG, {}, {"pod": {"labels": {roles.LABEL_ROLE: "x"}}},
         f"spec.pod.labels.{roles.LABEL_ROLE}: set by the operator"),
    ],
    ids=["colocated", "replicas-derived", "replicas-configured", "replicas-need-nodes", "replicas-sync",
         "gpus-per-replica", "gpu-name", "cpu", "shm", "toleration", "node-selector", "env", "role-label"],
)
def test_impossible_roles_are_refused_with_the_fix(config: dict, rollout: dict, spec: dict, expected: str) -> None:
    errors = _errors(_obj(config=config, rollout=rollout, **spec))
    assert any(expected in e for e in errors), errors


def test_offline_recipes_have_no_rollout_role() -> None:
    obj = _obj(rollout={})
    obj["spec"].update(recipe="sft", config={"data": {"train_files": "s3://b/t.parquet"},
                                             "model": {"partial_pretrain": "Qwen/Qwen2.5-0.5B"}})
    errors = _errors(obj)
    assert any(e.startswith("spec.roles.rollout: spec.recipe sft trains on fixed data") for e in errors), errors


def test_unknown_role_fields_are_refused_by_the_schema() -> None:
    errors = _errors(_obj(rollout={"gpus": 4}))
    assert any(e.startswith("spec.roles.rollout.gpus:") for e in errors), errors


def test_the_operator_and_the_trainer_count_replicas_alike() -> None:
    from hybridflow.workers.rollout_service import replica_count

    tp = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    for path, value, base in [("trainer.nnodes", 4, None), ("actor_rollout_ref.rollout.replicas", 5, None),
                              ("trainer.device", "cpu", None), (tp, 2, None), (tp, 4, None),
                              (tp, 2, _with("trainer.device", "cpu"))]:
        config = get_recipe("ppo").parse(_with(path, value, base))
        world = config.trainer.nnodes * config.trainer.n_gpus_per_node
        assert roles.rollout_replicas(config)[0] == replica_count(config, world)


# ------------------------------------------------------------------------------------ trainer's pools


def test_pools_ask_for_their_roles_resource_from_the_operators_env() -> None:
    rayjob = builders.build_rayjob(_rljob(rollout=ROLLOUT_ROLE), 1)
    env = _env(rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"])
    manager = ResourcePoolManager({"global_pool": [4, 4], "rollout_pool": [4, 4]},
                                  {"actor_rollout_ref": "global_pool", "rollout": "rollout_pool"},
                                  use_gpu=True, role_resources=role_resources_from_env(env))
    assert manager.get_resource_pool("actor_rollout_ref").bundle() == {
        "CPU": 1.0, "GPU": 1.0, "rljob.role/trainer": 1.0}
    assert manager.get_resource_pool("rollout").bundle() == {"CPU": 1.0, "GPU": 1.0, "rljob.role/rollout": 1.0}
    # the custom resource is reserved by the bundle: actors inside it ask only for their share of CPU/GPU
    assert manager.get_resource_pool("rollout").actor_resources() == {"num_cpus": 0.5, "num_gpus": 0.5}


def test_without_the_env_pools_go_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROLE_RESOURCES_ENV, raising=False)
    manager = ResourcePoolManager({"global_pool": [2]}, {"actor_rollout_ref": "global_pool"})
    assert manager.role_resources == {}
    assert manager.get_resource_pool("actor_rollout_ref").bundle() == {"CPU": 1.0}
    monkeypatch.setenv(ROLE_RESOURCES_ENV, '{"rollout": "rljob.role/rollout"}')
    manager = ResourcePoolManager({"global_pool": [2], "rollout_pool": [2]},
                                  {"actor_rollout_ref": "global_pool", "rollout": "rollout_pool"})
    assert manager.get_resource_pool("actor_rollout_ref").bundle() == {"CPU": 1.0}
    assert manager.get_resource_pool("rollout").bundle() == {"CPU": 1.0, "rljob.role/rollout": 1.0}
    assert RayResourcePool([1]).bundle() == {"CPU": 1.0}


@pytest.mark.parametrize(("raw", "expected"), [("{rollout", "is not JSON"), ('["rollout"]', "must be a JSON object"),
                                               ('{"rollout": ""}', "must be a JSON object")])
def test_a_malformed_env_says_what_it_should_be(raw: str, expected: str) -> None:
    with pytest.raises(ValueError, match=expected) as err:
        role_resources_from_env({ROLE_RESOURCES_ENV: raw})
    assert "rljob.role/rollout" in str(err.value)


def test_a_local_run_places_every_role_on_this_machine() -> None:
    from rljob_operator import localrun

    example = yaml.safe_load((REPO / "examples" / "rljob_multirole.yaml").read_text())
    run = localrun.build_local_run(api.RLJob.model_validate(example), Path("/w"), python="py", environ={})
    assert ROLE_RESOURCES_ENV not in run.env  # a local Ray has no rollout pods to place the rollout pool on
    assert "spec.roles: every role runs on this machine" in run.notes
    assert "HYBRIDFLOW_METRICS_PORT" in run.env
