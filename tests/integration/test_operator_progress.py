"""Issue 6, operator side: trainer progress into RLJob status, and the stall timeout, with the real operator.

The operator runs as a subprocess against the API emulator (the test plays KubeRay). A fake trainer
endpoint on 127.0.0.1 serves the trainer's own `TrainerMetrics` registry (hybridflow.prometheus), reached
through `--trainer-metrics-url`; the progress-record fallback reads `progress.json` written by the
trainer's own writer (hybridflow.progress) to a real S3 endpoint (moto_server).
"""

from __future__ import annotations

import copy
import http.server
import os
import pathlib
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hybridflow.progress import CheckpointInfo, Progress, write_progress
from hybridflow.prometheus import TrainerMetrics
from tests.support import binaries
from tests.support.kube_emulator import KubeEmulator
from tests.support.operator_proc import Operator, free_port, wait_for
from tests.support.s3 import MotoServer, make_bucket, s3_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
RLJ, RAY = "rl.hybridflow.dev/v1alpha1", "ray.io/v1"
LOCATION = "file:///tmp/hybridflow/checkpoints"  # examples/rljob_cpu_tiny.yaml's default_local_dir root


class FakeTrainers:
    """Serves `/<namespace>/<ray cluster>/metrics` from one TrainerMetrics per trainer (404 for others)."""

    def __init__(self) -> None:
        self.trainers: dict[tuple[str, str], TrainerMetrics] = {}
        trainers = self.trainers

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                parts = self.path.strip("/").split("/")
                metrics = trainers.get((parts[0], parts[1])) if len(parts) == 3 else None
                body = generate_latest(metrics.registry) if metrics else b"no such trainer\n"
                self.send_response(200 if metrics else 404)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.template = f"http://127.0.0.1:{self.server.server_address[1]}/{{namespace}}/{{cluster}}/metrics"

    def add(self, cluster: str, name: str, total_steps: int) -> TrainerMetrics:
        """A trainer of RLJob `name` running on Ray cluster `cluster`, labelled as the operator runs it."""
        metrics = TrainerMetrics({"rljob": name, "namespace": "default"})
        metrics.set_run(total_steps, attempt=1)
        self.trainers[("default", cluster)] = metrics
        return metrics


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def trainers() -> Iterator[FakeTrainers]:
    fake = FakeTrainers()
    yield fake
    fake.server.shutdown()


@pytest.fixture(scope="module")
def cluster(moto: MotoServer, trainers: FakeTrainers,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KubeEmulator, Operator]]:
    kube = KubeEmulator(crd_files=sorted((ROOT / "crds").glob("*.yaml"))).start()
    operator = Operator(kube, tmp_path_factory.mktemp("progress-operator"),
                        args=("--standalone", "-A", "--trainer-metrics-url", trainers.template))
    with pytest.MonkeyPatch.context() as env:  # the operator reads S3 with the standard AWS variables
        for key, value in s3_env(moto.url).items():
            env.setenv(key, value)
        operator.start()
    yield kube, operator
    operator.stop()
    kube.stop()
    log = operator.log.read_text()
    assert "Traceback" not in log, log[-3000:]


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    job = yaml.safe_load((ROOT / "examples" / "rljob_cpu_tiny.yaml").read_text())
    job["metadata"] = {"name": name}
    job["spec"].update(copy.deepcopy(spec))
    return job


def status(kube: KubeEmulator, name: str) -> dict[str, Any]:
    return kube.get(RLJ, "rljobs", name).get("status") or {}


def running(kube: KubeEmulator, rayjob: str, cluster: str) -> None:
    """KubeRay: the attempt's Ray cluster is up and the trainer runs."""
    kube.patch_status(RAY, "rayjobs", rayjob, {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                                               "rayClusterName": cluster})


def events(kube: KubeEmulator, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list("v1", "events") if e["involvedObject"]["name"] == name and e["reason"] == reason]


def test_progress_metrics_and_checkpoint_fill_in(cluster: tuple[KubeEmulator, Operator],
                                                 trainers: FakeTrainers) -> None:
    kube, operator = cluster
    kube.create(RLJ, "rljobs", manifest("prog", runPolicy={"stallTimeoutSeconds": 3}), "default")
    wait_for(lambda: kube.find(RAY, "rayjobs", "prog-a1"), "RayJob prog-a1")
    trainer = trainers.add("prog-a1-raycluster-x", "prog", total_steps=40)
    running(kube, "prog-a1", "prog-a1-raycluster-x")
    trainer.observe_step({"critic/score/mean": 0.25, "actor/kl_loss": 0.01, "perf/throughput": 900.0,
                          "timing_s/step": 2.0}, step=3)
    trainer.observe_checkpoint(2, when=1_780_000_000.0)
    wait_for(lambda: status(kube, "prog").get("progress", {}).get("step") == 3, "status.progress.step 3")
    st = status(kube, "prog")
    assert st["progress"] == {"step": 3, "totalSteps": 40, "percent": 7.5, "etaSeconds": 74}
    assert st["metrics"] == {"rewardMean": 0.25, "kl": 0.01, "throughputTokensPerSecond": 900.0}
    assert st["checkpoint"] == {"step": 2, "uri": f"{LOCATION}/tiny-cpu-grpo/global_step_2",
                                "time": "2026-05-28T20:26:40Z"}

    # Steps keep coming faster than the 3 s stall timeout: the attempt is left alone.
    for step in range(4, 9):
        trainer.observe_step({"critic/score/mean": 0.25 + step / 100}, step=step)
        time.sleep(1.2)
    wait_for(lambda: status(kube, "prog").get("progress", {}).get("step") == 8, "status.progress.step 8")
    assert status(kube, "prog")["phase"] == "Running" and kube.find(RAY, "rayjobs", "prog-a2") is None
    assert status(kube, "prog")["metrics"]["rewardMean"] == pytest.approx(0.33)

    try:
        kubectl = binaries.ensure("kubectl")
    except binaries.BinaryUnavailable:
        return  # the status itself is checked above; the printer columns need the real kubectl
    env = {**os.environ, "KUBECONFIG": str(operator.kubeconfig), "HOME": str(operator.kubeconfig.parent)}
    table = subprocess.run([str(kubectl), "get", "rljobs", "prog"], env=env, capture_output=True, text=True,
                           timeout=60, check=True).stdout.splitlines()
    assert table[0].split()[:5] == ["NAME", "PHASE", "STEP", "TOTAL", "REWARD"]
    assert table[1].split()[:5] == ["prog", "Running", "8", "40", "0.33"]


def test_progress_record_on_s3_when_the_trainer_is_unreachable(cluster: tuple[KubeEmulator, Operator],
                                                               moto: MotoServer,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    kube, _ = cluster
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    make_bucket(moto.url, bucket)
    root = f"s3://{bucket}/runs/rec"
    for key, value in s3_env(moto.url).items():
        monkeypatch.setenv(key, value)
    kube.create(RLJ, "rljobs", manifest("rec", checkpoint={"uri": root}), "default")
    wait_for(lambda: kube.find(RAY, "rayjobs", "rec-a1"), "RayJob rec-a1")
    running(kube, "rec-a1", "rec-a1-raycluster-gone")  # no such trainer: the endpoint answers 404
    write_progress(root, Progress(step=6, total_steps=12, attempt=1, avg_step_seconds=5.0,
                                  metrics={"reward_mean": 0.75, "kl": 0.02},
                                  checkpoint=CheckpointInfo(5, f"{root}/global_step_5", "2026-11-30T12:00:00Z")))
    wait_for(lambda: status(kube, "rec").get("progress", {}).get("step") == 6, "status.progress.step 6 from S3")
    st = status(kube, "rec")
    assert st["progress"] == {"step": 6, "totalSteps": 12, "percent": 50.0, "etaSeconds": 30}
    assert st["metrics"] == {"rewardMean": 0.75, "kl": 0.02}
    assert st["checkpoint"] == {"step": 5, "uri": f"{root}/global_step_5", "time": "2026-11-30T12:00:00Z"}


def test_a_succeeded_job_reports_its_export(cluster: tuple[KubeEmulator, Operator], moto: MotoServer,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """spec.export: the trainer is told to export (its config), and the location it records shows in status."""
    from hybridflow.progress import record_export

    kube, _ = cluster
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    make_bucket(moto.url, bucket)
    root = f"s3://{bucket}/runs/exp"
    for key, value in s3_env(moto.url).items():
        monkeypatch.setenv(key, value)
    kube.create(RLJ, "rljobs", manifest("exp", checkpoint={"uri": root}, export={"maxShardSize": "2GB"}), "default")
    wait_for(lambda: kube.find(RAY, "rayjobs", "exp-a1"), "RayJob exp-a1")
    config = yaml.safe_load(kube.get("v1", "configmaps", "exp-config")["data"]["config.yaml"])
    assert config["trainer"]["export"]["enable"] is True and config["trainer"]["export"]["max_shard_size"] == "2GB"
    running(kube, "exp-a1", "exp-a1-raycluster-gone")  # the trainer's endpoint is unreachable: progress.json it is
    # what the trainer writes at the end of a run (hybridflow.model_merger.export_final_checkpoint)
    write_progress(root, Progress(step=80, total_steps=80, attempt=1,
                                  checkpoint=CheckpointInfo(80, f"{root}/global_step_80", "2026-12-01T12:00:00Z")))
    wait_for(lambda: status(kube, "exp").get("progress", {}).get("step") == 80, "status.progress.step 80 from S3")
    record_export(root, 80, f"{root}/export/global_step_80")  # after the last step, before the driver exits
    kube.patch_status(RAY, "rayjobs", "exp-a1", {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"})
    wait_for(lambda: status(kube, "exp").get("export"), "status.export")
    st = status(kube, "exp")
    assert st["phase"] == "Succeeded"
    assert (st["export"]["step"], st["export"]["uri"], st["export"]["lora"]) == (80, f"{root}/export/global_step_80",
                                                                                 False)


def test_a_stalled_attempt_restarts_until_backoff_limit(cluster: tuple[KubeEmulator, Operator],
                                                        trainers: FakeTrainers) -> None:
    kube, operator = cluster
    kube.create(RLJ, "rljobs", manifest("stuck", runPolicy={"stallTimeoutSeconds": 3, "backoffLimit": 1}),
                "default")
    wait_for(lambda: kube.find(RAY, "rayjobs", "stuck-a1"), "RayJob stuck-a1")
    trainers.add("stuck-a1-rc", "stuck", total_steps=40).observe_step({}, step=7)
    started = time.monotonic()
    running(kube, "stuck-a1", "stuck-a1-rc")
    wait_for(lambda: status(kube, "stuck").get("progress", {}).get("step") == 7, "status.progress.step 7")

    wait_for(lambda: kube.find(RAY, "rayjobs", "stuck-a2"), "RayJob stuck-a2 after the stall", timeout=30)
    assert time.monotonic() - started > 3  # not before the timeout
    assert kube.find(RAY, "rayjobs", "stuck-a1") is None  # the stuck attempt was stopped
    wait_for(lambda: status(kube, "stuck").get("attempt") == 2, "status.attempt 2")
    st = status(kube, "stuck")
    assert st["failedAttempts"] == 1 and st["lastFailure"]["reason"] == "Stalled"
    assert "no progress past step 7" in st["lastFailure"]["message"]
    (stalled,) = wait_for(lambda: events(kube, "stuck", "Stalled"), "Stalled Event")
    assert stalled["type"] == "Warning" and "stallTimeoutSeconds" in stalled["message"]

    # The retry hangs at start-up (its trainer never answers): that is a stall too, and the last retry.
    running(kube, "stuck-a2", "stuck-a2-rc")
    wait_for(lambda: status(kube, "stuck").get("phase") == "Failed", "phase Failed", timeout=30)
    st = status(kube, "stuck")
    assert (st["attempt"], st["failedAttempts"], st["lastFailure"]["reason"]) == (2, 2, "Stalled")
    assert "its first step" in st["lastFailure"]["message"] and "could not read" in st["lastFailure"]["message"]
    wait_for(lambda: kube.find(RAY, "rayjobs", "stuck-a2") is None, "the last stuck attempt stopped")
    time.sleep(3)
    assert kube.find(RAY, "rayjobs", "stuck-a3") is None  # attempts = 1 + backoffLimit
    assert len(wait_for(lambda: events(kube, "stuck", "Failed"), "Failed Event")) == 1
    assert len(events(kube, "stuck", "Stalled")) == 2
    assert "cannot read the progress of RLJob default/stuck" in operator.log.read_text()
