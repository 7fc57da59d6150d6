"""SIGTERM during `fit()`: the run stops only after checkpointing the step it stops at, wherever the signal lands.

The loop's steps, saves and metrics logging are replaced by recorders (no Ray, no model); the signal is
real: the test process sends itself SIGTERM at a chosen point of a step and the trainer's handler runs.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from hybridflow.config import load_config
from hybridflow.tracking import Tracking
from hybridflow.trainer.ray_trainer import RayPPOTrainer, WorkerGroups


class RecordingTrainer(RayPPOTrainer):
    """fit() over fake steps: records which steps ran and which were checkpointed."""

    def __init__(self, signal_at: tuple[int, str], run_dir: Path, save_freq: int = -1) -> None:
        config = load_config(
            None,
            [
                "trainer.total_training_steps=5",
                f"trainer.save_freq={save_freq}",
                "trainer.logger=[console,file]",  # file: metrics.jsonl beside the checkpoints
                f"trainer.default_local_dir={run_dir}",  # the progress record goes here
            ],
        )
        config.trainer.val_before_train = False
        self.messages: list[str] = []
        super().__init__(
            config,
            None,
            WorkerGroups(actor_rollout=None),
            [None] * 5,
            reward_fn=lambda *_: None,
            log=self.messages.append,
        )
        self.signal_at = signal_at
        self.steps: list[int] = []
        self.saved: list[int] = []
        self.rows_at_save: list[list[int]] = []

    def logged_steps(self) -> list[int]:
        rows = self.ckpt_root and Path(self.ckpt_root, "metrics.jsonl")
        return [json.loads(line)["step"] for line in rows.read_text().splitlines()] if rows.exists() else []

    def _resume(self) -> Any:
        return None

    def _maybe_signal(self, where: str) -> None:
        if self.signal_at == (self.global_step, where):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next bytecode

    def train_step(self) -> dict[str, float]:
        self.steps.append(self.global_step)
        self._maybe_signal("train_step")
        return {"x": float(self.global_step)}

    def save_checkpoint(self) -> str:
        self.saved.append(self.global_step)
        self.rows_at_save.append(self.logged_steps())
        return f"step{self.global_step}"


@pytest.mark.parametrize(
    ("signal_at", "stops_at"),
    [
        ((2, "train_step"), 2),  # during a step: that step finishes and is saved
        ((2, "log"), 3),  # after step 2's save decision, while its metrics are logged: step 3 is saved
    ],
)
def test_the_step_a_sigterm_stops_at_is_checkpointed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, signal_at: tuple[int, str], stops_at: int
) -> None:
    trainer = RecordingTrainer(signal_at, tmp_path)
    real_log = Tracking.log

    def log(self: Tracking, data: dict[str, Any], step: int) -> None:
        real_log(self, data, step)
        trainer._maybe_signal("log")

    monkeypatch.setattr(Tracking, "log", log)
    before = signal.getsignal(signal.SIGTERM)
    assert trainer.fit() == stops_at
    assert trainer.steps == list(range(1, stops_at + 1))
    assert trainer.saved == [stops_at], "the run must not end without a checkpoint of its last step"
    assert f"finished step {stops_at}, saved a checkpoint" in trainer.messages[-1]
    assert signal.getsignal(signal.SIGTERM) is before  # fit() puts the previous handler back


def test_without_a_signal_the_run_goes_to_the_end(tmp_path: Path) -> None:
    trainer = RecordingTrainer((0, "never"), tmp_path)
    assert trainer.fit() == 5
    assert trainer.steps == [1, 2, 3, 4, 5]
    assert trainer.saved == []  # save_freq=-1: no periodic saves


def test_a_checkpointed_step_has_its_metrics_row_already(tmp_path: Path) -> None:
    """A run SIGKILLed right after a checkpoint commits must not leave that step without a row: the resumed run
    starts after it and never logs it again (seen as a missing step 8 in the async kill -9 test)."""
    trainer = RecordingTrainer((0, "never"), tmp_path, save_freq=2)
    assert trainer.fit() == 5
    assert trainer.saved == [2, 4, 5]
    assert trainer.rows_at_save == [[1, 2], [1, 2, 3, 4], [1, 2, 3, 4, 5]]
