"""A RayCluster's pods for the KubeRay stand-in: the head pod, and worker groups as local Ray worker nodes.

What KubeRay's RayCluster controller and the kubelet do, done on this machine (names checked against KubeRay
v1's ray-operator: utils/constant.go, utils/util.go `PodName`, common/pod.go):

- every pod is created from its group's template with `generateName` `<cluster>-head-` or
  `<cluster>-<group>-worker-`, the template's labels plus KubeRay's (`ray.io/cluster`, `ray.io/group`
  (`headgroup` for the head), `ray.io/node-type` head|worker, `ray.io/is-ray-node: "yes"`,
  `ray.io/identifier`, `app.kubernetes.io/name: kuberay`, `app.kubernetes.io/created-by: kuberay-operator`)
  and a controller ownerReference to the RayCluster (so the pods go with it);
- a worker pod's container runs `ray start --address=<head> --block` with the group's rayStartParams, and
  `num-cpus` / `memory` / `num-gpus` from the container's limits when the params do not set them
  (KubeRay's generateRayStartCommand); here that is a process group of our own, started with the pod's
  environment resolved like the kubelet does (pod.py), in a folder standing for the pod's filesystem;
- the status is what the kubelet writes: Pending until the raylet has registered with the head (KubeRay's
  readiness probe asks the raylet), then Running with the Ready condition and a running container status;
- a worker node whose processes die (`kill`: SIGKILL, like a lost pod) gets what a lost pod gets: its Pod
  turns Failed (the container terminated with exit code 137), KubeRay deletes it, and since the group is
  one pod short it creates a new Pod, with a new name, whose Ray worker node starts with the same resources.

The head pod stands for the local Ray head the stand-in shares between RayJobs (`LocalRayCluster`): it is
Running once created, and it has no process of its own here. Ports that KubeRay fixes (every pod may use
8080 for metrics, 52365 for the dashboard agent) are free ports here, since the pods share one machine; the
object store is small (rayStartParams can say otherwise) since the box is small.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.local.pod import PodFields, PodNotReady, PodRoot, Reader, resolve_env
from e2e.local.raycluster import HOST, free_port, ray_cli

Obj = dict[str, Any]
RAY = "ray.io/v1"
HEAD_GROUP = "headgroup"
#: Ports a pod's `ray start` would leave at their defaults: each node here gets free ones.
PORT_FLAGS = ("node-manager-port", "object-manager-port", "metrics-export-port", "dashboard-agent-listen-port",
              "dashboard-agent-grpc-port", "runtime-env-agent-port")
#: rayStartParams the stand-in decides itself (the head's address, the ports above, blocking in the foreground).
OWN_PARAMS = frozenset({"address", "block", "temp-dir", "node-ip-address", *PORT_FLAGS})
#: Object store per worker node unless rayStartParams set `object-store-memory` (Ray's minimum is ~75 MiB).
OBJECT_STORE_BYTES = 128 << 20
#: The exit code the kubelet reports for a container killed by SIGKILL.
SIGKILL_EXIT = 128 + signal.SIGKILL

log = logging.getLogger("e2e.kuberay")


# ---- pure: pod manifests and statuses ------------------------------------------------------------------


def pod_generate_name(cluster: str, node_type: str, group: str) -> str:
    """KubeRay's `PodName(prefix, nodeType, true)`: `<cluster>-head-` or `<cluster>-<group>-worker-`."""
    prefix = cluster if node_type == "head" else f"{cluster}-{group}"
    return f"{prefix[:50]}-{node_type}-".lower()


def pod_labels(cluster: str, node_type: str, group: str, template_labels: Mapping[str, str]) -> dict[str, str]:
    """The template's labels plus KubeRay's (its own win for ray.io/node-type and ray.io/group)."""
    return {
        **template_labels,
        "ray.io/cluster": cluster,
        "ray.io/node-type": node_type,
        "ray.io/group": group,
        "ray.io/is-ray-node": "yes",
        "ray.io/identifier": f"{cluster}-{node_type}"[-63:],
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }


def build_pod(raycluster: Obj, node_type: str, group: str, template: Obj, command: list[str] | None = None) -> Obj:
    """The Pod KubeRay creates for one node of `group` (`command`: the Ray container's, when it runs one)."""
    meta = raycluster["metadata"]
    tmeta = template.get("metadata") or {}
    spec = copy.deepcopy(template.get("spec") or {})
    spec.setdefault("restartPolicy", "Always")
    spec["nodeName"] = "localhost"
    if command:
        container = spec["containers"][0]  # KubeRay: the Ray container is the first one
        container["command"] = ["/bin/bash", "-c", "--"]
        container["args"] = [f"ulimit -n 65536; {shlex.join(command)}"]
    owner = {"apiVersion": RAY, "kind": "RayCluster", "name": meta["name"], "uid": meta["uid"],
             "controller": True, "blockOwnerDeletion": True}
    metadata: Obj = {
        "generateName": pod_generate_name(meta["name"], node_type, group),
        "namespace": meta.get("namespace", "default"),
        "labels": pod_labels(meta["name"], node_type, group, tmeta.get("labels") or {}),
        "ownerReferences": [owner],
    }
    if tmeta.get("annotations"):
        metadata["annotations"] = dict(tmeta["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _conditions(ready: bool, since: str, container: str) -> list[Obj]:
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": since},
                  {"type": "Initialized", "status": "True", "lastTransitionTime": since}]
    for kind in ("ContainersReady", "Ready"):
        condition = {"type": kind, "status": "True" if ready else "False", "lastTransitionTime": since}
        if not ready:
            condition.update(reason="ContainersNotReady", message=f"containers with unready status: [{container}]")
        conditions.append(condition)
    return conditions


def pod_status(container: str, phase: str, *, since: str, started: str, restarts: int = 0,
               exit_code: int | None = None, finished: str | None = None) -> Obj:
    """A kubelet-written Pod status: Pending (container starting), Running (and Ready), or Failed (exited).

    `since`: when the conditions last changed; `started`: when the container started (RFC 3339).
    """
    ready = phase == "Running"
    state: Obj
    if phase == "Failed":
        reason = "Error" if exit_code != 0 else "Completed"
        state = {"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": started, "finishedAt": finished}}
    elif phase == "Running":
        state = {"running": {"startedAt": started}}
    else:
        state = {"waiting": {"reason": "ContainerCreating"}}
    return {
        "phase": phase,
        "conditions": _conditions(ready, since, container),
        "hostIP": HOST,
        "podIP": HOST,
        "podIPs": [{"ip": HOST}],
        "startTime": started,
        "qosClass": "Guaranteed",
        "containerStatuses": [{
            "name": container,
            "ready": ready,
            "started": ready,
            "restartCount": restarts,
            "state": state,
            "image": "local",
            "imageID": "",
        }],
    }


def _quantity(value: Any) -> float:
    """A Kubernetes quantity (`2`, `500m`, `8Gi`, `1e3`) as a number."""
    text = str(value).strip()
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30,
                "Ti": 1 << 40}
    for suffix in sorted(suffixes, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * suffixes[suffix]
    return float(text)


def start_params(group: Obj) -> dict[str, str]:
    """A worker group's `ray start` params as KubeRay completes them (generateRayStartCommand): num-cpus from
    the Ray container's CPU limit (its request when there is no limit), memory and num-gpus (a resource whose
    name ends in "gpu") from its limits, each only when rayStartParams do not set it; Go's Quantity.Value()
    rounds up."""
    params = {str(k): str(v) for k, v in (group.get("rayStartParams") or {}).items()}
    resources = group["template"]["spec"]["containers"][0].get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    cpu = limits.get("cpu") or requests.get("cpu")
    if "num-cpus" not in params and cpu:
        params["num-cpus"] = str(math.ceil(_quantity(cpu)))
    if "memory" not in params and limits.get("memory"):
        params["memory"] = str(math.ceil(_quantity(limits["memory"])))
    gpus = [v for k, v in limits.items() if k.endswith("gpu") and _quantity(v) > 0]
    if "num-gpus" not in params and gpus:
        params["num-gpus"] = str(math.ceil(_quantity(gpus[0])))
    return params


def ray_start_argv(ray: str, address: str, params: Mapping[str, str], temp_dir: Path) -> list[str]:
    """`ray start --address=... --block` with the params as KubeRay writes them (`--key=value` on a shell line,
    so a quoted value such as `'{"rljob.role/rollout": 1}'` is unquoted here as bash would), free ports."""
    argv = [ray, "start", f"--address={address}", "--block", f"--node-ip-address={HOST}", f"--temp-dir={temp_dir}"]
    argv += [f"--{flag}={free_port()}" for flag in PORT_FLAGS]
    if "object-store-memory" not in params:
        argv.append(f"--object-store-memory={OBJECT_STORE_BYTES}")
    for key, value in params.items():
        if key in OWN_PARAMS:
            continue
        argv += shlex.split(f"--{key}={value}")  # KubeRay: fmt "--%s=%s" on a bash command line
    return argv


# ---- a worker node: one pod's `ray start` ----------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (Ray's workers, and what they spawn, e.g. a vLLM engine core)."""
    try:
        import psutil

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:  # noqa: BLE001 - psutil missing or the process is gone: the process group still applies
        return []


@dataclass
class WorkerNode:
    """One worker pod's Ray node: `ray start --block` as its own process group, and its log."""

    pod: str
    group: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log_path: Path
    temp_dir: Path
    proc: subprocess.Popen[bytes]
    started: float = field(default_factory=time.time)
    ready_at: float | None = None
    #: The pod's Running/Ready status has been written.
    reported: bool = False
    killed: bool = False

    @classmethod
    def start(cls, pod: str, group: str, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path,
              temp_dir: Path) -> WorkerNode:
        """Start `argv` in its own session (so `kill` reaches its whole process group and nothing else)."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cwd.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as out:
            proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        return cls(pod, group, argv, env, cwd, log_path, temp_dir, proc)

    def output(self) -> str:
        """What `ray start` printed (`kubectl logs` of the pod)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def is_ready(self) -> bool:
        """The raylet registered with the head: `ray start` prints its banner only after that."""
        if self.ready_at is None and self.proc.poll() is None and "Ray runtime started" in self.output():
            self.ready_at = time.time()
        return self.ready_at is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL every process of the node at once, as when its pod is lost, and reap the leader."""
        self.killed = True
        pids = [self.proc.pid, *_descendants(self.proc.pid)]
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in pids:  # a process that left the group (its own session) dies with the pod all the same
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the group's last members go after their leader
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            time.sleep(0.1)


# ---- one RayCluster's pods ------------------------------------------------------------------------------


@dataclass
class _Slot:
    """One pod KubeRay keeps: the current Pod's name, and for a worker its group and Ray node."""

    pod: str
    created: str
    #: The worker group's spec; None for the head pod.
    group: Obj | None = None
    #: The worker's Ray node; None until its container could start (or for the head).
    node: WorkerNode | None = None
    #: The worker container's command line (`ray start ...`) and the node's temp dir.
    argv: list[str] = field(default_factory=list)
    temp_dir: Path | None = None
    #: Container restarts in this pod (a node that exits before it was ever ready: CrashLoopBackOff).
    restarts: int = 0
    #: When the crashed container is started again (monotonic clock); None while it runs.
    retry_at: float | None = None

    @property
    def group_name(self) -> str:
        """The pod's ray.io/group."""
        return HEAD_GROUP if self.group is None else str(self.group["groupName"])

    @property
    def container(self) -> str:
        """The name of the pod's Ray container."""
        return "" if self.group is None else _container(self.group["template"])

    def ready(self) -> bool:
        """A worker whose Ray node is up and whose pod says so; the head always."""
        return self.group is None or (self.node is not None and self.node.is_ready() and self.node.reported)


class ClusterPods:
    """The pods of one RayCluster, kept as KubeRay and the kubelet would (see the module docstring).

    `api` is the emulator client (`create`, `patch_status`, `delete`, `find`); `read(kind, name)` fetches the
    ConfigMaps/Secrets a pod mounts or reads env from; `now()` gives RFC 3339 timestamps.
    """

    def __init__(self, api: Any, raycluster: Obj, ray_address: str, workdir: Path, read: Reader,
                 env: Callable[[dict[str, str]], dict[str, str]], now: Callable[[], str],
                 run_workers: bool = True, command: Callable[[Obj, Path], list[str]] | None = None) -> None:
        """`env(pod_env)` gives a node process's full environment from its pod's resolved env; `command(group,
        temp_dir)` a worker node's command line (default: `ray start` joining `ray_address`, see ray_start_argv).
        """
        self.api = api
        self.raycluster = raycluster
        self.name = raycluster["metadata"]["name"]
        self.namespace = raycluster["metadata"].get("namespace", "default")
        self.workdir = workdir
        self.read = read
        self.env = env
        self.now = now
        self.run_workers = run_workers
        self.command = command or (lambda group, temp_dir: ray_start_argv(ray_cli(), ray_address, start_params(group),
                                                                          temp_dir))
        self.slots: list[_Slot] = []
        #: Pods replaced after their node was lost: (old pod, new pod).
        self.replaced: list[tuple[str, str]] = []
        #: Why a worker pod is not running (what `kubectl describe pod` would say); None when none is stuck.
        self.waiting: str | None = None

    # ---- creating ---------------------------------------------------------------------------------
    def create(self) -> None:
        """Create the head pod and every worker group's pods, starting their Ray nodes."""
        spec = self.raycluster["spec"]
        head = spec["headGroupSpec"]["template"]
        pod = self.api.create("v1", "pods", build_pod(self.raycluster, "head", HEAD_GROUP, head), self.namespace)
        now = self.now()
        self._write_status(pod["metadata"]["name"], pod_status(_container(head), "Running", since=now, started=now))
        self.slots.append(_Slot(pod["metadata"]["name"], now))
        if not self.run_workers:
            return
        for group in spec.get("workerGroupSpecs") or []:
            for _ in range(int(group.get("replicas", 0))):
                self.slots.append(self._create_worker(group))

    def _create_worker(self, group: Obj, replaces: str | None = None) -> _Slot:
        """Create a worker Pod (Pending) and start its Ray node, or say why its container cannot start yet."""
        temp_dir = Path(tempfile.mkdtemp(prefix="rayW", dir="/tmp"))  # short: Ray's sockets live under it
        argv = self.command(group, temp_dir)
        body = build_pod(self.raycluster, "worker", group["groupName"], group["template"], argv)
        pod = self.api.create("v1", "pods", body, self.namespace)
        now = self.now()
        slot = _Slot(pod["metadata"]["name"], now, group, argv=argv, temp_dir=temp_dir)
        self._write_status(slot.pod, pod_status(slot.container, "Pending", since=now, started=now))
        if replaces:
            self.replaced.append((replaces, slot.pod))
        self._start_node(slot)
        return slot

    def _start_node(self, slot: _Slot) -> None:
        """Mount the pod's volumes, resolve its env and start its node; a missing ConfigMap/Secret leaves the
        container waiting (CreateContainerConfigError), retried at the next sync."""
        assert slot.group is not None and slot.temp_dir is not None
        template = slot.group["template"]
        container = template["spec"]["containers"][0]
        root = PodRoot(self.workdir / "pods" / slot.pod)
        try:
            root.mount_volumes(template["spec"], container, self.read)
            pod_env = resolve_env(container, PodFields(slot.pod, self.namespace), self.read)
        except PodNotReady as err:
            self.waiting = f"pod {slot.pod}: {err}"
            return
        slot.node = WorkerNode.start(slot.pod, slot.group_name, slot.argv, self.env(pod_env),
                                     root.local("/home/ray"), self.workdir / "pods" / f"{slot.pod}.log", slot.temp_dir)
        log.info("RayCluster %s/%s: pod %s: %s", self.namespace, self.name, slot.pod, " ".join(slot.argv))

    # ---- keeping them -----------------------------------------------------------------------------
    def sync(self) -> None:
        """Running+Ready once a node's raylet is up; a node that died is a lost pod: Failed, deleted, replaced."""
        self.waiting = None
        for index, slot in enumerate(self.slots):
            if slot.group is None:
                continue
            if slot.node is None:
                self._start_node(slot)
                continue
            code = slot.node.proc.poll()
            if code is None:
                if slot.node.is_ready() and not slot.node.reported:
                    self._write_status(slot.pod, pod_status(slot.container, "Running", since=self.now(),
                                                            started=slot.created, restarts=slot.restarts))
                    slot.node.reported = True
                continue
            exit_code = SIGKILL_EXIT if code < 0 else code
            if slot.node.ready_at is None and not slot.node.killed:
                self._crashed(slot, exit_code)
                continue
            now = self.now()
            log.warning("RayCluster %s/%s: pod %s lost (its Ray node exited with %s); KubeRay replaces it",
                        self.namespace, self.name, slot.pod, exit_code)
            self._write_status(slot.pod, pod_status(slot.container, "Failed", since=now, started=slot.created,
                                                    restarts=slot.restarts, exit_code=exit_code, finished=now))
            self._delete_pod(slot.pod)
            _remove_tree(slot.temp_dir)
            self.slots[index] = self._create_worker(slot.group, replaces=slot.pod)

    def _crashed(self, slot: _Slot, exit_code: int) -> None:
        """`ray start` exited before its node came up (e.g. the head cannot be reached): the kubelet restarts
        the container in the same pod after a back-off (10 s, doubling, at most 5 min): CrashLoopBackOff."""
        node = slot.node
        assert node is not None
        if slot.retry_at is None:
            slot.restarts += 1
            slot.retry_at = time.monotonic() + min(300.0, 10.0 * 2 ** (slot.restarts - 1))
            status = pod_status(slot.container, "Running", since=self.now(), started=slot.created,
                                restarts=slot.restarts)
            status["conditions"] = _conditions(False, self.now(), slot.container)
            status["containerStatuses"][0].update(ready=False, started=False, state={"waiting": {
                "reason": "CrashLoopBackOff", "message": f"back-off restarting failed container {slot.container}"}},
                lastState={"terminated": {"exitCode": exit_code, "reason": "Error"}})
            self._write_status(slot.pod, status)
        tail = node.output()[-500:]
        self.waiting = (f"pod {slot.pod}: container {slot.container} exited with {exit_code} before its Ray node "
                        f"came up (CrashLoopBackOff, restart {slot.restarts}); its log ends:\n{tail}")
        if time.monotonic() >= slot.retry_at:
            slot.retry_at = None
            slot.node = WorkerNode.start(slot.pod, slot.group_name, node.argv, node.env, node.cwd, node.log_path,
                                         node.temp_dir)

    def ready(self) -> bool:
        """Every pod Running and Ready (KubeRay's RayCluster state `ready`)."""
        return all(slot.ready() for slot in self.slots)

    def counts(self) -> tuple[int, int]:
        """(desired, ready) worker pods."""
        workers = [slot for slot in self.slots if slot.group is not None]
        return len(workers), sum(1 for slot in workers if slot.ready())

    def worker(self, group: str, index: int = 0) -> _Slot:
        """The `index`-th pod of worker group `group` (raises KeyError naming the groups there are)."""
        found = [slot for slot in self.slots if slot.group is not None and slot.group_name == group]
        if index >= len(found):
            groups = sorted({slot.group_name for slot in self.slots if slot.group is not None})
            raise KeyError(f"RayCluster {self.namespace}/{self.name} has {len(found)} pod(s) in worker group "
                           f"{group!r}; worker groups: {groups}")
        return found[index]

    def stop(self) -> None:
        """The RayCluster is gone: every node's processes go, and its pods (if garbage collection left any)."""
        for slot in self.slots:
            if slot.node is not None and slot.node.proc.poll() is None:
                slot.node.kill()
            self._delete_pod(slot.pod)
            _remove_tree(slot.temp_dir)
        self.slots = []

    # ---- pieces -----------------------------------------------------------------------------------
    def _write_status(self, pod: str, status: Obj) -> None:
        self.api.patch_status("v1", "pods", pod, status, self.namespace)

    def _delete_pod(self, pod: str) -> None:
        if self.api.find("v1", "pods", pod, self.namespace) is not None:
            self.api.delete("v1", "pods", pod, self.namespace)


def _container(template: Obj) -> str:
    return str(template["spec"]["containers"][0]["name"])


def _remove_tree(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
