"""The SFT / DPO config tree: verl's SFT keys and defaults, TRL's DPO names, and messages that name the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow._config.offline import DpoConfig, SftConfig, load_offline_config, parse_offline_config
from hybridflow.config import ConfigError
from hybridflow.recipes import RECIPES, get_recipe

REPO = Path(__file__).resolve().parents[2]


def problems(mapping: dict, recipe: str = "sft") -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_offline_config(mapping, recipe)  # type: ignore[arg-type]
    return err.value.problems


def test_defaults_are_verl_sft_trainers() -> None:
    cfg = parse_offline_config({}, "sft")
    assert isinstance(cfg, SftConfig)
    assert (cfg.data.prompt_key, cfg.data.response_key, cfg.data.multiturn.messages_key) == ("question", "answer", "messages")
    assert (cfg.data.train_batch_size, cfg.data.micro_batch_size_per_gpu, cfg.data.max_length) == (256, 4, 1024)
    assert (cfg.optim.lr, cfg.optim.betas, cfg.optim.lr_warmup_steps_ratio, cfg.optim.lr_scheduler_type,
            cfg.optim.clip_grad) == (1e-5, [0.9, 0.95], 0.1, "cosine", 1.0)
    assert cfg.trainer.total_epochs == 4 and cfg.trainer.resume_mode == "auto"
    assert cfg.trainer.default_local_dir == "checkpoints/hybridflow/default"  # ${...} resolved
    dpo = parse_offline_config({}, "dpo")
    assert isinstance(dpo, DpoConfig)
    assert (dpo.data.prompt_key, dpo.data.chosen_key, dpo.data.rejected_key) == ("prompt", "chosen", "rejected")
    assert (dpo.dpo.beta, dpo.dpo.loss_type) == (0.1, "sigmoid")  # TRL's DPOConfig defaults


def test_verl_sft_spellings_set_the_engine_keys() -> None:
    cfg = parse_offline_config({
        "optim": {"warmup_steps_ratio": 0.0, "lr_scheduler": "constant"},
        "model": {"fsdp_config": {"cpu_offload": True}},
        "trainer": {"project_name": "p", "experiment_name": "e"},
    }, "sft")
    assert (cfg.optim.lr_warmup_steps_ratio, cfg.optim.lr_scheduler_type) == (0.0, "constant")
    assert cfg.model.fsdp_config.offload_policy  # one offload mechanism serves every spelling
    assert cfg.trainer.default_local_dir == "checkpoints/p/e"
    assert problems({"optim": {"warmup_steps_ratio": 0.2, "lr_warmup_steps_ratio": 0.1}}) == [
        "optim: warmup_steps_ratio=0.2 contradicts lr_warmup_steps_ratio=0.1; set only one of the two"
    ]


@pytest.mark.parametrize(
    ("recipe", "mapping", "expected"),
    [
        ("sft", {"data": {"train_batch_size": 6}, "trainer": {"n_gpus_per_node": 4}},
         "data.train_batch_size: 6 rows do not split evenly over 4 processes (trainer.nnodes x trainer.n_gpus_per_node); "
         "make it a multiple of 4"),
        ("sft", {"data": {"micro_batch_size": 8}}, "data.micro_batch_size: verl's deprecated global micro batch (8); "
         "remove it and set data.micro_batch_size_per_gpu"),
        ("sft", {"data": {"promt_key": "q"}}, "data.promt_key: unknown key; did you mean prompt_key?"),
        ("sft", {"dpo": {"beta": 0.1}}, "dpo: not a key of the sft trainer (python -m hybridflow.trainer.fsdp_sft_trainer); "
         "it belongs to the dpo trainer's config"),
        ("dpo", {"actor_rollout_ref": {}}, "actor_rollout_ref: not a key of the dpo trainer"),
        ("dpo", {"dpo": {"loss_type": "hinge"}}, "dpo.loss_type: 'hinge' is not valid; use one of 'sigmoid' or 'ipo'"),
        ("dpo", {"dpo": {"beta": 0}}, "dpo.beta: must be > 0"),
        ("dpo", {"data": {"response_key": "r"}}, "data.response_key: unknown key"),
        ("sft", {"data": {"truncation": "middle"}}, "data.truncation: 'middle' is not valid; use one of 'error', 'left' or 'right'"),
        ("sft", {"ulysses_sequence_parallel_size": 2}, "ulysses_sequence_parallel_size: 2 is not valid"),
    ],
)
def test_invalid_configs_say_what_to_change(recipe: str, mapping: dict, expected: str) -> None:
    found = problems(mapping, recipe)
    assert any(p.startswith(expected) for p in found), found


def test_a_run_needs_a_model_and_data() -> None:
    with pytest.raises(ConfigError) as err:
        parse_offline_config({}, "dpo").validate_for_run()
    assert err.value.problems == [
        "model.partial_pretrain: required to run; set it to a Hugging Face model folder or hub id",
        "data.train_files: required to run; set it to a parquet file or URI (or a list of them)",
    ]


def test_load_applies_overrides_and_refuses_a_manifest(tmp_path: Path) -> None:
    cfg = load_offline_config(REPO / "examples" / "tiny_dpo.yaml", ["dpo.loss_type=ipo", "trainer.n_gpus_per_node=1"], "dpo")
    assert cfg.dpo.loss_type == "ipo" and cfg.world_size == 1
    with pytest.raises(ConfigError, match="this is a Kubernetes manifest, not a trainer config; run it with `rljob run -f"):
        load_offline_config(REPO / "examples" / "rljob_tiny_sft.yaml", [], "sft")


def test_recipes_name_existing_trainer_modules() -> None:
    for recipe in RECIPES.values():
        assert (REPO / "trainer_image" / (recipe.module.replace(".", "/") + ".py")).is_file(), recipe.module
    assert get_recipe("sft").keep_keys == ("max_ckpt_to_keep",)
    with pytest.raises(ValueError, match="unknown recipe 'rl'; use one of ppo, sft, dpo"):
        get_recipe("rl")


def test_trainer_cli_reports_bad_input_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Config problems, a missing column and torchrun are all refused before Ray or a model starts."""
    from hybridflow.data.toy import build_toy_tokenizer, write_parquet
    from hybridflow.trainer import fsdp_dpo_trainer, fsdp_sft_trainer

    assert fsdp_sft_trainer.main(["data.promt_key=q"]) == 2
    assert "data.promt_key: unknown key; did you mean prompt_key?" in capsys.readouterr().err
    tokenizer_dir = tmp_path / "tok"
    build_toy_tokenizer(str(tokenizer_dir))
    write_parquet([{"prompt": "copy a", "chosen": "a"}], str(tmp_path / "pairs.parquet"))
    args = [f"model.partial_pretrain={tokenizer_dir}", f"data.train_files={tmp_path / 'pairs.parquet'}",
            "trainer.device=cpu", "trainer.n_gpus_per_node=1", "data.train_batch_size=1"]
    assert fsdp_dpo_trainer.main(args) == 2
    assert "error: column 'rejected' missing" in capsys.readouterr().err
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert fsdp_sft_trainer.main(args) == 2
    assert "started by torchrun; run `python -m hybridflow.trainer.fsdp_sft_trainer` once instead" in capsys.readouterr().err
