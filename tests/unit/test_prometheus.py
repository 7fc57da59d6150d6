"""Trainer Prometheus metrics: names the dashboard uses, labels from the operator's env, the HTTP endpoint."""

from __future__ import annotations

import math
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hybridflow import prometheus
from hybridflow.prometheus import PrometheusLogger, TrainerMetrics
from hybridflow.tracking import Tracking

STEP = {
    "critic/score/mean": 0.5, "actor/kl_loss": 0.01, "actor/entropy": 1.5, "response_length/mean": 12.0,
    "perf/throughput": 900.0, "timing_s/step": 2.0, "timing_s/gen": 1.2, "timing_s/update_actor": 0.5,
    "val-core/gsm8k/reward/mean@1": 0.25, "actor/pg_loss": None,
}
DASHBOARD = ["hybridflow_reward_mean", "hybridflow_kl", "hybridflow_throughput_tokens_per_second",
             "hybridflow_step_duration_seconds", "hybridflow_step", "hybridflow_total_steps", "hybridflow_attempt"]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }


@pytest.mark.parametrize(
    ("env", "config_port", "expected"),
    [({}, None, 8000), ({}, 9100, 9100), ({prometheus.PORT_ENV: "8001"}, 9100, 8001), ({prometheus.PORT_ENV: "0"}, None, 0)],
)
def test_resolve_port(env: dict, config_port: int | None, expected: int) -> None:
    assert prometheus.resolve_port(config_port, env) == expected


@pytest.mark.parametrize("bad", ["http", "70000", "-1"])
def test_bad_port_env_says_how_to_fix(bad: str) -> None:
    with pytest.raises(ValueError, match="0..65535"):
        prometheus.resolve_port(None, {prometheus.PORT_ENV: bad})


def test_job_labels() -> None:
    assert prometheus.job_labels({}) == {}
    assert prometheus.job_labels({"RLJOB_NAME": "j", "RLJOB_NAMESPACE": "ml"}) == {"rljob": "j", "namespace": "ml"}


def test_gauges_with_operator_labels() -> None:
    now = [100.0]
    metrics = TrainerMetrics({"rljob": "j", "namespace": "ml"}, clock=lambda: now[0])
    metrics.set_run(total_steps=10, attempt=3)
    metrics.observe_step(STEP, step=4)
    metrics.observe_checkpoint(4)
    now[0] = 130.0
    samples = _samples(generate_latest(metrics.registry).decode())
    job = (("namespace", "ml"), ("rljob", "j"))
    for name in DASHBOARD:
        assert (name, job) in samples, name
    assert samples[("hybridflow_reward_mean", job)] == 0.5
    assert samples[("hybridflow_kl", job)] == 0.01
    assert samples[("hybridflow_step", job)] == 4 and samples[("hybridflow_total_steps", job)] == 10
    assert samples[("hybridflow_attempt", job)] == 3
    assert samples[("hybridflow_phase_duration_seconds", (*job[:1], ("phase", "gen"), *job[1:]))] == 1.2
    assert ("hybridflow_phase_duration_seconds", (*job[:1], ("phase", "step"), *job[1:])) not in samples
    assert samples[("hybridflow_val_reward_mean", (("data_source", "gsm8k"), *job))] == 0.25
    assert samples[("hybridflow_checkpoint_step", job)] == 4
    assert samples[("hybridflow_checkpoint_age_seconds", job)] == 30.0
    assert samples[("hybridflow_response_length_tokens", job)] == 12.0


def test_unlabelled_outside_the_operator_and_age_unknown_before_a_checkpoint() -> None:
    metrics = TrainerMetrics()
    metrics.set_run(total_steps=None, attempt=None)
    samples = _samples(generate_latest(metrics.registry).decode())
    assert samples[("hybridflow_attempt", ())] == 1
    assert math.isnan(samples[("hybridflow_checkpoint_age_seconds", ())])


def test_logger_serves_http_and_tracking_registers_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(prometheus.PORT_ENV, "0")
    monkeypatch.setenv(prometheus.ADDR_ENV, "127.0.0.1")
    monkeypatch.setenv("RLJOB_NAME", "demo")
    monkeypatch.setenv("RLJOB_NAMESPACE", "team")
    tracker = Tracking("p", "e", ["console"], total_steps=3, stream=open("/dev/null", "w"))  # noqa: SIM115
    logger = tracker.loggers["prometheus"]
    assert isinstance(logger, PrometheusLogger)
    tracker.log(STEP, step=2)
    tracker.checkpoint_saved(2, "file:///x/global_step_2")
    with urllib.request.urlopen(f"http://127.0.0.1:{logger.port}/metrics", timeout=5) as response:
        samples = _samples(response.read().decode())
    tracker.finish()
    job = (("namespace", "team"), ("rljob", "demo"))
    assert samples[("hybridflow_step", job)] == 2 and samples[("hybridflow_checkpoint_step", job)] == 2


def test_port_in_use_says_how_to_fix() -> None:
    first = PrometheusLogger(0, addr="127.0.0.1", env={})
    try:
        with pytest.raises(RuntimeError, match="HYBRIDFLOW_METRICS_PORT or trainer.metrics_port"):
            PrometheusLogger(first.port, addr="127.0.0.1", env={})
    finally:
        first.finish()
