"""The step loop of every trainer here (RL: `RayPPOTrainer`; SFT and DPO: `OfflineTrainer`).

    resume -> (start) -> (validate) -> [step -> (validate) -> log -> (checkpoint)] x total steps

A step's metrics row is logged before its checkpoint commits: a run killed between the two redoes the step on
resume and logs it again, where the other order would leave the committed step without a row for good. A
SIGTERM (pod eviction, `ray job stop`) lets the current step finish, checkpoints it and ends the loop.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any


class StepLoop:
    """`fit()` over the hooks a trainer provides: `_resume`, `train_step`, `validate`, `save_checkpoint` (and
    optionally `_start`, `_run_step`, `_finish`, `_can_validate`, `_due`)."""

    config: Any
    log: Callable[[str], None]
    total_training_steps: int

    def _init_loop(self, ckpt_root: str, train_loader: Any) -> None:
        self.ckpt_root = ckpt_root
        self._train_loader = train_loader
        self.global_step = 0
        self.tracker: Any = None
        self._data_iter: Iterator[Any] | None = None
        self._stop_signal: int | None = None

    # ---- what a trainer provides ------------------------------------------------------------------

    def _resume(self) -> Any:
        """Load the step trainer.resume_mode chooses (setting global_step); its trainer state, or None."""
        raise NotImplementedError

    def train_step(self) -> dict[str, float]:
        raise NotImplementedError

    def validate(self) -> dict[str, float]:
        raise NotImplementedError

    def save_checkpoint(self) -> str:
        raise NotImplementedError

    def _start(self, state: Any) -> None:
        """After the resume, before the first step."""

    def _run_step(self) -> dict[str, float]:
        return self.train_step()

    def _finish(self) -> None:
        """After the last step, also when the loop failed."""

    def _can_validate(self) -> bool:
        return True

    def _due(self, freq: int | None, last: bool) -> bool:
        """verl's RL rule: every `freq` steps and at the last one, never when freq <= 0."""
        return bool(freq and freq > 0 and (self.global_step % freq == 0 or last))

    # ---- the loop ---------------------------------------------------------------------------------

    def fit(self) -> int:
        """Train until total_training_steps (or a SIGTERM); return the last completed global step."""
        from hybridflow.progress import choose_wandb_run_id, read_progress_or_warn
        from hybridflow.tracking import Tracking

        trainer = self.config.trainer
        state = self._resume()
        self._start(state)
        record = None
        if trainer.resume_mode != "disable" and self.ckpt_root:
            record = read_progress_or_warn(self.ckpt_root, self.log)  # the W&B run id before any checkpoint
        self.tracker = Tracking(
            trainer.project_name, trainer.experiment_name, trainer.logger, self.config.to_dict(),
            default_local_dir=self.ckpt_root, total_steps=self.total_training_steps,
            wandb_run_id=choose_wandb_run_id(state, record, trainer.resume_mode),
        )
        previous_handler = self._install_sigterm_handler()
        try:
            if trainer.val_before_train and self.global_step == 0 and self._can_validate():
                self.tracker.log(self.validate(), step=0)
            while self.global_step < self.total_training_steps:
                self.global_step += 1
                metrics = self._run_step()
                last = self.global_step >= self.total_training_steps
                if self._due(trainer.test_freq, last) and self._can_validate():
                    started = time.perf_counter()
                    metrics.update(self.validate())
                    metrics["timing_s/testing"] = time.perf_counter() - started
                # Read the flag once: a SIGTERM landing after this read (say, while the metrics are logged)
                # must not end the run before the step it stops at is checkpointed.
                stopping = self._stop_signal is not None
                self.tracker.log(metrics, step=self.global_step)  # before the checkpoint (module docstring)
                if self._due(trainer.save_freq, last) or stopping:
                    self.save_checkpoint()
                if stopping:
                    self.log(
                        f"received signal {self._stop_signal}: finished step {self.global_step}, saved a "
                        f"checkpoint under {self.ckpt_root}; exiting. Rerun with trainer.resume_mode=auto to continue."
                    )
                    break
        finally:
            self._finish()
            if previous_handler is not None:
                signal.signal(signal.SIGTERM, previous_handler)
            self.tracker.finish()
        return self.global_step

    def _next_batch(self) -> Any:
        """The next training batch; a new epoch starts when the loader is exhausted."""
        for _ in range(2):
            if self._data_iter is None:
                self._data_iter = iter(self._train_loader)
            try:
                return next(self._data_iter)
            except StopIteration:
                self._data_iter = None
        raise RuntimeError("the training data loader yields no batch; check data.train_files and data.train_batch_size")

    def _install_sigterm_handler(self) -> Any:
        """Route SIGTERM (pod eviction, `ray job stop`) to a graceful stop; only possible on the main thread."""
        if threading.current_thread() is not threading.main_thread():
            self.log("fit() runs outside the main thread: SIGTERM will not trigger a final checkpoint")
            return None
        return signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, _frame: Any) -> None:
        self.log(f"signal {signum} received: finishing the current step, then checkpointing and exiting")
        self._stop_signal = signum
