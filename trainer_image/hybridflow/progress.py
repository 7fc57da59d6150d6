"""The progress record `progress.json` beside the checkpoints: where a run stands, readable without the pods.

One small JSON object, rewritten atomically (one PUT on object storage, write-and-rename on disk) after
every step::

    {"step": 12, "total_steps": 100, "attempt": 2, "updated": "2026-11-30T12:00:00Z",
     "avg_step_seconds": 4.1, "metrics": {"reward_mean": 0.61, "kl": 0.002, ...},
     "checkpoint": {"step": 10, "uri": "s3://b/run/global_step_10", "time": "2026-11-30T11:59:50Z"},
     "wandb_run_id": "abc123",
     "export": {"step": 100, "uri": "s3://b/run/export/global_step_100", "time": "...", "lora": false}}

`export` appears once a finished run exported its final checkpoint (`trainer.export.enable`).

The operator falls back to it when the trainer's metrics endpoint cannot be reached, and a restarted
attempt finds the W&B run id here even before its first checkpoint (issue 6).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from hybridflow import storage

if TYPE_CHECKING:  # checkpoint imports torch; the operator reads progress.json without it
    from hybridflow.checkpoint import TrainerState

PROGRESS_FILE = "progress.json"
ATTEMPT_ENV = "HYBRIDFLOW_ATTEMPT"

# Summary name -> verl metric keys, first present wins. KL prefers the divergence from the reference
# policy (KL loss, KL-in-reward, or online DPO's estimate), then on-policy distillation's from the teacher,
# and falls back to the PPO old/new-policy KL.
SUMMARY_KEYS: dict[str, tuple[str, ...]] = {
    "reward_mean": ("critic/score/mean", "critic/rewards/mean"),
    "kl": ("actor/kl_loss", "critic/kl", "dpo/kl", "actor/distillation/loss", "actor/ppo_kl"),
    "entropy": ("actor/entropy",),
    "response_length_mean": ("response_length/mean",),
    "throughput_tokens_per_second": ("perf/throughput",),
    "step_seconds": ("timing_s/step",),
    "loss": ("train/loss",),  # the offline trainers (SFT, DPO): their objective on the last batch
    # asynchronous training: the trainer's policy version and how many versions old its samples were
    "policy_version": ("fully_async/policy_version",),
    "staleness_mean": ("fully_async/trajectory_staleness/mean",),
    "staleness_max": ("fully_async/trajectory_staleness/max",),
}


def summarize_metrics(data: Mapping[str, float | None]) -> dict[str, float]:
    """Pick the few numbers people watch (reward, KL, entropy, length, tokens/s, step time) from verl keys."""
    out: dict[str, float] = {}
    for name, keys in SUMMARY_KEYS.items():
        for key in keys:
            value = data.get(key)
            if value is not None:
                out[name] = float(value)
                break
    return out


def iso_utc(timestamp: float) -> str:
    """Format a Unix time as RFC 3339 UTC with a Z (what Kubernetes status fields use)."""
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class CheckpointInfo:
    """The latest committed checkpoint."""

    step: int
    uri: str
    time: str


@dataclass
class ExportInfo:
    """The Hugging Face folder exported from the final checkpoint (`trainer.export`)."""

    step: int
    uri: str
    time: str
    lora: bool = False


@dataclass
class Progress:
    """Where a run stands; serialised as progress.json."""

    step: int
    total_steps: int | None = None
    attempt: int | None = None
    updated: str | None = None
    avg_step_seconds: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: CheckpointInfo | None = None
    wandb_run_id: str | None = None
    export: ExportInfo | None = None

    def to_json(self) -> bytes:
        """Serialise as compact, stable JSON."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> Progress:
        """Parse a record; unknown keys (from a newer trainer) are ignored, a broken one raises ValueError."""
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{PROGRESS_FILE} is not valid JSON ({exc})") from exc
        if not isinstance(data, dict) or not isinstance(data.get("step"), int):
            raise ValueError(f"{PROGRESS_FILE} has no integer 'step'; it was not written by hybridflow")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        checkpoint = known.get("checkpoint")
        known["checkpoint"] = CheckpointInfo(**checkpoint) if isinstance(checkpoint, dict) else None
        export = known.get("export")
        known["export"] = (ExportInfo(**{k: v for k, v in export.items() if k in ExportInfo.__dataclass_fields__})
                           if isinstance(export, dict) else None)
        known["metrics"] = {k: float(v) for k, v in (known.get("metrics") or {}).items() if v is not None}
        return cls(**known)


def progress_uri(root: str) -> str:
    """Where the record of the run whose checkpoints live under `root` goes."""
    return f"{root.rstrip('/')}/{PROGRESS_FILE}"


def write_progress(root: str, record: Progress, **kwargs: Any) -> None:
    """Replace the record atomically (readers see the old or the new one, never a torn file)."""
    storage.write_bytes(progress_uri(root), record.to_json(), **kwargs)


def read_progress(root: str, **kwargs: Any) -> Progress | None:
    """Return the record under `root`, or None when the run has not written one yet."""
    try:
        return Progress.from_json(storage.read_bytes(progress_uri(root), **kwargs))
    except FileNotFoundError:
        return None


def record_export(root: str, step: int, uri: str, *, lora: bool = False, clock: Callable[[], float] = time.time) -> Progress:
    """Add the export of the final checkpoint to the record under `root` (after training: no writer races it)."""
    record = read_progress(root) or Progress(step=step)
    record.export = ExportInfo(step=step, uri=uri, time=iso_utc(clock()), lora=lora)
    record.updated = iso_utc(clock())
    write_progress(root, record)
    return record


def read_progress_or_warn(root: str, warn: Callable[[str], None]) -> Progress | None:
    """Return the record under `root`; a broken or unreadable one is reported through `warn` and skipped."""
    try:
        return read_progress(root)
    except (ValueError, OSError) as exc:  # StorageError is an OSError
        warn(f"progress: ignoring the previous {progress_uri(root)}: {exc}")
        return None


def choose_wandb_run_id(
    checkpoint_state: TrainerState | None, progress_record: Progress | None, resume_mode: str
) -> str | None:
    """Pick the W&B run a starting attempt continues: the checkpoint's id, else progress.json's (issue 6).

    The progress record is rewritten every step, so it holds the id even when the previous attempt died
    before its first checkpoint. `resume_mode=disable` starts a fresh run and so a fresh W&B run.
    """
    if resume_mode == "disable":
        return None
    if checkpoint_state is not None and checkpoint_state.wandb_run_id:
        return checkpoint_state.wandb_run_id
    return progress_record.wandb_run_id if progress_record is not None else None


def attempt_from_env(env: Mapping[str, str] | None = None) -> int | None:
    """The operator's attempt number ($HYBRIDFLOW_ATTEMPT), or None outside the operator."""
    env = os.environ if env is None else env
    raw = env.get(ATTEMPT_ENV)
    return int(raw) if raw and raw.strip().isdigit() else None


class ProgressLogger:
    """Tracking backend that rewrites progress.json after each step (and each committed checkpoint).

    It starts from the previous attempt's record, so the last checkpoint and the W&B run id survive a
    restart. A storage failure here is reported and skipped: progress is advisory, training goes on.
    """

    def __init__(
        self,
        root: str,
        *,
        total_steps: int | None = None,
        wandb_run_id: str | None = None,
        clock: Callable[[], float] = time.time,
        env: Mapping[str, str] | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.root = root
        self.clock = clock
        self.warn = warn or (lambda msg: print(msg, file=sys.stderr, flush=True))
        previous = read_progress_or_warn(root, self.warn)
        self.record = Progress(
            step=previous.step if previous else 0,
            total_steps=total_steps,
            attempt=attempt_from_env(env),
            checkpoint=previous.checkpoint if previous else None,
            wandb_run_id=wandb_run_id or (previous.wandb_run_id if previous else None),
        )
        self._step_seconds: list[float] = []

    def log(self, data: Mapping[str, float | None], step: int) -> None:
        """Record the step's summary metrics and write the record."""
        summary = summarize_metrics(data)
        if "step_seconds" in summary:
            self._step_seconds.append(summary["step_seconds"])
            self.record.avg_step_seconds = sum(self._step_seconds) / len(self._step_seconds)
        self.record.step = step
        self.record.metrics.update(summary)
        self._write()

    def checkpoint_saved(self, step: int, uri: str) -> None:
        """Record a newly committed checkpoint and write the record."""
        self.record.checkpoint = CheckpointInfo(step=step, uri=uri, time=iso_utc(self.clock()))
        self._write()

    def _write(self) -> None:
        self.record.updated = iso_utc(self.clock())
        try:
            write_progress(self.root, self.record)
        except (OSError, storage.StorageError) as exc:
            self.warn(f"progress: could not write {progress_uri(self.root)} ({exc}); training continues")

    def finish(self) -> None:
        """Nothing buffered: every update is already written."""
