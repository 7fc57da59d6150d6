"""The whole stack learns: GRPO, online DPO and PPO (with a critic) on the demo's toy task, 2 FSDP2 workers on Ray.

Runs `hybridflow.trainer.main_ppo.main` in-process against one Ray session per module, and judges
learning from the JSONL metrics the file logger writes (what the operator and users read too).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridflow.demo import EXAMPLE
from tests.support.demo_run import mean, run_demo
from tests.support.ray_local import local_ray

PPO_EXAMPLE = EXAMPLE.parent / "tiny_ppo.yaml"

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def ray_session() -> Iterator[None]:
    with local_ray(num_cpus=2):
        yield


def test_grpo_learns_the_toy_task(tmp_path: Path) -> None:
    rows = run_demo(tmp_path, "trainer.total_training_steps=50", "trainer.test_freq=50")
    train = [r["critic/score/mean"] for r in rows if "critic/score/mean" in r]
    assert len(train) == 50
    first, last = mean(train[:3]), mean(train[-5:])
    assert first < 0.2, f"a random model should rarely be right, got {first:.2f}"
    assert last > 0.7, f"GRPO should learn to copy a letter: reward {first:.2f} -> {last:.2f}"
    val = [r for r in rows if any(k.startswith("val-core/") for k in r)]
    assert val[0]["step"] == 0 and val[-1]["step"] == 50
    key = "val-core/toy/copy/reward/mean@1"
    assert val[-1][key] > val[0][key] + 0.3
    for name in (
        "actor/pg_loss",
        "actor/entropy",
        "actor/ppo_kl",
        "response_length/mean",
        "perf/throughput",
        "timing_s/gen",
    ):
        assert name in rows[-1], name


def test_online_dpo_learns_the_toy_task(tmp_path: Path) -> None:
    """Online DPO on the GRPO example: best vs worst of each prompt's 8 samples, DPO weights on the PPO loss."""
    rows = run_demo(
        tmp_path,
        "algorithm.adv_estimator=online_dpo",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum",
        "trainer.total_training_steps=50",
        "trainer.test_freq=50",
    )
    train = [r for r in rows if "critic/score/mean" in r]
    assert len(train) == 50
    # Step 1: the policy is the reference, so every margin is 0 and the DPO loss is log 2.
    assert train[0]["dpo/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert train[0]["dpo/margin_mean"] == pytest.approx(0.0, abs=1e-6)
    first = mean([r["critic/score/mean"] for r in train[:3]])
    last = mean([r["critic/score/mean"] for r in train[-5:]])
    assert last > first + 0.2, f"online DPO should learn to copy a letter: reward {first:.2f} -> {last:.2f}"
    assert train[-1]["dpo/pairs"] > 0 and train[-1]["dpo/accuracy"] > 0.5  # the policy ranks most pairs right
    assert train[-1]["dpo/margin_mean"] > 0
    assert train[0]["dpo/kl"] == pytest.approx(0.0, abs=1e-6) and train[-1]["dpo/kl"] > 0  # moved off the reference
    val = [r for r in rows if any(k.startswith("val-core/") for k in r)]
    key = "val-core/toy/copy/reward/mean@1"
    assert val[-1][key] > val[0][key] + 0.3


def test_ppo_with_critic_learns_a_little(tmp_path: Path) -> None:
    """examples/tiny_ppo.yaml: GAE with a critic, one response per prompt."""
    train = run_demo(tmp_path, "trainer.test_freq=-1", example=PPO_EXAMPLE)
    assert len(train) == 30
    assert "critic/vf_loss" in train[-1] and "critic/values/mean" in train[-1]
    first, last = (
        mean([r["critic/score/mean"] for r in train[:3]]),
        mean([r["critic/score/mean"] for r in train[-5:]]),
    )
    assert last > first + 0.15, f"PPO reward should rise: {first:.2f} -> {last:.2f}"
