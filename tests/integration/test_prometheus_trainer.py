"""Prometheus end to end: a real `prometheus` scrapes the trainer driver's endpoint; the API has the series.

Two tiers: the tracking backend driven step by step (seconds, no Ray), and a tiny real GRPO job
(`hybridflow.trainer.main_ppo` on local Ray, checkpoints and progress on a moto S3 endpoint), as the
operator would run it (RLJOB_NAME / RLJOB_NAMESPACE / HYBRIDFLOW_ATTEMPT / HYBRIDFLOW_METRICS_PORT set).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hybridflow import checkpoint as ck
from hybridflow import progress, storage
from hybridflow.prometheus import ADDR_ENV, PORT_ENV
from hybridflow.tracking import Tracking
from tests.support.prometheus import INSTALL_HINT, PrometheusServer, find_prometheus
from tests.support.s3 import MotoServer, free_port, make_bucket, s3_env

pytestmark = pytest.mark.skipif(find_prometheus() is None, reason=f"prometheus is not installed; {INSTALL_HINT}")


@pytest.fixture
def operator_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {"RLJOB_NAME": "tiny", "RLJOB_NAMESPACE": "ml", "HYBRIDFLOW_ATTEMPT": "2",
           PORT_ENV: str(free_port()), ADDR_ENV: "127.0.0.1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator[Callable[[int], PrometheusServer]]:
    servers: list[PrometheusServer] = []

    def start(port: int, interval_ms: int = 1000) -> PrometheusServer:
        server = PrometheusServer(tmp_path / "prom", {"hybridflow-trainer": [f"127.0.0.1:{port}"]},
                                  interval_ms=interval_ms)
        (tmp_path / "prom").mkdir(exist_ok=True)
        servers.append(server.start())
        return server

    (tmp_path / "prom").mkdir()
    yield start
    for server in servers:
        server.stop()


def _wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def _points(server: PrometheusServer, metric: str) -> int:
    result = server.query(f'count_over_time({metric}{{rljob="tiny",namespace="ml"}}[10m])')
    return int(float(result[0]["value"][1])) if result else 0


def test_tracking_backend_scraped_by_prometheus(operator_env: dict[str, str], prometheus_for, tmp_path: Path) -> None:
    server = prometheus_for(int(operator_env[PORT_ENV]))
    tracker = Tracking("p", "e", ["prometheus"], default_local_dir=str(tmp_path / "ckpt"), total_steps=20)
    try:
        step = 0
        while _points(server, "hybridflow_reward_mean") < 4:
            step += 1
            assert step <= 40, f"prometheus scraped too little; targets: {server.targets()}"
            tracker.log({"critic/score/mean": step / 20, "timing_s/step": 0.5, "timing_s/gen": 0.3}, step=step)
            if step % 3 == 0:
                tracker.checkpoint_saved(step, ck.step_dir(str(tmp_path / "ckpt"), step))
            time.sleep(0.5)
        # Instant queries while the endpoint is still up: once `finish()` stops it, the next scrape
        # fails and Prometheus marks every series stale, so an instant query would find nothing.
        (reward,) = server.query('hybridflow_reward_mean{rljob="tiny"}')
        assert reward["metric"]["namespace"] == "ml" and reward["metric"]["job"] == "hybridflow-trainer"
        assert 0 < float(reward["value"][1]) <= step / 20
        (attempt,) = server.query("hybridflow_attempt")
        assert float(attempt["value"][1]) == 2
        assert server.query('hybridflow_phase_duration_seconds{phase="gen"}')
        assert server.query("hybridflow_checkpoint_age_seconds >= 0")
    finally:
        tracker.finish()


@pytest.mark.slow
@pytest.mark.ray
def test_tiny_job_metrics_in_prometheus_and_checkpoints_on_s3(
    operator_env: dict[str, str], prometheus_for, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hybridflow.demo import EXAMPLE, prepare

    overrides = prepare(tmp_path / "demo")
    moto = MotoServer().start()
    try:
        make_bucket(moto.url, "runs")
        for key, value in s3_env(moto.url).items():
            monkeypatch.setenv(key, value)
        root = "s3://runs/tiny"
        overrides.update({
            "trainer.default_local_dir": root, "trainer.total_training_steps": "10", "trainer.save_freq": "5",
            "trainer.test_freq": "-1", "trainer.val_before_train": "false", "data.train_batch_size": "16",
            "actor_rollout_ref.actor.ppo_mini_batch_size": "16",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "64",
        })
        # 250 ms scrapes: the tiny job's training steps last only a few seconds once Ray is up.
        server = prometheus_for(int(operator_env[PORT_ENV]), interval_ms=250)
        started = time.monotonic()
        job = subprocess.run(
            [sys.executable, "-m", "hybridflow.trainer.main_ppo", str(EXAMPLE),
             *(f"{k}={v}" for k, v in overrides.items())],
            env={**os.environ, "RAY_AUTH_MODE": "disabled"}, capture_output=True, text=True, timeout=240,
        )
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        print(f"tiny job took {time.monotonic() - started:.1f}s")
        points = _wait_for(lambda: _points(server, "hybridflow_reward_mean"), 5, "the reward series")
        assert points >= 3, f"only {points} scrapes of hybridflow_reward_mean; targets: {server.targets()}"
        steps = server.query('max_over_time(hybridflow_step{rljob="tiny"}[10m])')
        assert float(steps[0]["value"][1]) >= 8
        assert server.query('max_over_time(hybridflow_total_steps{rljob="tiny"}[10m]) == 10')  # target gone: range
        # Checkpoints and the progress record landed on S3.
        assert ck.find_latest_committed(root) == 10
        record = progress.read_progress(root)
        assert record is not None and (record.step, record.total_steps, record.attempt) == (10, 10, 2)
        assert "reward_mean" in record.metrics
        assert record.checkpoint is not None and record.checkpoint.step == 10
        assert record.checkpoint.uri == ck.step_dir(root, 10)
        assert server.query('max_over_time(hybridflow_checkpoint_step{rljob="tiny"}[10m]) >= 5')
        fs, path = storage.open_fs(root)
        assert fs.exists(f"{path}/metrics.jsonl")
    finally:
        moto.stop()
