"""Asynchronous GRPO on the toy task, for real: a vLLM AsyncLLM replica generates the next batch while one FSDP2
trainer process updates (split placement, one core each), in one-step-off and fully-async (partial rollout)
modes; and exact resume: a one-step-off run killed with SIGKILL after a checkpoint, then resumed, trains the
same prompts with the same policy versions, in the same order, as an uninterrupted run.

Drivers run as `python -m hybridflow.trainer.main_ppo` subprocesses on this module's Ray session (vLLM in the
pytest process would change torch's state for later tests). A recording reward logs every trained prompt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridflow import checkpoint as ck
from hybridflow.demo import prepare
from tests.support.demo_run import RECORDING_REWARD
from tests.support.ray_local import local_ray_address

pytestmark = [pytest.mark.ray, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_grpo_async.yaml"
BATCH, N = 32, 8


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    with local_ray_address(2) as address:
        yield address


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("async_demo")
    base = prepare(root)
    (root / "recording_reward.py").write_text(RECORDING_REWARD)
    return {**base, "custom_reward_function.path": str(root / "recording_reward.py")}


def driver(demo: dict[str, str], root: Path, *extra: str) -> list[str]:
    args = {**demo, "trainer.default_local_dir": str(root)}
    return [sys.executable, "-m", "hybridflow.trainer.main_ppo", str(EXAMPLE), *(f"{k}={v}" for k, v in args.items()),
            "reward_model.score_timeout_s=null", "trainer.val_before_train=false", *extra]


def run(cmd: list[str], env: dict[str, str], log: Path, timeout: float = 600) -> None:
    with log.open("w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    assert proc.returncode == 0, log.read_text()[-4000:]


def env_for(ray_address: str, sample_log: Path) -> dict[str, str]:
    return {**os.environ, "RAY_ADDRESS": ray_address, "SAMPLE_LOG": str(sample_log), "RAY_AUTH_MODE": "disabled"}


def rows(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines() if line.strip()]


def trained(sample_log: Path, metric_rows: list[dict]) -> list[tuple[int, int]]:
    """(prompt index, policy version of its samples) in training order: prompts from the reward log (one line
    per sample), versions from each step's trainer version minus its staleness (one version per batch here)."""
    prompts = [int(line.split()[1]) for line in sample_log.read_text().splitlines()][::N]
    steps = [r for r in metric_rows if "fully_async/policy_version" in r]
    versions = [int(r["fully_async/policy_version"] - r["fully_async/trajectory_staleness/max"]) for r in steps]
    assert len(prompts) == BATCH * len(versions)
    return [(p, versions[i // BATCH]) for i, p in enumerate(prompts)]


def learned(metric_rows: list[dict]) -> tuple[float, float]:
    scores = [r["critic/score/mean"] for r in metric_rows if "critic/score/mean" in r]
    return sum(scores[:3]) / 3, sum(scores[-5:]) / 5


STEPS = 40


@pytest.fixture(scope="module")
def one_step_off(demo: dict[str, str], ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted one-step-off run (also the resume test's reference)."""
    root = tmp_path_factory.mktemp("one_step_off")
    run(driver(demo, root / "ckpt", f"trainer.total_training_steps={STEPS}", "trainer.save_freq=-1"),
        env_for(ray_address, root / "samples.log"), root / "driver.log")
    return root


def test_one_step_off_learns_with_staleness_exactly_one(one_step_off: Path) -> None:
    metric_rows = rows(one_step_off / "ckpt")
    first, last = learned(metric_rows)
    assert last > first + 0.25, f"one-step-off GRPO should learn the toy task: reward {first:.2f} -> {last:.2f}"
    lags = [r["fully_async/trajectory_staleness/max"] for r in metric_rows if "fully_async/policy_version" in r]
    assert lags == [0.0] + [1.0] * (STEPS - 1)


def test_fully_async_with_partial_rollout_learns(demo: dict[str, str], ray_address: str, tmp_path: Path) -> None:
    run(driver(demo, tmp_path / "ckpt", f"trainer.total_training_steps={STEPS}", "trainer.save_freq=-1",
               "async_training.mode=fully_async", "async_training.staleness_threshold=0.5",
               "async_training.partial_rollout=true"),
        env_for(ray_address, tmp_path / "samples.log"), tmp_path / "driver.log")
    metric_rows = rows(tmp_path / "ckpt")
    first, last = learned(metric_rows)
    assert last > first + 0.25, f"fully-async GRPO should learn the toy task: reward {first:.2f} -> {last:.2f}"
    steps = [r for r in metric_rows if "fully_async/policy_version" in r]
    assert max(r["fully_async/trajectory_staleness/max"] for r in steps) <= 1  # max(1, ceil(0.5)) x 1
    # 40 x 32 prompts: epoch 0 (1,024) and part of epoch 1, trained in the order groups finished; so no prompt
    # more than twice, and every prompt of epoch 0 but at most the admission window (48 groups) still in flight
    counts = Counter(int(line.split()[1]) for line in (tmp_path / "samples.log").read_text().splitlines()[::N])
    assert max(counts.values()) <= 2 and len(counts) >= 1024 - 48, f"{len(counts)} distinct, max {max(counts.values())}"


def test_kill9_and_resume_trains_the_same_prompts_with_the_same_versions(
    demo: dict[str, str], ray_address: str, one_step_off: Path, tmp_path: Path
) -> None:
    root, sample_log = tmp_path / "ckpt", tmp_path / "samples.log"
    total = 14
    cmd = driver(demo, root, f"trainer.total_training_steps={total}", "trainer.save_freq=4", "trainer.resume_mode=auto")
    env = env_for(ray_address, sample_log)
    with (tmp_path / "a.log").open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    latest = root / ck.LATEST_FILE
    deadline = time.monotonic() + 400
    while not (latest.exists() and int(latest.read_text()) >= 8):
        assert proc.poll() is None, (tmp_path / "a.log").read_text()[-4000:]
        assert time.monotonic() < deadline, "the first run never reached step 8"
        time.sleep(0.1)
    proc.kill()  # SIGKILL: no chance to clean up
    proc.wait()
    resumed_from = int(latest.read_text())
    killed_lines = sample_log.read_text().splitlines()[: resumed_from * BATCH * N]
    sample_log.write_text("\n".join(killed_lines) + "\n")
    run(cmd, env, tmp_path / "b.log")
    assert f"resumed from {ck.step_dir(str(root), resumed_from)}" in (tmp_path / "b.log").read_text()
    by_step = {r["step"]: r for r in rows(root)}  # the resumed run's rows win over the killed run's last ones
    got = trained(sample_log, [by_step[step] for step in sorted(by_step)])
    expected = trained(one_step_off / "samples.log", rows(one_step_off / "ckpt"))[: total * BATCH]
    assert got == expected, "the resumed run trained other prompts or versions than the uninterrupted one"
