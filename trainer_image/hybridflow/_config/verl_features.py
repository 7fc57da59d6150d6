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

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .names import TOOL_CALL_FORMATS


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
    accepts_keys: tuple[str, ...] = ()
    """A mapping value is accepted when it is not empty and every key of it is one of these."""


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
    "ulysses", "Ulysses sequence parallelism for the reward model (size > 1)",
    "remove the key or set it to 1 (actor, ref and critic have ulysses_sequence_parallel_size; the reward model "
    "scores with micro_batch_size_per_gpu or use_dynamic_bsz)",
    later=True,
)
MULTIMODAL = Feature(
    "multimodal", "this multimodal feature (video input, verl's multimodal extras)",
    "image prompts run with data.image_key (docs/multimodal.md): remove this key", later=True,
)
MULTIMODAL_AGENTS = Feature(
    "multimodal_agents", "image prompts in multi-turn agent loops (tools, interactions)",
    "image prompts run in sync rollout or the single-turn agent loop here: set "
    "actor_rollout_ref.rollout.multi_turn.enable=false", later=True,
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
REWARD_MANAGERS = Feature(
    "reward_manager", "this verl reward manager", "use reward_model.reward_manager=naive, dapo, batch or prime",
    later=True,
)
PROFILER = Feature(
    "profiler", "verl's npu profiler (Ascend NPUs)",
    "HybridFlow runs on NVIDIA GPUs and CPUs: use global_profiler.tool=nsys, torch_memory or torch",
)
PROFILER_WINDOW = Feature(
    "profiler", "a mini-batch window of the torch profiler (tool_config.torch.step_start / step_end)",
    "remove it: the whole worker call is traced (choose steps with global_profiler.steps)",
)
TRTLLM = Feature("trtllm", "the TensorRT-LLM rollout engine", "use actor_rollout_ref.rollout.name=vllm (or sglang, hf)")
ROLLOUT_EXTRAS = Feature(
    "rollout_extras", "this verl rollout-engine option",
    "remove it; engine arguments go in rollout.engine_kwargs.<engine>",
)
ROLLOUT_TP_NODES = Feature(
    "rollout_tp_nodes", "a server replica (rollout.mode=async) spanning nodes",
    "use a tensor_model_parallel_size that divides trainer.n_gpus_per_node, or sync mode with vllm, whose engine "
    "may span whole nodes", later=True,
)
REPEAT_ROLLOUTS = Feature(
    "num_repeat_rollouts", "verl's multi_turn.num_repeat_rollouts (repeating each interaction rollout)",
    "remove it; actor_rollout_ref.rollout.n samples each prompt n times",
)
TOOL_FORMATS = Feature(
    "tool_format", "this multi-turn tool-call format",
    f"set actor_rollout_ref.rollout.multi_turn.format to one of {', '.join(TOOL_CALL_FORMATS)} (hermes: "
    "<tool_call>{json}</tool_call>, as Qwen2.5's and Qwen3's chat templates write; gpt-oss: Harmony; qwen3_coder: the "
    "XML calls of Qwen3-Coder and Qwen3.5), or qwen, read as hermes",
)
CUSTOM_SERVER = Feature(
    "custom_server", "a custom async rollout server class", "remove it: the built-in vLLM AsyncLLM or SGLang replicas serve every agent loop",
)
ROUTING_REPLAY = Feature("routing_replay", "MoE routing replay", "remove it: experts are routed afresh in each forward")
MTP = Feature("mtp", "multi-token prediction (model.mtp)", "remove model.mtp.*")
ALGO_EXTRAS = Feature(
    "algorithm_extras", "verl's shared-prefix forward (PrefixGrouper) with this value",
    "set use_prefix_grouper to true or false (both train the same here: each response's forward includes its "
    "prompt) or remove it", later=True,
)
DATA_EXTRAS = Feature(
    "data_extras", "this verl data option",
    "remove it: prompts come from data.prompt_key of verl-layout parquet, shuffled by data.shuffle and data.seed",
    later=True,
)
LOGGERS = Feature(
    "logger", "this verl logger or log folder",
    "use trainer.logger console, file, tensorboard ($TENSORBOARD_DIR sets its folder), wandb, mlflow or prometheus",
    later=True,
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
    VerlKey("reward_model.ulysses_sequence_parallel_size", ULYSSES, accepts=(1,),
            note="1 means no sequence parallelism, as here"),
    VerlKey("data.video_key", MULTIMODAL),
    VerlKey("data.process_multi_modal_inputs_in_dataset", MULTIMODAL),
    VerlKey("actor_rollout_ref.model.custom_chat_template", MULTIMODAL),
    VerlKey("actor_rollout_ref.model.lora", MEGATRON_LORA),
    VerlKey("critic.model.lora_rank", LORA_CRITIC, accepts=(0,), note="0 means no LoRA, as here"),
    *[VerlKey(f"critic.model.{key}", LORA_CRITIC) for key in ("lora_alpha", "target_modules", "exclude_modules")],
    VerlKey("actor_rollout_ref.rollout.layered_summon", None,
            note="a memory saver of verl's LoRA weight sync (gather layer by layer); here the merged weights are "
            "gathered whole, with the same result"),
    VerlKey("reward_model.use_reward_loop", None,
            note="verl's reward loop (true) and classic path (false) give the same scores: rules or "
            "custom_reward_function through reward_model.reward_manager, the classifier reward model "
            "(reward_model.enable) on its FSDP worker, or a generative one served on replicas for the custom function"),
    VerlKey("reward_model.num_workers", None,
            note="reward-loop worker count; rule scoring here runs in the trainer (time-limited by score_timeout_s)"),
    *_each((*_ROLES, "actor_rollout_ref.rollout"), "profiler.tool_config.torch.step_start", feature=PROFILER_WINDOW,
           accepts=(0, -1), note="the whole update is traced, as here"),
    *_each((*_ROLES, "actor_rollout_ref.rollout"), "profiler.tool_config.torch.step_end", feature=PROFILER_WINDOW,
           accepts=(None, -1), note="the whole update is traced, as here"),
    *_each((*_ROLES, "actor_rollout_ref.rollout"), "profiler.tool_config.torch.manual_save", note="traces are "
           "written when each profiled step (or call, with discrete=true) ends"),
    *_each((*_ROLES, "actor_rollout_ref.rollout"), "profiler.tool_config.*.name", note="the tool's display name"),
    *_each((*_ROLES, "actor_rollout_ref.rollout"), "profiler.tool_config.*._target_", note="a verl dataclass path"),
    *_each((*_ROLES, "actor_rollout_ref.rollout"), "profiler._target_", note="a verl dataclass path"),
    VerlKey("global_profiler._target_", None, note="a verl dataclass path"),
    VerlKey("global_profiler.global_tool_config.*._target_", None, note="a verl dataclass path"),
    VerlKey("global_profiler.global_tool_config.*.name", None, note="the tool's display name"),
    VerlKey("actor_rollout_ref.rollout.multi_stage_wake_up", ROLLOUT_EXTRAS, accepts=(False, True),
            note="a peak-memory option (wake the weights, sync them, then the KV cache): the vLLM engine here always "
            "wakes in those stages (sync mode), SGLang and server replicas resume weights and KV cache together; "
            "the samples are the same either way"),
    VerlKey("actor_rollout_ref.rollout.checkpoint_engine", ROLLOUT_EXTRAS),
    VerlKey("actor_rollout_ref.rollout.skip_tokenizer_init", ROLLOUT_EXTRAS),
    VerlKey("actor_rollout_ref.rollout.data_parallel_size", ROLLOUT_EXTRAS, accepts=(1,),
            note="1: one data-parallel rank per engine, as here"),
    VerlKey("actor_rollout_ref.rollout.expert_parallel_size", ROLLOUT_EXTRAS, accepts=(1,),
            note="1: no expert parallelism, as here"),
    VerlKey("actor_rollout_ref.rollout.sglang_engine_mode", None,
            note="verl itself reads it nowhere; server-mode SGLang replicas here run sglang.Engine in their Ray actors"),
    VerlKey("actor_rollout_ref.rollout.disable_log_stats", None, note="engine statistics logging only"),
    VerlKey("actor_rollout_ref.rollout.prometheus", None,
            note="the engine's own Prometheus server; HybridFlow's metrics are served with trainer.logger=prometheus"),
    VerlKey("actor_rollout_ref.rollout.trace", None,
            note="rollout tracing to mlflow/weave (logging only); HybridFlow does not trace rollouts"),
    VerlKey("actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts", REPEAT_ROLLOUTS),
    VerlKey("actor_rollout_ref.actor.router_replay", ROUTING_REPLAY),
    VerlKey("actor_rollout_ref.rollout.enable_rollout_routing_replay", ROUTING_REPLAY, accepts=(False,),
            note="false: no routing replay, as here"),
    VerlKey("actor_rollout_ref.model.mtp", MTP),
    VerlKey("actor_rollout_ref.actor.use_prefix_grouper", ALGO_EXTRAS, accepts=(False, True),
            note="a compute saver (verl encodes the prompt a group's responses share once, with the same outputs and "
            "gradients, arXiv:2506.05433); here each response's forward includes its prompt: same log-probs and "
            "gradients, more compute for long prompts"),
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
    VerlKey("actor_rollout_ref.actor.entropy_from_logits_with_chunking",
            note="entropy is always computed from logits in chunks here"),
    VerlKey("actor_rollout_ref.ref.entropy_from_logits_with_chunking", note="the reference computes no entropy"),
    VerlKey("actor_rollout_ref.ref.entropy_checkpointing", note="the reference computes no entropy and no backward"),
    VerlKey("actor_rollout_ref.model.fused_kernel_options.impl_backend",
            note="both backends run HybridFlow's chunked torch kernel, with the same numbers"),
    VerlKey("reward_model.launch_reward_fn_async", note="scoring runs before log-probs"),
    VerlKey("actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode", note="token ids are never re-tokenised"),
    VerlKey("actor_rollout_ref.rollout.agent.num_workers", note="trajectories run in the driver's event loop"),
    VerlKey("distillation.n_gpus_per_node", note="the size of a separate teacher pool; the teacher shares the "
            "trainer's devices here"),
    VerlKey("distillation.teacher_key", note="routes samples among several teachers; one teacher here"),
    VerlKey("distillation.distillation_loss.topk", note="read by top-k loss modes only"),
    *[VerlKey(f"{role}.profiler.tool_config.npu", note="settings of verl's npu profiler (Ascend), not built here")
      for role in (*_ROLES, "actor_rollout_ref.rollout")],
    *[VerlKey(f"{role}.profiler.tool_config.torch_memory", note="torch_memory is set up once per run, in "
              "global_profiler.global_tool_config.torch_memory") for role in (*_ROLES, "actor_rollout_ref.rollout")],
    VerlKey("global_profiler.global_tool_config.torch_memory.stack_depth", note="torch records whole stacks"),
    VerlKey("global_profiler.global_tool_config.nsys.controller_nsight_options",
            note="the controller is the driver process here: run it under nsys profile to profile it"),
)
"""Fields HybridFlow keeps for verl but that change nothing here: noted at start-up when a config sets them."""

VALUES: tuple[VerlValue, ...] = (
    *[VerlValue(f"{role}.strategy", "megatron", MEGATRON) for role in _ROLES],
    VerlValue("actor_rollout_ref.rollout.name", "trtllm", TRTLLM),
    VerlValue("reward_model.reward_manager", "collabllm", REWARD_MANAGERS),
    *[VerlValue("trainer.logger.*", name, LOGGERS) for name in ("swanlab", "vemlp_wandb", "clearml", "trackio")],
    *[VerlValue(pattern, "npu", PROFILER) for pattern in ("global_profiler.tool", *[f"{role}.profiler.tool" for role in (*_ROLES, "actor_rollout_ref.rollout")])],
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


@functools.lru_cache(maxsize=1 << 16)
def matches(pattern: str, loc: tuple[Any, ...]) -> bool:
    """Whether a location (`('a', 'b', 0)`) is the dotted pattern (`a.*`; `*` matches one level, a list index too).

    Cached: every config parse asks it for each key of the tree against every table entry (the operator's
    reconciles and its admission webhook parse the trainer config several times per RLJob)."""
    parts = pattern.split(".")
    return len(parts) == len(loc) and all(p in ("*", str(part)) for p, part in zip(parts, loc, strict=True))


def accepted(key: VerlKey, value: Any) -> bool:
    """Whether `value` is one the key accepts without effect (same type and value: true is not 1)."""
    if key.feature is None:
        return True
    if key.accepts_keys and isinstance(value, dict) and value and set(value) <= set(key.accepts_keys):
        return True
    return any(type(value) is type(a) and value == a for a in key.accepts) or (
        isinstance(value, float) and any(type(a) is int and value == a for a in key.accepts)
    )


def key_entry(loc: tuple[Any, ...]) -> VerlKey | None:
    """The table entry for a key path, or None."""
    return _key_entry(tuple(loc))


@functools.lru_cache(maxsize=1 << 14)
def _key_entry(loc: tuple[Any, ...]) -> VerlKey | None:
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
    for feature in [*candidates, ROLLOUT_TP_NODES, TOOL_FORMATS, CUSTOM_SERVER,
                    DISTILL_GKD, MULTI_TEACHER, MULTIMODAL_AGENTS]:
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
