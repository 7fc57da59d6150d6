"""Roles through the real operator (a subprocess) and the real `kubectl` against the API emulator, which checks
the RayJobs against KubeRay v1.7's CRD when ../shared/kuberay is there."""

from __future__ import annotations

import copy
import json
import os
import pathlib
import shlex
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support import binaries
from tests.support.kube_emulator import KubeEmulator
from tests.support.operator_proc import Operator, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
RLJ, RAY = "rl.hybridflow.dev/v1alpha1", "ray.io/v1"
EXAMPLE = ROOT / "examples" / "rljob_multirole.yaml"


@pytest.fixture(scope="module")
def kubectl() -> pathlib.Path:
    try:
        return binaries.ensure("kubectl")
    except binaries.BinaryUnavailable as err:
        pytest.skip(f"no kubectl binary: {err}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KubeEmulator, Operator]]:
    kube = KubeEmulator(crd_files=sorted((ROOT / "crds").glob("*.yaml"))).start()
    operator = Operator(kube, tmp_path_factory.mktemp("roles-operator"))
    operator.start()
    yield kube, operator
    operator.stop()
    kube.stop()
    assert "Traceback" not in operator.log.read_text(), operator.log.read_text()[-3000:]


def _apply(kubectl: pathlib.Path, operator: Operator, job: dict[str, Any], tmp_path: pathlib.Path) -> str:
    # JSON, not a YAML dump: kubectl reads YAML 1.1, where PyYAML's bare `n:` (rollout.n) is the boolean false
    path = tmp_path / f"{job['metadata']['name']}.json"
    path.write_text(json.dumps(job))
    env = {**os.environ, "KUBECONFIG": str(operator.kubeconfig), "HOME": str(operator.kubeconfig.parent)}
    done = subprocess.run([str(kubectl), "apply", "-f", str(path), "--validate=false"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_multi_role_job_becomes_one_raycluster_with_a_group_per_role(
    kubectl: pathlib.Path, cluster: tuple[KubeEmulator, Operator], tmp_path: pathlib.Path,
) -> None:
    kube, operator = cluster
    job = yaml.safe_load(EXAMPLE.read_text())
    name = job["metadata"]["name"]
    assert "created" in _apply(kubectl, operator, job, tmp_path)
    rayjob = wait_for(lambda: kube.find(RAY, "rayjobs", f"{name}-a1"), "the operator's RayJob")
    assert rayjob["spec"]["suspend"] is True  # Kueue admits it, every role at once
    groups = {g["groupName"]: g for g in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    assert list(groups) == ["trainer", "rollout"]
    for role, group in groups.items():
        (advertised,) = shlex.split(group["rayStartParams"]["resources"])
        assert json.loads(advertised) == {f"rljob.role/{role}": 8}
        assert group["replicas"] == 1
    rollout = groups["rollout"]["template"]["spec"]
    assert rollout["nodeSelector"] == {"gpu.type": "l40s"}
    assert {"key": "inference", "operator": "Equal", "value": "true", "effect": "NoSchedule"} in rollout["tolerations"]
    assert rollout["containers"][0]["resources"]["limits"]["memory"] == "256Gi"
    assert groups["trainer"]["template"]["spec"]["nodeSelector"] == {"gpu.type": "h100"}
    # With ../shared/kuberay the emulator stored the RayJob only after KubeRay's CRD schema accepted it.
    assert kube.kuberay_schema or not (ROOT.parent / "shared" / "kuberay").exists()


def test_a_rollout_role_without_split_placement_is_refused_with_the_fix(
    kubectl: pathlib.Path, cluster: tuple[KubeEmulator, Operator], tmp_path: pathlib.Path,
) -> None:
    kube, operator = cluster
    job = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    job["metadata"]["name"] = "colocated-roles"
    job["spec"]["config"]["trainer"]["placement"] = "colocate"
    job["spec"]["config"]["actor_rollout_ref"]["rollout"]["mode"] = "sync"
    del job["spec"]["roles"]["rollout"]["replicas"]
    _apply(kubectl, operator, job, tmp_path)

    def refused() -> dict[str, Any] | None:
        conditions = (kube.get(RLJ, "rljobs", "colocated-roles").get("status") or {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "Validated" and c["status"] == "False"), None)

    condition = wait_for(refused, "Validated=False")
    assert "spec.roles.rollout: needs spec.config.trainer.placement: split (it is colocate)" in condition["message"]
    assert "set trainer.placement: split, or remove spec.roles.rollout" in condition["message"]
    assert kube.find(RAY, "rayjobs", "colocated-roles-a1") is None


def test_a_sandbox_role_becomes_a_cpu_only_group_and_a_gpu_there_is_refused(
    kubectl: pathlib.Path, cluster: tuple[KubeEmulator, Operator], tmp_path: pathlib.Path,
) -> None:
    kube, operator = cluster
    job = yaml.safe_load((ROOT / "examples" / "rljob_code_sandbox.yaml").read_text())
    name = job["metadata"]["name"]
    assert "created" in _apply(kubectl, operator, job, tmp_path)
    rayjob = wait_for(lambda: kube.find(RAY, "rayjobs", f"{name}-a1"), "the operator's RayJob")
    groups = {g["groupName"]: g for g in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    assert list(groups) == ["trainer", "sandbox"]
    sandbox = groups["sandbox"]
    assert sandbox["replicas"] == 4 and sandbox["rayStartParams"]["num-cpus"] == "0"
    (advertised,) = shlex.split(sandbox["rayStartParams"]["resources"])
    assert json.loads(advertised) == {"rljob.role/sandbox": 1}
    assert sandbox["template"]["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "8", "memory": "16Gi"}
    assert sandbox["template"]["metadata"]["labels"]["rl.hybridflow.dev/role"] == "sandbox"
    assert kube.kuberay_schema or not (ROOT.parent / "shared" / "kuberay").exists()

    job["metadata"]["name"] = "sandbox-on-gpus"
    job["spec"]["roles"]["sandbox"]["resources"]["gpuResourceName"] = "nvidia.com/gpu"
    _apply(kubectl, operator, job, tmp_path)

    def refused() -> dict[str, Any] | None:
        conditions = (kube.get(RLJ, "rljobs", "sandbox-on-gpus").get("status") or {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "Validated" and c["status"] == "False"), None)

    condition = wait_for(refused, "Validated=False")
    assert "spec.roles.sandbox.resources.gpuResourceName: the sandbox pods are CPU-only" in condition["message"]
    assert kube.find(RAY, "rayjobs", "sandbox-on-gpus-a1") is None
