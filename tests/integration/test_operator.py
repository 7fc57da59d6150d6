"""The real operator (kopf, in a subprocess) against the API emulator over HTTP; the test plays KubeRay."""

from __future__ import annotations

import copy
import json
import pathlib
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from tests.support.kube_emulator import KubeEmulator
from tests.support.operator_proc import Operator, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
RLJ, RAY = "rl.hybridflow.dev/v1alpha1", "ray.io/v1"
MIRROR = "registry.local/mirror/trainer:0.1.0"  # the operator's --trainer-image in this module
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists"}
POD_DEFAULTS = json.dumps({"serviceAccountName": "rl-trainer", "tolerations": [GPU_TOLERATION]})  # --pod-defaults


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeEmulator]:
    emulator = KubeEmulator(crd_files=sorted((ROOT / "crds").glob("*.yaml"))).start()
    yield emulator
    emulator.stop()


@pytest.fixture(scope="module")
def operator(kube: KubeEmulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    op = Operator(kube, tmp_path_factory.mktemp("operator"),
                  args=("--standalone", "-A", "--trainer-image", MIRROR, "--pod-defaults", POD_DEFAULTS))
    op.start()
    yield op
    op.stop()
    assert "Traceback" not in op.log.read_text(), op.log.read_text()[-3000:]


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    job = yaml.safe_load((ROOT / "examples" / "rljob_cpu_tiny.yaml").read_text())
    job["metadata"] = {"name": name}
    job["spec"].update(copy.deepcopy(spec))
    return job


def status(kube: KubeEmulator, name: str) -> dict[str, Any]:
    return kube.get(RLJ, "rljobs", name).get("status") or {}


def condition(kube: KubeEmulator, name: str, ctype: str) -> dict[str, Any]:
    return next((c for c in status(kube, name).get("conditions", []) if c["type"] == ctype), {})


def kuberay(kube: KubeEmulator, rayjob: str, deployment: str, job: str = "", **extra: Any) -> None:
    """Set a RayJob's status the way KubeRay does."""
    kube.patch_status(RAY, "rayjobs", rayjob, {"jobDeploymentStatus": deployment, "jobStatus": job or None, **extra})


def phase_is(kube: KubeEmulator, name: str, phase: str) -> Callable[[], bool]:
    return lambda: status(kube, name).get("phase") == phase


def events_for(kube: KubeEmulator, name: str) -> list[dict[str, Any]]:
    return [e for e in kube.list("v1", "events") if e["involvedObject"]["name"] == name]


def test_valid_job_gets_children_and_succeeds(kube: KubeEmulator, operator: Operator) -> None:
    job = kube.create(RLJ, "rljobs", manifest("ok"), "default")
    rayjob = wait_for(lambda: kube.find(RAY, "rayjobs", "ok-a1"), "RayJob ok-a1")
    configmap = kube.get("v1", "configmaps", "ok-config")
    for child in (rayjob, configmap):
        refs = child["metadata"]["ownerReferences"]
        assert refs == [{"apiVersion": RLJ, "kind": "RLJob", "name": "ok", "uid": job["metadata"]["uid"],
                         "controller": True, "blockOwnerDeletion": True}]
    assert "config.yaml" in configmap["data"]
    wait_for(lambda: condition(kube, "ok", "Validated").get("status") == "True", "Validated=True")
    assert status(kube, "ok")["rayJobName"] == "ok-a1" and status(kube, "ok")["attempt"] == 1
    kuberay(kube, "ok-a1", "Initializing")
    wait_for(phase_is(kube, "ok", "Starting"), "phase Starting")
    kuberay(kube, "ok-a1", "Running", "RUNNING", dashboardURL="ok-head-svc:8265")
    wait_for(phase_is(kube, "ok", "Running"), "phase Running")
    assert status(kube, "ok")["dashboardURL"] == "ok-head-svc:8265"
    kuberay(kube, "ok-a1", "Complete", "SUCCEEDED")
    wait_for(phase_is(kube, "ok", "Succeeded"), "phase Succeeded")
    assert condition(kube, "ok", "Succeeded")["status"] == "True"
    assert [r["metadata"]["name"] for r in kube.list(RAY, "rayjobs", labels="rl.hybridflow.dev/rljob=ok")] == ["ok-a1"]


def test_pods_run_the_rljobs_image_or_the_operators_defaults(kube: KubeEmulator, operator: Operator) -> None:
    kube.create(RLJ, "rljobs", manifest("mirrored"), "default")
    kube.create(RLJ, "rljobs", manifest("pinned", image="team/trainer:dev"), "default")
    for name, image in (("mirrored", MIRROR), ("pinned", "team/trainer:dev")):
        cluster = wait_for(lambda n=name: kube.find(RAY, "rayjobs", f"{n}-a1"), f"RayJob {name}-a1")["spec"]["rayClusterSpec"]
        templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
        assert {c["image"] for t in templates for c in t["spec"]["containers"]} == {image}, name
        for template in templates:  # the operator's pod defaults reach every pod
            assert template["spec"]["serviceAccountName"] == "rl-trainer", name
            assert GPU_TOLERATION in template["spec"]["tolerations"], name
    mirrored = kube.get(RLJ, "rljobs", "mirrored")["spec"]
    assert "image" not in mirrored and "serviceAccountName" not in mirrored.get("pod", {})  # the spec is not rewritten


def test_failures_retry_with_resume_then_give_up(kube: KubeEmulator, operator: Operator) -> None:
    kube.create(RLJ, "rljobs", manifest("flaky", runPolicy={"backoffLimit": 1}), "default")
    wait_for(lambda: kube.find(RAY, "rayjobs", "flaky-a1"), "RayJob flaky-a1")
    kuberay(kube, "flaky-a1", "Failed", "FAILED", reason="AppFailed", message="worker OOM-killed")
    second = wait_for(lambda: kube.find(RAY, "rayjobs", "flaky-a2"), "RayJob flaky-a2 (the retry)")
    assert "trainer.resume_mode=auto" in second["spec"]["entrypoint"]
    assert "trainer.default_local_dir=file:///tmp/hybridflow/checkpoints" in second["spec"]["entrypoint"]
    wait_for(lambda: status(kube, "flaky").get("attempt") == 2, "status.attempt 2")
    assert status(kube, "flaky")["lastFailure"]["reason"] == "AppFailed"
    kuberay(kube, "flaky-a2", "Failed", "FAILED", reason="AppFailed", message="NCCL timeout")
    wait_for(phase_is(kube, "flaky", "Failed"), "phase Failed")
    failed = condition(kube, "flaky", "Failed")
    assert (failed["status"], failed["reason"], failed["message"]) == ("True", "AppFailed", "NCCL timeout")
    time.sleep(1)
    assert kube.find(RAY, "rayjobs", "flaky-a3") is None  # attempts = 1 + backoffLimit
    wait_for(lambda: any(e["reason"] == "Failed" for e in events_for(kube, "flaky")), "Failed Event")
    reasons = [e["reason"] for e in events_for(kube, "flaky")]
    assert reasons.count("AttemptStarted") == 2 and "AttemptFailed" in reasons and "Failed" in reasons


BAD = {
    "bad-nnodes": ({"config": {**manifest("x")["spec"]["config"], "trainer": {
        **manifest("x")["spec"]["config"]["trainer"], "nnodes": 0}}}, "nnodes"),
    "bad-no-model": ({"config": {"trainer": {"nnodes": 1, "device": "cpu"}}}, "model.path"),
    "bad-quantity": ({"resources": {"cpu": "2", "memory": "8Gi", "sharedMemory": "16Gi",
                                    "head": {"cpu": "1", "memory": "4Gi"}}}, "sharedMemory"),
}


def test_invalid_specs_get_a_clear_message_and_no_children(kube: KubeEmulator, operator: Operator) -> None:
    for name, (spec, _) in BAD.items():
        kube.create(RLJ, "rljobs", manifest(name, **spec), "default")
    for name, (_, needle) in BAD.items():
        wait_for(phase_is(kube, name, "Invalid"), f"{name}: phase Invalid")
        validated = condition(kube, name, "Validated")
        assert validated["status"] == "False" and needle in validated["message"], validated
        # The status is written first, then the Event is posted: wait for it rather than race it.
        warnings = wait_for(lambda n=name: [e for e in events_for(kube, n) if e["reason"] == "InvalidSpec"],
                            f"{name}: InvalidSpec Event")
        assert len(warnings) == 1 and needle in warnings[0]["message"]
    time.sleep(3)  # a resync (2 s) later: still nothing scheduled, no repeated Event
    for name in BAD:
        assert kube.list(RAY, "rayjobs", labels=f"rl.hybridflow.dev/rljob={name}") == []
        assert kube.find("v1", "configmaps", f"{name}-config") is None
        assert len([e for e in events_for(kube, name) if e["reason"] == "InvalidSpec"]) == 1


def test_suspend_and_resume(kube: KubeEmulator, operator: Operator) -> None:
    kube.create(RLJ, "rljobs", manifest("pause"), "default")
    wait_for(lambda: kube.find(RAY, "rayjobs", "pause-a1"), "RayJob pause-a1")
    kuberay(kube, "pause-a1", "Running", "RUNNING")
    wait_for(phase_is(kube, "pause", "Running"), "phase Running")
    kube.patch(RLJ, "rljobs", "pause", {"spec": {"suspend": True}})
    wait_for(lambda: kube.get(RAY, "rayjobs", "pause-a1")["spec"].get("suspend") is True, "RayJob suspended")
    wait_for(phase_is(kube, "pause", "Suspended"), "phase Suspended")
    kuberay(kube, "pause-a1", "Suspended")
    kube.patch(RLJ, "rljobs", "pause", {"spec": {"suspend": False}})
    wait_for(lambda: kube.get(RAY, "rayjobs", "pause-a1")["spec"].get("suspend") is False, "RayJob resumed")
    kuberay(kube, "pause-a1", "Running", "RUNNING")
    wait_for(phase_is(kube, "pause", "Running"), "phase Running again")
    assert kube.find(RAY, "rayjobs", "pause-a2") is None  # resuming is not a new attempt


def test_restart_mid_flight_creates_no_duplicates(kube: KubeEmulator, operator: Operator) -> None:
    kube.create(RLJ, "rljobs", manifest("restart"), "default")
    wait_for(lambda: kube.find(RAY, "rayjobs", "restart-a1"), "RayJob restart-a1")
    wait_for(lambda: status(kube, "restart").get("attempt") == 1, "status written")
    operator.stop()
    kuberay(kube, "restart-a1", "Failed", "FAILED", reason="NodeLost", message="node went away")
    operator.start()
    wait_for(lambda: kube.find(RAY, "rayjobs", "restart-a2"), "RayJob restart-a2 after restart")
    time.sleep(2)
    names = sorted(r["metadata"]["name"] for r in kube.list(RAY, "rayjobs", labels="rl.hybridflow.dev/rljob=restart"))
    assert names == ["restart-a1", "restart-a2"]
    assert len(kube.list("v1", "configmaps", labels="rl.hybridflow.dev/rljob=restart")) == 1
    wait_for(lambda: status(kube, "restart").get("attempt") == 2, "status.attempt 2")


def test_deletion_garbage_collects_children(kube: KubeEmulator, operator: Operator) -> None:
    kube.create(RLJ, "rljobs", manifest("gone"), "default")
    wait_for(lambda: kube.find(RAY, "rayjobs", "gone-a1"), "RayJob gone-a1")
    kube.delete(RLJ, "rljobs", "gone")
    assert kube.find(RAY, "rayjobs", "gone-a1") is None and kube.find("v1", "configmaps", "gone-config") is None
    assert kube.find(RLJ, "rljobs", "gone") is None  # no finalizer held it


def test_ttl_deletes_the_children_of_a_finished_job_and_keeps_it(kube: KubeEmulator, operator: Operator) -> None:
    """spec.runPolicy.ttlSecondsAfterFinished: RayJobs (their Ray clusters with them) and ConfigMap go, the RLJob stays."""
    kube.create(RLJ, "rljobs", manifest("brief", runPolicy={"backoffLimit": 1, "ttlSecondsAfterFinished": 1}),
                "default")
    first = wait_for(lambda: kube.find(RAY, "rayjobs", "brief-a1"), "RayJob brief-a1")
    kuberay(kube, "brief-a1", "Failed", "FAILED", reason="AppFailed", message="worker lost")
    second = wait_for(lambda: kube.find(RAY, "rayjobs", "brief-a2"), "RayJob brief-a2 (the retry)")
    # The Ray cluster KubeRay would create, owned by its RayJob: the garbage collector takes it along.
    kube.create(RAY, "rayclusters", {
        "apiVersion": RAY, "kind": "RayCluster", "spec": second["spec"]["rayClusterSpec"],
        "metadata": {"name": "brief-a2-x7k2p", "ownerReferences": [
            {"apiVersion": RAY, "kind": "RayJob", "name": "brief-a2", "uid": second["metadata"]["uid"],
             "controller": True}]}}, "default")  # fmt: skip
    kuberay(kube, "brief-a2", "Complete", "SUCCEEDED")
    wait_for(phase_is(kube, "brief", "Succeeded"), "phase Succeeded")
    ended = status(kube, "brief")["completionTime"]
    wait_for(lambda: not kube.list(RAY, "rayjobs", labels="rl.hybridflow.dev/rljob=brief"), "RayJobs deleted", 10)
    assert first["metadata"]["name"] == "brief-a1"
    assert kube.find("v1", "configmaps", "brief-config") is None
    assert kube.find(RAY, "rayclusters", "brief-a2-x7k2p") is None
    kept = wait_for(lambda: status(kube, "brief").get("childrenDeletedAt") and status(kube, "brief"),
                    "status.childrenDeletedAt")
    assert kept["phase"] == "Succeeded" and kept["completionTime"] == ended and kept["attempt"] == 2
    assert kept["childrenDeletedAt"] >= ended
    # Events are posted after the status write: on a loaded box the status can be read before the Event exists.
    (event,) = wait_for(lambda: [e for e in events_for(kube, "brief") if e["reason"] == "ChildrenDeleted"],
                        "the ChildrenDeleted Event")
    assert "RayJob brief-a1, RayJob brief-a2, ConfigMap brief-config" in event["message"]
    time.sleep(2.5)  # a resync later: nothing is recreated, nothing posted twice
    assert not kube.list(RAY, "rayjobs", labels="rl.hybridflow.dev/rljob=brief")
    assert kube.find("v1", "configmaps", "brief-config") is None
    assert len([e for e in events_for(kube, "brief") if e["reason"] == "ChildrenDeleted"]) == 1
    assert 'rljob_reconciles_total{trigger="requeue"}' in _fetch(f"http://127.0.0.1:{operator.metrics_port}/metrics")


def test_without_ttl_children_stay(kube: KubeEmulator, operator: Operator) -> None:
    kube.create(RLJ, "rljobs", manifest("keeper"), "default")
    wait_for(lambda: kube.find(RAY, "rayjobs", "keeper-a1"), "RayJob keeper-a1")
    kuberay(kube, "keeper-a1", "Complete", "SUCCEEDED")
    wait_for(phase_is(kube, "keeper", "Succeeded"), "phase Succeeded")
    time.sleep(2.5)  # a resync later
    assert kube.find(RAY, "rayjobs", "keeper-a1") and kube.find("v1", "configmaps", "keeper-config")
    assert "childrenDeletedAt" not in status(kube, "keeper")


@pytest.mark.parametrize(("scheduling", "labels", "suspend", "phase"), [
    ({"scheduler": "kueue", "queue": "team-a"}, {"kueue.x-k8s.io/queue-name": "team-a"}, True, "Queued"),
    ({"scheduler": "volcano", "queue": "training"},
     {"ray.io/scheduler-name": "volcano", "volcano.sh/queue-name": "training"}, False, "Starting"),
    ({"scheduler": "yunikorn", "queue": "root.rl"},
     {"yunikorn.apache.org/queue": "root.rl", "yunikorn.apache.org/app-id": "default-gang-yunikorn-a1",
      "ray.io/gang-scheduling-enabled": "true"}, False, "Starting"),
    ({"scheduler": "kai-scheduler", "queue": "team-a"}, {"kai.scheduler/queue": "team-a"}, False, "Starting"),
], ids=["kueue", "volcano", "yunikorn", "kai-scheduler"])  # fmt: skip
def test_gang_scheduling_reaches_the_rayjob(kube: KubeEmulator, operator: Operator, scheduling: dict[str, str],
                                            labels: dict[str, str], suspend: bool, phase: str) -> None:
    """spec.scheduling becomes the RayJob's labels (and suspend for Kueue), accepted by KubeRay's CRD schema."""
    name = f"gang-{scheduling['scheduler'].split('-')[0]}"
    kube.create(RLJ, "rljobs", manifest(name, scheduling=scheduling), "default")
    rayjob = wait_for(lambda: kube.find(RAY, "rayjobs", f"{name}-a1"), f"RayJob {name}-a1")
    assert labels.items() <= rayjob["metadata"]["labels"].items()
    assert rayjob["spec"]["suspend"] is suspend
    wait_for(phase_is(kube, name, phase), f"phase {phase}")
    if scheduling["scheduler"] == "kueue":  # Kueue admits the workload: it unsuspends the RayJob
        kube.patch(RAY, "rayjobs", f"{name}-a1", {"spec": {"suspend": False}})
        kuberay(kube, f"{name}-a1", "Running", "RUNNING")
        wait_for(phase_is(kube, name, "Running"), "phase Running once admitted")
        assert kube.get(RAY, "rayjobs", f"{name}-a1")["spec"]["suspend"] is False  # the operator leaves it


def test_metrics_and_health_endpoint(kube: KubeEmulator, operator: Operator) -> None:
    url = f"http://127.0.0.1:{operator.metrics_port}"
    text = wait_for(lambda: _fetch(url + "/metrics"), "metrics endpoint")
    assert "rljob_reconciles_total" in text and 'rljob_jobs{phase="Running"}' in text
    assert "rljob_attempts_total" in text and "rljob_reconcile_duration_seconds_bucket" in text
    assert _fetch(url + "/healthz") == "ok\n"


def _fetch(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.read().decode()
    except OSError:
        return ""


def test_spec_edits_while_running(kube: KubeEmulator, operator: Operator) -> None:
    """Live edits apply in place, pod/config edits start a resuming attempt, a new checkpoint URI is refused."""
    kube.create(RLJ, "rljobs", manifest("edit"), "default")
    wait_for(lambda: kube.find(RAY, "rayjobs", "edit-a1"), "RayJob edit-a1")
    # KubeRay puts a finalizer on its RayJobs and removes it once the Ray cluster is torn down.
    kube.patch(RAY, "rayjobs", "edit-a1", {"metadata": {"finalizers": ["ray.io/rayjob-finalizer"]}})
    kuberay(kube, "edit-a1", "Running", "RUNNING")
    wait_for(phase_is(kube, "edit", "Running"), "phase Running")

    kube.patch(RLJ, "rljobs", "edit", {"spec": {"runPolicy": {"backoffLimit": 5}}})  # live
    wait_for(lambda: status(kube, "edit").get("observedGeneration") == 2, "generation 2 observed")
    assert condition(kube, "edit", "SpecApplied")["status"] == "True"
    assert status(kube, "edit")["phase"] == "Running" and kube.find(RAY, "rayjobs", "edit-a2") is None

    config = manifest("edit")["spec"]["config"]
    config["trainer"]["n_gpus_per_node"] = 1  # world size 2 -> 1: checkpoints do not depend on it
    kube.patch(RLJ, "rljobs", "edit", {"spec": {"config": config}})
    wait_for(lambda: kube.get(RAY, "rayjobs", "edit-a1")["metadata"].get("deletionTimestamp"), "edit-a1 stopping")
    wait_for(phase_is(kube, "edit", "Restarting"), "phase Restarting")
    assert condition(kube, "edit", "SpecApplied")["reason"] == "Restarting"
    time.sleep(1)
    assert kube.find(RAY, "rayjobs", "edit-a2") is None  # never two attempts at once
    kube.patch(RAY, "rayjobs", "edit-a1", {"metadata": {"finalizers": None}})  # KubeRay: cluster gone
    second = wait_for(lambda: kube.find(RAY, "rayjobs", "edit-a2"), "RayJob edit-a2 after the edit")
    assert "n_gpus_per_node: 1" in kube.get("v1", "configmaps", "edit-config")["data"]["config.yaml"]
    assert "trainer.resume_mode=auto" in second["spec"]["entrypoint"]
    wait_for(lambda: status(kube, "edit").get("attempt") == 2, "status.attempt 2")
    changed = [e["message"] for e in events_for(kube, "edit") if e["reason"] == "SpecChanged"]
    assert len(changed) == 1 and "spec.config changed" in changed[0], changed

    kube.patch(RLJ, "rljobs", "edit", {"spec": {"checkpoint": {"uri": "file:///tmp/elsewhere"}}})  # refused
    wait_for(lambda: condition(kube, "edit", "SpecApplied").get("reason") == "CheckpointChangeRefused",
             "SpecApplied=False CheckpointChangeRefused")
    refused = wait_for(lambda: [e for e in events_for(kube, "edit") if e["reason"] == "SpecChangeRefused"],
                       "SpecChangeRefused Event")
    assert len(refused) == 1 and refused[0]["type"] == "Warning" and "file:///tmp/elsewhere" in refused[0]["message"]
    kuberay(kube, "edit-a2", "Failed", "FAILED", reason="AppFailed", message="preempted")
    third = wait_for(lambda: kube.find(RAY, "rayjobs", "edit-a3"), "RayJob edit-a3 (retry)")
    assert "default_local_dir=file:///tmp/hybridflow/checkpoints" in third["spec"]["entrypoint"]
    assert "elsewhere" not in kube.get("v1", "configmaps", "edit-config")["data"]["config.yaml"]
    # The operator creates the RayJob, then writes the status: wait for the write rather than race it.
    wait_for(lambda: status(kube, "edit").get("phase") in ("Retrying", "Pending", "Starting"), "phase after the retry")


def _nested(depth: int, leaf: Any = 1) -> Any:
    """A value `depth` mappings deep: {"a": {"a": ... leaf}}."""
    for _ in range(depth):
        leaf = {"a": leaf}
    return leaf


def _config_with(group: str, key: str, value: Any) -> dict[str, Any]:
    config = copy.deepcopy(manifest("x")["spec"]["config"])
    config.setdefault(group, {})[key] = value
    return config


# Issue 12: the worst inputs the fuzz found, as the API server hands them to the operator (JSON, so no
# YAML limits apply): each must cost one validation and one status write, never a crash or a retry loop.
WORST = {
    "worst-deep-free-form": {"config": _config_with("reward_model", "reward_kwargs", _nested(300))},
    "worst-deep-pod": {"pod": {"affinity": _nested(300)}},
    "worst-huge-string": {"config": _config_with("trainer", "nnodes", "9" * 400_000 + "x")},
    "worst-deep-value": {"config": _config_with("trainer", "project_name", _nested(250, "p"))},
    "worst-deep-unknown-key": {"config": {**manifest("x")["spec"]["config"], "deep": _nested(300)}},
}


def test_worst_inputs_cost_one_status_write_each(kube: KubeEmulator, operator: Operator) -> None:
    for name, spec in WORST.items():
        kube.create(RLJ, "rljobs", manifest(name, **spec), "default")
    for name in WORST:
        wait_for(phase_is(kube, name, "Invalid"), f"{name}: phase Invalid", timeout=30)
        validated = condition(kube, name, "Validated")
        assert validated["status"] == "False", validated
        assert len(validated["message"]) < 20_000, f"{name}: {len(validated['message'])} characters"
        wait_for(lambda n=name: "kopf.zalando.org/last-handled-configuration" in (  # kopf's own write, last
            kube.get(RLJ, "rljobs", n)["metadata"].get("annotations") or {}), f"{name}: handled by kopf")
    versions = {name: kube.get(RLJ, "rljobs", name)["metadata"]["resourceVersion"] for name in WORST}
    patches = kube.count_requests(("patch",), "rljobs")
    time.sleep(3)  # a resync (2 s) later: nothing rewritten, nothing retried
    assert {name: kube.get(RLJ, "rljobs", name)["metadata"]["resourceVersion"] for name in WORST} == versions
    assert kube.count_requests(("patch",), "rljobs") == patches
    for name in WORST:
        assert kube.list(RAY, "rayjobs", labels=f"rl.hybridflow.dev/rljob={name}") == []
        assert len([e for e in events_for(kube, name) if e["reason"] == "InvalidSpec"]) == 1
    assert operator.metric("rljob_reconcile_errors_total") == 0
    assert "Traceback" not in operator.log.read_text(), operator.log.read_text()[-3000:]
