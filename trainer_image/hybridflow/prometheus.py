"""The trainer driver's Prometheus endpoint: `hybridflow_*` gauges updated once per step.

Names follow Prometheus conventions (base units in the name, `_seconds`, `_tokens`), and the Helm
chart's Grafana dashboard is built on them, so keep them stable (issue 6). When the operator runs the
trainer, every series carries `rljob` and `namespace` labels from $RLJOB_NAME / $RLJOB_NAMESPACE.

Port: $HYBRIDFLOW_METRICS_PORT (the operator sets it; the head Service exposes it), else
`trainer.metrics_port`; 0 picks a free port. Address: $HYBRIDFLOW_METRICS_ADDR, default all interfaces.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from hybridflow.progress import attempt_from_env, summarize_metrics

PORT_ENV = "HYBRIDFLOW_METRICS_PORT"
ADDR_ENV = "HYBRIDFLOW_METRICS_ADDR"
DEFAULT_PORT = 8000
_VAL_PREFIX = "val-core/"

# Summary name (progress.SUMMARY_KEYS) -> (metric name, help).
SUMMARY_GAUGES: dict[str, tuple[str, str]] = {
    "reward_mean": ("hybridflow_reward_mean", "Mean sequence score of the last training batch."),
    "kl": ("hybridflow_kl", "KL divergence of the policy from the reference (KL loss or KL-in-reward), "
                            "else the PPO old/new-policy KL."),
    "entropy": ("hybridflow_entropy", "Mean token entropy of the policy on the last batch."),
    "response_length_mean": ("hybridflow_response_length_tokens", "Mean response length of the last batch."),
    "throughput_tokens_per_second": ("hybridflow_throughput_tokens_per_second",
                                     "Tokens processed per second per accelerator in the last step."),
    "step_seconds": ("hybridflow_step_duration_seconds", "Wall time of the last training step."),
    "loss": ("hybridflow_loss", "Training loss of the last batch (SFT and DPO trainers)."),
    "policy_version": ("hybridflow_policy_version", "Actor updates in the weights being trained (asynchronous "
                                                    "training)."),
    "staleness_mean": ("hybridflow_staleness_mean", "Mean policy versions between a trained token and the trainer."),
    "staleness_max": ("hybridflow_staleness_max", "Oldest trained sample's policy versions behind the trainer."),
}


def resolve_port(config_port: int | None, env: Mapping[str, str] | None = None) -> int:
    """$HYBRIDFLOW_METRICS_PORT, else the configured port, else 8000 (what the operator's Service uses)."""
    env = os.environ if env is None else env
    raw = env.get(PORT_ENV)
    if raw:
        if not raw.isdigit() or int(raw) > 65535:
            raise ValueError(f"${PORT_ENV}={raw!r} is not a TCP port; set it to a number in 0..65535 (0 = any free)")
        return int(raw)
    return DEFAULT_PORT if config_port is None else int(config_port)


def job_labels(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`rljob`/`namespace` labels when the operator launched this trainer, else none."""
    env = os.environ if env is None else env
    if not env.get("RLJOB_NAME"):
        return {}
    return {"rljob": env["RLJOB_NAME"], "namespace": env.get("RLJOB_NAMESPACE", "")}


class TrainerMetrics:
    """The gauges, in their own registry (no clash with other collectors in the process)."""

    def __init__(self, labels: Mapping[str, str] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.registry = CollectorRegistry()
        self.labels = dict(labels or {})
        self.clock = clock
        names = list(self.labels)

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, [*names, *extra], registry=self.registry)

        self.step = gauge("hybridflow_step", "Last completed training step.")
        self.total_steps = gauge("hybridflow_total_steps", "Training steps the run will take.")
        self.attempt = gauge("hybridflow_attempt", "Attempt number (the operator restarts failed attempts).")
        self.summary = {key: gauge(name, doc) for key, (name, doc) in SUMMARY_GAUGES.items()}
        self.phase = gauge("hybridflow_phase_duration_seconds", "Wall time of one phase of the last step.",
                           ("phase",))
        self.val_reward = gauge("hybridflow_val_reward_mean", "Mean validation score per data source.",
                                ("data_source",))
        self.last_step_time = gauge("hybridflow_last_step_timestamp_seconds", "Unix time the last step finished.")
        self.checkpoint_step = gauge("hybridflow_checkpoint_step", "Step of the latest committed checkpoint.")
        self.checkpoint_time = gauge("hybridflow_checkpoint_timestamp_seconds",
                                     "Unix time the latest checkpoint was committed.")
        self.checkpoint_age = gauge("hybridflow_checkpoint_age_seconds",
                                    "Seconds since the latest checkpoint was committed (at scrape time).")
        self._checkpoint_at: float | None = None
        self._g(self.checkpoint_age).set_function(self._age)

    def _age(self) -> float:
        return float("nan") if self._checkpoint_at is None else max(self.clock() - self._checkpoint_at, 0.0)

    def _g(self, gauge: Gauge, **extra: str) -> Any:
        return gauge.labels(**self.labels, **extra) if (self.labels or extra) else gauge

    def set_run(self, total_steps: int | None, attempt: int | None) -> None:
        """Run-level facts known at start."""
        if total_steps is not None:
            self._g(self.total_steps).set(total_steps)
        self._g(self.attempt).set(attempt if attempt is not None else 1)

    def observe_step(self, data: Mapping[str, float | None], step: int) -> None:
        """Update every gauge from one step's verl metrics."""
        self._g(self.step).set(step)
        self._g(self.last_step_time).set(self.clock())
        for name, summary in summarize_metrics(data).items():
            self._g(self.summary[name]).set(summary)
        for key, value in data.items():
            if value is None:
                continue
            if key.startswith("timing_s/") and key != "timing_s/step":
                self._g(self.phase, phase=key.removeprefix("timing_s/")).set(value)
            elif key.startswith(_VAL_PREFIX):  # val-core/<data_source>/reward/mean@n
                self._g(self.val_reward, data_source=key.removeprefix(_VAL_PREFIX).split("/", 1)[0]).set(value)

    def observe_checkpoint(self, step: int, when: float | None = None) -> None:
        """Record a committed checkpoint."""
        at = self.clock() if when is None else when
        self._checkpoint_at = at
        self._g(self.checkpoint_step).set(step)
        self._g(self.checkpoint_time).set(at)


class PrometheusLogger:
    """Tracking backend: serves TrainerMetrics over HTTP from the driver for the life of the run."""

    def __init__(
        self,
        port: int,
        *,
        addr: str | None = None,
        total_steps: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.metrics = TrainerMetrics(job_labels(env))
        self.metrics.set_run(total_steps, attempt_from_env(env))
        addr = addr or env.get(ADDR_ENV) or "0.0.0.0"
        try:
            self.server, self._thread = start_http_server(port, addr=addr, registry=self.metrics.registry)
        except OSError as exc:
            raise RuntimeError(
                f"cannot serve Prometheus metrics on {addr}:{port} ({exc}); free the port, or pick another "
                f"with ${PORT_ENV} or trainer.metrics_port (0 = any free port)"
            ) from exc
        self.port = int(self.server.server_port)

    def log(self, data: Mapping[str, float | None], step: int) -> None:
        """Update the gauges (the next scrape sees them)."""
        self.metrics.observe_step(data, step)

    def checkpoint_saved(self, step: int, uri: str) -> None:
        """Update the checkpoint gauges."""
        self.metrics.observe_checkpoint(step)

    def finish(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()
