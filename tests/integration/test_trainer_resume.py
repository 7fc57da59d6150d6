"""Crash, stop and resume: kill -9 / SIGTERM the driver, resume on another world size, corrupt checkpoints.

Drivers run as real `python -m hybridflow.trainer.main_ppo` subprocesses attached to this module's Ray
session (RAY_ADDRESS), as on a cluster. A custom reward function records every scored prompt index,
so the test can check that the resumed runs neither repeat nor skip a sample.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridflow import checkpoint as ck
from hybridflow.data import StatefulDataLoader
from hybridflow.demo import EXAMPLE, prepare
from hybridflow.trainer import main_ppo
from tests.support.demo_run import RECORDING_REWARD
from tests.support.ray_local import local_ray_address

pytestmark = [pytest.mark.ray, pytest.mark.slow]

BATCH, N = 16, 2


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    with local_ray_address(2) as address:
        yield address


def fast_args(base: dict[str, str], *extra: str) -> list[str]:
    """Small steps (16 prompts x 2 samples) so a run is many quick checkpoints."""
    return [
        str(EXAMPLE),
        *(f"{k}={v}" for k, v in base.items()),
        f"data.train_batch_size={BATCH}",
        f"actor_rollout_ref.rollout.n={N}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.resume_mode=auto",
        *extra,
    ]


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    handle = log.open("w")
    return subprocess.Popen(
        [sys.executable, "-m", "hybridflow.trainer.main_ppo", *args],
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=env,
    )


def wait_until(predicate, proc: subprocess.Popen, log: Path, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"driver exited early ({proc.returncode}):\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


def latest(root: Path) -> int:
    path = root / ck.LATEST_FILE
    return int(path.read_text()) if path.exists() else 0


def logged_steps(root: Path) -> list[int]:
    path = root / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def prompts_by_process(sample_log: Path) -> list[list[int]]:
    """Scored prompt indices per driver process, in order, one entry per prompt (n samples collapsed)."""
    runs: dict[str, list[int]] = {}
    for line in sample_log.read_text().splitlines():
        pid, index = line.split()
        runs.setdefault(pid, []).append(int(index))
    return [indices[::N] for indices in runs.values()]


def expected_prompts(steps: int, dataset_len: int, seed: int) -> list[int]:
    loader = StatefulDataLoader(list(range(dataset_len)), BATCH, shuffle=True, seed=seed, collate_fn=list)
    out: list[int] = []
    while len(out) < steps * BATCH:
        for batch in loader:
            out += batch
            if len(out) >= steps * BATCH:
                break
    return out


def test_kill9_sigterm_and_resume_on_another_world_size(tmp_path: Path, ray_address: str) -> None:
    base = prepare(tmp_path)
    root = Path(base["trainer.default_local_dir"])
    reward_file = tmp_path / "recording_reward.py"
    reward_file.write_text(RECORDING_REWARD)
    sample_log = tmp_path / "samples.log"
    env = {
        **os.environ,
        "RAY_ADDRESS": ray_address,
        "SAMPLE_LOG": str(sample_log),
        "RAY_AUTH_MODE": "disabled",
    }
    total = 70  # > one epoch (1024 / 16 = 64 batches): resume also crosses an epoch boundary
    args = fast_args(
        base,
        f"custom_reward_function.path={reward_file}",
        # score in the driver (no worker pool): the log's pid then names the run, and its lines keep their order
        "reward_model.score_timeout_s=null",
        f"trainer.total_training_steps={total}",
        "trainer.save_freq=3",
    )

    # Run A: 2 workers, killed with SIGKILL (no chance to clean up) once step 6 is committed.
    proc = start([*args, "trainer.n_gpus_per_node=2"], env, tmp_path / "a.log")
    wait_until(lambda: latest(root) >= 6, proc, tmp_path / "a.log")
    proc.kill()
    proc.wait()
    resumed_from = latest(root)
    assert ck.find_latest_committed(str(root)) == resumed_from

    # Run B: resumes on ONE worker (world size 2 -> 1); SIGTERM finishes the step, checkpoints, exits 0.
    proc = start([*args, "trainer.n_gpus_per_node=1"], env, tmp_path / "b.log")
    wait_until(lambda: latest(root) > resumed_from, proc, tmp_path / "b.log")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, (tmp_path / "b.log").read_text()[-3000:]
    b_log = (tmp_path / "b.log").read_text()
    assert f"resumed from {ck.step_dir(str(root), resumed_from)}" in b_log
    assert "received signal 15" in b_log
    stopped_at = latest(root)
    assert logged_steps(root)[-1] == stopped_at  # the step it was in when signalled was finished and saved

    # Run C: back to 2 workers, to the end.
    proc = start([*args, "trainer.n_gpus_per_node=2"], env, tmp_path / "c.log")
    assert proc.wait(timeout=300) == 0, (tmp_path / "c.log").read_text()[-3000:]
    assert f"resumed from {ck.step_dir(str(root), stopped_at)}" in (tmp_path / "c.log").read_text()
    assert latest(root) == total

    run_a, run_b, run_c = prompts_by_process(sample_log)
    trained = run_a[: resumed_from * BATCH] + run_b[: (stopped_at - resumed_from) * BATCH] + run_c
    assert trained == expected_prompts(total, 1024, seed=1), "resumed runs repeated or skipped prompts"
    assert len(run_b) == (stopped_at - resumed_from) * BATCH  # B stopped right after its checkpoint


def test_corrupt_latest_checkpoint_falls_back_to_previous(
    tmp_path: Path, ray_address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = prepare(tmp_path)
    root = Path(base["trainer.default_local_dir"])
    assert main_ppo.main(fast_args(base, "trainer.total_training_steps=4", "trainer.save_freq=2")) == 0
    assert ck.list_steps(str(root)) == [2, 4]
    model_file = root / "global_step_4" / "actor" / "model.pt"
    data = bytearray(model_file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: same size, different checksum
    model_file.write_bytes(bytes(data))
    capsys.readouterr()

    assert main_ppo.main(fast_args(base, "trainer.total_training_steps=6", "trainer.save_freq=2")) == 0
    out = capsys.readouterr().out
    assert "global_step_4 skipped: checksum mismatch" in out
    assert f"resumed from {ck.step_dir(str(root), 2)}" in out
    assert logged_steps(root) == [1, 2, 3, 4, 3, 4, 5, 6]
    assert ck.find_latest_committed(str(root)) == 6
