"""Cross-field rules of hybridflow.config: each rule, its message, and all problems at once."""

from __future__ import annotations

import time

import pytest

from hybridflow._config import rules
from hybridflow.config import GROUP_ESTIMATORS, ConfigError, load_config

# A small valid GRPO job the cases below break one rule at a time.
BASE = [
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.n=4",
    "data.train_batch_size=32",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=4",
]


def problems(*overrides: str) -> list[str]:
    """The problems of BASE plus `overrides` (empty when valid)."""
    try:
        load_config(None, [*BASE, *overrides])
    except ConfigError as exc:
        return exc.problems
    return []


def test_base_is_valid() -> None:
    """The starting point of every case passes."""
    assert problems() == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # train_batch_size % ppo_mini_batch_size
        (
            ["actor_rollout_ref.actor.ppo_mini_batch_size=12"],
            "actor_rollout_ref.actor.ppo_mini_batch_size: 12 does not divide data.train_batch_size (32)",
        ),
        (
            ["actor_rollout_ref.actor.ppo_mini_batch_size=64"],
            "actor_rollout_ref.actor.ppo_mini_batch_size: 64 does not divide data.train_batch_size (32); "
            "use a divisor of 32, e.g. 32",
        ),
        # responses over ranks
        (
            ["trainer.n_gpus_per_node=6", "actor_rollout_ref.rollout.n=2"],
            "data.train_batch_size: 32 prompts x rollout.n 2 = 64 responses do not split evenly over 6 ranks",
        ),
        (
            [
                "trainer.nnodes=2",
                "trainer.n_gpus_per_node=8",
                "actor_rollout_ref.rollout.n=2",
                "data.train_batch_size=64",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            ],
            "actor_rollout_ref.actor.ppo_mini_batch_size: 4 prompts x rollout.n 2 = 8 responses per mini-batch do "
            "not split over 16 ranks; make it a multiple of 8",
        ),
        # micro-batches per rank: 8 x 4 / 4 ranks = 8 per rank
        (
            ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: 3 does not divide the 8 responses each rank gets "
            "per mini-batch (ppo_mini_batch_size x rollout.n / 4 ranks); use one of 1, 2, 4, 8",
        ),
        (
            ["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=5"],
            "critic.ppo_micro_batch_size_per_gpu: 5 does not divide the 8 responses",
        ),
        # tensor parallelism
        (
            ["actor_rollout_ref.rollout.tensor_model_parallel_size=3"],
            "actor_rollout_ref.rollout.tensor_model_parallel_size: 3 does not divide trainer.n_gpus_per_node (4); "
            "use one of 1, 2, 4",
        ),
        (
            ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
            "actor_rollout_ref.rollout.tensor_model_parallel_size: the hf rollout does not shard; set it to 1",
        ),
        # estimators
        (["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n: grpo compares several responses"),
        (
            ["algorithm.adv_estimator=gae", "critic.enable=false"],
            "critic.enable: gae needs a critic (value estimates); set critic.enable=true (or null)",
        ),
        (["trainer.critic_warmup=2"], "trainer.critic_warmup: there is no critic to warm up"),
        # DAPO
        (["algorithm.filter_groups.enable=true"], "algorithm.filter_groups.metric: required when"),
        (
            [
                "algorithm.adv_estimator=reinforce_plus_plus",
                "actor_rollout_ref.rollout.n=1",
                "algorithm.filter_groups.enable=true",
                "algorithm.filter_groups.metric=acc",
            ],
            "algorithm.filter_groups.enable: dynamic sampling filters groups of responses",
        ),
        (
            ["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=0"],
            "reward_model.overlong_buffer.len: must be between 1 and the response length (512)",
        ),
        # sampling
        (
            ["actor_rollout_ref.rollout.do_sample=false"],
            "actor_rollout_ref.rollout.do_sample: with greedy decoding",
        ),
        (
            ["actor_rollout_ref.rollout.temperature=0"],
            "actor_rollout_ref.rollout.do_sample: with greedy decoding",
        ),
        (
            ["trainer.n_gpus_per_node=6", "actor_rollout_ref.actor.fsdp_config.fsdp_size=4"],
            "actor_rollout_ref.actor.fsdp_config.fsdp_size: 4 does not divide the 6 ranks",
        ),
        # token budgets
        (
            [
                "actor_rollout_ref.actor.use_dynamic_bsz=true",
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1000",
            ],
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu: 1000 tokens cannot hold one sequence of "
            "max_prompt_length + max_response_length = 1024; raise it to at least 1024",
        ),
        (
            ["actor_rollout_ref.rollout.max_model_len=600"],
            "actor_rollout_ref.rollout.max_model_len: 600 is less than prompt_length + response_length (1024)",
        ),
        # trainer
        (["trainer.resume_mode=resume_path"], "trainer.resume_from_path: required when trainer.resume_mode"),
    ],
)
def test_rule_reports_actionable_message(overrides: list[str], expected: str) -> None:
    """Each rule fires with a message naming the key, the numbers and the fix."""
    found = problems(*overrides)
    assert any(p.startswith(expected) for p in found), found


@pytest.mark.parametrize("estimator", GROUP_ESTIMATORS)
def test_group_estimators_need_several_responses(estimator: str) -> None:
    """Every group estimator insists on rollout.n > 1; remax and reinforce_plus_plus do not."""
    assert any(
        "needs n > 1" in p
        for p in problems(f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.n=1")
    )


@pytest.mark.parametrize("estimator", ["remax", "reinforce_plus_plus"])
def test_single_response_estimators_accept_n_1(estimator: str) -> None:
    """Estimators without a group baseline work with one response per prompt."""
    assert problems(f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.n=1") == []


def test_valid_micro_batches_and_dynamic_bsz_pass() -> None:
    """Divisible micro-batches pass; with dynamic batching the micro size is not checked."""
    assert problems("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4") == []
    assert (
        problems(
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
        )
        == []
    )


def test_critic_inherits_actor_sizes_without_duplicate_reports() -> None:
    """A batch problem the critic inherits from the actor is reported once, under the actor."""
    found = problems("algorithm.adv_estimator=gae", "actor_rollout_ref.actor.ppo_mini_batch_size=12")
    assert [p.split(":")[0] for p in found] == ["actor_rollout_ref.actor.ppo_mini_batch_size"]


def test_clip_ratios_default_to_clip_ratio() -> None:
    """clip_ratio_low/high fall back to clip_ratio; either can be set alone (DAPO clip-higher)."""
    cfg = load_config(
        None, [*BASE, "actor_rollout_ref.actor.clip_ratio=0.1", "actor_rollout_ref.actor.clip_ratio_high=0.3"]
    )
    assert (cfg.actor_rollout_ref.actor.clip_ratio_low, cfg.actor_rollout_ref.actor.clip_ratio_high) == (
        0.1,
        0.3,
    )


def test_all_rule_problems_are_reported_together() -> None:
    """Several broken rules in different groups come back in one ConfigError."""
    found = problems(
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=3",
        "trainer.resume_mode=resume_path",
        "algorithm.filter_groups.enable=true",
    )
    paths = {p.split(":")[0] for p in found}
    assert paths >= {
        "actor_rollout_ref.rollout.n",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "trainer.resume_from_path",
        "algorithm.filter_groups.metric",
        "algorithm.filter_groups.enable",
    }


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (1, "1"),
        (12, "1, 2, 3, 4, 6, 12"),
        (7919, "1, 7919"),
        (1000, "1, 2, 4, 5, 8, 10, ..., 100, 125, 200, 250, 500, 1000"),
        (10**40, "1, 2, 4, 5, 8, 10, ..., "),
        (2**61 - 1, "1, ..., 2305843009213693951"),  # a prime too large to search to its square root
    ],
)
def test_divisor_hints_are_short_and_bounded(n: int, expected: str) -> None:
    """Hints list a few divisors and stop searching early, whatever the number (issue 12: they hung)."""
    start = time.monotonic()
    shown = rules._divisors(n)
    assert time.monotonic() - start < 0.5
    assert shown.startswith(expected) and shown.count(",") < rules._DIVISORS_SHOWN + 1


def test_a_huge_batch_gets_its_divisor_hint_at_once() -> None:
    """A micro-batch that does not divide a huge per-rank share is reported in well under a second."""
    start = time.monotonic()
    found = problems("data.train_batch_size=" + "8" * 30, "actor_rollout_ref.actor.ppo_mini_batch_size=" + "8" * 30,
                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=9")  # fmt: skip
    assert time.monotonic() - start < 1
    assert any("ppo_micro_batch_size_per_gpu: 9 does not divide" in p and "..." in p for p in found), found
