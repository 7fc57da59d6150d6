"""Pure: the trainer's progress as the operator sees it, from its metrics endpoint or its progress record.

The trainer driver serves `hybridflow_*` gauges on port 8000 (reached through KubeRay's head Service,
`<rayClusterName>-head-svc`), and rewrites `progress.json` beside the checkpoints after every step
(`hybridflow.progress`). Either source becomes one `TrainerReport`, which `build_progress_status` turns
into the `status.progress` / `status.metrics` / `status.checkpoint` fragment. `watch_step` and
`is_stalled` implement `spec.runPolicy.stallTimeoutSeconds` ("no new step for that long", issue 6).
No I/O, no clock: texts, objects and `now` come in.
"""

from __future__ import annotations

import datetime
import json
import math
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from rljob_operator.builders import METRICS_PORT
from rljob_operator.names import LABEL_RLJOB
from rljob_operator.settings import TRAINER_METRICS_URL

PROGRESS_FILE = "progress.json"

# Prometheus gauge -> TrainerReport field (names as hybridflow.prometheus exports them).
_GAUGES = {
    "hybridflow_step": "step",
    "hybridflow_total_steps": "total_steps",
    "hybridflow_step_duration_seconds": "step_seconds",
    "hybridflow_reward_mean": "reward_mean",
    "hybridflow_kl": "kl",
    "hybridflow_throughput_tokens_per_second": "throughput",
    "hybridflow_policy_version": "policy_version",
    "hybridflow_staleness_max": "staleness_max",
    "hybridflow_checkpoint_step": "checkpoint_step",
    "hybridflow_checkpoint_timestamp_seconds": "checkpoint_timestamp",
}


@dataclass
class TrainerReport:
    """What the trainer says about itself (any field may be unknown)."""

    step: int | None = None
    total_steps: int | None = None
    step_seconds: float | None = None
    reward_mean: float | None = None
    kl: float | None = None
    throughput: float | None = None
    policy_version: int | None = None  # asynchronous training only
    staleness_max: float | None = None
    checkpoint_step: int | None = None
    checkpoint_uri: str | None = None
    checkpoint_time: str | None = None
    checkpoint_timestamp: float | None = None
    export: dict[str, Any] | None = None  # progress.json only: the finished run's Hugging Face export


def trainer_metrics_url(rayjob: dict[str, Any] | None, port: int = METRICS_PORT,
                        template: str = TRAINER_METRICS_URL) -> str | None:
    """The driver's /metrics through KubeRay's head Service, once the RayJob names its Ray cluster.

    `template` (the operator's --trainer-metrics-url) gets {cluster}, {namespace}, {port} and {rljob}.
    """
    if not rayjob:
        return None
    cluster = (rayjob.get("status") or {}).get("rayClusterName")
    meta = rayjob.get("metadata") or {}
    namespace = meta.get("namespace")
    if not cluster or not namespace:
        return None
    rljob = (meta.get("labels") or {}).get(LABEL_RLJOB, "")
    return template.format(cluster=cluster, namespace=namespace, port=port, rljob=rljob)


def parse_trainer_metrics(text: str) -> TrainerReport | None:
    """Read the hybridflow_* gauges from a Prometheus text exposition; None when there are none."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        field = _GAUGES.get(family.name)
        for sample in family.samples:
            if field and sample.name == family.name and not math.isnan(sample.value):
                values[field] = float(sample.value)
    if "step" not in values:
        return None
    report = TrainerReport()
    for field, value in values.items():
        is_int = field in ("step", "total_steps", "checkpoint_step", "policy_version")
        setattr(report, field, int(value) if is_int else value)
    if report.checkpoint_timestamp is not None:
        report.checkpoint_time = _rfc3339(report.checkpoint_timestamp)
    return report


def parse_progress_record(raw: bytes | str) -> TrainerReport | None:
    """Read a trainer's progress.json; None when it is not one (the reason is not worth a status)."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("step"), int):
        return None
    metrics: dict[str, Any] = data["metrics"] if isinstance(data.get("metrics"), dict) else {}
    checkpoint: dict[str, Any] = data["checkpoint"] if isinstance(data.get("checkpoint"), dict) else {}
    return TrainerReport(
        step=data["step"], total_steps=data.get("total_steps"),
        step_seconds=data.get("avg_step_seconds") or metrics.get("step_seconds"),
        reward_mean=metrics.get("reward_mean"), kl=metrics.get("kl"),
        throughput=metrics.get("throughput_tokens_per_second"),
        policy_version=_int_or_none(metrics.get("policy_version")), staleness_max=metrics.get("staleness_max"),
        checkpoint_step=checkpoint.get("step"), checkpoint_uri=checkpoint.get("uri"),
        checkpoint_time=checkpoint.get("time"), export=_export_record(data.get("export")),
    )


def _export_record(raw: Any) -> dict[str, Any] | None:
    """progress.json's `export` ({step, uri, time, lora}) as the status.export fragment; None when absent or odd."""
    if not isinstance(raw, dict) or not isinstance(raw.get("uri"), str):
        return None
    kept = {"step": raw.get("step") if isinstance(raw.get("step"), int) else None, "uri": raw["uri"],
            "time": raw.get("time") if isinstance(raw.get("time"), str) else None,
            "lora": raw.get("lora") if isinstance(raw.get("lora"), bool) else None}
    return {k: v for k, v in kept.items() if v is not None}


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def compute_eta_seconds(step: int | None, total: int | None, step_seconds: float | None) -> int | None:
    """Seconds left at the recent pace: (total - step) x seconds per step."""
    if step is None or not total or step_seconds is None or step_seconds < 0:
        return None
    return int(round(max(total - step, 0) * step_seconds))


def build_progress_status(report: TrainerReport, checkpoint_root: str | None = None) -> dict[str, Any]:
    """The status fragment (camelCase, as in the CRD) for a report; empty sections are left out.

    The metrics endpoint carries the checkpoint's step, not its URI: that is rebuilt from the job's
    checkpoint location with the trainer's folder naming (`global_step_N`).
    """
    progress: dict[str, Any] = {"step": report.step, "totalSteps": report.total_steps}
    if report.step is not None and report.total_steps:
        progress["percent"] = round(100.0 * report.step / report.total_steps, 1)
    progress["etaSeconds"] = compute_eta_seconds(report.step, report.total_steps, report.step_seconds)
    metrics = {"rewardMean": report.reward_mean, "kl": report.kl, "throughputTokensPerSecond": report.throughput,
               "policyVersion": report.policy_version, "stalenessMax": report.staleness_max}
    uri = report.checkpoint_uri
    if uri is None and report.checkpoint_step is not None and checkpoint_root:
        uri = f"{checkpoint_root.rstrip('/')}/global_step_{report.checkpoint_step}"
    checkpoint = {"step": report.checkpoint_step, "uri": uri, "time": report.checkpoint_time}
    fragment: dict[str, Any] = {}
    for key, section in (("progress", progress), ("metrics", metrics), ("checkpoint", checkpoint)):
        kept = {k: _finite(v) for k, v in section.items() if _finite(v) is not None}
        if kept and (key != "checkpoint" or kept.get("step") is not None):
            fragment[key] = kept
    if report.export:
        fragment["export"] = dict(report.export)
    return fragment


@dataclass(frozen=True)
class StepWatch:
    """The last step seen for an attempt and since when (the stall clock)."""

    attempt: int
    step: int | None
    since: datetime.datetime


def watch_step(previous: StepWatch | None, attempt: int, step: int | None, now: datetime.datetime) -> StepWatch:
    """Restart the stall clock when the attempt changes or the step advances; keep it otherwise."""
    if previous is None or previous.attempt != attempt or (step is not None and step != previous.step):
        return StepWatch(attempt, step, now)
    return previous


def is_stalled(watch: StepWatch | None, now: datetime.datetime, timeout_seconds: int | None) -> bool:
    """True when no new step was seen for `timeout_seconds` (None: no stall timeout)."""
    if watch is None or not timeout_seconds:
        return False
    return (now - watch.since).total_seconds() > timeout_seconds


def stall_message(watch: StepWatch, timeout_seconds: int, unread: str | None = None) -> str:
    """The failure message of a stalled attempt: what happened and what to change.

    `unread`: why the operator could not read the trainer's progress at all (then say so: the fix may be
    the operator's access to the trainer rather than the trainer).
    """
    at = f"step {watch.step}" if watch.step is not None else "its first step"
    message = (f"Attempt {watch.attempt} made no progress past {at} for more than {timeout_seconds}s "
               f"(spec.runPolicy.stallTimeoutSeconds). Raise the timeout if steps (or start-up) legitimately "
               f"take longer.")
    if unread:
        message += (f" The operator could not read the trainer's progress ({unread}); check that it can reach "
                    f"the Ray head Service and read the checkpoint location.")
    return message


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _rfc3339(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
