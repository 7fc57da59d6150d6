"""A small stand-in for KubeRay's RayJob controller: RayJobs in the API emulator run on a local Ray cluster.

What it does, following KubeRay v1's RayJob reconciler (ray-operator/controllers/ray/rayjob_controller.go):

- a new RayJob gets the `ray.io/rayjob-finalizer`, a `jobId` and a `rayClusterName` (`<rayjob>-<5
  random chars>` each), `startTime` and `jobDeploymentStatus: Initializing`;
- Initializing: the RayCluster object is created (owned by the RayJob, state `ready`: the local cluster
  is already up), `dashboardURL` is set to `<cluster>-head-svc.<ns>.svc.cluster.local:8265`, and the job
  is submitted; then `Running` with `jobStatus: PENDING`, `RUNNING` once the entrypoint runs;
- the job ends: `Complete` + `SUCCEEDED`, or `Failed` + `FAILED` with reason `AppFailed` and Ray's
  message (exit code and the log tail), `endTime`, `succeeded`/`failed` counts; the RayCluster is
  deleted when `shutdownAfterJobFinishes`;
- `spec.suspend`: the job is stopped, the RayCluster deleted, `Suspended`; unsuspending starts over;
- deletion: the job is stopped (SIGTERM, SIGKILL 3 s later, as Ray's job manager does) and the
  finalizer is removed.

The RayCluster's pods are kept as KubeRay and the kubelet keep them (`workers.py`): a head Pod, and for
each worker group `replicas` Pods whose Ray worker nodes (`ray start --address=<head> --block`, the group's
rayStartParams, e.g. a role's `rljob.role/<role>` resource) join the local head; the job is submitted once
every pod is Running and Ready (KubeRay waits for the RayCluster's state `ready`); a worker node that is
lost (`kill_worker`) is replaced by a new Pod with a new name; the pods go when the RayCluster goes.

"Submitting the job" is what Ray's job supervisor does on the head node: run the entrypoint as a shell
process with RAY_ADDRESS pointing at the cluster and the runtime env's `env_vars` set. The head pod's
environment and mounts come first, resolved like the kubelet would (`pod.py`): ConfigMap/Secret
volumes become files under a folder standing for the container's filesystem, and env/envFrom resolve
Secret and ConfigMap keys from the emulator. The entrypoint is mapped to this machine with
`rljob_operator.localrun.localize_entrypoint` (the mounted config path becomes the local file, `python`
the current interpreter), the very function `rljob run` uses; so the stand-in runs the trainer's
entrypoint, nothing else. No Ray dashboard is needed (Ray's job API would need one): the driver runs as
a local process group that `kill()` can crash like a lost head node would.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import string
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from e2e.local.pod import PodFields, PodNotReady, PodRoot, resolve_env
from e2e.local.raycluster import RAY_ENV
from e2e.local.workers import ClusterPods, WorkerNode
from rljob_operator import names
from rljob_operator.localrun import localize_entrypoint
from tests.support.kube_emulator import KubeEmulator
from tests.support.kube_store import ApiError

Obj = dict[str, Any]
RAY = "ray.io/v1"
FINALIZER = "ray.io/rayjob-finalizer"
#: Ray's job manager waits this long after SIGTERM before SIGKILL (RAY_JOB_STOP_WAIT_TIME_S default).
STOP_GRACE_S = 3.0
#: How much of the driver log goes into the failure message (Ray keeps the last 20,000 characters).
LOG_TAIL_CHARS = 2000
#: Variables of the "image" the driver inherits; nothing else of this machine's environment leaks in.
#: (VLLM_RPC_BASE_PATH: where vLLM puts its sockets; tests/conftest.py points it at a folder it removes.)
IMAGE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "VLLM_RPC_BASE_PATH")
_PLURALS = {"ConfigMap": "configmaps", "Secret": "secrets"}

log = logging.getLogger("e2e.kuberay")


def rfc3339(ts: float | None = None) -> str:
    """A Kubernetes timestamp (UTC, seconds, Z)."""
    return datetime.fromtimestamp(time.time() if ts is None else ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def random_suffix(n: int = 5) -> str:
    """KubeRay's `rand.String(5)`-style suffix (lowercase letters and digits)."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(n))


@dataclass
class Driver:
    """One submitted Ray job: the entrypoint process (its own process group) and its log."""

    rayjob: str
    namespace: str
    job_id: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes]
    started: float = field(default_factory=time.time)
    stop_deadline: float | None = None  # set by a stop request: SIGKILL after this moment
    killed: bool = False

    def poll(self) -> int | None:
        """The exit status (negative: killed by that signal), None while running."""
        if self.stop_deadline is not None and self.proc.poll() is None and time.monotonic() > self.stop_deadline:
            self._signal(signal.SIGKILL)
        return self.proc.poll()

    def stop(self) -> None:
        """Ray's `stop_job`: SIGTERM now, SIGKILL after the grace period (see `poll`)."""
        if self.proc.poll() is None and self.stop_deadline is None:
            self._signal(signal.SIGTERM)
            self.stop_deadline = time.monotonic() + STOP_GRACE_S

    def kill(self) -> None:
        """SIGKILL the whole process group now (a crashed driver; Ray then cleans up its actors)."""
        self.killed = True
        self._signal(signal.SIGKILL)
        self.proc.wait(30)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def output(self) -> str:
        """Everything the driver printed so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class KubeRayStandIn:
    """Watches RayJobs in `kube` from a thread and runs them on the Ray cluster at `ray_address`."""

    def __init__(self, kube: KubeEmulator, ray_address: str, workdir: Path,
                 env_overrides: Mapping[str, str] | None = None, poll_s: float = 0.5,
                 run_workers: bool = True) -> None:
        """`env_overrides` are set last in every driver's (and worker node's) environment: what a pod has to
        itself but a shared machine does not (e.g. the metrics port: every pod may listen on 8000, processes
        here may not). `run_workers=False`: worker groups get no pods or Ray nodes (head only), for tests
        without a Ray cluster at `ray_address`.
        """
        self.kube = kube
        self.ray_address = ray_address
        self.workdir = workdir
        self.env_overrides = dict(env_overrides or {})
        self.poll_s = poll_s
        self.run_workers = run_workers
        #: Why a RayJob's head "pod" cannot start yet, by (namespace, name): what `kubectl describe pod` shows.
        self.waiting: dict[tuple[str, str], str] = {}
        self._drivers: dict[str, Driver] = {}  # by RayJob uid
        self._pods: dict[tuple[str, str], ClusterPods] = {}  # by RayCluster (namespace, name)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self) -> KubeRayStandIn:
        """Start watching (a store listener wakes the loop on every change; it also polls drivers)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kube.store.listeners.append(self._wake.set)
        self._thread = threading.Thread(target=self._loop, name="kuberay-stand-in", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop and kill every driver still running."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
        if self._wake.set in self.kube.store.listeners:
            self.kube.store.listeners.remove(self._wake.set)
        with self._lock:
            drivers = list(self._drivers.values())
        for driver in drivers:
            if driver.proc.poll() is None:
                driver.kill()
        with self._lock:
            clusters, self._pods = list(self._pods.values()), {}
        for pods in clusters:
            pods.stop()

    # ---- what tests use --------------------------------------------------------------------------
    def driver(self, rayjob: str, namespace: str = "default") -> Driver:
        """The driver of a RayJob (raises KeyError, saying which RayJobs have one, when not submitted)."""
        with self._lock:
            found = [d for d in self._drivers.values() if (d.namespace, d.rayjob) == (namespace, rayjob)]
            known = sorted(f"{d.namespace}/{d.rayjob}" for d in self._drivers.values())
        if not found:
            raise KeyError(f"RayJob {namespace}/{rayjob} has no submitted job yet; submitted: {known}")
        return found[-1]

    def kill(self, rayjob: str, namespace: str = "default") -> None:
        """Crash a running Ray job (SIGKILL its driver); the next sync reports it the way KubeRay would."""
        self.driver(rayjob, namespace).kill()
        self._wake.set()

    def pods(self, rayjob: str, namespace: str = "default") -> ClusterPods:
        """The pods of a RayJob's RayCluster (raises KeyError, saying which clusters have pods, when none)."""
        cluster = ((self.kube.find(RAY, "rayjobs", rayjob, namespace) or {}).get("status") or {}).get("rayClusterName")
        with self._lock:
            found = self._pods.get((namespace, cluster or ""))
            known = sorted(f"{ns}/{name}" for ns, name in self._pods)
        if found is None:
            raise KeyError(f"RayJob {namespace}/{rayjob} has no RayCluster with pods (cluster {cluster!r}); "
                           f"clusters with pods: {known}")
        return found

    def kill_worker(self, rayjob: str, group: str, index: int = 0, namespace: str = "default") -> WorkerNode:
        """Lose a worker pod: SIGKILL every process of the `index`-th Ray worker node of `group` in the RayJob's
        RayCluster. The next sync does what KubeRay and the kubelet do: the Pod turns Failed and is deleted, and
        a new Pod (a new name) starts a Ray worker node with the same resources. Returns the killed node."""
        node = self.pods(rayjob, namespace).worker(group, index).node
        assert node is not None
        node.kill()
        log.warning("RayJob %s/%s: killed worker pod %s (group %s)", namespace, rayjob, node.pod, group)
        self._wake.set()
        return node

    # ---- the loop --------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.poll_s)
            self._wake.clear()
            if self._stopping.is_set():
                return
            for rayjob in self.kube.list(RAY, "rayjobs"):
                try:
                    self.sync(rayjob)
                except ApiError as err:
                    if err.code not in (404, 409):  # gone, or changed under us: the next pass sees it
                        log.exception("RayJob %s: API error", rayjob["metadata"]["name"])
                except Exception:
                    log.exception("RayJob %s: stand-in error", rayjob["metadata"]["name"])
            try:
                self._sync_pods()
            except Exception:
                log.exception("stand-in error while keeping pods")

    def sync(self, rayjob: Obj) -> None:
        """One reconcile of one RayJob (KubeRay's state machine, one transition per call)."""
        meta, spec = rayjob["metadata"], rayjob.get("spec") or {}
        status = rayjob.get("status") or {}
        name, ns = meta["name"], meta.get("namespace", "default")
        finalizers = list(meta.get("finalizers") or [])
        if meta.get("deletionTimestamp"):
            self._stop(meta["uid"])
            if FINALIZER in finalizers:
                finalizers.remove(FINALIZER)
                self.kube.patch(RAY, "rayjobs", name, {"metadata": {"finalizers": finalizers or None}}, ns)
            return
        if FINALIZER not in finalizers:
            self.kube.patch(RAY, "rayjobs", name, {"metadata": {"finalizers": [*finalizers, FINALIZER]}}, ns)
            return
        deployment = status.get("jobDeploymentStatus") or ""
        suspend = bool(spec.get("suspend"))
        if deployment == "":
            if suspend:
                self._write(rayjob, {"jobDeploymentStatus": "Suspended"})
                return
            self._write(rayjob, {
                "jobId": spec.get("jobId") or f"{name}-{random_suffix()}",
                "rayClusterName": f"{name}-{random_suffix()}",
                "jobDeploymentStatus": "Initializing",
                "startTime": rfc3339(),
            })
        elif deployment in ("Initializing", "Running") and suspend:
            self._suspend(rayjob)
        elif deployment == "Initializing":
            self._initialize(rayjob)
        elif deployment == "Running":
            self._follow(rayjob)
        elif deployment == "Suspended" and not suspend:
            self._write(rayjob, {"jobDeploymentStatus": None, "jobStatus": None})
        elif deployment in ("Complete", "Failed") and spec.get("shutdownAfterJobFinishes"):
            self._delete_cluster(rayjob)

    # ---- transitions -----------------------------------------------------------------------------
    def _initialize(self, rayjob: Obj) -> None:
        """Create the RayCluster object, then submit the job and move to Running."""
        meta, status = rayjob["metadata"], rayjob["status"]
        key = (meta.get("namespace", "default"), meta["name"])
        cluster = status["rayClusterName"]
        self._ensure_cluster(rayjob, cluster)
        try:
            pods = self._ensure_pods(rayjob, cluster)
        except PodNotReady as err:
            self._wait(key, f"a worker pod cannot start: {err}")
            return
        if not pods.ready():
            desired, ready = pods.counts()
            self._wait(key, pods.waiting or f"RayCluster {cluster}: {ready}/{desired} worker pods Running and Ready "
                                            "(KubeRay submits the job once the cluster is ready)")
            return
        try:
            driver = self._submit(rayjob, cluster, status["jobId"])
        except PodNotReady as err:
            # KubeRay keeps waiting for the head pod; so do we (and say why, like `kubectl describe pod`).
            self._wait(key, str(err))
            return
        except (RuntimeError, ValueError, yaml.YAMLError) as err:
            self._write(rayjob, {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed",
                                 "message": f"the local KubeRay stand-in cannot run this RayJob: {err}",
                                 "endTime": rfc3339(), "failed": 1, "succeeded": 0})
            return
        self.waiting.pop(key, None)
        with self._lock:
            self._drivers[meta["uid"]] = driver
        self._write(rayjob, {
            "dashboardURL": f"{cluster}-head-svc.{key[0]}.svc.cluster.local:8265",
            "jobDeploymentStatus": "Running",
            "jobStatus": "PENDING",
        })

    def _follow(self, rayjob: Obj) -> None:
        """Report the Ray job's status; on its end, Complete or Failed as KubeRay does."""
        status = rayjob["status"]
        with self._lock:
            driver = self._drivers.get(rayjob["metadata"]["uid"])
        if driver is None:
            self._write(rayjob, _ended(False, "the Ray job's driver is gone (the KubeRay stand-in was restarted "
                                              "or the head node was lost)"))
            return
        code = driver.poll()
        if code is None:
            if status.get("jobStatus") != "RUNNING":
                self._write(rayjob, {"jobStatus": "RUNNING", "rayJobInfo": {"startTime": rfc3339(driver.started)}})
            return
        if code == 0:
            self._write(rayjob, _ended(True, "Job finished successfully."))
        elif driver.stop_deadline is not None and not driver.killed:
            self._write(rayjob, {**_ended(True, "Job was intentionally stopped."), "jobStatus": "STOPPED"})
        else:
            tail = driver.output()[-LOG_TAIL_CHARS:]
            self._write(rayjob, _ended(False, f"Job entrypoint command failed with exit code {code}, last "
                                              f"available logs (truncated to {LOG_TAIL_CHARS} chars):\n{tail}"))
        self._delete_cluster_if_done(rayjob)

    def _suspend(self, rayjob: Obj) -> None:
        """Stop the job and free the cluster, then Suspended with the job fields reset."""
        self._write(rayjob, {"jobDeploymentStatus": "Suspending"})
        self._stop(rayjob["metadata"]["uid"], wait=True)
        self._delete_cluster(rayjob)
        self._write(rayjob, {"jobDeploymentStatus": "Suspended", "jobStatus": None, "rayClusterName": None,
                             "dashboardURL": None, "jobId": None, "message": None, "reason": None,
                             "rayJobInfo": None})

    # ---- pieces ----------------------------------------------------------------------------------
    def _wait(self, key: tuple[str, str], why: str) -> None:
        """Record why a RayJob cannot start yet (logged once per reason)."""
        if self.waiting.get(key) != why:
            log.warning("RayJob %s/%s: waiting: %s", *key, why)
        self.waiting[key] = why

    def _write(self, rayjob: Obj, status: Obj) -> None:
        meta = rayjob["metadata"]
        log.info("RayJob %s/%s status %s", meta.get("namespace"), meta["name"],
                 {k: v for k, v in status.items() if k != "message"})
        self.kube.patch_status(RAY, "rayjobs", meta["name"], status, meta.get("namespace", "default"))

    def _ensure_cluster(self, rayjob: Obj, cluster: str) -> None:
        meta = rayjob["metadata"]
        ns = meta.get("namespace", "default")
        if self.kube.find(RAY, "rayclusters", cluster, ns) is not None:
            return
        labels = {**(meta.get("labels") or {}), "ray.io/originated-from-cr-name": meta["name"],
                  "ray.io/originated-from-crd": "RayJob"}
        owner = {"apiVersion": RAY, "kind": "RayJob", "name": meta["name"], "uid": meta["uid"],
                 "controller": True, "blockOwnerDeletion": True}
        body = {"apiVersion": RAY, "kind": "RayCluster",
                "metadata": {"name": cluster, "namespace": ns, "labels": labels, "ownerReferences": [owner]},
                "spec": rayjob["spec"]["rayClusterSpec"]}
        self.kube.create(RAY, "rayclusters", body, ns)

    def _ensure_pods(self, rayjob: Obj, cluster: str) -> ClusterPods:
        """The RayCluster's pods (created on the first call), synced, with the cluster's status from them."""
        ns = rayjob["metadata"].get("namespace", "default")
        with self._lock:
            pods = self._pods.get((ns, cluster))
        if pods is None:
            raycluster = self.kube.get(RAY, "rayclusters", cluster, ns)
            pods = ClusterPods(self.kube, raycluster, self.ray_address, self.workdir / ns / cluster,
                               lambda kind, name: self.kube.find("v1", _PLURALS[kind], name, ns),
                               self._node_env, rfc3339, run_workers=self.run_workers)
            with self._lock:
                self._pods[(ns, cluster)] = pods
            pods.create()
        self._sync_cluster(pods)
        return pods

    def _sync_pods(self) -> None:
        """Keep every RayCluster's pods (lost ones replaced); a RayCluster that is gone takes its nodes along."""
        with self._lock:
            clusters = list(self._pods.items())
        for key, pods in clusters:
            current = self.kube.find(RAY, "rayclusters", key[1], key[0])
            if current is None or current["metadata"]["uid"] != pods.raycluster["metadata"]["uid"]:
                with self._lock:
                    self._pods.pop(key, None)
                pods.stop()
                continue
            self._sync_cluster(pods)

    def _sync_cluster(self, pods: ClusterPods) -> None:
        """Sync the pods, then write the RayCluster's status from them when it changed (KubeRay's fields)."""
        pods.sync()
        desired, ready = pods.counts()
        current = self.kube.find(RAY, "rayclusters", pods.name, pods.namespace)
        if current is None:
            return
        was = current.get("status") or {}
        # `state` turns ready once every pod is, and stays so while lost workers are replaced.
        status = {"desiredWorkerReplicas": desired, "readyWorkerReplicas": ready, "availableWorkerReplicas": ready,
                  "state": "ready" if pods.ready() or was.get("state") == "ready" else None}
        if {k: was.get(k) for k in status} != status:
            self.kube.patch_status(RAY, "rayclusters", pods.name, status, pods.namespace)

    def _node_env(self, pod_env: dict[str, str]) -> dict[str, str]:
        """A worker node's environment: the image's, the pod's, then what every process of this cluster needs."""
        return {**_image_env(), **pod_env, **RAY_ENV, "PYTHONUNBUFFERED": "1", **self.env_overrides}

    def _delete_cluster_if_done(self, rayjob: Obj) -> None:
        if (rayjob.get("spec") or {}).get("shutdownAfterJobFinishes"):
            self._delete_cluster(rayjob)

    def _delete_cluster(self, rayjob: Obj) -> None:
        cluster = (rayjob.get("status") or {}).get("rayClusterName")
        ns = rayjob["metadata"].get("namespace", "default")
        if cluster and self.kube.find(RAY, "rayclusters", cluster, ns) is not None:
            self.kube.delete(RAY, "rayclusters", cluster, ns)  # its pods go with it (ownerReferences)
        with self._lock:
            pods = self._pods.pop((ns, cluster or ""), None)
        if pods is not None:
            pods.stop()

    def _stop(self, uid: str, wait: bool = False) -> None:
        with self._lock:
            driver = self._drivers.get(uid)
        if driver is None:
            return
        driver.stop()
        while wait and driver.poll() is None:
            time.sleep(0.1)

    def _submit(self, rayjob: Obj, cluster: str, job_id: str) -> Driver:
        """Prepare the head "pod" (mounts, env) and start the entrypoint the way Ray's job supervisor does."""
        meta, spec = rayjob["metadata"], rayjob["spec"]
        ns, name = meta.get("namespace", "default"), meta["name"]
        template = spec["rayClusterSpec"]["headGroupSpec"]["template"]
        container = template["spec"]["containers"][0]  # KubeRay: the Ray container is the first one

        def read(kind: str, obj_name: str) -> Obj | None:
            return self.kube.find("v1", _PLURALS[kind], obj_name, ns)

        root = PodRoot(self.workdir / ns / name / "pod")
        root.mount_volumes(template["spec"], container, read)
        pod_env = resolve_env(container, PodFields(f"{cluster}-head-{random_suffix()}", ns), read)
        argv = localize_entrypoint(spec["entrypoint"], root.local(names.CONFIG_PATH), sys.executable)
        env = {**_image_env(), **pod_env, **runtime_env_vars(spec.get("runtimeEnvYAML")), **RAY_ENV,
               "RAY_ADDRESS": self.ray_address, "PYTHONUNBUFFERED": "1", **self.env_overrides}
        cwd = root.local("/home/ray")
        cwd.mkdir(parents=True, exist_ok=True)
        log_path = self.workdir / ns / name / "driver.log"
        with log_path.open("ab") as out:
            proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        log.info("RayJob %s/%s: submitted job %s: %s", ns, name, job_id, " ".join(argv))
        return Driver(name, ns, job_id, argv, env, log_path, proc)


def _image_env() -> dict[str, str]:
    """The "image's" variables: this machine's IMAGE_ENV, with this interpreter's bin folder first on PATH."""
    image_env = {k: os.environ[k] for k in IMAGE_ENV if k in os.environ}
    image_env["PATH"] = f"{Path(sys.executable).parent}:{image_env.get('PATH', '/usr/bin:/bin')}"
    return image_env


def runtime_env_vars(runtime_env_yaml: str | None) -> dict[str, str]:
    """The `env_vars` of a RayJob's runtimeEnvYAML; other runtime-env fields cannot be honoured here."""
    if not runtime_env_yaml:
        return {}
    runtime_env = yaml.safe_load(runtime_env_yaml) or {}
    if not isinstance(runtime_env, dict):
        raise ValueError(f"spec.runtimeEnvYAML must be a YAML mapping, got {type(runtime_env).__name__}")
    unsupported = sorted(set(runtime_env) - {"env_vars"})
    if unsupported:
        raise ValueError(f"spec.runtimeEnvYAML fields {unsupported} are not supported by the local stand-in "
                         "(only env_vars); bake them into the trainer image instead")
    return {str(k): str(v) for k, v in (runtime_env.get("env_vars") or {}).items()}


def _ended(succeeded: bool, message: str) -> Obj:
    """The status fields KubeRay writes when a Ray job reaches a terminal state."""
    now = rfc3339()
    return {
        "jobDeploymentStatus": "Complete" if succeeded else "Failed",
        "jobStatus": "SUCCEEDED" if succeeded else "FAILED",
        "reason": None if succeeded else "AppFailed",
        "message": message,
        "endTime": now,
        "rayJobInfo": {"endTime": now},
        "succeeded": 1 if succeeded else 0,
        "failed": 0 if succeeded else 1,
    }
