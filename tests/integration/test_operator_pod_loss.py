"""Recovery per role through the real operator (kopf, a subprocess) against the API emulator (issue 15, part 3).

The test plays KubeRay and the kubelet: it marks the attempt's RayJob running and creates the pods KubeRay
would (the group's pod template labels plus KubeRay's `ray.io/*` labels, a Ready condition). Then it loses
a rollout pod (the attempt goes on; status.roles counts it, a PodLost Event says so) and a trainer pod (the
attempt ends with reason TrainerPodLost and the next one starts).
"""

from __future__ import annotations

import copy
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.kube_emulator import KubeEmulator
from tests.support.operator_proc import Operator, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
RLJ, RAY = "rl.hybridflow.dev/v1alpha1", "ray.io/v1"
Obj = dict[str, Any]


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[tuple[KubeEmulator, Operator]]:
    kube = KubeEmulator(crd_files=sorted((ROOT / "crds").glob("*.yaml"))).start()
    operator = Operator(kube, tmp_path / "operator", args=("--standalone", "-A", "--pod-loss-grace-seconds", "0.5"))
    operator.start()
    yield kube, operator
    operator.stop()
    kube.stop()
    assert "Traceback" not in operator.log.read_text(), operator.log.read_text()[-3000:]


def _pod(rayjob: Obj, template: Obj, name: str, group: str, node_type: str, ready: bool = True) -> Obj:
    """A pod as KubeRay creates it from a group's template and the kubelet reports it."""
    labels = {**(template.get("metadata") or {}).get("labels", {}), "ray.io/group": group,
              "ray.io/node-type": node_type, "ray.io/cluster": f"{rayjob['metadata']['name']}-x1y2z",
              "ray.io/is-ray-node": "yes"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": copy.deepcopy(template["spec"]),
            "status": {"phase": "Running" if ready else "Pending",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [{"name": template["spec"]["containers"][0]["name"], "ready": ready,
                                              "restartCount": 0, "state": {"running": {}}}]}}


def _create(kube: KubeEmulator, pod: Obj) -> None:
    """Create the pod, then write its status as the kubelet does (a create drops status, as the API server's)."""
    kube.create("v1", "pods", pod, "default")
    kube.patch_status("v1", "pods", pod["metadata"]["name"], pod["status"])


def _roles(kube: KubeEmulator, name: str) -> dict[str, tuple[int, int, int]]:
    status = kube.get(RLJ, "rljobs", name).get("status") or {}
    return {r["name"]: (r["ready"], r["desired"], r["restarts"]) for r in status.get("roles") or []}


def _condition(kube: KubeEmulator, name: str, ctype: str) -> Obj:
    status = kube.get(RLJ, "rljobs", name).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == ctype), {})


def _events(kube: KubeEmulator, reason: str) -> list[str]:
    return [e["message"] for e in kube.list("v1", "events", "default") if e.get("reason") == reason]


def test_a_lost_rollout_pod_is_counted_and_a_lost_trainer_pod_restarts_the_attempt(
    cluster: tuple[KubeEmulator, Operator],
) -> None:
    kube, operator = cluster
    job = yaml.safe_load((ROOT / "examples" / "rljob_multirole.yaml").read_text())
    job["spec"].pop("scheduling", None)  # no Kueue here: the RayJob runs as created
    name = job["metadata"]["name"]
    kube.create(RLJ, "rljobs", job, "default")
    rayjob = wait_for(lambda: kube.find(RAY, "rayjobs", f"{name}-a1"), "the RayJob of attempt 1")
    kube.patch_status(RAY, "rayjobs", rayjob["metadata"]["name"],
                      {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
    cluster_spec = rayjob["spec"]["rayClusterSpec"]
    groups = {g["groupName"]: g["template"] for g in cluster_spec["workerGroupSpecs"]}
    head = _pod(rayjob, cluster_spec["headGroupSpec"]["template"], f"{name}-head", "headgroup", "head")
    trainer = _pod(rayjob, groups["trainer"], f"{name}-trainer-worker-aaaaa", "trainer", "worker")
    rollout = _pod(rayjob, groups["rollout"], f"{name}-rollout-worker-bbbbb", "rollout", "worker", ready=False)
    for obj in (head, trainer, rollout):
        _create(kube, obj)

    wait_for(lambda: _roles(kube, name) == {"trainer": (2, 2, 0), "rollout": (0, 1, 0)}, "the pods by role")
    assert "rollout 0/1 ready" in _condition(kube, name, "RolesReady")["message"]
    kube.patch_status("v1", "pods", rollout["metadata"]["name"], {
        "conditions": [{"type": "Ready", "status": "True"}], "phase": "Running"})
    wait_for(lambda: _condition(kube, name, "RolesReady").get("status") == "True", "RolesReady=True")

    # A rollout pod is lost: KubeRay replaces it; the attempt goes on.
    kube.delete("v1", "pods", rollout["metadata"]["name"])
    wait_for(lambda: _roles(kube, name).get("rollout") == (0, 1, 1), "the lost rollout pod counted")
    (message,) = wait_for(lambda: _events(kube, "PodLost"), "a PodLost event")
    assert rollout["metadata"]["name"] in message and "The attempt goes on" in message
    status = kube.get(RLJ, "rljobs", name)["status"]
    assert (status["phase"], status["attempt"]) == ("Running", 1)
    replacement = _pod(rayjob, groups["rollout"], f"{name}-rollout-worker-ccccc", "rollout", "worker")
    _create(kube, replacement)
    wait_for(lambda: _roles(kube, name).get("rollout") == (1, 1, 1), "the replacement rollout pod ready")

    # A trainer pod is evicted: its FSDP ranks are gone, so attempt 2 starts (and resumes from the checkpoint).
    kube.patch_status("v1", "pods", trainer["metadata"]["name"], {
        "phase": "Failed", "reason": "Evicted", "conditions": [{"type": "Ready", "status": "False"}]})
    failure = wait_for(lambda: (kube.get(RLJ, "rljobs", name).get("status") or {}).get("lastFailure"),
                       "the attempt's end")
    assert failure["reason"] == "TrainerPodLost" and failure["attempt"] == 1
    assert trainer["metadata"]["name"] in failure["message"] and "Evicted" in failure["message"]
    wait_for(lambda: kube.find(RAY, "rayjobs", f"{name}-a1") is None
             or kube.find(RAY, "rayjobs", f"{name}-a1")["metadata"].get("deletionTimestamp"),
             "the RayJob of attempt 1 stopped")
    (lost,) = wait_for(lambda: _events(kube, "TrainerPodLost"), "a TrainerPodLost event")
    assert "attempt 2 resumes from the latest checkpoint" in lost
    assert operator.metric('rljob_pods_lost_total{role="rollout"}') == 1
    assert operator.metric('rljob_pods_lost_total{role="trainer"}') == 1
