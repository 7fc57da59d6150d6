"""Experiment loggers: console, JSONL file, TensorBoard, W&B and MLflow behind one `Tracking.log(data, step)`.

Metric names follow verl (`critic/score/mean`, `actor/pg_loss`, `actor/entropy`, `actor/ppo_kl`,
`response_length/mean`, `perf/throughput`, `timing_s/gen`, ...), so dashboards built for verl work.
Two more backends come with the run's storage and the operator: `prometheus` (the driver's metrics
endpoint, also switched on by $HYBRIDFLOW_METRICS_PORT) and the progress record `progress.json` beside the
checkpoints (always on when the run has a checkpoint folder).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TextIO

import fsspec

from hybridflow.progress import summarize_metrics

BACKENDS = ("console", "file", "tensorboard", "wandb", "mlflow", "prometheus")
MLFLOW_DIR = "mlruns"  # the MLflow file store beside the checkpoints, when $MLFLOW_TRACKING_URI is not set
FILE_LOGGER_ENV = "HYBRIDFLOW_FILE_LOGGER_PATH"
METRICS_FILE = "metrics.jsonl"
GENERATIONS_FILE = "val_generations.jsonl"  # trainer.log_val_generations, beside the metrics file


class Logger(Protocol):
    """One backend: receives a flat dict of floats per step."""

    def log(self, data: Mapping[str, float | None], step: int) -> None: ...

    def finish(self) -> None: ...


def to_scalars(data: Mapping[str, Any]) -> dict[str, float | None]:
    """Flatten tensors / numpy scalars to floats; non-finite values become None (valid JSON)."""
    out: dict[str, float | None] = {}
    for key, value in data.items():
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, bool | int | float):
            value = float(value)
            out[key] = value if math.isfinite(value) else None
    return out


def _fmt_seconds(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def format_console_line(
    data: Mapping[str, float | None], step: int, total_steps: int | None, avg_step_s: float | None
) -> str:
    """Build the one readable line per step: the numbers a person watches, then a progress bar with ETA."""
    summary = summarize_metrics(data)  # the same numbers as progress.json, Prometheus and the RLJob status
    fields = [
        ("reward", "reward_mean", "{:.3f}"),
        ("loss", "loss", "{:.4f}"),
        ("kl", "kl", "{:.4f}"),
        ("entropy", "entropy", "{:.3f}"),
        ("resp_len", "response_length_mean", "{:.1f}"),
        ("tok/s", "throughput_tokens_per_second", "{:.0f}"),
        ("step_s", "step_seconds", "{:.2f}"),
    ]
    parts = [f"step {step}" + (f"/{total_steps}" if total_steps else "")]
    parts += [f"{name} {fmt.format(summary[key])}" for name, key, fmt in fields if key in summary]
    val = sorted((k.removeprefix("val-core/"), v) for k, v in data.items() if k.startswith("val-core/"))
    parts += [f"val {name} {value:.3f}" for name, value in val if value is not None]
    if total_steps:
        done = min(step / total_steps, 1.0)
        bar = "#" * int(done * 20) + "-" * (20 - int(done * 20))
        progress = f"[{bar}] {done:4.0%}"
        if avg_step_s is not None:
            progress += f" ETA {_fmt_seconds(avg_step_s * max(total_steps - step, 0))}"
        parts.append(progress)
    return " | ".join(parts)


class ConsoleLogger:
    """Prints one line per step with a progress bar and an ETA from the mean step time."""

    def __init__(self, total_steps: int | None = None, stream: TextIO | None = None) -> None:
        self.total_steps = total_steps
        self.stream = stream
        self._step_times: list[float] = []

    def log(self, data: Mapping[str, float | None], step: int) -> None:
        step_s = data.get("timing_s/step")
        if step_s is not None:
            self._step_times.append(step_s)
        avg = sum(self._step_times) / len(self._step_times) if self._step_times else None
        print(
            format_console_line(data, step, self.total_steps, avg), file=self.stream or sys.stdout, flush=True
        )

    def log_generations(self, samples: Sequence[tuple[str, str, float]], step: int) -> None:
        """Print each sample as `[score] input -> output` (long texts shortened)."""
        out = self.stream or sys.stdout
        print(f"validation generations at step {step}:", file=out)
        for text_in, text_out, score in samples:
            print(f"  [{score:g}] {_shorten(text_in)!r} -> {_shorten(text_out)!r}", file=out, flush=True)

    def finish(self) -> None:
        """Nothing to close."""


def _shorten(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit // 2 - 2] + " .. " + text[-(limit // 2 - 2) :]


class FileLogger:
    """Writes one flat JSON object per step (`{"step": N, ...metrics}`) to a JSONL file or URI.

    Local files are appended to; object stores cannot append, so there the whole file is rewritten
    each step (it stays small: one line per step).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fs, self._fs_path = fsspec.core.url_to_fs(path)
        self._local = "file" in (
            self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        )
        self.fs.makedirs(os.path.dirname(self._fs_path) or ".", exist_ok=True)
        self._lines: list[str] = []
        self._generations: FileLogger | None = None
        if not self._local and self.fs.exists(self._fs_path):
            self._lines = self.fs.cat_file(self._fs_path).decode().splitlines()

    def log(self, data: Mapping[str, float | None], step: int) -> None:
        self.append([json.dumps({"step": step, **data})])

    def append(self, lines: Sequence[str]) -> None:
        """Add JSON lines to the file (appended locally, the whole file rewritten on object stores)."""
        if self._local:
            with open(self._fs_path, "a", encoding="utf-8") as handle:
                handle.write("".join(line + "\n" for line in lines))
            return
        self._lines += lines
        with self.fs.open(self._fs_path, "wb") as handle:
            handle.write(("\n".join(self._lines) + "\n").encode())

    def log_generations(self, samples: Sequence[tuple[str, str, float]], step: int) -> None:
        """One JSON line per sample (`step`, `input`, `output`, `score`) in val_generations.jsonl beside the metrics."""
        if self._generations is None:
            folder = self.path.rsplit("/", 1)[0] if "/" in self.path else "."
            self._generations = FileLogger(f"{folder}/{GENERATIONS_FILE}")
        self._generations.append(
            [json.dumps({"step": step, "input": i, "output": o, "score": score}) for i, o, score in samples]
        )

    def finish(self) -> None:
        """Nothing buffered."""


class TensorboardLogger:
    """Scalars through torch's SummaryWriter (log dir: $TENSORBOARD_DIR or tensorboard_log/<project>/<exp>)."""

    def __init__(self, log_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=log_dir)

    def log(self, data: Mapping[str, float | None], step: int) -> None:
        for key, value in data.items():
            if value is not None:
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_generations(self, samples: Sequence[tuple[str, str, float]], step: int) -> None:
        """A markdown table of the samples under the text tag `val/generations`."""
        rows = ["| score | input | output |", "|---|---|---|"]
        rows += [f"| {score:g} | {_md(i)} | {_md(o)} |" for i, o, score in samples]
        self.writer.add_text("val/generations", "\n".join(rows), step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


class WandbLogger:
    """Weights & Biases run; `run_id` is kept in checkpoints so a resumed job continues the same run."""

    def __init__(self, project: str, name: str, config: Mapping[str, Any] | None, run_id: str | None) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise RuntimeError(
                "trainer.logger includes 'wandb' but the wandb package is not installed: "
                "run `pip install wandb` (and set WANDB_API_KEY), or remove 'wandb' from trainer.logger."
            ) from exc
        self._wandb = wandb
        self.run = wandb.init(
            project=project, name=name, config=dict(config or {}), id=run_id, resume="allow"
        )
        self.run_id: str = self.run.id
        self._generation_rows: list[list[Any]] = []

    def log(self, data: Mapping[str, float | None], step: int) -> None:
        self.run.log({k: v for k, v in data.items() if v is not None}, step=step)

    def log_generations(self, samples: Sequence[tuple[str, str, float]], step: int) -> None:
        """A `val/generations` table (step, input, output, score) that grows with every validation."""
        self._generation_rows += [[step, i, o, score] for i, o, score in samples]
        table = self._wandb.Table(columns=["step", "input", "output", "score"], data=self._generation_rows)
        self.run.log({"val/generations": table}, step=step)

    def finish(self) -> None:
        self.run.finish()


class MlflowLogger:
    """An MLflow run: experiment = project name, run name = experiment name (verl's mapping); the config as params.

    The tracking store is $MLFLOW_TRACKING_URI when set (a server, or sqlite:/// with the full `mlflow` package),
    else an MLflow file store `<default_local_dir>/mlruns` (`./mlruns` when the checkpoints are remote).
    Metric names keep verl's, with `@` written `_at_` (MLflow refuses it, as verl does).
    """

    def __init__(
        self, project: str, name: str, config: Mapping[str, Any] | None, tracking_uri: str
    ) -> None:
        try:
            import mlflow
        except ImportError as exc:
            raise RuntimeError(
                "trainer.logger includes 'mlflow' but mlflow is not installed: run `pip install mlflow-skinny` "
                "(or mlflow), or remove 'mlflow' from trainer.logger."
            ) from exc
        self._mlflow = mlflow
        if tracking_uri.startswith("file:") or "://" not in tracking_uri:
            # MLflow 3 keeps its file store in maintenance mode and asks for this opt-in; it is the only store
            # mlflow-skinny can write without a server or SQLAlchemy.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = mlflow.MlflowClient(tracking_uri=tracking_uri)
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
        self.run = self.client.create_run(experiment_id, run_name=name)
        self.run_id: str = self.run.info.run_id
        self.tracking_uri = tracking_uri
        params = flatten_params(config or {})
        if params:
            from mlflow.entities import Param

            items = [Param(k, v) for k, v in params.items()]
            for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
                self.client.log_batch(self.run_id, params=items[start : start + 100])

    def log(self, data: Mapping[str, float | None], step: int) -> None:
        from mlflow.entities import Metric

        stamp = _now_ms()
        metrics = [
            Metric(key.replace("@", "_at_"), value, stamp, step) for key, value in data.items() if value is not None
        ]
        for start in range(0, len(metrics), 1000):  # MLflow's limit per batch
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def log_generations(self, samples: Sequence[tuple[str, str, float]], step: int) -> None:
        """The samples as a JSON artifact `val_generations/step_<N>.json` of the run."""
        rows = [{"input": i, "output": o, "score": score} for i, o, score in samples]
        self.client.log_text(self.run_id, json.dumps(rows), f"val_generations/step_{step}.json")

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def flatten_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """The config as MLflow params: nested keys joined by `/`, list items by index, values as text (<= 6000 chars)."""
    out: dict[str, str] = {}
    items: Any = config.items() if isinstance(config, Mapping) else enumerate(config)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, Mapping | list | tuple) and value:
            out.update(flatten_params(value, f"{name}/"))  # type: ignore[arg-type]
        else:
            out[name] = str(value)[:6000]
    return out


def resolve_mlflow_uri(default_local_dir: str | None, env: Mapping[str, str] | None = None) -> str:
    """$MLFLOW_TRACKING_URI, else a file store under <default_local_dir>/mlruns (./mlruns for a remote folder)."""
    env = os.environ if env is None else env
    if env.get("MLFLOW_TRACKING_URI"):
        return env["MLFLOW_TRACKING_URI"]
    root = str(default_local_dir or "").removeprefix("file://")
    folder = os.path.join(root, MLFLOW_DIR) if root and "://" not in root else MLFLOW_DIR
    return "file://" + os.path.abspath(folder)


def resolve_file_logger_path(default_local_dir: str | None, env: Mapping[str, str] | None = None) -> str:
    """Return $HYBRIDFLOW_FILE_LOGGER_PATH, else `<default_local_dir>/metrics.jsonl`."""
    env = os.environ if env is None else env
    if env.get(FILE_LOGGER_ENV):
        return env[FILE_LOGGER_ENV]
    if not default_local_dir:
        raise ValueError(
            f"the file logger needs trainer.default_local_dir or ${FILE_LOGGER_ENV} to know where to write"
        )
    return f"{default_local_dir.rstrip('/')}/{METRICS_FILE}"


class Tracking:
    """Fan one step's metrics out to the configured backends (verl's `Tracking`, same call shape)."""

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        default_backend: str | Sequence[str],
        config: Mapping[str, Any] | None = None,
        *,
        default_local_dir: str | None = None,
        total_steps: int | None = None,
        wandb_run_id: str | None = None,
        stream: TextIO | None = None,
    ) -> None:
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise ValueError(f"trainer.logger: unknown logger(s) {unknown}; valid ones are {list(BACKENDS)}")
        self.loggers: dict[str, Logger] = {}
        self.wandb_run_id = wandb_run_id
        if "console" in backends:
            self.loggers["console"] = ConsoleLogger(total_steps, stream)
        if "file" in backends:
            self.loggers["file"] = FileLogger(resolve_file_logger_path(default_local_dir))
        if "tensorboard" in backends:
            log_dir = os.environ.get("TENSORBOARD_DIR") or f"tensorboard_log/{project_name}/{experiment_name}"
            self.loggers["tensorboard"] = TensorboardLogger(log_dir)
        if "wandb" in backends:
            wandb_logger = WandbLogger(project_name, experiment_name, config, wandb_run_id)
            self.wandb_run_id = wandb_logger.run_id
            self.loggers["wandb"] = wandb_logger
        if "mlflow" in backends:
            self.loggers["mlflow"] = MlflowLogger(
                project_name, experiment_name, config, resolve_mlflow_uri(default_local_dir)
            )
        if "prometheus" in backends or os.environ.get("HYBRIDFLOW_METRICS_PORT"):
            from hybridflow.prometheus import PrometheusLogger, resolve_port

            port = resolve_port(((config or {}).get("trainer") or {}).get("metrics_port"))
            self.loggers["prometheus"] = PrometheusLogger(port, total_steps=total_steps)
        if default_local_dir:
            from hybridflow.progress import ProgressLogger

            self.loggers["progress"] = ProgressLogger(
                default_local_dir, total_steps=total_steps, wandb_run_id=self.wandb_run_id
            )

    @property
    def file_path(self) -> str | None:
        """Where the JSONL metrics go, when the file logger is on."""
        file_logger = self.loggers.get("file")
        return file_logger.path if isinstance(file_logger, FileLogger) else None

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """Send one step's metrics to every backend."""
        scalars = to_scalars(data)
        for logger in self.loggers.values():
            logger.log(scalars, step)

    def checkpoint_saved(self, step: int, uri: str) -> None:
        """Tell the backends that follow checkpoints (progress record, Prometheus) that `step` is committed."""
        for logger in self.loggers.values():
            notify = getattr(logger, "checkpoint_saved", None)
            if notify is not None:
                notify(step, uri)

    def log_generations(self, samples: Sequence[tuple[str, str, float]], step: int) -> None:
        """Send validation samples (input, output, score) to the backends that show text."""
        for logger in self.loggers.values():
            show = getattr(logger, "log_generations", None)
            if show is not None:
                show(samples, step)

    def finish(self) -> None:
        """Flush and close every backend."""
        for logger in self.loggers.values():
            logger.finish()
