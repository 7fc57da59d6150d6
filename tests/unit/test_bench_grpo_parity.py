"""bench/grpo_step.py: every shared setting reaches both trainers (issue 17: same work on both sides)."""

from __future__ import annotations

import argparse

import pytest

from bench.grpo_step import EXAMPLE, build_trl_kwargs, shared_settings
from hybridflow.trainer.main_ppo import load_run_config


def settings_for(bf16: bool = False, ckpt: bool = False) -> list:
    return shared_settings(argparse.Namespace(bf16=bf16, gradient_checkpointing=ckpt))


@pytest.mark.parametrize("ckpt", [False, True])
def test_our_overrides_load_and_set_the_shared_values(ckpt: bool) -> None:
    overrides = [o for item in settings_for(ckpt=ckpt) for o in item.ours]
    cfg, _ = load_run_config([str(EXAMPLE), *overrides, "actor_rollout_ref.model.path=/nonexistent"])
    actor = cfg.actor_rollout_ref.actor
    assert actor.optim.lr_scheduler_type == "constant" and actor.optim.weight_decay == 0.0  # TRL: linear, 0.0
    assert actor.optim.lr == 1e-6 and actor.grad_clip == 1.0 and actor.ppo_epochs == 1
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode) == (0.2, 0.2, "token-mean")
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is ckpt
    assert cfg.trainer.seed == 42


def test_trl_gets_every_shared_field_and_a_missing_one_is_an_error() -> None:
    settings = settings_for(ckpt=False)
    fields = {k for item in settings for k in item.trl} | {"output_dir"}
    kwargs = build_trl_kwargs({"output_dir": "x", "not_a_field": 1}, settings, fields)
    assert kwargs["gradient_checkpointing"] is False and kwargs["lr_scheduler_type"] == "constant"
    assert "not_a_field" not in kwargs
    with pytest.raises(RuntimeError, match="lr_scheduler_type"):
        build_trl_kwargs({}, settings, fields - {"lr_scheduler_type"})


def test_every_setting_is_spelled_for_both_sides() -> None:
    for item in settings_for(bf16=True, ckpt=True):
        assert item.ours and item.trl and item.value, item.name
