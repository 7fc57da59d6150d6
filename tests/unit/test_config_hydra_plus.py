"""Hydra's `+` / `++` semantics on the trainer's command line (issue 13).

Hydra composes the defaults first, so `+key=v` on a key the config already has fails there ("Could not append to
config"); here it is refused with the fix (drop the `+`, or `++`). `++key=v` sets, adding the key if absent. A key
`+` adds is validated like any other: an unknown key stays unknown.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow._config.offline import load_offline_config
from hybridflow.config import ConfigError, apply_overrides, load_config


def _problems(overrides: list[str], path: Path | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return info.value.problems


def test_plus_on_a_default_key_is_refused_naming_the_fix() -> None:
    """`+trainer.nnodes=2`: nnodes is a default key, so '+' is refused as Hydra refuses it, with both fixes."""
    (problem,) = _problems(["+trainer.nnodes=2"])
    assert problem.startswith("'+trainer.nnodes=2': trainer.nnodes already exists (a default key, value 1)")
    assert "drop the '+' to replace it (trainer.nnodes=...)" in problem
    assert "++trainer.nnodes=..." in problem
    assert "Could not append to config" in problem


def test_plus_on_a_key_of_the_file_or_an_earlier_override_is_refused(tmp_path: Path) -> None:
    """A key the YAML file set, or an earlier override added, exists too."""
    job = tmp_path / "job.yaml"
    job.write_text("reward_model:\n  reward_kwargs: {max_resp_len: 64}\n")
    (problem,) = _problems(["+reward_model.reward_kwargs.max_resp_len=128"], job)
    assert "reward_model.reward_kwargs.max_resp_len already exists (set, value 64)" in problem
    (problem,) = _problems(["+reward_model.reward_kwargs.a=1", "+reward_model.reward_kwargs.a=2"])
    assert problem.startswith("'+reward_model.reward_kwargs.a=2': reward_model.reward_kwargs.a already exists (set")


def test_double_plus_forces_and_adds() -> None:
    """`++key=v` replaces a default key and adds a missing one."""
    cfg = load_config(None, ["++trainer.nnodes=2", "++actor_rollout_ref.model.override_config.rope_theta=10000"])
    assert cfg.trainer.nnodes == 2
    assert cfg.actor_rollout_ref.model.override_config == {"rope_theta": 10000}


def test_plus_adds_a_new_key_which_is_still_validated() -> None:
    """`+` into a free-form mapping adds; `+` of a key the schema does not know is an unknown key, not accepted."""
    cfg = load_config(None, ["+reward_model.reward_kwargs.max_resp_len=64",
                             "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4"])
    assert cfg.reward_model.reward_kwargs == {"max_resp_len": 64}
    assert cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"] == {"swap_space": 4}
    (problem,) = _problems(["+trainer.nnodez=2"])
    assert problem.startswith("trainer.nnodez: unknown key")
    assert "nnodes" in problem


def test_plus_after_removal_adds_again() -> None:
    """`~key` then `+key=v` works, as in Hydra (the key is gone when `+` runs)."""
    cfg = load_config(None, ["~trainer.nnodes", "+trainer.nnodes=2"])
    assert cfg.trainer.nnodes == 2


def test_keys_verl_has_no_default_for_take_plus() -> None:
    """verl's lines add fsdp_config.model_dtype / mixed_precision and data.gen_batch_size with '+' (verl's defaults
    lack them); HybridFlow has defaults for them but accepts the '+', with the values applied."""
    cfg = load_config(None, ["+actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",
                             "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
                             "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=bf16",
                             "+critic.model.fsdp_config.model_dtype=bf16",
                             "+data.gen_batch_size=2048", "data.train_batch_size=1024",
                             "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc",
                             "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=8"])
    fsdp = cfg.actor_rollout_ref.actor.fsdp_config
    assert (fsdp.model_dtype, fsdp.mixed_precision.param_dtype, fsdp.mixed_precision.reduce_dtype) == (
        "bf16", "bf16", "bf16")
    assert cfg.critic.model.fsdp_config.model_dtype == "bf16"
    assert cfg.data.gen_batch_size == 2048
    # Those keys are still refused with '+' when the file or an earlier override set them.
    (problem,) = _problems(["data.gen_batch_size=8", "+data.gen_batch_size=16"])
    assert "data.gen_batch_size already exists (set, value 8)" in problem


def test_apply_overrides_without_defaults_checks_only_the_mapping() -> None:
    """The generic applier: with no defaults given, only the mapping's keys count."""
    assert apply_overrides({}, ["+trainer.nnodes=2"]) == {"trainer": {"nnodes": 2}}
    with pytest.raises(ConfigError, match="already exists"):
        apply_overrides({}, ["+trainer.nnodes=2"], {"trainer": {"nnodes": 1}})


def test_offline_trainers_refuse_plus_on_their_default_keys() -> None:
    """The SFT trainer's command line follows the same rule against its own defaults."""
    with pytest.raises(ConfigError) as info:
        load_offline_config(None, ["+trainer.total_epochs=2"], "sft")
    assert "trainer.total_epochs already exists (a default key" in info.value.problems[0]
    assert load_offline_config(None, ["++trainer.total_epochs=2"], "sft").trainer.total_epochs == 2
