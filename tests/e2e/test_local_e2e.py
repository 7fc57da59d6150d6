"""Local end-to-end: `kubectl apply` an RLJob -> operator -> RayJob -> trainer on local Ray -> checkpoints in S3.

Everything is real except Kubernetes itself (the API emulator) and KubeRay (the stand-in in
e2e/local/kuberay.py, which runs the RayJob's own entrypoint on a local Ray cluster and reports RayJob
status the way KubeRay does): the operator runs as its own process, `kubectl` is the real binary, the
trainer trains the tiny demo model, and checkpoints go to a moto S3 server with credentials that reach
the trainer only through the Secret named in `spec.checkpoint.secretRef`.

Scenario 1: the job trains a few steps, checkpoints to S3 and ends Succeeded with its final checkpoint
committed. Scenario 2: the Ray job is killed after a checkpoint; the operator starts attempt 2, whose
trainer resumes from exactly that checkpoint and succeeds. Scenario 3: a multi-role job (trainer and rollout
worker groups, each pod a Ray worker node run by the stand-in) loses its rollout pod mid-run; a new pod
replaces it, the trainer's rollout replica restarts there, and the same attempt succeeds.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from e2e.local import manifest
from e2e.local.kuberay import KubeRayStandIn
from e2e.local.raycluster import LocalRayCluster
from hybridflow import checkpoint, progress, storage
from hybridflow.demo import prepare
from tests.support import binaries
from tests.support.kube_emulator import KubeEmulator
from tests.support.operator_proc import Operator, wait_for
from tests.support.s3 import MotoServer, make_bucket, s3_env

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
RLJ, RAY = "rl.hybridflow.dev/v1alpha1", "ray.io/v1"
BUCKET, SECRET = "rljob-e2e", "s3-credentials"
#: One trainer run (driver start, one worker actor, a few sub-second steps) takes ~35 s on 2 idle cores.
RUN_TIMEOUT_S = 240


@dataclass
class Stack:
    """The running pieces, and how to reach them."""

    kube: KubeEmulator
    operator: Operator
    kuberay: KubeRayStandIn
    s3: MotoServer
    kubectl: pathlib.Path
    workdir: pathlib.Path

    def run_kubectl(self, *args: str) -> str:
        """Run the real kubectl against the emulator (own HOME: no user config or cache is touched)."""
        env = {**os.environ, "KUBECONFIG": str(self.operator.kubeconfig), "HOME": str(self.workdir)}
        done = subprocess.run([str(self.kubectl), *args], env=env, capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 0, f"kubectl {' '.join(args)} failed: {done.stderr}"
        return done.stdout

    def status(self, name: str) -> dict[str, Any]:
        """The RLJob's status (empty before the operator's first write)."""
        return self.kube.get(RLJ, "rljobs", name).get("status") or {}

    def rayjob_status(self, name: str) -> dict[str, Any]:
        """A RayJob's status (empty when it does not exist or has none yet)."""
        found = self.kube.find(RAY, "rayjobs", name)
        return (found or {}).get("status") or {}

    def diagnostics(self, name: str) -> str:
        """What to look at when a wait fails: statuses, the stand-in's view and the log tails."""
        parts = [f"RLJob status: {json.dumps(self.status(name), indent=1)}"]
        for rayjob in self.kube.list(RAY, "rayjobs", labels=f"rl.hybridflow.dev/rljob={name}"):
            rj = rayjob["metadata"]["name"]
            parts.append(f"RayJob {rj} status: {json.dumps(rayjob.get('status'), indent=1)}")
            try:
                parts.append(f"{rj} driver log tail:\n{self.kuberay.driver(rj).output()[-3000:]}")
            except KeyError as err:
                parts.append(str(err))
        parts.append(f"stand-in waiting on: {self.kuberay.waiting}")
        parts.append(f"operator log tail:\n{self.operator.log.read_text()[-3000:]}")
        return "\n".join(parts)

    def wait(self, name: str, check: Callable[[], Any], what: str, timeout: float = RUN_TIMEOUT_S) -> Any:
        """wait_for with the job's diagnostics in the failure message; stops early once the RLJob has failed."""

        def check_or_give_up() -> Any:
            if self.status(name).get("phase") in ("Invalid", "Failed"):
                raise AssertionError(f"RLJob {name} is {self.status(name)['phase']} while waiting for {what}")
            return check()

        try:
            return wait_for(check_or_give_up, what, timeout)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.diagnostics(name)}") from None


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Emulator (RLJob + KubeRay CRDs), moto S3 with a bucket, local Ray, the KubeRay stand-in, the operator."""
    try:
        kubectl = binaries.ensure("kubectl")
    except binaries.BinaryUnavailable as err:
        pytest.skip(f"no kubectl binary: {err}")
    workdir = tmp_path_factory.mktemp("e2e")
    inputs = prepare(workdir / "demo")  # tiny model, toy tokenizer and data: no downloads
    # The cluster scripts name the same inputs without preparing them here: same layout, by construction.
    assert {k: v for k, v in inputs.items() if k != "trainer.default_local_dir"} == \
        manifest.input_overrides(str(workdir / "demo"))
    with pytest.MonkeyPatch.context() as mp:
        s3 = MotoServer().start()
        # The test process reads the bucket through hybridflow's own checkpoint/progress readers.
        for key, value in s3_env(s3.url).items():
            mp.setenv(key, value)
        kube = ray = kuberay = operator = None
        try:
            make_bucket(s3.url, BUCKET)
            kube = KubeEmulator(crd_files=sorted((ROOT / "crds").glob("*.yaml"))).start()
            ray = LocalRayCluster(num_cpus=2, log_dir=workdir).start()
            # Each pod could listen on 8000 for metrics; processes on one machine cannot: any free port.
            kuberay = KubeRayStandIn(kube, ray.address, workdir / "kuberay",
                                     env_overrides={"HYBRIDFLOW_METRICS_PORT": "0"}).start()
            operator = Operator(kube, workdir / "operator")
            operator.start()
            yield Stack(kube, operator, kuberay, s3, kubectl, workdir)
            assert "Traceback" not in operator.log.read_text(), operator.log.read_text()[-3000:]
        finally:
            for piece in (operator, kuberay, ray, kube, s3):
                if piece is not None:
                    piece.stop()


def write_manifest(stack: Stack, name: str, *overrides: str) -> pathlib.Path:
    """The shared e2e RLJob (e2e/local/manifest.py) on the prepared inputs, checkpointing to S3, plus its Secret."""
    job = manifest.render_rljob(name, inputs_dir=str(stack.workdir / "demo"),
                                checkpoint_uri=f"s3://{BUCKET}/runs/{name}", secret=SECRET, overrides=overrides)
    path = stack.workdir / f"{name}.yaml"
    path.write_text(manifest.dump([manifest.render_secret(SECRET, s3_env(stack.s3.url)), job]))
    return path


def get_rljobs_row(stack: Stack, name: str) -> dict[str, str]:
    """`kubectl get rljobs` parsed into {column: value} for one job (the server-side table)."""
    lines = stack.run_kubectl("get", "rljobs").splitlines()
    # Cut at the header's column starts: empty cells (no progress yet) are blank, not "<none>".
    starts = [m.start() for m in re.finditer(r"\S+", lines[0])]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    rows = [{lines[0][a:b].strip(): line[a:b].strip() for a, b in bounds} for line in lines[1:]]
    found = [row for row in rows if row["NAME"] == name]
    assert len(found) == 1, lines
    return found[0]


def steps_in_log(output: str) -> list[int]:
    """Step numbers of the trainer's console lines (`step N/T | ...`)."""
    return [int(m.group(1)) for m in re.finditer(r"^step (\d+)/\d+ \|", output, re.MULTILINE)]


def metrics_steps(uri: str) -> list[int]:
    """Steps in the trainer's metrics.jsonl next to the checkpoints."""
    text = storage.read_bytes(f"{uri}/metrics.jsonl").decode()
    return [json.loads(line)["step"] for line in text.splitlines() if line.strip()]


def test_rljob_trains_checkpoints_to_s3_and_succeeds(stack: Stack) -> None:
    name, uri = "e2e-tiny", f"s3://{BUCKET}/runs/e2e-tiny"
    applied = stack.run_kubectl("apply", "--validate=false", "-f",
                                str(write_manifest(stack, name, "trainer.total_training_steps=3",
                                                   "trainer.save_freq=2")))
    assert f"secret/{SECRET} created" in applied and f"rljob.rl.hybridflow.dev/{name} created" in applied

    rayjob = stack.wait(name, lambda: stack.kube.find(RAY, "rayjobs", f"{name}-a1"), "the operator's RayJob")
    assert rayjob["spec"]["entrypoint"].endswith(f"trainer.default_local_dir={uri} trainer.resume_mode=auto")
    running = stack.wait(name, lambda: stack.rayjob_status(f"{name}-a1").get("jobStatus") == "RUNNING"
                         and stack.rayjob_status(f"{name}-a1"), "the Ray job RUNNING")
    assert running["jobDeploymentStatus"] == "Running" and running["jobId"].startswith(f"{name}-a1-")
    cluster = stack.kube.get(RAY, "rayclusters", running["rayClusterName"])
    assert cluster["metadata"]["ownerReferences"][0]["name"] == f"{name}-a1"
    assert running["dashboardURL"] == f"{running['rayClusterName']}-head-svc.default.svc.cluster.local:8265"
    stack.wait(name, lambda: stack.status(name).get("phase") == "Running", "RLJob phase Running")
    assert stack.status(name)["dashboardURL"] == running["dashboardURL"]

    stack.wait(name, lambda: stack.status(name).get("phase") == "Succeeded", "RLJob phase Succeeded")
    final = stack.rayjob_status(f"{name}-a1")
    assert (final["jobDeploymentStatus"], final["jobStatus"], final["succeeded"]) == ("Complete", "SUCCEEDED", 1)
    assert final["endTime"] >= final["startTime"]
    stack.wait(name, lambda: stack.kube.find(RAY, "rayclusters", running["rayClusterName"]) is None,
               "RayCluster deleted after the job (shutdownAfterJobFinishes)", timeout=20)
    output = stack.kuberay.driver(f"{name}-a1").output()
    assert "training finished at global step 3" in output and steps_in_log(output) == [1, 2, 3]

    # The final checkpoint is in S3 and committed (marker matches manifest, every file's checksum).
    assert checkpoint.find_latest_committed(uri) == 3
    assert checkpoint.verify_step(checkpoint.step_dir(uri, 3), deep=True) is None
    assert storage.read_bytes(f"{uri}/{checkpoint.LATEST_FILE}").decode().strip() == "3"
    assert metrics_steps(uri) == [1, 2, 3]
    record = progress.read_progress(uri)
    assert record is not None and (record.step, record.total_steps, record.attempt) == (3, 3, 1)

    # The operator reads the trainer's progress (progress.json beside the checkpoints here: the head
    # Service's DNS name does not resolve on this machine) once more after the end: it converges to 3/3.
    stack.wait(name, lambda: (stack.status(name).get("progress") or {}).get("step") == 3, "status.progress 3",
               timeout=30)
    row = get_rljobs_row(stack, name)
    assert (row["PHASE"], row["STEP"], row["TOTAL"], row["ATTEMPT"]) == ("Succeeded", "3", "3", "1"), row
    assert float(row["REWARD"]) == pytest.approx(record.metrics["reward_mean"]), row


def test_killed_attempt_resumes_from_its_checkpoint(stack: Stack) -> None:
    name, uri = "e2e-resume", f"s3://{BUCKET}/runs/e2e-resume"
    total = 8
    applied = stack.run_kubectl("apply", "--validate=false", "-f",
                                str(write_manifest(stack, name, f"trainer.total_training_steps={total}",
                                                   "trainer.save_freq=2")))
    assert f"rljob.rl.hybridflow.dev/{name} created" in applied

    stack.wait(name, lambda: stack.rayjob_status(f"{name}-a1").get("jobStatus") == "RUNNING", "attempt 1 RUNNING")
    stack.wait(name, lambda: _latest_step(stack, uri), "attempt 1's first committed checkpoint")
    stack.kuberay.kill(f"{name}-a1")  # the Ray job dies (driver and its actors) right after a checkpoint
    resume_from = checkpoint.find_latest_committed(uri)
    assert resume_from is not None and 2 <= resume_from < total, resume_from
    first_run = stack.kuberay.driver(f"{name}-a1").output()
    assert "training finished" not in first_run

    failed = stack.wait(name, lambda: stack.rayjob_status(f"{name}-a1").get("jobDeploymentStatus") == "Failed"
                        and stack.rayjob_status(f"{name}-a1"), "attempt 1 reported Failed", timeout=30)
    assert (failed["jobStatus"], failed["reason"]) == ("FAILED", "AppFailed")
    assert "exit code -9" in failed["message"]
    second = stack.wait(name, lambda: stack.kube.find(RAY, "rayjobs", f"{name}-a2"), "the retry's RayJob",
                        timeout=60)
    assert "trainer.resume_mode=auto" in second["spec"]["entrypoint"]
    stack.wait(name, lambda: stack.status(name).get("attempt") == 2, "status.attempt 2", timeout=30)
    assert stack.status(name)["lastFailure"]["reason"] == "AppFailed"

    stack.wait(name, lambda: stack.status(name).get("phase") == "Succeeded", "RLJob phase Succeeded")
    retry = stack.kuberay.driver(f"{name}-a2").output()
    resumed_at = checkpoint.step_dir(uri, resume_from)
    assert f"resumed from {resumed_at} (global step {resume_from})" in retry, retry[-3000:]
    assert steps_in_log(retry) == list(range(resume_from + 1, total + 1)), retry[-3000:]
    assert f"training finished at global step {total}" in retry
    assert checkpoint.find_latest_committed(uri) == total
    record = progress.read_progress(uri)
    assert record is not None and (record.step, record.attempt) == (total, 2)
    assert metrics_steps(uri)[-1] == total

    stack.wait(name, lambda: (stack.status(name).get("progress") or {}).get("step") == total,
               f"status.progress {total}", timeout=30)
    row = get_rljobs_row(stack, name)
    assert (row["PHASE"], row["STEP"], row["TOTAL"], row["ATTEMPT"]) == ("Succeeded", str(total), str(total), "2"), row


def _latest_step(stack: Stack, uri: str) -> int | None:
    """The step named by latest_checkpointed_iteration.txt (written only after a step is committed)."""
    try:
        return int(storage.read_bytes(f"{uri}/{checkpoint.LATEST_FILE}").decode().strip())
    except FileNotFoundError:
        return None
    finally:
        time.sleep(0.05)  # poll S3 fast (a step takes ~0.5 s), but not in a hot loop


def test_lost_rollout_pod_is_replaced_without_restarting_the_attempt(stack: Stack) -> None:
    """A multi-role job (trainer + rollout worker groups): the rollout role's pod is lost mid-run; KubeRay's
    stand-in replaces it, the trainer's rollout replica restarts on the new node with the current weights, and
    the attempt goes on to Succeeded."""
    # 16 steps of ~0.3 s: status.progress lags the trainer by a few seconds, and the pod must be lost mid-run.
    name, uri, total = "e2e-roles", f"s3://{BUCKET}/runs/e2e-roles", 16
    path = write_manifest(stack, name, f"trainer.total_training_steps={total}", "trainer.save_freq=8",
                          "trainer.placement=split", "actor_rollout_ref.rollout.name=vllm",
                          "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.dtype=float32",
                          "actor_rollout_ref.rollout.enforce_eager=true")
    *docs, job = [json.loads(doc) for doc in path.read_text().split("\n---\n")]
    # One CPU per pod: each role's Ray node advertises one (KubeRay's num-cpus from the container's limits).
    job["spec"]["resources"]["cpu"] = "1"
    job["spec"]["roles"] = {"rollout": {"replicas": 1}}
    path.write_text(manifest.dump([*docs, job]))
    stack.run_kubectl("apply", "--validate=false", "-f", str(path))
    rayjob = f"{name}-a1"

    stack.wait(name, lambda: stack.rayjob_status(rayjob).get("jobStatus") == "RUNNING", "the Ray job RUNNING")
    cluster = stack.rayjob_status(rayjob)["rayClusterName"]
    pods = {p["metadata"]["name"]: p for p in stack.kube.list("v1", "pods", labels=f"ray.io/cluster={cluster}")}
    by_group = {p["metadata"]["labels"]["ray.io/group"]: p for p in pods.values()}
    assert sorted(by_group) == ["headgroup", "rollout", "trainer"] and len(pods) == 3, sorted(pods)
    for group, pod in by_group.items():
        labels, status = pod["metadata"]["labels"], pod["status"]
        assert labels["ray.io/node-type"] == ("head" if group == "headgroup" else "worker")
        assert labels["ray.io/is-ray-node"] == "yes" and labels["app.kubernetes.io/managed-by"] == "rljob-operator"
        assert (labels["rl.hybridflow.dev/rljob"], labels["rl.hybridflow.dev/attempt"]) == (name, "1")
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "RayCluster"
        assert pod["metadata"]["ownerReferences"][0]["name"] == cluster
        assert status["phase"] == "Running", status
        assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
        container = "ray-head" if group == "headgroup" else "ray-worker"
        assert [(c["name"], c["ready"], c["restartCount"]) for c in status["containerStatuses"]] == [(container, True, 0)]
    assert by_group["rollout"]["metadata"]["labels"]["rl.hybridflow.dev/role"] == "rollout"
    assert by_group["trainer"]["metadata"]["labels"]["rl.hybridflow.dev/role"] == "trainer"
    assert by_group["rollout"]["metadata"]["name"].startswith(f"{cluster}-rollout-worker-")
    assert '--resources={"rljob.role/rollout": 1}' in stack.kuberay.pods(rayjob).worker("rollout").node.argv

    stack.wait(name, lambda: (stack.status(name).get("progress") or {}).get("step", 0) >= 1, "status.progress step 1")
    lost = stack.kuberay.kill_worker(rayjob, "rollout")
    assert "training finished" not in stack.kuberay.driver(rayjob).output(), \
        "the run ended before the rollout pod was lost; give it more steps"

    def replaced() -> dict[str, Any] | None:
        found = stack.kube.list("v1", "pods", labels=f"ray.io/cluster={cluster},ray.io/group=rollout")
        return found[0] if len(found) == 1 and found[0]["metadata"]["name"] != lost.pod else None

    new = stack.wait(name, replaced, "a new rollout pod", timeout=60)
    assert stack.kube.find("v1", "pods", lost.pod) is None
    assert new["metadata"]["name"].startswith(f"{cluster}-rollout-worker-")
    assert new["metadata"]["labels"]["rl.hybridflow.dev/role"] == "rollout"
    stack.wait(name, lambda: stack.kube.get("v1", "pods", new["metadata"]["name"])["status"]["phase"] == "Running",
               "the new rollout pod Running", timeout=60)
    # The operator counts the loss against the rollout role and lets the attempt go on.
    def roles() -> dict[str, dict[str, Any]]:
        return {r["name"]: r for r in stack.status(name).get("roles") or []}

    stack.wait(name, lambda: roles().get("rollout", {}).get("restarts") == 1, "status.roles: the rollout role's restart",
               timeout=60)
    seen = roles()
    assert (seen["rollout"]["desired"], seen["trainer"]["desired"], seen["trainer"]["restarts"]) == (1, 2, 0), seen
    lost_events = [e["message"] for e in stack.kube.list("v1", "events", "default") if e.get("reason") == "PodLost"]
    assert len(lost_events) == 1 and lost.pod in lost_events[0], lost_events

    stack.wait(name, lambda: stack.status(name).get("phase") == "Succeeded", "RLJob phase Succeeded")
    assert stack.status(name)["attempt"] == 1
    assert stack.kube.find(RAY, "rayjobs", f"{name}-a2") is None
    output = stack.kuberay.driver(rayjob).output()
    assert steps_in_log(output) == list(range(1, total + 1)), output[-3000:]
    assert "rollout replica 0 restarted and resynced" in output, output[-3000:]
    assert checkpoint.find_latest_committed(uri) == total
    stack.wait(name, lambda: not stack.kube.list("v1", "pods", labels=f"ray.io/cluster={cluster}"),
               "the pods deleted with the RayCluster", timeout=30)
