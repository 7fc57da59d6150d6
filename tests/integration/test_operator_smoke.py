"""spec.runPolicy.smokeRun with the real operator (kopf, a subprocess) against the API emulator; the test plays KubeRay.

The emulator checks every RayJob the operator creates against KubeRay v1.7.0's CRD schema (../shared/kuberay).
"""

from __future__ import annotations

import copy
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.kube_emulator import KubeEmulator
from tests.support.operator_proc import Operator, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
RLJ, RAY = "rl.hybridflow.dev/v1alpha1", "ray.io/v1"
SMOKE_LABEL = "rl.hybridflow.dev/smoke-run=true"


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeEmulator]:
    emulator = KubeEmulator(crd_files=sorted((ROOT / "crds").glob("*.yaml"))).start()
    yield emulator
    emulator.stop()


@pytest.fixture(scope="module")
def operator(kube: KubeEmulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    op = Operator(kube, tmp_path_factory.mktemp("operator"))
    op.start()
    yield op
    op.stop()
    assert "Traceback" not in op.log.read_text(), op.log.read_text()[-3000:]


def manifest(name: str, **run_policy: Any) -> dict[str, Any]:
    job = yaml.safe_load((ROOT / "examples" / "rljob_cpu_tiny.yaml").read_text())
    job["metadata"] = {"name": name}
    job["spec"]["runPolicy"] = {"backoffLimit": 1, "smokeRun": {"steps": 2}, **copy.deepcopy(run_policy)}
    return job


def status(kube: KubeEmulator, name: str) -> dict[str, Any]:
    return kube.get(RLJ, "rljobs", name).get("status") or {}


def condition(kube: KubeEmulator, name: str, ctype: str) -> dict[str, Any]:
    return next((c for c in status(kube, name).get("conditions", []) if c["type"] == ctype), {})


def kuberay(kube: KubeEmulator, rayjob: str, deployment: str, job: str = "", **extra: Any) -> None:
    kube.patch_status(RAY, "rayjobs", rayjob, {"jobDeploymentStatus": deployment, "jobStatus": job or None, **extra})


def reasons(kube: KubeEmulator, name: str) -> list[str]:
    return [e["reason"] for e in kube.list("v1", "events") if e["involvedObject"]["name"] == name]


def rayjobs(kube: KubeEmulator, name: str, selector: str = "") -> list[str]:
    labels = f"rl.hybridflow.dev/rljob={name}" + (f",{selector}" if selector else "")
    return sorted(r["metadata"]["name"] for r in kube.list(RAY, "rayjobs", labels=labels))


def test_smoke_run_passes_then_the_full_run_starts_once(kube: KubeEmulator, operator: Operator) -> None:
    """Smoke RayJob first (small, its own config and location), an operator restart mid-smoke, then attempt 1;
    a failed attempt is retried without a second smoke run."""
    kube.create(RLJ, "rljobs", manifest("smoky"), "default")
    smoke = wait_for(lambda: kube.find(RAY, "rayjobs", "smoky-smoke"), "RayJob smoky-smoke")
    assert rayjobs(kube, "smoky") == ["smoky-smoke"]  # no full attempt, so no full request
    spec = smoke["spec"]
    assert "/etc/hybridflow/smoke-config.yaml" in spec["entrypoint"] and "trainer.resume_mode=disable" in spec["entrypoint"]
    assert "trainer.default_local_dir=file:///tmp/hybridflow/checkpoints/tiny-cpu-grpo/smoke-run" in spec["entrypoint"]
    assert spec["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 1
    data = kube.get("v1", "configmaps", "smoky-config")["data"]
    smoke_config = yaml.safe_load(data["smoke-config.yaml"])
    assert (smoke_config["trainer"]["n_gpus_per_node"], smoke_config["trainer"]["total_training_steps"]) == (1, 2)
    assert yaml.safe_load(data["config.yaml"])["trainer"]["n_gpus_per_node"] == 2
    wait_for(lambda: status(kube, "smoky").get("phase") == "SmokeRun", "phase SmokeRun")
    assert status(kube, "smoky")["smokeRun"]["rayJobName"] == "smoky-smoke"
    assert condition(kube, "smoky", "SmokeRunPassed")["status"] == "Unknown"
    kuberay(kube, "smoky-smoke", "Running", "RUNNING", startTime="2026-12-01T10:00:00Z")
    wait_for(lambda: status(kube, "smoky")["smokeRun"].get("state") == "Running", "smoke run Running")

    operator.stop()  # restart mid-smoke: the smoke run finishes while no operator is looking
    kuberay(kube, "smoky-smoke", "Complete", "SUCCEEDED", endTime="2026-12-01T10:03:00Z")
    operator.start()
    first = wait_for(lambda: kube.find(RAY, "rayjobs", "smoky-a1"), "RayJob smoky-a1 after the smoke run")
    assert "/etc/hybridflow/config.yaml" in first["spec"]["entrypoint"]
    assert "trainer.resume_mode=auto" in first["spec"]["entrypoint"]
    wait_for(lambda: condition(kube, "smoky", "SmokeRunPassed").get("status") == "True", "SmokeRunPassed=True")
    assert status(kube, "smoky")["smokeRun"]["state"] == "Passed" and status(kube, "smoky")["attempt"] == 1
    wait_for(lambda: {"SmokeRunStarted", "SmokeRunPassed", "AttemptStarted"} <= set(reasons(kube, "smoky")), "Events")

    kuberay(kube, "smoky-a1", "Failed", "FAILED", reason="AppFailed", message="worker lost")
    wait_for(lambda: kube.find(RAY, "rayjobs", "smoky-a2"), "RayJob smoky-a2 (the retry)")
    time.sleep(1)
    assert rayjobs(kube, "smoky", SMOKE_LABEL) == ["smoky-smoke"]  # never a second smoke run
    assert reasons(kube, "smoky").count("SmokeRunStarted") == 1
    wait_for(lambda: status(kube, "smoky").get("failedAttempts") == 1, "failedAttempts 1")


def test_smoke_failure_fails_the_job_with_the_log_tail(kube: KubeEmulator, operator: Operator) -> None:
    kube.create(RLJ, "rljobs", manifest("fumes"), "default")
    wait_for(lambda: kube.find(RAY, "rayjobs", "fumes-smoke"), "RayJob fumes-smoke")
    logs = "\n".join(f"(TaskRunner) loading shard {i}" for i in range(60))
    kuberay(kube, "fumes-smoke", "Failed", "FAILED", reason="AppFailed", message=(
        "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
        f"{logs}\nFileNotFoundError: outputs/demo/data/train.parquet"))
    wait_for(lambda: status(kube, "fumes").get("phase") == "Failed", "phase Failed")
    failed = condition(kube, "fumes", "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "SmokeRunFailed")
    assert "FileNotFoundError: outputs/demo/data/train.parquet" in failed["message"]
    assert "loading shard 59" in failed["message"] and "loading shard 5\n" not in failed["message"]
    assert condition(kube, "fumes", "SmokeRunPassed")["status"] == "False"
    assert status(kube, "fumes")["lastFailure"]["attempt"] == 0
    wait_for(lambda: "Failed" in reasons(kube, "fumes"), "Failed Event")
    time.sleep(2.5)  # a resync (2 s) later: the full run was never requested
    assert rayjobs(kube, "fumes") == ["fumes-smoke"]


def test_impossible_smoke_run_is_invalid_and_schedules_nothing(kube: KubeEmulator, operator: Operator) -> None:
    kube.create(RLJ, "rljobs", manifest("ash", smokeRun={"nGpusPerNode": 4}), "default")
    wait_for(lambda: status(kube, "ash").get("phase") == "Invalid", "phase Invalid")
    message = condition(kube, "ash", "Validated")["message"]
    assert "spec.runPolicy.smokeRun.nGpusPerNode: 4 is more than" in message and "lower it" in message
    assert rayjobs(kube, "ash") == []
