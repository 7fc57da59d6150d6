"""Loggers: console line and progress, JSONL file (local and object store), TensorBoard, W&B errors."""

from __future__ import annotations

import builtins
import io
import json
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch

from hybridflow import tracking
from hybridflow.tracking import Tracking

METRICS = {
    "critic/score/mean": torch.tensor(0.25),
    "actor/ppo_kl": np.float32(0.0012),
    "actor/entropy": 1.5,
    "actor/pg_loss": -0.1,
    "response_length/mean": 3.0,
    "perf/throughput": 1234.4,
    "timing_s/step": 2.0,
    "timing_s/gen": 0.5,
    "broken": float("nan"),
    "text": "ignored",
}


def test_to_scalars_converts_and_drops_non_numbers() -> None:
    out = tracking.to_scalars(METRICS)
    assert out["critic/score/mean"] == 0.25
    assert abs(out["actor/ppo_kl"] - 0.0012) < 1e-7
    assert out["broken"] is None
    assert "text" not in out


def test_console_line_has_the_watched_numbers_and_eta() -> None:
    stream = io.StringIO()
    logger = Tracking("p", "e", "console", total_steps=10, stream=stream)
    logger.log(METRICS, step=4)
    line = stream.getvalue().strip()
    for piece in (
        "step 4/10",
        "reward 0.250",
        "kl 0.0012",
        "entropy 1.500",
        "resp_len 3.0",
        "tok/s 1234",
        "step_s 2.00",
    ):
        assert piece in line
    assert "40%" in line and "ETA 0:00:12" in line  # 6 steps left x 2 s


def test_console_kl_is_the_reference_kl_when_there_is_one() -> None:
    """The console's kl is the number the status and Prometheus show (progress.summarize_metrics)."""
    line = tracking.format_console_line({"actor/ppo_kl": 0.3, "actor/kl_loss": 0.02}, 1, None, None)
    assert "kl 0.0200" in line


def test_console_eta_uses_mean_step_time_and_val_metrics() -> None:
    stream = io.StringIO()
    logger = tracking.ConsoleLogger(total_steps=4, stream=stream)
    logger.log({"timing_s/step": 1.0}, 1)
    logger.log({"timing_s/step": 3.0, "val-core/toy/reward/mean@1": 0.5}, 2)
    last = stream.getvalue().strip().splitlines()[-1]
    assert "ETA 0:00:04" in last  # 2 steps x mean 2 s
    assert "val toy/reward/mean@1 0.500" in last


def test_file_logger_writes_flat_jsonl_at_default_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(tracking.FILE_LOGGER_ENV, raising=False)
    logger = Tracking("p", "e", ["file"], default_local_dir=str(tmp_path / "ckpt"))
    logger.log(METRICS, step=1)
    logger.log({"critic/score/mean": 0.5}, step=2)
    lines = (tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert first["step"] == 1 and first["actor/pg_loss"] == -0.1 and first["broken"] is None
    assert json.loads(lines[1]) == {"step": 2, "critic/score/mean": 0.5}
    assert logger.file_path == str(tmp_path / "ckpt" / "metrics.jsonl")


def test_file_logger_path_from_env(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "m.jsonl"
    assert tracking.resolve_file_logger_path("/ignored", {tracking.FILE_LOGGER_ENV: str(target)}) == str(
        target
    )
    assert tracking.resolve_file_logger_path("s3://b/run/", {}) == "s3://b/run/metrics.jsonl"
    with pytest.raises(ValueError, match="default_local_dir"):
        tracking.resolve_file_logger_path(None, {})


def test_file_logger_on_object_store_rewrites_and_keeps_history() -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe("/bucket/run/metrics.jsonl", b'{"step": 1}\n')
    logger = tracking.FileLogger("memory://bucket/run/metrics.jsonl")
    logger.log({"critic/score/mean": 1.0}, 2)
    lines = fs.cat_file("/bucket/run/metrics.jsonl").decode().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    fs.rm("/bucket", recursive=True)


def test_tensorboard_logger_writes_event_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    logger = Tracking("p", "e", ["tensorboard"])
    logger.log(METRICS, step=1)
    logger.finish()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_unknown_backend_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid ones are.*console"):
        Tracking("p", "e", ["console", "mlflowz"])


def test_wandb_missing_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def fake_import(name: str, *args, **kwargs):
        if name == "wandb":
            raise ImportError("no wandb")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(RuntimeError, match="pip install wandb"):
        Tracking("p", "e", ["wandb"])


def test_wandb_resumes_the_same_run_id(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []

    class FakeRun:
        def __init__(self, run_id: str) -> None:
            self.id = run_id
            self.logged: list[tuple[dict, int]] = []

        def log(self, data: dict, step: int) -> None:
            self.logged.append((data, step))

        def finish(self) -> None:
            pass

    class FakeWandb:
        @staticmethod
        def init(**kwargs):
            calls.append(kwargs)
            return FakeRun(kwargs["id"] or "new-id")

    monkeypatch.setitem(__import__("sys").modules, "wandb", FakeWandb)
    first = Tracking("p", "e", ["wandb"])
    assert first.wandb_run_id == "new-id"
    again = Tracking("p", "e", ["wandb"], wandb_run_id=first.wandb_run_id)
    again.log({"a": 1.0, "b": float("inf")}, step=3)
    assert calls[1]["id"] == "new-id" and calls[1]["resume"] == "allow"
    assert again.loggers["wandb"].run.logged == [({"a": 1.0}, 3)]


SAMPLES = [("What is 2+2?", "4", 1.0), ("Name | a colour", "blue\nish", 0.0)]


def test_generations_on_console_and_beside_the_metrics_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tracking.FILE_LOGGER_ENV, raising=False)
    stream = io.StringIO()
    logger = Tracking("p", "e", ["console", "file"], default_local_dir=str(tmp_path), stream=stream)
    logger.log_generations(SAMPLES, step=0)
    logger.log_generations(SAMPLES[:1], step=5)
    printed = stream.getvalue()
    assert "validation generations at step 0:" in printed and "[1] 'What is 2+2?' -> '4'" in printed
    rows = [json.loads(x) for x in (tmp_path / tracking.GENERATIONS_FILE).read_text().splitlines()]
    assert rows == [
        {"step": 0, "input": "What is 2+2?", "output": "4", "score": 1.0},
        {"step": 0, "input": "Name | a colour", "output": "blue\nish", "score": 0.0},
        {"step": 5, "input": "What is 2+2?", "output": "4", "score": 1.0},
    ]
    assert not (tmp_path / "metrics.jsonl").exists()  # samples never enter the metrics stream


def test_generations_as_tensorboard_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    logger = Tracking("p", "e", ["tensorboard"])
    logger.log_generations(SAMPLES, step=3)
    logger.finish()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    (text,) = events.Tensors("val/generations/text_summary")
    table = text.tensor_proto.string_val[0].decode()
    assert text.step == 3
    assert "| 1 | What is 2+2? | 4 |" in table and "Name \\| a colour" in table and "blue<br>ish" in table
