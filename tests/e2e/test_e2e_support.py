"""The e2e support code on its own: kubelet-like env/volumes, the KubeRay stand-in's state machine, the manifest.

The state-machine tests use the operator's real builders for the RayJob and ConfigMap, and a trainer
config that main_ppo rejects at once (exit 2, before Ray), so the driver is real but quick and no Ray
cluster is needed.
"""

from __future__ import annotations

import base64
import pathlib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.local.kuberay import FINALIZER, KubeRayStandIn, runtime_env_vars
from e2e.local.pod import PodFields, PodNotReady, PodRoot, expand, resolve_env
from e2e.local.workers import (
    HEAD_GROUP,
    PORT_FLAGS,
    ClusterPods,
    build_pod,
    pod_generate_name,
    pod_status,
    ray_start_argv,
    start_params,
)
from rljob_operator import api, builders
from rljob_operator.validation import check_rljob
from tests.support.kube_emulator import KubeEmulator
from tests.support.operator_proc import wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
RAY = "ray.io/v1"
POD = PodFields(name="job-abcde-head-x1y2z", namespace="team")
OBJECTS: dict[tuple[str, str], dict[str, Any]] = {
    ("Secret", "creds"): {"data": {"AWS_ACCESS_KEY_ID": base64.b64encode(b"AKIA").decode(),
                                   "bad key": base64.b64encode(b"x").decode()}},
    ("ConfigMap", "settings"): {"data": {"LEVEL": "debug", "config.yaml": "a: 1\n"}},
}


def read(kind: str, name: str) -> dict[str, Any] | None:
    return OBJECTS.get((kind, name))


# ---- pod.py ------------------------------------------------------------------------------------


def test_env_follows_kubelet_order_and_sources() -> None:
    container = {
        "envFrom": [{"secretRef": {"name": "creds"}}, {"configMapRef": {"name": "settings"}, "prefix": "CM_"}],
        "env": [
            {"name": "LEVEL", "value": "info"},
            {"name": "CM_LEVEL", "value": "override"},  # env wins over envFrom
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "AWS_ACCESS_KEY_ID"}}},
            {"name": "URL", "value": "http://$(NS).svc/$(MISSING)/$$(NS)"},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k", "optional": True}}},
        ],
    }
    env = resolve_env(container, POD, read)
    assert env == {"AWS_ACCESS_KEY_ID": "AKIA", "CM_LEVEL": "override", "CM_config.yaml": "a: 1\n",
                   "LEVEL": "info", "NS": "team", "KEY": "AKIA", "URL": "http://team.svc/$(MISSING)/$(NS)"}
    assert "bad key" not in env  # not a valid variable name: the kubelet skips it


@pytest.mark.parametrize(("var", "needle"), [
    ({"name": "X", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}, "secret 'absent' not found"),
    ({"name": "X", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nokey"}}}, "couldn't find key nokey"),
    ({"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}, "not emulated"),
    ({"name": "X", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}, "not emulated"),
])
def test_unresolvable_env_keeps_the_container_from_starting(var: dict[str, Any], needle: str) -> None:
    with pytest.raises(PodNotReady, match="CreateContainerConfigError") as err:
        resolve_env({"env": [var]}, POD, read)
    assert needle in str(err.value)


def test_expand_escapes_and_keeps_unknown() -> None:
    assert expand("$(A)-$(B)-$$(A)-$", {"A": "1"}) == "1-$(B)-$(A)-$"


def test_volumes_become_files_under_the_pod_root(tmp_path: pathlib.Path) -> None:
    spec = {"volumes": [{"name": "cfg", "configMap": {"name": "settings"}},
                        {"name": "sec", "secret": {"secretName": "creds",
                                                   "items": [{"key": "AWS_ACCESS_KEY_ID", "path": "id/key"}]}},
                        {"name": "shm", "emptyDir": {"medium": "Memory"}}]}
    container = {"volumeMounts": [{"name": "cfg", "mountPath": "/etc/hybridflow"},
                                  {"name": "sec", "mountPath": "/var/run/creds"},
                                  {"name": "shm", "mountPath": "/dev/shm"}]}
    root = PodRoot(tmp_path)
    root.mount_volumes(spec, container, read)
    assert root.local("/etc/hybridflow/config.yaml").read_text() == "a: 1\n"
    assert root.local("/var/run/creds/id/key").read_text() == "AKIA"
    assert root.local("/dev/shm").is_dir()
    with pytest.raises(ValueError, match="not an absolute path"):
        root.local("../escape")
    with pytest.raises(PodNotReady, match="FailedMount"):
        root.mount_volumes(spec, {"volumeMounts": [{"name": "other", "mountPath": "/x"}]}, read)


def test_runtime_env_yaml() -> None:
    assert runtime_env_vars(None) == {}
    assert runtime_env_vars("env_vars:\n  A: 1\n") == {"A": "1"}
    with pytest.raises(ValueError, match=r"\['pip'\] are not supported"):
        runtime_env_vars("pip: [torch]\n")


# ---- the state machine against the emulator ------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[tuple[KubeEmulator, KubeRayStandIn]]:
    kube = KubeEmulator().start()
    # No Ray cluster: the drivers here exit on their config before they would connect to one.
    standin = KubeRayStandIn(kube, "127.0.0.1:1", tmp_path / "kuberay", poll_s=0.2, run_workers=False).start()
    try:
        yield kube, standin
    finally:
        standin.stop()
        kube.stop()


def children(**spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The operator's ConfigMap and RayJob for the tiny example, with a config main_ppo rejects (exit 2)."""
    doc = yaml.safe_load((ROOT / "examples" / "tiny_grpo_rljob.yaml").read_text())
    doc["metadata"].update(namespace="default", uid="11111111-2222-3333-4444-555555555555")
    doc["spec"].update(spec)
    rljob = api.RLJob.model_validate(doc)
    configmap, rayjob = builders.build_configmap(rljob), builders.build_rayjob(rljob, 1)
    for child in (configmap, rayjob):
        del child["metadata"]["ownerReferences"]  # no RLJob in this emulator
    configmap["data"]["config.yaml"] = "trainer:\n  nnodes: 0\n"
    return configmap, rayjob


def rayjob_status(kube: KubeEmulator, name: str) -> dict[str, Any]:
    return (kube.get(RAY, "rayjobs", name).get("status")) or {}


def test_failed_entrypoint_is_reported_like_kuberay(cluster: tuple[KubeEmulator, KubeRayStandIn]) -> None:
    kube, standin = cluster
    configmap, rayjob = children()
    kube.create("v1", "configmaps", configmap, "default")
    kube.create(RAY, "rayjobs", rayjob, "default")
    name = rayjob["metadata"]["name"]
    wait_for(lambda: rayjob_status(kube, name).get("jobDeploymentStatus") == "Failed", "RayJob Failed", 60)
    status = rayjob_status(kube, name)
    assert (status["jobStatus"], status["reason"], status["failed"]) == ("FAILED", "AppFailed", 1)
    assert "exit code 2" in status["message"] and "invalid trainer config" in status["message"]
    assert status["jobId"].startswith(f"{name}-") and status["rayClusterName"].startswith(f"{name}-")
    assert status["startTime"] <= status["endTime"]
    assert FINALIZER in kube.get(RAY, "rayjobs", name)["metadata"]["finalizers"]
    wait_for(lambda: kube.find(RAY, "rayclusters", status["rayClusterName"]) is None, "RayCluster deleted", 10)
    driver = standin.driver(name)
    assert driver.argv[1:4] == ["-m", "hybridflow.trainer.main_ppo",
                                str(standin.workdir / "default" / name / "pod" / "etc/hybridflow/config.yaml")]
    assert driver.env["RLJOB_NAMESPACE"] == "default" and driver.env["HYBRIDFLOW_ATTEMPT"] == "1"
    assert driver.env["RAY_ADDRESS"] == "127.0.0.1:1"

    kube.delete(RAY, "rayjobs", name)  # KubeRay drops its finalizer, then the object goes
    wait_for(lambda: kube.find(RAY, "rayjobs", name) is None, "RayJob deleted", 10)


def test_missing_secret_holds_the_job_in_initializing(cluster: tuple[KubeEmulator, KubeRayStandIn]) -> None:
    kube, standin = cluster
    configmap, rayjob = children(checkpoint={"uri": "s3://b/p", "secretRef": {"name": "s3-creds"}})
    kube.create("v1", "configmaps", configmap, "default")
    kube.create(RAY, "rayjobs", rayjob, "default")
    name = rayjob["metadata"]["name"]
    wait_for(lambda: "secret 's3-creds' not found" in standin.waiting.get(("default", name), ""),
             "the stand-in waiting for the Secret", 20)
    assert rayjob_status(kube, name)["jobDeploymentStatus"] == "Initializing"
    with pytest.raises(KeyError, match="no submitted job"):
        standin.driver(name)
    kube.create("v1", "secrets", {"metadata": {"name": "s3-creds"}, "data": {
        "AWS_ACCESS_KEY_ID": base64.b64encode(b"from-secret").decode()}}, "default")
    wait_for(lambda: rayjob_status(kube, name).get("jobDeploymentStatus") == "Failed", "RayJob ran and failed", 60)
    assert standin.driver(name).env["AWS_ACCESS_KEY_ID"] == "from-secret"
    assert ("default", name) not in standin.waiting


def test_created_suspended_never_runs(cluster: tuple[KubeEmulator, KubeRayStandIn]) -> None:
    kube, standin = cluster
    configmap, rayjob = children(suspend=True)
    assert rayjob["spec"]["suspend"] is True
    kube.create("v1", "configmaps", configmap, "default")
    kube.create(RAY, "rayjobs", rayjob, "default")
    name = rayjob["metadata"]["name"]
    wait_for(lambda: rayjob_status(kube, name).get("jobDeploymentStatus") == "Suspended", "RayJob Suspended", 20)
    assert kube.list(RAY, "rayclusters") == []
    kube.patch(RAY, "rayjobs", name, {"spec": {"suspend": False}})
    wait_for(lambda: rayjob_status(kube, name).get("jobDeploymentStatus") == "Failed", "unsuspended, ran", 60)


# ---- worker groups (workers.py) ------------------------------------------------------------------------

ROLE_GROUP = {
    "groupName": "rollout", "replicas": 1,
    "rayStartParams": {"resources": '\'{"rljob.role/rollout": 1}\''},
    "template": {"metadata": {"labels": {"rl.hybridflow.dev/role": "rollout", "ray.io/group": "wrong"}},
                 "spec": {"containers": [{"name": "ray-worker", "resources": {
                     "requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1500m", "memory": "2Gi"}}}]}},
}  # fmt: skip


def test_worker_pod_is_what_kuberay_builds() -> None:
    raycluster = {"metadata": {"name": "job-a1-x2c4v", "namespace": "team", "uid": "u-1"}}
    pod = build_pod(raycluster, "worker", "rollout", ROLE_GROUP["template"], ["ray", "start", "--block"])
    assert pod["metadata"]["generateName"] == "job-a1-x2c4v-rollout-worker-"
    assert pod["metadata"]["labels"] == {
        "rl.hybridflow.dev/role": "rollout", "ray.io/cluster": "job-a1-x2c4v", "ray.io/node-type": "worker",
        "ray.io/group": "rollout", "ray.io/is-ray-node": "yes", "ray.io/identifier": "job-a1-x2c4v-worker",
        "app.kubernetes.io/name": "kuberay", "app.kubernetes.io/created-by": "kuberay-operator"}
    assert pod["metadata"]["ownerReferences"] == [{"apiVersion": RAY, "kind": "RayCluster", "name": "job-a1-x2c4v",
                                                   "uid": "u-1", "controller": True, "blockOwnerDeletion": True}]
    assert pod["spec"]["containers"][0]["args"] == ["ulimit -n 65536; ray start --block"]
    assert pod_generate_name("job-a1-x2c4v", "head", HEAD_GROUP) == "job-a1-x2c4v-head-"
    assert pod_generate_name("x" * 60, "worker", "g") == "x" * 50 + "-worker-"  # KubeRay cuts the prefix at 50


def test_worker_nodes_start_with_the_groups_params_and_free_ports(tmp_path: pathlib.Path) -> None:
    params = start_params(ROLE_GROUP)
    # KubeRay: num-cpus and memory from the limits (rounded up, as Go's Quantity.Value), the group's own params as given
    assert params == {"resources": '\'{"rljob.role/rollout": 1}\'', "num-cpus": "2", "memory": str(2 << 30)}
    assert start_params({**ROLE_GROUP, "rayStartParams": {"num-cpus": "0"}})["num-cpus"] == "0"
    requests_only = {"groupName": "g", "template": {"spec": {"containers": [{"name": "ray-worker", "resources": {
        "requests": {"cpu": "3", "memory": "1Gi", "nvidia.com/gpu": "1"}}}]}}}
    assert start_params(requests_only) == {"num-cpus": "3"}  # memory and GPUs come from limits only
    argv = ray_start_argv("ray", "127.0.0.1:6379", {**params, "block": "true", "num-gpus": "0"}, tmp_path)
    assert argv[:4] == ["ray", "start", "--address=127.0.0.1:6379", "--block"]
    assert '--resources={"rljob.role/rollout": 1}' in argv  # unquoted as bash would
    assert "--num-cpus=2" in argv and "--num-gpus=0" in argv and argv.count("--block") == 1
    ports = [a for a in argv if a.split("=")[0].lstrip("-") in PORT_FLAGS]
    assert len(ports) == len(PORT_FLAGS) and "--metrics-export-port=8080" not in ports


def test_pod_status_reads_like_the_kubelets() -> None:
    running = pod_status("ray-worker", "Running", since="t1", started="t0", restarts=2)
    assert {c["type"]: c["status"] for c in running["conditions"]} == {
        "PodScheduled": "True", "Initialized": "True", "ContainersReady": "True", "Ready": "True"}
    (container,) = running["containerStatuses"]
    assert (container["name"], container["ready"], container["restartCount"]) == ("ray-worker", True, 2)
    assert container["state"] == {"running": {"startedAt": "t0"}}
    failed = pod_status("ray-worker", "Failed", since="t2", started="t0", exit_code=137, finished="t2")
    assert failed["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    assert {c["type"]: c["status"] for c in failed["conditions"]}["Ready"] == "False"


class Recorder:
    """The emulator client, recording each pod's status writes (phase, or the waiting container's reason)."""

    def __init__(self, kube: KubeEmulator) -> None:
        self.kube = kube
        self.phases: dict[str, list[str]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kube, name)

    def patch_status(self, api_version: str, plural: str, name: str, status: dict[str, Any],
                     namespace: str | None = "default") -> dict[str, Any]:
        reason = ((status["containerStatuses"][0]["state"].get("waiting") or {}).get("reason"))
        self.phases.setdefault(name, []).append(reason or status["phase"])
        return self.kube.patch_status(api_version, plural, name, status, namespace)


@pytest.fixture
def raycluster() -> Iterator[tuple[Recorder, dict[str, Any]]]:
    kube = KubeEmulator().start()
    try:
        spec = {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head"}]}}},
                "workerGroupSpecs": [ROLE_GROUP]}
        cluster = kube.create(RAY, "rayclusters", {"metadata": {"name": "c-1"}, "spec": spec}, "default")
        yield Recorder(kube), cluster
    finally:
        kube.stop()


def _pods(api: Recorder, cluster: dict[str, Any], tmp_path: pathlib.Path, script: str) -> ClusterPods:
    """The cluster's pods with `sh -c script` standing for `ray start` (no Ray needed)."""
    return ClusterPods(api, cluster, "unused:1", tmp_path, lambda kind, name: None, lambda env: dict(env),
                       lambda: "2026-01-01T00:00:00Z", command=lambda group, temp_dir: ["sh", "-c", script])


def test_a_lost_worker_pod_fails_goes_and_is_replaced(raycluster: tuple[Recorder, dict[str, Any]],
                                                     tmp_path: pathlib.Path) -> None:
    api, cluster = raycluster
    pods = _pods(api, cluster, tmp_path, "echo 'Ray runtime started.'; exec sleep 60")
    try:
        pods.create()
        wait_for(lambda: (pods.sync(), pods.ready())[1], "the worker pod Running and Ready", 10)
        first = pods.worker("rollout")
        listed = {p["metadata"]["labels"]["ray.io/group"]: p for p in api.list("v1", "pods")}
        assert sorted(listed) == ["headgroup", "rollout"]
        assert listed["rollout"]["metadata"]["name"] == first.pod and listed["rollout"]["status"]["phase"] == "Running"
        assert api.phases[first.pod] == ["ContainerCreating", "Running"]

        assert first.node is not None
        first.node.kill()
        assert first.node.proc.poll() == -signal.SIGKILL
        pods.sync()
        second = pods.worker("rollout")
        assert second.pod != first.pod and pods.replaced == [(first.pod, second.pod)]
        assert api.phases[first.pod] == ["ContainerCreating", "Running", "Failed"]  # then deleted, as KubeRay does
        assert api.find("v1", "pods", first.pod) is None
        assert api.get("v1", "pods", second.pod)["metadata"]["labels"]["rl.hybridflow.dev/role"] == "rollout"
        wait_for(lambda: (pods.sync(), pods.ready())[1], "the new pod Running and Ready", 10)
        assert pods.counts() == (1, 1)
        with pytest.raises(KeyError, match=r"worker groups: \['rollout'\]"):
            pods.worker("trainer")
    finally:
        pods.stop()
    assert api.list("v1", "pods") == []


def test_a_node_that_never_comes_up_crash_loops_in_its_pod(raycluster: tuple[Recorder, dict[str, Any]],
                                                          tmp_path: pathlib.Path) -> None:
    api, cluster = raycluster
    pods = _pods(api, cluster, tmp_path, "echo cannot reach the head; exit 3")
    try:
        pods.create()
        slot = pods.worker("rollout")
        wait_for(lambda: (pods.sync(), slot.restarts)[1] == 1, "the container restarting", 10)
        pods.sync()
        assert pods.worker("rollout").pod == slot.pod and not pods.ready()  # same pod: the kubelet restarts it
        status = api.get("v1", "pods", slot.pod)["status"]
        (container,) = status["containerStatuses"]
        assert (container["restartCount"], container["state"]["waiting"]["reason"]) == (1, "CrashLoopBackOff")
        assert container["lastState"]["terminated"]["exitCode"] == 3
        assert pods.waiting is not None and "exited with 3" in pods.waiting and "cannot reach the head" in pods.waiting
    finally:
        pods.stop()


# ---- the shared manifest ----------------------------------------------------------------------------


def test_cluster_manifest_is_a_valid_rljob(tmp_path: pathlib.Path) -> None:
    """What e2e/cluster/*.sh apply: `python -m e2e.local.manifest ...` passes `rljob validate`'s checks."""
    out = subprocess.run(
        [sys.executable, "-m", "e2e.local.manifest", "e2e-kind", "--inputs", "/home/ray/demo",
         "--checkpoint-uri", "s3://rljob-e2e/runs/e2e-kind", "--secret", "s3-credentials",
         "--image", "registry.local/trainer-e2e:1", "trainer.total_training_steps=3"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout
    (job,) = list(yaml.safe_load_all(out))
    assert check_rljob(job).errors == []
    config = job["spec"]["config"]
    assert config["actor_rollout_ref"]["model"]["path"] == "/home/ray/demo/model"
    assert config["actor_rollout_ref"]["rollout"]["n"] == 4  # survives YAML 1.1 readers: every key is quoted
    assert '"n": 4' in out and config["trainer"]["total_training_steps"] == 3
    assert job["spec"]["checkpoint"] == {"uri": "s3://rljob-e2e/runs/e2e-kind", "secretRef": {"name": "s3-credentials"}}
    assert job["spec"]["image"] == "registry.local/trainer-e2e:1"


# ---- the cluster scripts (not run here: no Docker engine; checked for what can be checked) ---------------

CLUSTER = ROOT / "e2e" / "cluster"


def test_verify_cli_checks_commits_like_the_trainer(tmp_path: pathlib.Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from e2e.cluster import verify as verify_cli
    from hybridflow import checkpoint

    root = str(tmp_path / "ckpt")

    def verify(*args: str) -> tuple[int, str, str]:
        code = verify_cli.main([root, *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    assert verify("--wait-latest", "0.3")[0] == 1
    payload = tmp_path / "ckpt" / "global_step_2" / "actor" / "model.bin"
    payload.parent.mkdir(parents=True)
    payload.write_bytes(b"weights")
    checkpoint.commit_step(root, 2)
    code, out, _ = verify("--wait-latest", "5")
    assert (code, out.strip()) == (0, "2")
    assert verify("--committed", "2")[0] == 0
    code, _, err = verify("--committed", "3")
    assert code == 1 and "is 2, expected 3" in err
    payload.write_bytes(b"WEIGHTS")  # same size, other bytes: only the deep check sees it
    code, _, err = verify("--committed", "2")
    assert code == 1 and "checksum mismatch" in err


@pytest.mark.parametrize("script", ["kind.sh", "gpu.sh", "lib.sh"])
def test_cluster_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(CLUSTER / script)], check=True)


def test_cluster_scripts_use_files_and_chart_values_that_exist() -> None:
    text = (CLUSTER / "kind.sh").read_text() + (CLUSTER / "gpu.sh").read_text()
    for path in ("operator/Dockerfile", "trainer_image/Dockerfile", "helm/rljob-operator"):
        assert f"$ROOT/{path}" in text and (ROOT / path).exists(), path
    for path in ("Dockerfile.e2e", "minio.yaml"):
        assert (CLUSTER / path).exists()
    values = yaml.safe_load((ROOT / "helm" / "rljob-operator" / "values.yaml").read_text())
    keys = sorted(set(re.findall(r"--set \"?([a-zA-Z.]+)=", text)))
    assert {"image.repository", "image.tag", "operator.resyncSeconds"} <= set(keys), keys
    for key in keys:
        node: Any = values
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"chart value {key} set by the scripts does not exist"
            node = node[part]
    dockerfile = (CLUSTER / "Dockerfile.e2e").read_text()
    assert "prepare(Path('/home/ray/demo'))" in dockerfile and "--inputs /home/ray/demo" in (CLUSTER / "lib.sh").read_text()
