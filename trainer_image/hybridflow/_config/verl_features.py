"""verl features HybridFlow does not have: one table, consulted wherever a key or value would be refused.

A verl user's key that HybridFlow lacks must never read like a typo ("unknown key"), nor be dropped
silently. Each entry below says what the verl feature is and what to do here; each verl key the table
names is either

- refused, with `path: <what> is not supported by HybridFlow (or: not built in HybridFlow yet); <what
  to do>` (errors.describe_error asks `key_refusal` / `value_refusal` before it would say "unknown key"
  or "is not valid"), or
- accepted because it cannot change what the run computes (a logging or loading hint, an option of a
  backend HybridFlow does not use, or a value that asks for exactly what HybridFlow does): verl_compat
  removes it before validation and the config's `verl_notes` say so, printed once at start-up.

Entries only apply to keys and values the schema does not know, so a feature built later (a field
added to the models) takes precedence over its entry here; test_verl_features checks no entry shadows
a field. No torch, no Ray.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Feature:
    """A verl feature HybridFlow lacks: what it is and what to do instead."""

    name: str
    """Short id, used in counts and docs (e.g. `megatron`)."""
    what: str
    """The feature in verl's terms, e.g. "verl's Megatron-LM backend"."""
    instead: str
    """What to remove or use instead."""
    later: bool = False
    """True when an issue plans it ("not built in HybridFlow yet"), False when it is out of scope."""

    @property
    def message(self) -> str:
        """`<what> is not supported by HybridFlow; <instead>` (or `... not built in HybridFlow yet; ...`)."""
        status = "is not built in HybridFlow yet" if self.later else "is not supported by HybridFlow"
        return f"{self.what} {status}; {self.instead}"


@dataclass(frozen=True)
class VerlKey:
    """A verl key path (`*` matches one level) HybridFlow has no field for."""

    pattern: str
    feature: Feature | None = None
    """Refused as this feature unless its value is in `accepts`; None: always accepted (see `note`)."""
    accepts: tuple[Any, ...] = ()
    """Values accepted without effect (compared with their type: 1 is not true)."""
    note: str = ""
    """Why an accepted value changes nothing here (printed at start-up)."""


@dataclass(frozen=True)
class VerlValue:
    """A value verl allows at a path (`*` matches one level) and HybridFlow does not."""

    pattern: str
    value: str
    feature: Feature


# ----------------------------------------------------------------------------------------- features

MEGATRON = Feature(
    "megatron", "verl's Megatron-LM backend",
    "FSDP2 only: remove the megatron.* keys and use strategy=fsdp2 (rollout.tensor_model_parallel_size still shards "
    "generation)",
)
MEGATRON_OPTIM = Feature(
    "megatron", "Megatron's optimizer configuration (override_optimizer_config, lr_decay_style)",
    "remove it; use optim.lr_scheduler_type, and fsdp_config.optimizer_offload=true for CPU optimizer state",
)
ULYSSES = Feature(
    "ulysses", "Ulysses sequence parallelism (size > 1)",
    "remove the key or set it to 1; for long sequences use use_dynamic_bsz with ppo_max_token_len_per_gpu",
    later=True,
)
FUSED_KERNELS = Feature(
    "fused_kernels", "the fused log-prob kernel path (use_fused_kernels, liger)",
    "remove it or set it to false (lower ppo_micro_batch_size_per_gpu if memory runs short)", later=True,
)
TORCH_COMPILE = Feature(
    "torch_compile", "torch.compile (use_torch_compile=true)",
    "remove it or set it to false (same results, slower)", later=True,
)
MEMORY_SAVERS = Feature(
    "memory_savers", "verl's entropy/activation memory saving (checkpointing, chunking, offload)",
    "remove it; use model.enable_gradient_checkpointing and a smaller micro-batch",
)
MULTIMODAL = Feature(
    "multimodal", "multimodal (image/video) input",
    "HybridFlow trains text-only models: remove the image/video keys and use a text dataset", later=True,
)
LORA_CRITIC = Feature(
    "lora_critic", "LoRA for the critic (critic.model.lora_*)",
    "remove the critic.model.lora_* keys (or set critic.model.lora_rank=0): the critic trains all its weights; "
    "LoRA for the policy is actor_rollout_ref.model.lora_rank", later=True,
)
MEGATRON_LORA = Feature(
    "megatron_lora", "verl's Megatron LoRA section (model.lora.*)",
    "use actor_rollout_ref.model.lora_rank, lora_alpha and target_modules (peft LoRA on FSDP2)",
)
REWARD_LOOP = Feature(
    "reward_loop", "verl's reward loop / generative reward model",
    "remove it; score with rules, custom_reward_function.path, or a classifier reward model (reward_model.enable)",
    later=True,
)
REWARD_POOL = Feature(
    "reward_pool", "a separate reward-model resource pool", "remove it: the reward model shares the actor's devices",
)
SANDBOX_REWARD = Feature(
    "sandbox_reward", "SandboxFusion code-execution reward", "remove it; score code with custom_reward_function.path",
    later=True,
)
REWARD_MANAGERS = Feature(
    "reward_manager", "this verl reward manager", "use reward_model.reward_manager=naive, dapo or batch", later=True,
)
PROFILER = Feature(
    "profiler", "verl's profiler (nsys, npu, torch_memory)",
    "remove the profiler keys (run the trainer under nsys or py-spy yourself)", later=True,
)
TRTLLM = Feature("trtllm", "the TensorRT-LLM rollout engine", "use actor_rollout_ref.rollout.name=vllm (or sglang, hf)")
ROLLOUT_EXTRAS = Feature(
    "rollout_extras", "this verl rollout-engine option",
    "remove it; engine arguments go in rollout.engine_kwargs.<engine>",
)
ROLLOUT_TP_NODES = Feature(
    "rollout_tp_nodes", "rollout tensor parallelism across nodes",
    "use a tensor_model_parallel_size that divides trainer.n_gpus_per_node", later=True,
)
SERVER_TP = Feature(
    "server_tp", "tensor parallelism in server-mode (async) rollout replicas",
    "use tensor_model_parallel_size=1 with mode=async (one replica per GPU), or mode=sync", later=True,
)
SGLANG_SERVER = Feature(
    "sglang_server", "server-mode (async) rollout on SGLang",
    "set actor_rollout_ref.rollout.name=vllm (CPU: `make vllm`), or mode=sync", later=True,
)
INTERACTIONS = Feature(
    "interactions", "verl's interactions (simulated user turns)", "remove them; tool calling works without",
    later=True,
)
TOOL_FORMATS = Feature(
    "tool_format", "this multi-turn tool-call format",
    "set actor_rollout_ref.rollout.multi_turn.format=hermes (<tool_call>{json}</tool_call>)",
)
CUSTOM_SERVER = Feature(
    "custom_server", "a custom async rollout server class", "remove it: the built-in vLLM AsyncLLM replicas serve every agent loop",
)
ROUTING_REPLAY = Feature("routing_replay", "MoE routing replay", "remove it: experts are routed afresh in each forward")
MTP = Feature("mtp", "multi-token prediction (model.mtp)", "remove model.mtp.*")
BYPASS_CORRECTION = Feature(
    "bypass_correction", "rollout-correction weights or rejection computed in bypass mode (verl computes them "
    "against the current policy inside the loss)",
    "use bypass_mode=false (decoupled: the trainer's pi_old) with rollout_is / rollout_rs, or bypass_mode=true "
    "without them", later=True,
)
REINFORCE_LOSS = Feature(
    "reinforce_loss", "the bypass-mode REINFORCE loss (algorithm.rollout_correction.loss_type=reinforce)",
    "use loss_type=ppo_clip", later=True,
)
ALGO_EXTRAS = Feature(
    "algorithm_extras", "this verl algorithm option",
    "remove it (for truncated importance sampling against the rollout use actor.tis_imp_ratio_cap)", later=True,
)
ESTIMATORS = Feature(
    "estimator", "this verl advantage estimator", "use one HybridFlow has (grpo, rloo, gae, reinforce_plus_plus, ...)",
    later=True,
)
POLICY_LOSSES = Feature(
    "policy_loss", "this verl policy loss", "use loss_mode vanilla, gspo, gpg or cispo", later=True,
)
DATA_EXTRAS = Feature(
    "data_extras", "this verl data option",
    "remove it: prompts come from data.prompt_key of verl-layout parquet, shuffled by data.shuffle and data.seed",
    later=True,
)
LOGGERS = Feature(
    "logger", "this verl logger or log folder",
    "use trainer.logger console, file, tensorboard ($TENSORBOARD_DIR sets its folder), wandb or prometheus", later=True,
)
CRITIC_FORWARD_BUDGET = Feature(
    "critic_forward_budget", "a separate token budget for the critic's value forward",
    "remove it: critic.ppo_max_token_len_per_gpu budgets every critic micro-batch",
)
DTYPE_KEY = Feature(
    "model_dtype_key", "verl's model.torch_dtype", "remove it; set <role>.fsdp_config.model_dtype (bf16, fp32) instead",
)
DISTILL_GKD = Feature(
    "distill_gkd", "GKD on-policy distillation (use_policy_gradient=false: the divergence back-propagated as a loss)",
    "set distillation.distillation_loss.use_policy_gradient=true (-D_t as the per-token advantage; loss_mode=k1 as in "
    "verl's recipes)", later=True,
)
DISTILL_POOL = Feature(
    "distill_pool", "a separate teacher resource pool (distillation.nnodes > 0, served teacher replicas)",
    "remove distillation.nnodes / n_gpus_per_node (or set nnodes=0): the teacher is a frozen FSDP group on the "
    "trainer's devices, like the reference policy", later=True,
)
MULTI_TEACHER = Feature(
    "multi_teacher", "multi-teacher distillation (several teacher_models routed by teacher_key)",
    "keep one entry, distillation.teacher_models.teacher_model", later=True,
)
DISTILL_TOPK = Feature(
    "distill_topk", "top-k distillation losses (the teacher's top-k log-probs per position)",
    "use loss_mode=k1, the single-sample reverse KL (verl's policy-gradient recipes)", later=True,
)

_ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic", "reward_model")
_POLICY_ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref")


def _each(roles: tuple[str, ...], key: str, **kwargs: Any) -> list[VerlKey]:
    """The same VerlKey under several groups."""
    return [VerlKey(f"{role}.{key}", **kwargs) for role in roles]


_NO_EFFECT_FSDP1 = "an FSDP1 option; the FSDP2 engine here always prefetches and keeps original parameters"

KEYS: tuple[VerlKey, ...] = (
    *_each(_ROLES, "megatron", feature=MEGATRON),
    VerlKey("actor_rollout_ref.actor.optim.override_optimizer_config", MEGATRON_OPTIM),
    VerlKey("critic.optim.override_optimizer_config", MEGATRON_OPTIM),
    VerlKey("actor_rollout_ref.actor.optim.lr_decay_style", MEGATRON_OPTIM),
    VerlKey("critic.optim.lr_decay_style", MEGATRON_OPTIM),
    *_each(_ROLES, "ulysses_sequence_parallel_size", feature=ULYSSES, accepts=(1,),
           note="1 means no sequence parallelism, as here"),
    VerlKey("actor_rollout_ref.model.use_fused_kernels", FUSED_KERNELS, accepts=(False,),
            note="false asks for plain log-probs, as computed here"),
    VerlKey("actor_rollout_ref.model.fused_kernel_options", FUSED_KERNELS),
    VerlKey("actor_rollout_ref.model.use_liger", FUSED_KERNELS, accepts=(False,), note="false: no liger kernels, as here"),
    VerlKey("critic.model.use_liger", FUSED_KERNELS, accepts=(False,), note="false: no liger kernels, as here"),
    *_each(_POLICY_ROLES, "use_torch_compile", feature=TORCH_COMPILE, accepts=(False,),
           note="false: no torch.compile, as here"),
    *_each(_POLICY_ROLES, "entropy_checkpointing", feature=MEMORY_SAVERS, accepts=(False,),
           note="false: entropy is not recomputed in backward, as here"),
    *_each(_POLICY_ROLES, "entropy_from_logits_with_chunking", feature=MEMORY_SAVERS, accepts=(False,),
           note="false: entropy from whole logits, as here"),
    VerlKey("actor_rollout_ref.model.enable_activation_offload", MEMORY_SAVERS, accepts=(False,),
            note="false: activations stay on the device, as here"),
    VerlKey("critic.model.enable_activation_offload", MEMORY_SAVERS, accepts=(False,),
            note="false: activations stay on the device, as here"),
    VerlKey("data.image_key", MULTIMODAL),
    VerlKey("data.video_key", MULTIMODAL),
    VerlKey("data.process_multi_modal_inputs_in_dataset", MULTIMODAL),
    VerlKey("actor_rollout_ref.actor.freeze_vision_tower", MULTIMODAL, accepts=(False,),
            note="false: there is no vision tower here"),
    VerlKey("actor_rollout_ref.model.custom_chat_template", MULTIMODAL),
    VerlKey("actor_rollout_ref.model.lora", MEGATRON_LORA),
    VerlKey("critic.model.lora_rank", LORA_CRITIC, accepts=(0,), note="0 means no LoRA, as here"),
    *[VerlKey(f"critic.model.{key}", LORA_CRITIC) for key in ("lora_alpha", "target_modules", "exclude_modules")],
    VerlKey("actor_rollout_ref.rollout.layered_summon", None,
            note="a memory saver of verl's LoRA weight sync (gather layer by layer); here the merged weights are "
            "gathered whole, with the same result"),
    VerlKey("reward_model.use_reward_loop", REWARD_LOOP, accepts=(False,),
            note="false selects verl's classic reward path, the one HybridFlow has"),
    VerlKey("reward_model.rollout", REWARD_LOOP),
    VerlKey("reward_model.num_workers", None,
            note="reward-loop worker count; rule scoring here runs in the trainer (time-limited by score_timeout_s)"),
    VerlKey("reward_model.enable_resource_pool", REWARD_POOL, accepts=(False,),
            note="false: the reward model shares the actor's devices, as here"),
    VerlKey("reward_model.nnodes", REWARD_POOL, accepts=(0,), note="0: no pool of its own, as here"),
    VerlKey("reward_model.n_gpus_per_node", REWARD_POOL, accepts=(0,), note="0: no pool of its own, as here"),
    VerlKey("reward_model.sandbox_fusion", SANDBOX_REWARD),
    VerlKey("global_profiler", PROFILER),
    *_each((*_ROLES, "actor_rollout_ref.rollout"), "profiler", feature=PROFILER),
    VerlKey("actor_rollout_ref.rollout.over_sample_rate", ROLLOUT_EXTRAS, accepts=(0, 0.0),
            note="0: every request runs to completion, as here"),
    VerlKey("actor_rollout_ref.rollout.multi_stage_wake_up", ROLLOUT_EXTRAS, accepts=(False,),
            note="false: the engine wakes in one stage, as here"),
    VerlKey("actor_rollout_ref.rollout.checkpoint_engine", ROLLOUT_EXTRAS),
    VerlKey("actor_rollout_ref.rollout.skip_tokenizer_init", ROLLOUT_EXTRAS),
    VerlKey("actor_rollout_ref.rollout.data_parallel_size", ROLLOUT_EXTRAS, accepts=(1,),
            note="1: one data-parallel rank per engine, as here"),
    VerlKey("actor_rollout_ref.rollout.expert_parallel_size", ROLLOUT_EXTRAS, accepts=(1,),
            note="1: no expert parallelism, as here"),
    VerlKey("actor_rollout_ref.rollout.sglang_engine_mode", SGLANG_SERVER),
    VerlKey("actor_rollout_ref.rollout.disable_log_stats", None, note="engine statistics logging only"),
    VerlKey("actor_rollout_ref.rollout.prometheus", None,
            note="the engine's own Prometheus server; HybridFlow's metrics are served with trainer.logger=prometheus"),
    VerlKey("actor_rollout_ref.rollout.trace", None,
            note="rollout tracing to mlflow/weave (logging only); HybridFlow does not trace rollouts"),
    VerlKey("actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts", INTERACTIONS),
    VerlKey("actor_rollout_ref.actor.router_replay", ROUTING_REPLAY),
    VerlKey("actor_rollout_ref.rollout.enable_rollout_routing_replay", ROUTING_REPLAY, accepts=(False,),
            note="false: no routing replay, as here"),
    VerlKey("actor_rollout_ref.model.mtp", MTP),
    VerlKey("actor_rollout_ref.actor.calculate_sum_pi_squared", ALGO_EXTRAS, accepts=(False,),
            note="false: the statistic is not computed, as here"),
    VerlKey("actor_rollout_ref.actor.use_prefix_grouper", ALGO_EXTRAS, accepts=(False,),
            note="false: no shared-prefix forward, as here"),
    VerlKey("actor_rollout_ref.actor.tau_pos", ALGO_EXTRAS),
    VerlKey("actor_rollout_ref.actor.tau_neg", ALGO_EXTRAS),
    VerlKey("data.custom_cls", DATA_EXTRAS),
    VerlKey("data.sampler", DATA_EXTRAS),
    VerlKey("data.apply_chat_template_kwargs", DATA_EXTRAS, accepts=({},), note="empty: the template's defaults, as here"),
    VerlKey("data.gen_batch_size", DATA_EXTRAS),
    VerlKey("data.trust_remote_code", DATA_EXTRAS, accepts=(False,), note="false: no remote code, as here"),
    VerlKey("data.filter_overlong_prompts_workers", None,
            note="worker processes for filter_overlong_prompts; prompts are filtered in the driver"),
    VerlKey("trainer.tensorboard_dir", LOGGERS),
    VerlKey("trainer.rl_logging_board_dir", LOGGERS),
    VerlKey("trainer.use_legacy_worker_impl", None, note="verl picks one of its worker implementations; HybridFlow has one"),
    VerlKey("actor_rollout_ref.nccl_timeout", None,
            note="NCCL collective timeout; torch's default applies here (a hang fails after it)"),
    VerlKey("actor_rollout_ref.model.use_shm", None, note="a loading-speed hint (model copied to /dev/shm)"),
    *_each(_POLICY_ROLES, "fsdp_config.forward_prefetch", note=_NO_EFFECT_FSDP1),
    *_each(_POLICY_ROLES, "fsdp_config.use_orig_params", note=_NO_EFFECT_FSDP1),
    VerlKey("critic.model.fsdp_config.forward_prefetch", None, note=_NO_EFFECT_FSDP1),
    VerlKey("critic.model.fsdp_config.use_orig_params", None, note=_NO_EFFECT_FSDP1),
    *_each(_POLICY_ROLES, "fsdp_config.strategy", feature=MEGATRON, accepts=("fsdp", "fsdp2"),
           note="fsdp and fsdp2 both run on the FSDP2 engine here"),
    VerlKey("critic.forward_max_token_len_per_gpu", CRITIC_FORWARD_BUDGET),
    VerlKey("actor_rollout_ref.model.torch_dtype", DTYPE_KEY),
    VerlKey("critic.model.torch_dtype", DTYPE_KEY),
    VerlKey("distillation.enable_resource_pool", DISTILL_POOL, accepts=(False,),
            note="false: the teacher shares the trainer's devices, as here"),
    VerlKey("distillation.teacher_models.*.inference", None,
            note="the teacher's inference-server settings; the teacher here is a frozen FSDP group, sharded and "
            "micro-batched as actor_rollout_ref.ref"),
    VerlKey("distillation.teacher_models.*.num_replicas", None,
            note="served teacher replicas; the teacher here is one FSDP group on the trainer's devices"),
    VerlKey("distillation.distillation_loss.tail_mass_eps", None, note="read by forward_kl_topk_tail only"),
)
"""verl keys without a field here, refused as a feature or accepted without effect."""

_FSDP_GROUPS = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic.model", "reward_model.model")
_PACKING = "verl's sequence packing; padding common to a micro-batch is trimmed instead (same results)"

NO_EFFECT_FIELDS: tuple[VerlKey, ...] = (
    *[VerlKey(f"{group}.use_remove_padding", note=_PACKING)
      for group in ("actor_rollout_ref.model", "critic.model", "reward_model.model")],
    *[VerlKey(f"{group}.fsdp_config.wrap_policy.min_num_params", note="FSDP1 wrapping; FSDP2 shards each decoder layer")
      for group in _FSDP_GROUPS],
    *[VerlKey(f"{group}.fsdp_config.mixed_precision.buffer_dtype", note="FSDP1 buffer dtype; FSDP2 keeps buffers as loaded")
      for group in _FSDP_GROUPS],
    VerlKey("data.dataloader_num_workers", note="batches are read in the driver"),
    VerlKey("reward_model.launch_reward_fn_async", note="scoring runs before log-probs"),
    VerlKey("actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode", note="token ids are never re-tokenised"),
    VerlKey("actor_rollout_ref.rollout.agent.num_workers", note="trajectories run in the driver's event loop"),
    VerlKey("distillation.n_gpus_per_node", note="the size of a separate teacher pool; the teacher shares the "
            "trainer's devices here"),
    VerlKey("distillation.teacher_key", note="routes samples among several teachers; one teacher here"),
    VerlKey("distillation.distillation_loss.topk", note="read by top-k loss modes only"),
)
"""Fields HybridFlow keeps for verl but that change nothing here: noted at start-up when a config sets them."""

VALUES: tuple[VerlValue, ...] = (
    *[VerlValue(f"{role}.strategy", "megatron", MEGATRON) for role in _ROLES],
    VerlValue("actor_rollout_ref.rollout.name", "trtllm", TRTLLM),
    *[VerlValue("reward_model.reward_manager", name, REWARD_MANAGERS) for name in ("prime", "collabllm")],
    *[VerlValue("actor_rollout_ref.actor.policy_loss.loss_mode", name, POLICY_LOSSES)
      for name in ("geo_mean", "sapo", "clip_cov", "kl_cov", "dppo_kl", "dppo_tv", "dro", "bypass_mode")],
    *[VerlValue("algorithm.adv_estimator", name, ESTIMATORS) for name in (
        "optimal_token_baseline", "tir_optimal_token_baseline", "grpo_passk", "gdpo", "grpo_vectorized",
        "rloo_vectorized", "gae_vectorized")],
    VerlValue("trainer.logger.*", "mlflow", LOGGERS),
    *[VerlValue("distillation.distillation_loss.loss_mode", name, DISTILL_TOPK)
      for name in ("forward_kl_topk", "forward_kl_topk_tail", "jsd", "nitrobrew")],
)
"""verl values refused as a feature (only consulted when the schema rejects the value)."""


# ------------------------------------------------------------------------------------ config names


@dataclass(frozen=True)
class ConfigName:
    """A `--config-name` of verl's: refused as a feature, or the keys its YAML sets in verl."""

    name: str
    feature: Feature | None = None
    sets: tuple[str, ...] = ()
    """`key=value` overrides equivalent to that YAML (applied before the command line's)."""
    where: str = "verl/trainer/config"


_MULTITURN_DIR = "examples/sglang_multiturn/config"
_MULTITURN = (
    "data.max_prompt_length=1024", "data.max_response_length=1024", "data.train_batch_size=256",
    "data.return_raw_chat=true", "actor_rollout_ref.rollout.name=sglang",
    # Tool calling runs in server mode (verl's agent loop); verl's own default mode is async.
    "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.multi_turn.enable=true",
)

CONFIG_NAMES: dict[str, ConfigName] = {
    c.name: c
    for c in (
        ConfigName("ppo_trainer"),
        ConfigName("ppo_megatron_trainer", MEGATRON),
        ConfigName("gsm8k_multiturn_megatron_grpo", MEGATRON, where=_MULTITURN_DIR),
        ConfigName("geo3k_multiturn_megatron_grpo", MEGATRON, where=_MULTITURN_DIR),
        ConfigName("deepeyes_multiturn_grpo", MULTIMODAL, where=_MULTITURN_DIR),
        ConfigName("gsm8k_multiturn_grpo", sets=(*_MULTITURN, "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5"),
                   where=_MULTITURN_DIR),
        # verl's *_server variant adds SGLang server timeouts; HybridFlow's router has its own.
        ConfigName("gsm8k_multiturn_grpo_server",
                   sets=(*_MULTITURN, "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5"), where=_MULTITURN_DIR),
        ConfigName("gsm8k_multiturn_grpo_w_interaction",
                   sets=(*_MULTITURN, "actor_rollout_ref.rollout.multi_turn.max_user_turns=5",
                         "actor_rollout_ref.rollout.multi_turn.format=qwen"), where=_MULTITURN_DIR),
        ConfigName("search_multiturn_grpo",
                   sets=(*_MULTITURN, "data.shuffle=false", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
                         "actor_rollout_ref.rollout.multi_turn.format=qwen"), where=_MULTITURN_DIR),
        ConfigName("geo3k_multiturn_grpo",
                   sets=(*[s for s in _MULTITURN if not s.startswith("data.max_")], "data.max_prompt_length=2048",
                         "data.max_response_length=2048"), where=_MULTITURN_DIR),
    )
}
"""verl config names HybridFlow knows; any other `--config-name` must be a YAML file (--config-path)."""


# ------------------------------------------------------------------------------------------ lookups


def matches(pattern: str, loc: tuple[Any, ...]) -> bool:
    """Whether a location (`('a', 'b', 0)`) is the dotted pattern (`a.*`; `*` matches one level, a list index too)."""
    parts = pattern.split(".")
    return len(parts) == len(loc) and all(p in ("*", str(part)) for p, part in zip(parts, loc, strict=True))


def accepted(key: VerlKey, value: Any) -> bool:
    """Whether `value` is one the key accepts without effect (same type and value: true is not 1)."""
    if key.feature is None:
        return True
    return any(type(value) is type(a) and value == a for a in key.accepts) or (
        isinstance(value, float) and any(type(a) is int and value == a for a in key.accepts)
    )


def key_entry(loc: tuple[Any, ...]) -> VerlKey | None:
    """The table entry for a key path, or None."""
    return next((k for k in KEYS if matches(k.pattern, loc)), None)


def key_refusal(loc: tuple[Any, ...], value: Any) -> str | None:
    """The feature message when `loc` is a verl key HybridFlow refuses at this value, else None."""
    entry = key_entry(loc)
    if entry is None or entry.feature is None or accepted(entry, value):
        return None
    return entry.feature.message


def value_refusal(loc: tuple[Any, ...], value: Any) -> str | None:
    """The feature message when `value` is a verl value HybridFlow lacks at `loc`, else None."""
    for entry in VALUES:
        if isinstance(value, str) and value == entry.value and matches(entry.pattern, loc):
            return entry.feature.message
    return None


def all_features() -> list[Feature]:
    """Every feature of the table, once each, in table order."""
    found: dict[str, Feature] = {}
    candidates = [k.feature for k in KEYS] + [v.feature for v in VALUES] + [c.feature for c in CONFIG_NAMES.values()]
    for feature in [*candidates, ROLLOUT_TP_NODES, SERVER_TP, SGLANG_SERVER, INTERACTIONS, TOOL_FORMATS, CUSTOM_SERVER,
                    DISTILL_GKD, MULTI_TEACHER, BYPASS_CORRECTION, REINFORCE_LOSS]:
        if feature is not None:
            found.setdefault(feature.message, feature)
    return list(found.values())


def feature_of(problem: str) -> Feature | None:
    """The feature a problem line refuses (its message appears in the line), or None for any other problem."""
    return next((f for f in all_features() if f.message in problem), None)


def walk(tree: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, Any], str]]:
    """Every (path, parent mapping, key) in a nested mapping, parents before children."""
    if not isinstance(tree, dict):
        return
    for key in list(tree):
        path = (*prefix, str(key))
        yield path, tree, key
        yield from walk(tree.get(key), path)
