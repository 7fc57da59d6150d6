"""Tests of hybridflow.config: defaults, parsing, unknown keys, type errors, round trips."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from pydantic import BaseModel

from hybridflow.config import (
    ADV_ESTIMATORS,
    KL_PENALTIES,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    ROLLOUT_NAMES,
    ConfigError,
    HybridFlowConfig,
    check_runnable,
    load_config,
    parse_config,
)


def get(cfg: HybridFlowConfig, dotted: str) -> Any:
    """Read a dotted key from a parsed config."""
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


# Defaults as documented in verl's ppo_trainer.yaml (key: value), plus the few we change on purpose
# (listed in DELIBERATE below).
VERL_DEFAULTS = {
    "algorithm.adv_estimator": "gae",
    "algorithm.gamma": 1.0,
    "algorithm.lam": 1.0,
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_penalty": "kl",
    "algorithm.kl_ctrl.type": "fixed",
    "algorithm.kl_ctrl.kl_coef": 0.001,
    "algorithm.kl_ctrl.horizon": 10000,
    "algorithm.kl_ctrl.target_kl": 0.1,
    "algorithm.filter_groups.enable": False,
    "data.prompt_key": "prompt",
    "data.reward_fn_key": "data_source",
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.train_batch_size": 1024,
    "data.val_batch_size": None,
    "data.return_raw_chat": False,
    "data.shuffle": True,
    "data.filter_overlong_prompts": False,
    "data.truncation": "error",
    "data.dataloader_num_workers": 8,
    "actor_rollout_ref.hybrid_engine": True,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.model.use_remove_padding": False,
    "actor_rollout_ref.model.trust_remote_code": False,
    "actor_rollout_ref.model.override_config": {},
    "actor_rollout_ref.model.external_lib": None,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": None,
    "actor_rollout_ref.actor.use_dynamic_bsz": False,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,
    "actor_rollout_ref.actor.grad_clip": 1.0,
    "actor_rollout_ref.actor.clip_ratio": 0.2,
    "actor_rollout_ref.actor.clip_ratio_low": 0.2,
    "actor_rollout_ref.actor.clip_ratio_high": 0.2,
    "actor_rollout_ref.actor.clip_ratio_c": 3.0,
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.entropy_coeff": 0,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "actor_rollout_ref.actor.ppo_epochs": 1,
    "actor_rollout_ref.actor.shuffle": False,
    "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.optim.lr_warmup_steps": -1,
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.0,
    "actor_rollout_ref.actor.optim.min_lr_ratio": 0.0,
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "constant",
    "actor_rollout_ref.actor.optim.weight_decay": 0.01,
    "actor_rollout_ref.actor.optim.betas": [0.9, 0.999],
    "actor_rollout_ref.actor.optim.total_training_steps": -1,
    "actor_rollout_ref.actor.fsdp_config.param_offload": False,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False,
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": -1,
    "actor_rollout_ref.actor.checkpoint.save_contents": ["model", "optimizer", "extra"],
    "actor_rollout_ref.actor.checkpoint.load_contents": ["model", "optimizer", "extra"],
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": None,
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": False,
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": 16384,
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.mode": "sync",
    "actor_rollout_ref.rollout.n": 1,
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.top_k": -1,
    "actor_rollout_ref.rollout.top_p": 1.0,
    "actor_rollout_ref.rollout.prompt_length": 512,
    "actor_rollout_ref.rollout.response_length": 512,
    "actor_rollout_ref.rollout.dtype": "bfloat16",
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.5,
    "actor_rollout_ref.rollout.ignore_eos": False,
    "actor_rollout_ref.rollout.free_cache_engine": True,
    "actor_rollout_ref.rollout.max_num_batched_tokens": 8192,
    "actor_rollout_ref.rollout.max_num_seqs": 1024,
    "actor_rollout_ref.rollout.enable_chunked_prefill": True,
    "actor_rollout_ref.rollout.enable_prefix_caching": True,
    "actor_rollout_ref.rollout.do_sample": True,
    "actor_rollout_ref.rollout.over_sample_rate": 0.0,
    "actor_rollout_ref.model.enable_activation_offload": False,
    "critic.model.enable_activation_offload": False,
    "actor_rollout_ref.rollout.calculate_log_probs": False,
    "actor_rollout_ref.rollout.val_kwargs.top_k": -1,
    "actor_rollout_ref.rollout.val_kwargs.top_p": 1.0,
    "actor_rollout_ref.rollout.val_kwargs.temperature": 0,
    "actor_rollout_ref.rollout.val_kwargs.n": 1,
    "actor_rollout_ref.rollout.val_kwargs.do_sample": False,
    "critic.enable": None,
    "critic.optim.lr": 1e-5,
    "critic.ppo_mini_batch_size": 256,
    "critic.ppo_micro_batch_size_per_gpu": None,
    "critic.ppo_max_token_len_per_gpu": 32768,
    "critic.ppo_epochs": 1,
    "critic.grad_clip": 1.0,
    "critic.cliprange_value": 0.5,
    "critic.loss_agg_mode": "token-mean",
    "reward_model.enable": False,
    "reward_model.reward_manager": "naive",
    "reward_model.micro_batch_size_per_gpu": None,
    "reward_model.overlong_buffer.enable": False,
    "custom_reward_function.path": None,
    "custom_reward_function.name": "compute_score",
    "trainer.total_epochs": 30,
    "trainer.total_training_steps": None,
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
    "trainer.device": "cuda",
    "trainer.save_freq": -1,
    "trainer.test_freq": -1,
    "trainer.val_before_train": True,
    "trainer.critic_warmup": 0,
    "trainer.balance_batch": True,
    "trainer.resume_mode": "auto",
    "trainer.resume_from_path": None,
    "trainer.log_val_generations": 0,
    "trainer.max_actor_ckpt_to_keep": None,
    "trainer.max_critic_ckpt_to_keep": None,
    "trainer.ray_init.num_cpus": None,
    "actor_rollout_ref.actor.tis_imp_ratio_cap": -1,
}
# Where we differ from verl on purpose: FSDP2 by default, TP 1 (fits one GPU / CPU), no wandb.
DELIBERATE = {
    "actor_rollout_ref.actor.strategy": "fsdp2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "trainer.logger": ["console"],
    "trainer.placement": "colocate",
}


@pytest.mark.parametrize(("key", "expected"), sorted({**VERL_DEFAULTS, **DELIBERATE}.items()))
def test_default_matches_verl(key: str, expected: Any) -> None:
    """Each listed key defaults to verl's documented value (or our deliberate choice)."""
    assert get(load_config(None), key) == expected


def test_defaults_are_valid_and_derived_helpers() -> None:
    """The default config validates; world size and critic follow verl's derivations."""
    cfg = load_config()
    assert cfg.world_size == 8
    assert cfg.critic_enabled is True  # gae
    assert cfg.ref_enabled is False
    grpo = load_config(None, ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4"])
    assert grpo.critic_enabled is False
    assert load_config(None, ["trainer.nnodes=2", "trainer.n_gpus_per_node=4"]).world_size == 8


def test_known_name_constants() -> None:
    """The exported name tuples carry verl's spellings (online_dpo is ours: verl has no such estimator)."""
    assert ADV_ESTIMATORS == (
        "gae",
        "grpo",
        "rloo",
        "remax",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "opo",
        "gpg",
        "online_dpo",
        "grpo_passk",
        "gdpo",
        "grpo_vectorized",
        "rloo_vectorized",
        "gae_vectorized",
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
    )
    assert POLICY_LOSSES == (
        "vanilla", "gspo", "gpg", "cispo", "sapo", "geo_mean", "clip_cov", "kl_cov", "up", "dppo_tv", "dppo_kl", "dro",
        "bypass_mode",
    )
    assert "low_var_kl+" in KL_PENALTIES and len(KL_PENALTIES) == 11
    assert LOSS_AGG_MODES[0] == "token-mean" and len(LOSS_AGG_MODES) == 4
    assert ROLLOUT_NAMES == ("vllm", "sglang", "hf")


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    """Every model class reachable from `model`."""
    seen.add(model)
    for field in model.model_fields.values():
        for arg in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel) and arg not in seen:
                _models(arg, seen)
    return seen


def test_every_model_forbids_extras_and_documents_every_field() -> None:
    """extra=forbid everywhere; every field has a description; JSON schema generation works."""
    models = _models(HybridFlowConfig, set())
    assert len(models) > 20
    for model in models:
        assert model.model_config.get("extra") == "forbid", model
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
    schema = HybridFlowConfig.model_json_schema()
    assert "actor_rollout_ref" in schema["properties"]


def test_parse_nested_mapping_and_coercions() -> None:
    """A verl-shaped mapping parses; strings become lists; derived nulls are filled."""
    cfg = parse_config(
        {
            "data": {"train_files": "s3://b/train.parquet", "train_batch_size": 64},
            "actor_rollout_ref": {
                "model": {"path": "Qwen/Qwen2.5-0.5B"},
                "actor": {
                    "ppo_mini_batch_size": 16,
                    "clip_ratio_high": 0.28,
                    "optim": {"warmup_style": "cosine"},
                },
            },
            "trainer": {"logger": "tensorboard", "n_gpus_per_node": 2},
        }
    )
    assert cfg.data.train_files == ["s3://b/train.parquet"]
    assert cfg.data.val_files == []
    assert cfg.trainer.logger == ["tensorboard"]
    actor = cfg.actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
    assert actor.optim.lr_scheduler_type == "cosine"
    assert cfg.critic.ppo_mini_batch_size == 16
    assert cfg.critic.model.path == "Qwen/Qwen2.5-0.5B"
    assert cfg.actor_rollout_ref.model.tokenizer_path == "Qwen/Qwen2.5-0.5B"
    assert cfg.actor_rollout_ref.ref.strategy == "fsdp2"


def test_round_trip_through_to_dict() -> None:
    """parse_config(cfg.to_dict()) gives an equal config, for defaults and a customised one."""
    for cfg in (
        load_config(),
        load_config(
            None,
            [
                "algorithm.adv_estimator=grpo",
                "actor_rollout_ref.rollout.n=8",
                "actor_rollout_ref.actor.clip_ratio_high=0.28",
                "trainer.logger=[console,file]",
                "+actor_rollout_ref.model.override_config.attention_dropout=0.1",
                "trainer.project_name=p",
            ],
        ),
    ):
        again = parse_config(cfg.to_dict())
        assert again == cfg
        assert again.to_dict() == cfg.to_dict()


@pytest.mark.parametrize(
    ("mapping", "expected"),
    [
        ({"trainr": {}}, "trainr: unknown key; did you mean trainer?"),
        ({"algorithm": {"gama": 0.9}}, "algorithm.gama: unknown key; did you mean gamma?"),
        (
            {"actor_rollout_ref": {"actor": {"ppo_mini_bach_size": 8}}},
            "actor_rollout_ref.actor.ppo_mini_bach_size: unknown key; did you mean ppo_mini_batch_size",
        ),
        (
            {"actor_rollout_ref": {"actor": {"optim": {"learning_rate": 1}}}},
            "actor_rollout_ref.actor.optim.learning_rate: unknown key; valid keys here: betas,",
        ),
        (
            {"actor_rollout_ref": {"rollout": {"val_kwargs": {"temprature": 0.5}}}},
            "actor_rollout_ref.rollout.val_kwargs.temprature: unknown key; did you mean temperature?",
        ),
        (
            {"critic": {"model": {"fsdp_config": {"param_ofload": True}}}},
            "critic.model.fsdp_config.param_ofload: unknown key; did you mean param_offload?",
        ),
    ],
)
def test_unknown_key_names_full_path_and_suggests(mapping: dict[str, Any], expected: str) -> None:
    """Unknown keys at any depth name their full dotted path and the closest valid keys."""
    with pytest.raises(ConfigError) as info:
        parse_config(mapping)
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith(expected), info.value.problems


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "algorithm.adv_estimator=ppo",
            "algorithm.adv_estimator: 'ppo' is not valid; use one of 'gae', 'grpo'",
        ),
        (
            "actor_rollout_ref.rollout.name=trt",
            "actor_rollout_ref.rollout.name: 'trt' is not valid; use one of",
        ),
        (
            "actor_rollout_ref.actor.loss_agg_mode=mean",
            "actor_rollout_ref.actor.loss_agg_mode: 'mean' is not valid",
        ),
        (
            "actor_rollout_ref.actor.policy_loss.loss_mode=ppo",
            "actor_rollout_ref.actor.policy_loss.loss_mode: 'ppo'",
        ),
        ("algorithm.kl_penalty=k4", "algorithm.kl_penalty: 'k4' is not valid; use one of 'kl', 'k1'"),
        ("data.train_batch_size=many", "data.train_batch_size: expected a whole number (got 'many')"),
        ("data.train_batch_size=1.5", "data.train_batch_size: expected a whole number (got 1.5)"),
        ("trainer.nnodes=[1]", "trainer.nnodes: expected a whole number"),
        ("actor_rollout_ref.actor.optim.lr=fast", "actor_rollout_ref.actor.optim.lr: expected a number"),
        ("trainer=3", "trainer: expected a mapping of keys to values (got 3)"),
        ("data.prompt_key=[a]", "data.prompt_key: expected a string"),
        ("trainer.val_before_train=maybe", "trainer.val_before_train: expected true or false (got 'maybe')"),
        (
            "actor_rollout_ref.actor.clip_ratio_c=0.5",
            "actor_rollout_ref.actor.clip_ratio_c: must be > 1.0 (got 0.5); change the value",
        ),
        ("trainer.logger=[console,neptune]", "trainer.logger[1]: 'neptune' is not valid"),  # mlflow: test_verl_features
        ("trainer.nnodes=0", "trainer.nnodes: must be >= 1 (got 0)"),
        ("trainer.default_hdfs_dir=hdfs://x", "trainer.default_hdfs_dir: expected null"),
        ("actor_rollout_ref.rollout.top_p=1.5", "actor_rollout_ref.rollout.top_p: must be <= 1"),
        (
            "actor_rollout_ref.actor.fsdp_config.fsdp_size=0",
            "actor_rollout_ref.actor.fsdp_config: fsdp_size must be -1",
        ),
    ],
)
def test_type_and_name_errors_say_what_is_expected(override: str, expected: str) -> None:
    """Wrong types and names report the path and what would be accepted."""
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


def test_every_problem_is_reported_at_once() -> None:
    """Unknown keys, bad names and bad types in different groups come back together."""
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "algorithm": {"adv_estimator": "nope", "lamda": 1},
                "data": {"train_batch_size": -1},
                "trainer": {"logger": ["console", "bogus"], "devise": "cpu"},
                "extra_group": {},
            }
        )
    paths = sorted(p.split(":")[0] for p in info.value.problems)
    assert paths == [
        "algorithm.adv_estimator",
        "algorithm.lamda",
        "data.train_batch_size",
        "extra_group",
        "trainer.devise",
        "trainer.logger[1]",
    ]
    text = str(info.value)
    assert text.startswith("invalid HybridFlow config (6 problems):")
    assert isinstance(info.value, ValueError)


def test_non_mapping_input_is_rejected() -> None:
    """A list at the top level is a clear error, not a crash."""
    with pytest.raises(ConfigError, match="expected a mapping of groups"):
        parse_config([1, 2])  # type: ignore[arg-type]


def test_validate_for_run_requires_model_and_data() -> None:
    """A run needs a model path and training files; an enabled reward model needs its path too."""
    cfg = load_config(None, ["reward_model.enable=true"])
    with pytest.raises(ConfigError) as info:
        cfg.validate_for_run()
    assert [p.split(":")[0] for p in info.value.problems] == [
        "actor_rollout_ref.model.path",
        "data.train_files",
        "reward_model.model.path",
    ]
    assert "required when reward_model.enable is true" in info.value.problems[2]
    ok = load_config(None, ["actor_rollout_ref.model.path=/m", "data.train_files=/d/train.parquet"])
    ok.validate_for_run()
    check_runnable(ok)
    with_rm = load_config(
        None,
        [
            "actor_rollout_ref.model.path=/m",
            "data.train_files=/d/train.parquet",
            "reward_model.enable=true",
            "reward_model.model.path=/rm",
        ],
    )
    with_rm.validate_for_run()
    with pytest.raises(ConfigError):
        check_runnable(cfg)


def test_async_rollout_mode_is_accepted_with_vllm_and_sglang_and_refused_with_what_is_not_built() -> None:
    """Server mode runs on vLLM AsyncLLM or SGLang replicas; what it does not do yet is refused with the fix, never
    ignored."""
    base = ["actor_rollout_ref.model.path=/m", "data.train_files=/d/train.parquet", "actor_rollout_ref.rollout.mode=async"]
    load_config(None, [*base, "actor_rollout_ref.rollout.multi_turn.enable=true"]).validate_for_run()
    load_config(None, [*base, "actor_rollout_ref.rollout.multi_turn.enable=true", "actor_rollout_ref.rollout.name=sglang",
                       "trainer.device=cuda"]).validate_for_run()
    for fmt in ("gpt-oss", "qwen"):  # verl's tool parsers (qwen: its configs' name for hermes)
        load_config(None, [*base, "actor_rollout_ref.rollout.multi_turn.enable=true",
                           f"actor_rollout_ref.rollout.multi_turn.format={fmt}"]).validate_for_run()
    refused = {
        "actor_rollout_ref.rollout.name=hf": "the hf rollout is not a server; set actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.multi_turn.format=pythonic": r"multi_turn.format to one of hermes, gpt-oss, qwen3_coder .* "
        r"or qwen, read as hermes \(got 'pythonic'\)",
        "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template=true": "token-in/token-out",
        "+actor_rollout_ref.rollout.agent.custom_async_server.path=/x.py": "custom async rollout server class",
    }
    # with tools (server mode needed); single-turn async where server mode cannot serve it runs in sync mode
    # (tests/unit/test_verl_compat_rollout.py)
    tools = "actor_rollout_ref.rollout.multi_turn.enable=true"
    for override, message in refused.items():
        with pytest.raises(ConfigError, match=message):
            load_config(None, [*base, tools, override, "trainer.n_gpus_per_node=2", "trainer.device=cuda"]).validate_for_run()
    # tensor-parallel replicas span tp slots of the pool (hybridflow.workers.rollout_service)
    load_config(None, [*base, tools, "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2",
                       "trainer.device=cuda"]).validate_for_run()
    sync = ["actor_rollout_ref.model.path=/m", "data.train_files=/d/train.parquet", "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.mode=sync"]
    with pytest.raises(ConfigError, match="run in server mode only"):
        load_config(None, sync).validate_for_run()


def test_warmup_style_conflict_is_reported() -> None:
    """The legacy warmup_style key may not contradict lr_scheduler_type."""
    with pytest.raises(ConfigError, match="contradicts lr_scheduler_type"):
        load_config(
            None,
            [
                "actor_rollout_ref.actor.optim.warmup_style=cosine",
                "actor_rollout_ref.actor.optim.lr_scheduler_type=constant",
            ],
        )


def test_assignment_is_validated() -> None:
    """Sections check values assigned after parsing (the trainer fills total_training_steps)."""
    cfg = load_config()
    cfg.actor_rollout_ref.actor.optim.total_training_steps = 100
    assert cfg.actor_rollout_ref.actor.optim.total_training_steps == 100
    with pytest.raises(ValueError):
        cfg.actor_rollout_ref.actor.optim.lr = "fast"  # type: ignore[assignment]


def test_top_level_ray_init_is_accepted_as_in_verl() -> None:
    """verl's top-level ray_init lands in trainer.ray_init; giving both is an error."""
    cfg = parse_config({"ray_init": {"num_cpus": 4, "address": "auto"}, "trainer": {"nnodes": 1}})
    assert (cfg.trainer.ray_init.num_cpus, cfg.trainer.ray_init.address) == (4, "auto")
    assert cfg.trainer.nnodes == 1
    assert "ray_init" not in cfg.to_dict()
    assert load_config(None, ["ray_init.num_cpus=2"]).trainer.ray_init.num_cpus == 2
    with pytest.raises(ConfigError) as info:
        parse_config({"ray_init": {"num_cpus": 4}, "trainer": {"ray_init": {"num_cpus": 2}}})
    assert info.value.problems == ["ray_init: also set as trainer.ray_init; keep only one of the two"]
