"""Two operator replicas against one API emulator with kopf's peering CRD: one active, takeover on a crash."""

from __future__ import annotations

import pathlib
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.kube_emulator import KubeEmulator
from tests.support.operator_proc import Operator, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
RLJ, RAY, KOPF = "rl.hybridflow.dev/v1alpha1", "ray.io/v1", "kopf.dev/v1"
RECONCILES = "rljob_reconciles_total"


@pytest.fixture
def kube() -> Iterator[KubeEmulator]:
    emulator = KubeEmulator(crd_files=sorted((ROOT / "crds").glob("*.yaml"))).start()
    yield emulator
    emulator.stop()


def manifest(name: str) -> dict[str, Any]:
    job = yaml.safe_load((ROOT / "examples" / "rljob_cpu_tiny.yaml").read_text())
    job["metadata"] = {"name": name}
    return job


def peers(kube: KubeEmulator) -> dict[str, Any]:
    obj = kube.find(KOPF, "clusterkopfpeerings", "rljob-operator", namespace=None)
    return (obj or {}).get("status") or {}


def replica(kube: KubeEmulator, tmp: pathlib.Path, name: str, priority: int) -> Operator:
    return Operator(kube, tmp / name, pod_id=name, args=[
        "-A", "--peering", "rljob-operator", "--priority", str(priority), "--peering-lifetime", "3"])


def test_two_replicas_one_active_then_takeover(kube: KubeEmulator, tmp_path: pathlib.Path) -> None:
    active, standby = replica(kube, tmp_path, "replica-a", 200), replica(kube, tmp_path, "replica-b", 100)
    try:
        active.start()
        wait_for(lambda: any(k.startswith("replica-a/") for k in peers(kube)), "replica-a's keep-alive")
        standby.start()
        wait_for(lambda: any(k.startswith("replica-b/") for k in peers(kube)), "replica-b's keep-alive")
        wait_for(lambda: "Pausing operations in favour of" in standby.log.read_text(), "replica-b pausing")

        kube.create(RLJ, "rljobs", manifest("first"), "default")
        wait_for(lambda: kube.find(RAY, "rayjobs", "first-a1"), "RayJob first-a1")
        wait_for(lambda: active.metric(RECONCILES) > 0, "reconciles on replica-a")
        time.sleep(4.5)  # two resync periods: the standby's own resync loop must stay idle too
        assert standby.metric(RECONCILES) == 0, standby.log.read_text()[-2000:]
        assert len(kube.list(RAY, "rayjobs")) == 1

        active.stop(signal.SIGKILL)  # a crash: its keep-alive stays until the lifetime (3 s) runs out
        kube.create(RLJ, "rljobs", manifest("second"), "default")
        wait_for(lambda: kube.find(RAY, "rayjobs", "second-a1"), "RayJob second-a1 from replica-b", timeout=30)
        assert standby.metric(RECONCILES) > 0
        kube.patch_status(RAY, "rayjobs", "first-a1", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
        wait_for(lambda: (kube.get(RLJ, "rljobs", "first").get("status") or {}).get("phase") == "Running",
                 "replica-b reconciles the job replica-a had started")
        assert sorted(r["metadata"]["name"] for r in kube.list(RAY, "rayjobs")) == ["first-a1", "second-a1"]
    finally:
        active.stop()
        standby.stop()
    assert "Traceback" not in standby.log.read_text(), standby.log.read_text()[-3000:]
