"""What a run plans before it starts: CPU slots per worker and whether a step needs an old-log-prob pass."""

from __future__ import annotations

import pytest

from hybridflow.config import load_config
from hybridflow.trainer.main_ppo import cpu_share, cpu_threads
from hybridflow.trainer.ray_trainer import needs_old_log_prob_pass


def cfg(*overrides: str):  # noqa: ANN201 - the config model
    base = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.n_gpus_per_node=2"]
    return load_config(None, [*base, *overrides])


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], False),  # one epoch, one mini-batch: on-policy, the update's own log-probs serve
        (["actor_rollout_ref.actor.ppo_mini_batch_size=4"], True),  # a second mini-batch follows a step
        (["actor_rollout_ref.actor.ppo_epochs=2"], True),
        (["algorithm.use_kl_in_reward=true"], True),  # the KL penalty reads old_log_probs
        (["actor_rollout_ref.actor.use_kl_loss=true"], False),  # reads ref_log_prob only
    ],
)
def test_old_log_prob_pass_only_when_the_update_is_off_policy(overrides: list[str], expected: bool) -> None:
    assert needs_old_log_prob_pass(cfg(*overrides)) is expected


@pytest.mark.parametrize(
    ("cpus", "gpus_per_node", "placement", "share", "threads"),
    [
        (2, 2, "colocate", 1.0, 1),
        (2, 1, "colocate", 2.0, 2),  # one worker gets the whole machine
        (5, 2, "colocate", 2.0, 2),  # whole cores only
        (2, 4, "colocate", 0.5, 1),
        (4, 2, "split", 1.0, 1),  # actor and rollout processes
    ],
)
def test_cpu_slots(cpus: int, gpus_per_node: int, placement: str, share: float, threads: int) -> None:
    c = cfg(
        f"trainer.ray_init.num_cpus={cpus}", f"trainer.n_gpus_per_node={gpus_per_node}", f"trainer.placement={placement}"
    )
    assert cpu_share(c) == share
    assert cpu_threads(c) == threads
