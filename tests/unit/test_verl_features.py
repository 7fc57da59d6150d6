"""verl keys HybridFlow lacks: refused as a named feature, or accepted with a note; clip_grad; global micro-batches;
verl's --config-name (hybridflow._config.verl_features, verl_compat, main_ppo.parse_command_line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hybridflow._config import verl_compat, verl_features
from hybridflow.config import ConfigError, HybridFlowConfig, load_config
from hybridflow.trainer.main_ppo import load_run_config, main, parse_argv, parse_command_line

RUN = ["actor_rollout_ref.model.path=/m", "data.train_files=/d/train.parquet"]


def _problems(overrides: list[str]) -> list[str]:
    """The problems load_config reports for the overrides (fails when it accepts them)."""
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    return info.value.problems


def _schema_paths(model: type[Any] = HybridFlowConfig, prefix: str = "") -> set[str]:
    """Every dotted key path of the config models."""
    from hybridflow._config.errors import _model_in

    paths: set[str] = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}{field.alias or name}"
        paths.add(path)
        inner = _model_in(field.annotation)
        if inner is not None:
            paths |= _schema_paths(inner, f"{path}.")
    return paths


def test_no_table_entry_shadows_a_field_of_the_schema() -> None:
    """A verl key built here later (a field) must not be refused or dropped by a stale entry: remove the entry."""
    fields = _schema_paths()
    stale = [k.pattern for k in verl_features.KEYS if any(verl_features.matches(k.pattern, tuple(f.split("."))) for f in fields)]
    assert not stale


def test_every_no_effect_field_is_a_field() -> None:
    fields = [tuple(f.split(".")) for f in _schema_paths()]
    assert all(any(verl_features.matches(k.pattern, f) for f in fields) for k in verl_features.NO_EFFECT_FIELDS)


def test_a_field_without_effect_here_is_kept_and_noted() -> None:
    cfg = load_config(None, ["actor_rollout_ref.model.use_remove_padding=true", "data.dataloader_num_workers=4"])
    assert cfg.actor_rollout_ref.model.use_remove_padding is True
    assert "actor_rollout_ref.model.use_remove_padding=true (verl's sequence packing" in cfg.verl_notes[0]
    assert "data.dataloader_num_workers=4 (batches are read in the driver)" in cfg.verl_notes[0]


def test_every_feature_message_says_not_supported_or_not_yet_and_what_to_do() -> None:
    for feature in verl_features.all_features():
        assert "not supported by HybridFlow" in feature.message or "not built in HybridFlow yet" in feature.message
        assert "; " in feature.message, feature.name  # the part after it says what to do
    for key in verl_features.KEYS:
        assert key.feature is not None or key.note, f"{key.pattern}: an always-accepted key needs a note"
        assert not key.accepts or key.note, f"{key.pattern}: accepted values need a note"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
         "actor_rollout_ref.actor.megatron: verl's Megatron-LM backend is not supported by HybridFlow; FSDP2 only"),
        ("actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.actor.strategy: verl's Megatron-LM backend"),
        ("reward_model.ulysses_sequence_parallel_size=2",
         "Ulysses sequence parallelism for the reward model (size > 1) is not built"),
        ("data.video_key=videos", "data.video_key: this multimodal feature (video input, verl's multimodal extras)"),
        ("critic.model.lora_rank=32", "critic.model.lora_rank: LoRA for the critic (critic.model.lora_*) is not built"),
        ("actor_rollout_ref.model.lora.rank=32", "actor_rollout_ref.model.lora: verl's Megatron LoRA section"),
        ("actor_rollout_ref.rollout.name=trtllm", "the TensorRT-LLM rollout engine is not supported by HybridFlow; use "),
        ("reward_model.reward_manager=collabllm", "this verl reward manager is not built"),
        ("trainer.logger=[console,swanlab]", "trainer.logger[1]: "),
        ("global_profiler.tool=npu", "global_profiler.tool: verl's npu profiler (Ascend NPUs) is not supported"),
        ("actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.tensor_model_parallel_size=16",
         "more than a node has (8): a server replica (rollout.mode=async) spanning nodes is not built in HybridFlow yet"),
    ],
)
def test_a_verl_feature_is_refused_by_name_not_as_an_unknown_key(override: str, expected: str) -> None:
    problems = _problems(override.split())
    assert len(problems) == 1 and expected in problems[0], problems
    assert verl_features.feature_of(problems[0]) is not None
    assert "unknown key" not in problems[0]


def test_a_typo_is_still_an_unknown_key_with_a_suggestion() -> None:
    assert _problems(["actor_rollout_ref.actor.ppo_mini_batchsize=8"]) == [
        "actor_rollout_ref.actor.ppo_mini_batchsize: unknown key; did you mean ppo_mini_batch_size?"
    ]


def test_a_key_accepted_without_effect_is_dropped_and_noted() -> None:
    cfg = load_config(None, [
        "reward_model.ulysses_sequence_parallel_size=1",
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",
        "trainer.use_legacy_worker_impl=auto",
    ])
    assert "ulysses_sequence_parallel_size" not in str(cfg.to_dict()["reward_model"])
    (note,) = cfg.verl_notes
    assert note.startswith("accepted without effect here: reward_model.ulysses_sequence_parallel_size=1 (")
    assert "entropy_from_logits_with_chunking=true (entropy is always computed" in note and "trainer.use_legacy_worker_impl=auto" in note
    assert load_config(None, []).verl_notes == []


def test_true_is_not_the_accepted_1() -> None:
    """`ulysses_sequence_parallel_size=true` is not size 1: refused, not dropped (a field or a table entry)."""
    assert "Ulysses" in _problems(["reward_model.ulysses_sequence_parallel_size=true"])[0]
    assert "expected a number, not true or false" in _problems(["critic.ulysses_sequence_parallel_size=true"])[0]


def test_optim_clip_grad_is_verls_name_for_grad_clip() -> None:
    cfg = load_config(None, ["actor_rollout_ref.actor.optim.clip_grad=0.5", "critic.optim.clip_grad=2"])
    assert cfg.actor_rollout_ref.actor.grad_clip == 0.5 and cfg.critic.grad_clip == 2
    same = load_config(None, ["actor_rollout_ref.actor.optim.clip_grad=0.5", "actor_rollout_ref.actor.grad_clip=0.5"])
    assert same.actor_rollout_ref.actor.grad_clip == 0.5
    assert _problems(["critic.optim.clip_grad=0.5", "critic.grad_clip=1.0"]) == [
        "critic.optim.clip_grad: 0.5 contradicts critic.grad_clip=1.0 (both set the gradient-norm clip); keep only one "
        "of the two"
    ]
    assert "expected a positive number" in _problems(["actor_rollout_ref.actor.optim.clip_grad=-1"])[0]


@pytest.mark.parametrize(
    ("old", "new", "extra"),
    [
        ("actor_rollout_ref.actor.ppo_micro_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", []),
        ("actor_rollout_ref.ref.log_prob_micro_batch_size", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", []),
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size",
         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", []),
        ("critic.ppo_micro_batch_size", "critic.ppo_micro_batch_size_per_gpu", ["algorithm.adv_estimator=gae"]),
        ("reward_model.micro_batch_size", "reward_model.micro_batch_size_per_gpu", []),
    ],
)
def test_a_global_micro_batch_is_divided_over_the_data_parallel_ranks(old: str, new: str, extra: list[str]) -> None:
    """verl divides the deprecated global size by world size // ulysses size; 2 nodes x 4 GPUs: 64 -> 8 per GPU."""
    cluster = ["trainer.nnodes=2", "trainer.n_gpus_per_node=4", *extra]
    cfg = load_config(None, [*cluster, f"{old}=64"])
    node: Any = cfg
    for part in new.split("."):
        node = getattr(node, part)
    assert node == 8
    assert f"{old}=64 is deprecated in verl: converted to {new.rsplit('.', 1)[1]}=8 (8 ranks)" in cfg.verl_notes
    not_divisible = _problems([*cluster, f"{old}=60"])
    assert not_divisible == [
        f"{old}: verl's deprecated global micro-batch size 60 does not split over the 8 data-parallel ranks (verl would "
        f"round it down); set {new} instead (e.g. 7)"
    ]
    assert f"keep only {new}" in _problems([*cluster, f"{old}=64", f"{new}=8"])[0]


def test_multi_turn_without_a_mode_runs_in_server_mode_as_verl_does() -> None:
    cfg = load_config(None, ["actor_rollout_ref.rollout.multi_turn.enable=true"])
    assert cfg.actor_rollout_ref.rollout.mode == "async"
    assert any("rollout.mode=async set" in n for n in cfg.verl_notes)
    assert load_config(None, ["actor_rollout_ref.rollout.multi_turn.enable=false"]).actor_rollout_ref.rollout.mode == "sync"


# ------------------------------------------------------------------------------------- --config-name


def test_verls_default_config_name_is_the_defaults() -> None:
    for argv in (["--config-name", "ppo_trainer"], ["--config-name=ppo_trainer.yaml"], ["-cn", "ppo_trainer"]):
        assert parse_argv([*argv, "trainer.seed=3"]) == (None, ["trainer.seed=3"])


def test_megatron_and_multimodal_config_names_are_refused_by_name() -> None:
    with pytest.raises(ConfigError) as info:
        parse_command_line(["--config-name", "ppo_megatron_trainer", "trainer.seed=1"])
    (problem,) = info.value.problems
    assert problem.startswith("--config-name ppo_megatron_trainer (verl/trainer/config/ppo_megatron_trainer.yaml in "
                              "verl): verl's Megatron-LM backend is not supported by HybridFlow; FSDP2 only")
    with pytest.raises(ConfigError, match="multimodal"):
        parse_command_line(["--config-name=deepeyes_multiturn_grpo"])


def test_a_multi_turn_config_name_sets_the_keys_its_verl_yaml_sets_before_the_command_line() -> None:
    line = parse_command_line([
        "--config-path", "/somewhere/verl/examples/sglang_multiturn/config", "--config-name", "gsm8k_multiturn_grpo",
        "actor_rollout_ref.rollout.name=vllm", *RUN,
    ])
    assert line.path is None and line.overrides[-3:] == ["actor_rollout_ref.rollout.name=vllm", *RUN]
    assert "actor_rollout_ref.rollout.multi_turn.enable=true" in line.overrides
    assert "examples/sglang_multiturn/config/gsm8k_multiturn_grpo.yaml sets" in line.notes[0]
    cfg, notes = load_run_config(line.overrides)
    assert cfg.actor_rollout_ref.rollout.mode == "async" and cfg.actor_rollout_ref.rollout.name == "vllm"
    assert cfg.data.return_raw_chat and cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 5


def test_another_config_name_is_a_yaml_under_config_path(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text("trainer:\n  seed: 5\n")
    assert parse_argv(["--config-path", str(tmp_path), "--config-name", "mine", "x.y=1"]) == (
        f"{tmp_path}/mine.yaml", ["x.y=1"]
    )
    with pytest.raises(ConfigError, match=r"--config-name other: not one of the verl config names HybridFlow knows"):
        parse_command_line([f"--config-path={tmp_path}", "--config-name=other"])
    with pytest.raises(ConfigError, match="both given"):
        parse_command_line(["job.yaml", "--config-name", "ppo_trainer"])
    with pytest.raises(ConfigError, match="needs a value"):
        parse_command_line(["--config-name"])


def test_main_prints_the_notes_once_and_refuses_a_feature_with_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config-name", "ppo_megatron_trainer", *RUN]) == 2
    assert "Megatron-LM backend is not supported by HybridFlow" in capsys.readouterr().err
    _, notes = load_run_config(["trainer.use_legacy_worker_impl=auto", *RUN])
    assert verl_compat.notes_line(notes).count("\n") == 0
    assert verl_compat.notes_line(notes).startswith("verl compatibility: accepted without effect here: ")


def test_the_docs_page_names_every_feature_and_accepted_key() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "verl_compat.md").read_text()
    assert all(f"`{f.name}`" in text for f in verl_features.all_features())
    assert all(f"`{k.pattern}`" in text for k in (*verl_features.KEYS, *verl_features.NO_EFFECT_FIELDS))


@pytest.mark.parametrize("spelling", ["bfloat16", "torch.bfloat16", "bf16", "BFloat16"])
def test_model_torch_dtype_is_the_load_dtype_of_the_groups_that_load_that_model(spelling: str) -> None:
    cfg = load_config(None, [f"actor_rollout_ref.model.torch_dtype={spelling}"])
    arr = cfg.actor_rollout_ref
    assert (arr.actor.fsdp_config.model_dtype, arr.ref.fsdp_config.model_dtype) == ("bf16", "bf16")
    assert cfg.critic.model.fsdp_config.model_dtype == "fp32"  # the critic loads its own model (critic.model)
    (note,) = cfg.verl_notes
    assert note == (
        f"actor_rollout_ref.model.torch_dtype={spelling} is verl's load dtype: set "
        "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16, actor_rollout_ref.ref.fsdp_config.model_dtype=bf16"
    )
    assert "torch_dtype" not in str(cfg.to_dict())


def test_model_torch_dtype_keeps_an_agreeing_explicit_model_dtype_and_refuses_a_contradiction() -> None:
    cfg = load_config(None, ["critic.model.torch_dtype=float32", "critic.model.fsdp_config.model_dtype=fp32"])
    assert cfg.critic.model.fsdp_config.model_dtype == "fp32" and cfg.verl_notes == []
    # the reference keeps its own explicit dtype; the actor gets verl's
    cfg = load_config(None, ["actor_rollout_ref.model.torch_dtype=float16", "actor_rollout_ref.ref.fsdp_config.model_dtype=fp16"])
    assert (cfg.actor_rollout_ref.actor.fsdp_config.model_dtype, cfg.actor_rollout_ref.ref.fsdp_config.model_dtype) == (
        "fp16", "fp16")
    assert _problems(["actor_rollout_ref.model.torch_dtype=bfloat16", "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32"]) == [
        "actor_rollout_ref.model.torch_dtype: bfloat16 contradicts actor_rollout_ref.actor.fsdp_config.model_dtype='fp32' "
        "(both set the dtype that model is loaded in); keep only one, or give both the same dtype"
    ]
    (problem,) = _problems(["actor_rollout_ref.model.torch_dtype=auto"])
    assert problem.startswith("actor_rollout_ref.model.torch_dtype: 'auto' is not a dtype HybridFlow loads models in; use ")


def test_activation_offload_is_a_field_noted_as_without_effect_on_cpu_only() -> None:
    on_cpu = load_config(None, ["actor_rollout_ref.model.enable_activation_offload=true", "trainer.device=cpu"])
    assert on_cpu.actor_rollout_ref.model.enable_activation_offload
    assert on_cpu.verl_notes == [
        "actor_rollout_ref.model.enable_activation_offload=true has no effect with trainer.device=cpu: activations are "
        "in host memory already"
    ]
    on_gpu = load_config(None, ["critic.model.enable_activation_offload=true"])
    assert on_gpu.critic.model.enable_activation_offload and on_gpu.verl_notes == []
