"""What a run plans before it starts: CPU slots, the old-log-prob pass, checkpoint retention, config hooks."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow.config import load_config
from hybridflow.trainer.main_ppo import actor_role
from hybridflow.trainer.ray_trainer import needs_old_log_prob_pass
from hybridflow.workers.cpu_slots import cpu_share, cpu_threads
from hybridflow.workers.fsdp_workers import ROLES


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
    ("overrides", "role"),
    [
        ([], "actor_rollout"),  # no KL, no DPO: no reference model is loaded
        (["actor_rollout_ref.actor.use_kl_loss=true"], "actor_rollout_ref"),
        (["algorithm.use_kl_in_reward=true"], "actor_rollout_ref"),
        (["algorithm.adv_estimator=online_dpo", "actor_rollout_ref.rollout.n=2",
          "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum"], "actor_rollout_ref"),
        (["trainer.placement=split"], "actor"),
        (["trainer.placement=split", "actor_rollout_ref.actor.use_kl_loss=true"], "actor_ref"),
    ],
)
def test_the_actor_group_holds_a_reference_only_when_it_is_read(overrides: list[str], role: str) -> None:
    assert actor_role(cfg(*overrides)) == role
    assert role in ROLES


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


def test_retention_keeps_the_smaller_of_actor_and_critic_limits() -> None:
    from hybridflow.trainer.ray_trainer import retained_steps

    both = cfg("trainer.max_actor_ckpt_to_keep=3", "trainer.max_critic_ckpt_to_keep=2").trainer
    assert retained_steps(both, with_critic=True) == 2
    assert retained_steps(both, with_critic=False) == 3  # no critic saved: its limit does not apply
    assert retained_steps(cfg("trainer.max_critic_ckpt_to_keep=1").trainer, with_critic=True) == 1
    assert retained_steps(cfg().trainer, with_critic=True) is None  # keep all


def test_hybrid_engine_false_is_refused() -> None:
    from hybridflow.config import ConfigError

    with pytest.raises(ConfigError, match="hybrid_engine: false is not supported .* trainer.placement=split"):
        cfg("actor_rollout_ref.hybrid_engine=false")


def test_external_lib_is_imported_and_a_missing_one_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from hybridflow.engines.fsdp_engine import import_external_lib

    (tmp_path / "my_models_lib.py").write_text("import builtins\nbuiltins._my_models_lib_loaded = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import_external_lib("my_models_lib")
    import builtins

    assert getattr(builtins, "_my_models_lib_loaded", False)
    del builtins._my_models_lib_loaded  # type: ignore[attr-defined]
    sys.modules.pop("my_models_lib", None)
    import_external_lib(None)  # unset: nothing to do
    with pytest.raises(ImportError, match="model.external_lib='no_such_models_lib' cannot be imported"):
        import_external_lib("no_such_models_lib")
