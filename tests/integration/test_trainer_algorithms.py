"""Each loop path runs through the real stack for a few steps: ReMax (greedy baseline), DAPO (dynamic
sampling, clip-higher, overlong shaping), REINFORCE++ with KL in the reward and a KL loss, Dr.GRPO on
split placement. Learning itself is covered by test_learning.py; the estimators' math by the unit tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridflow.demo import EXAMPLE, prepare
from hybridflow.trainer import main_ppo
from tests.support.ray_local import local_ray

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SMALL = [
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.n=4",
    "trainer.total_training_steps=2",
    "trainer.val_before_train=false",
    "trainer.save_freq=-1",
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with local_ray(2):
        yield prepare(tmp_path_factory.mktemp("algos"))


def train(inputs: dict[str, str], tmp_path: Path, *overrides: str) -> list[dict]:
    metrics = tmp_path / "metrics.jsonl"
    args = [f"{k}={v}" for k, v in inputs.items()] + [f"trainer.default_local_dir={tmp_path}"]
    assert main_ppo.main([str(EXAMPLE), *args, *SMALL, *overrides]) == 0
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def test_remax_uses_a_greedy_baseline(inputs: dict[str, str], tmp_path: Path) -> None:
    rows = train(
        inputs,
        tmp_path,
        "algorithm.adv_estimator=remax",
        "trainer.val_before_train=true",
        "trainer.test_freq=2",
        "trainer.log_val_generations=3",
    )
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "actor/pg_loss" in rows[-1]
    # the same 3 validation prompts, decoded, at each validation
    samples = [json.loads(x) for x in (tmp_path / "val_generations.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [0, 0, 0, 2, 2, 2]
    assert [s["input"] for s in samples[:3]] == [s["input"] for s in samples[3:]]
    assert all(s["input"] and s["score"] in (0.0, 1.0) for s in samples)


def test_dapo_dynamic_sampling_clip_higher_and_overlong(inputs: dict[str, str], tmp_path: Path) -> None:
    rows = train(
        inputs,
        tmp_path,
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=acc",
        "algorithm.filter_groups.max_num_gen_batches=0",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.rollout.n=16",
        "data.max_response_length=2",
        "reward_model.reward_manager=dapo",
        "reward_model.overlong_buffer.enable=true",
        "reward_model.overlong_buffer.len=1",
    )
    # A random model is rarely right: most groups are all-wrong and get filtered, so more prompt
    # batches are drawn until 8 groups with mixed outcomes are found.
    assert all(r["train/num_gen_batches"] >= 1 for r in rows)
    assert max(r["train/num_gen_batches"] for r in rows) > 1


def test_reinforce_pp_with_kl_in_reward_and_kl_loss(inputs: dict[str, str], tmp_path: Path) -> None:
    rows = train(
        inputs,
        tmp_path,
        "algorithm.adv_estimator=reinforce_plus_plus",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_penalty=low_var_kl",
        "algorithm.kl_ctrl.type=adaptive",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "trainer.total_training_steps=3",
    )
    assert "actor/reward_kl_penalty" in rows[-1] and "actor/kl_loss" in rows[-1]
    # The actor moved away from the reference after the first update, so the penalty is positive.
    assert rows[-1]["actor/reward_kl_penalty"] > 0
    assert rows[-1]["actor/reward_kl_penalty_coeff"] != rows[0]["actor/reward_kl_penalty_coeff"]


def test_dr_grpo_on_split_placement(inputs: dict[str, str], tmp_path: Path) -> None:
    rows = train(
        inputs,
        tmp_path,
        "algorithm.norm_adv_by_std_in_grpo=false",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
        "trainer.placement=split",
        "trainer.n_gpus_per_node=1",
        "trainer.total_training_steps=3",
        "trainer.save_freq=3",
    )
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert (tmp_path / "global_step_3" / "COMMITTED").exists()


def test_ppo_with_token_budget_micro_batches_on_two_ranks(inputs: dict[str, str], tmp_path: Path) -> None:
    """verl's use_dynamic_bsz for actor, old/ref log-probs and critic; two mini-batches force the old pass."""
    rows = train(
        inputs,
        tmp_path,
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100",  # ~3 rows of <= 33 tokens per micro-batch
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "critic.ppo_max_token_len_per_gpu=100",
    )
    assert [r["step"] for r in rows] == [1, 2]
    assert {"timing_s/old_log_prob", "timing_s/ref", "timing_s/values", "critic/vf_loss"} <= set(rows[-1])
    assert "actor/pg_loss" in rows[-1]  # critic_warmup is 0: the actor trained at step 1 and 2
    # trainer.balance_batch (on by default) evened the two ranks' token counts
    assert rows[-1]["global_seqlen/balanced_max"] - rows[-1]["global_seqlen/balanced_min"] <= (
        rows[-1]["global_seqlen/minmax_diff"]
    )


def test_cpu_mixed_precision_through_the_stack(inputs: dict[str, str], tmp_path: Path) -> None:
    """trainer.cpu_mixed_precision: PPO with a critic and a KL loss trains with it on, and the actor
    really computes in bf16 (its log-probs leave the fp32 HF rollout's, which fp32 ones match)."""
    common = ["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true",
              "actor_rollout_ref.rollout.calculate_log_probs=true", "trainer.total_training_steps=1"]
    fp32 = train(inputs, tmp_path / "fp32", *common)
    bf16 = train(inputs, tmp_path / "bf16", *common, "trainer.cpu_mixed_precision=true")
    # |p_actor - p_rollout| of the random tiny model's near-uniform token probabilities: ~1e-8 when
    # both compute in fp32, ~1e-5 with the actor's matmuls in bf16
    assert fp32[-1]["training/rollout_probs_diff_max"] < 1e-7
    assert bf16[-1]["training/rollout_probs_diff_max"] > 1e-6
    assert {"critic/vf_loss", "actor/kl_loss", "actor/pg_loss"} <= set(bf16[-1])
