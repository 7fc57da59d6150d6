"""Config groups of the worker roles: `actor_rollout_ref`, `critic` and `reward_model`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from .async_training import RolloutCorrectionConfig
from .common import CheckpointConfig, FsdpConfig, OptimConfig, Section
from .names import KlPenalty, LossAggMode, PolicyLoss, RewardManager, RolloutName
from .profiler import RoleProfilerConfig
from .values import Location

Strategy = Literal["fsdp2", "fsdp"]
STRATEGY_DOC = (
    "fsdp2 (torch fully_shard, the default here) or fsdp (verl's default, FSDP1 there); both run on the "
    "FSDP2 engine here, which shards the same way."
)
PROFILER_DOC = "torch.profiler traces of this role's workers in global_profiler.steps (verl's profiler section)."


def _off_or_positive(value: float) -> float:
    """A cap that -1 turns off: -1, or a positive number."""
    if value != -1 and value <= 0:
        raise ValueError(f"must be -1 (off) or a positive cap (got {value}); set e.g. 2.0, or -1 to turn it off")
    return value


OffOrPositive = Annotated[float, AfterValidator(_off_or_positive)]


class FusedKernelOptions(Section):
    """verl's `model.fused_kernel_options`: how the fused log-prob head runs."""

    impl_backend: Literal["torch", "triton"] = Field(
        default="torch",
        description="verl's kernel choice (torch or triton); both run HybridFlow's chunked torch kernel here, with "
        "the same numbers (triton is noted at start-up).",
    )
    chunk_size: int | None = Field(
        default=None,
        gt=0,
        description="HybridFlow: tokens per chunk of the fused head (each chunk's logits live briefly); null: what "
        "fits 16 MiB of fp32 logits (16 to 4096 tokens).",
    )


_LIGER_DOC = (
    "Patch the model with liger-kernel's Triton kernels (RMSNorm, RoPE, SwiGLU, ...), as verl does. CUDA only, and "
    "the liger-kernel package must be installed in the trainer image: either missing is an error at start-up."
)


_ACTIVATION_OFFLOAD_DOC = (
    "Move the activations autograd saves in the training forward to host memory, and back for backward "
    "(torch.autograd.graph.save_on_cpu, pinned on CUDA): less device memory, the same numbers, some copy time. "
    "Trained models only (the reference has no backward). No effect on CPU, where activations are in host memory "
    "already (said at start-up)."
)


class ModelConfig(Section):
    """The policy model (also the starting point of the reference model)."""

    path: str | None = Field(
        default=None, description="Hugging Face model folder or hub id. Required to run."
    )
    tokenizer_path: str | None = Field(default=None, description="Tokenizer location; null means path.")
    trust_remote_code: bool = Field(default=False, description="Allow the model's own Python code to run.")
    use_remove_padding: bool = Field(
        default=False,
        description="verl's sequence packing; accepted, no effect on results: padding common to a micro-batch "
        "is trimmed instead.",
    )
    enable_gradient_checkpointing: bool = Field(
        default=True, description="Recompute activations in backward to save memory."
    )
    enable_activation_offload: bool = Field(default=False, description=_ACTIVATION_OFFLOAD_DOC)
    override_config: dict[str, Any] = Field(
        default_factory=dict, description="Keys overriding the model's Hugging Face config."
    )
    external_lib: str | None = Field(
        default=None, description="Module to import before loading (registers custom model classes)."
    )
    lora_rank: int = Field(
        default=0,
        ge=0,
        description="LoRA rank (peft); > 0 trains low-rank adapters on target_modules instead of all weights: the "
        "reference policy is the base model with the adapter off (no second copy), the rollout gets merged weights, "
        "checkpoints hold the adapter and its optimizer state. 0: full fine-tuning.",
    )
    lora_alpha: float = Field(
        default=16, gt=0, description="LoRA alpha: the adapter's update is scaled by lora_alpha / lora_rank."
    )
    target_modules: str | list[str] = Field(
        default="all-linear",
        description="Layers that get adapters: all-linear (every Linear but the output head), a list of module "
        "names such as [q_proj,v_proj], or a regex (peft's target_modules). Linear layers only.",
    )
    exclude_modules: str | list[str] | None = Field(
        default=None, description="Layers to leave without adapters: a list of names or a regex (peft's exclude_modules)."
    )
    lora_adapter_path: Location | None = Field(
        default=None,
        description="Start from this peft adapter folder (a path or URI; e.g. a checkpoint's actor/lora_adapter or an "
        "export's lora_adapter) instead of a fresh adapter; its own rank, alpha and target modules apply. The "
        "reference policy stays the base model (model.path) without it.",
    )
    use_fused_kernels: bool = Field(
        default=False,
        description="Log-probs and entropies of the actor and reference from hidden states through a fused LM head "
        "+ log-softmax, a chunk of tokens at a time: the response's full-vocabulary logits are never built (in "
        "backward either). Same numbers as the plain path; needs a plain Linear output head.",
    )
    fused_kernel_options: FusedKernelOptions = Field(
        default_factory=FusedKernelOptions, description="Options of the fused log-prob head."
    )
    use_liger: bool = Field(default=False, description=_LIGER_DOC)


class PolicyLossConfig(Section):
    """Which policy-gradient loss the actor minimises."""

    loss_mode: PolicyLoss = Field(
        default="vanilla",
        description="vanilla: PPO clip with dual clip; gspo, gpg, cispo, sapo, geo_mean (GMPO), clip_cov, kl_cov, "
        "up, dppo_tv, dppo_kl, dro: their papers' losses as verl computes them; bypass_mode: verl's bypass-mode loss "
        "(chosen for you when algorithm.rollout_correction.bypass_mode=true asks for rollout_is, rollout_rs or "
        "loss_type=reinforce).",
    )
    clip_cov_ratio: float = Field(default=0.0002, gt=0, description="clip_cov: share of tokens cut from the gradient.")
    clip_cov_lb: float = Field(default=1.0, description="clip_cov: lower bound of the covariance of a cut token.")
    clip_cov_ub: float = Field(default=5.0, description="clip_cov: upper bound of the covariance of a cut token.")
    kl_cov_ratio: float = Field(
        default=0.0002, gt=0, description="kl_cov: share of tokens (largest covariance) given the |log ratio| penalty."
    )
    ppo_kl_coef: float = Field(default=0.1, ge=0, description="kl_cov: weight of the |log ratio| penalty.")
    dro_beta: float | None = Field(
        default=None, gt=0, description="dro: weight beta of the quadratic penalty beta/2 (log pi - log pi_old)^2; "
        "required with loss_mode=dro."
    )
    rollout_correction: RolloutCorrectionConfig | None = Field(
        default=None,
        description="Filled from algorithm.rollout_correction when loss_mode=bypass_mode (as verl does); leave it "
        "unset and configure algorithm.rollout_correction.",
    )


SP_DOC = (
    "Ulysses sequence parallelism: ranks that split each sequence's positions (attention heads exchanged "
    "all-to-all); the data-parallel size is then world size // this. Heads and KV heads must divide by it."
)


class ActorConfig(Section):
    """PPO actor: batch sizes, clipping, KL loss, optimizer, sharding."""

    strategy: Strategy = Field(default="fsdp2", description=STRATEGY_DOC)
    ppo_mini_batch_size: int = Field(
        default=256, gt=0, description="Prompts per optimizer step (times rollout.n responses)."
    )
    ppo_micro_batch_size_per_gpu: int | None = Field(
        default=None, gt=0, description="Responses per forward/backward on one rank; null: the whole share."
    )
    use_dynamic_bsz: bool = Field(default=False, description="Pack micro-batches by token count instead.")
    ppo_max_token_len_per_gpu: int = Field(
        default=16384, gt=0, description="Token budget per micro-batch with use_dynamic_bsz."
    )
    ulysses_sequence_parallel_size: int = Field(default=1, ge=1, description=SP_DOC)
    grad_clip: float = Field(default=1.0, gt=0, description="Clip the global gradient norm to this.")
    freeze_vision_tower: bool = Field(
        default=False,
        description="A vision-language model's vision encoder keeps its weights (no gradient, no optimizer state); "
        "the projector into the decoder and the decoder train. Refused for a text-only model.",
    )
    clip_ratio: float = Field(
        default=0.2, gt=0, description="PPO clip epsilon (both sides unless set apart)."
    )
    clip_ratio_low: float | None = Field(
        default=None, gt=0, description="Lower clip epsilon; null means clip_ratio."
    )
    clip_ratio_high: float | None = Field(
        default=None, gt=0, description="Upper clip epsilon (DAPO clip-higher); null means clip_ratio."
    )
    clip_ratio_c: float = Field(
        default=3.0, gt=1, description="Dual-clip bound for negative advantages, > 1 (arXiv:1912.09729)."
    )
    loss_agg_mode: LossAggMode = Field(default="token-mean", description="Reduction of the per-token loss.")
    tis_imp_ratio_cap: OffOrPositive = Field(
        default=-1.0,
        description="Truncated importance sampling: cap on the rollout-vs-trainer probability ratio per token; "
        "-1 turns it off.",
    )
    entropy_coeff: float = Field(default=0.0, ge=0, description="Entropy bonus coefficient.")
    tau_pos: float = Field(default=1.0, gt=0, description="sapo: gate temperature for tokens with a positive advantage.")
    tau_neg: float = Field(
        default=1.05, gt=0, description="sapo: gate temperature for the other tokens (above tau_pos: asymmetric)."
    )
    calculate_sum_pi_squared: bool = Field(
        default=False,
        description="Also compute sum over the vocabulary of pi^2 per response token in the old-log-prob pass "
        "(batch key sum_pi_squared); needed by the optimal_token_baseline estimators.",
    )
    use_kl_loss: bool = Field(default=False, description="Add a KL-to-reference loss term (GRPO style).")
    kl_loss_coef: float = Field(default=0.001, ge=0, description="Weight of the KL loss.")
    kl_loss_type: KlPenalty = Field(default="low_var_kl", description="KL estimator of the KL loss.")
    ppo_epochs: int = Field(default=1, gt=0, description="Passes over each batch.")
    shuffle: bool = Field(default=False, description="Shuffle the batch between PPO epochs.")
    use_torch_compile: bool = Field(
        default=False,
        description="torch.compile the per-chunk log-prob and entropy formulas (verl compiles its entropy function); "
        "if compilation fails, a warning says why and they run uncompiled. Same results. verl's default is true; "
        "HybridFlow's is false: compiling costs tens of seconds per process, which small and CPU runs do not win back.",
    )
    entropy_from_logits_with_chunking: bool = Field(
        default=False,
        description="verl's chunked entropy; accepted, no effect: entropy is always computed from the logits in "
        "chunks here (~64 MiB of fp32 each), so true and false give the same numbers and memory.",
    )
    entropy_checkpointing: bool = Field(
        default=False,
        description="Recompute the entropy's softmax in backward instead of keeping it (saves rows x response x "
        "vocabulary fp32 per micro-batch when entropy_coeff != 0); same values and gradients, one more softmax.",
    )
    policy_loss: PolicyLossConfig = Field(default_factory=PolicyLossConfig, description="Policy loss choice.")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="Optimizer and schedule.")
    fsdp_config: FsdpConfig = Field(default_factory=FsdpConfig, description="Sharding and offload.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoint contents.")
    profiler: RoleProfilerConfig = Field(default_factory=RoleProfilerConfig, description=PROFILER_DOC)


class RefConfig(Section):
    """Reference policy: a frozen copy of the initial actor for the KL term."""

    strategy: Strategy | None = Field(default=None, description="Sharding; null means the actor's.")
    log_prob_micro_batch_size_per_gpu: int | None = Field(
        default=None, gt=0, description="Responses per forward on one rank; null: the whole share."
    )
    log_prob_use_dynamic_bsz: bool | None = Field(
        default=None, description="Pack by token count; null means actor.use_dynamic_bsz."
    )
    log_prob_max_token_len_per_gpu: int | None = Field(
        default=None,
        gt=0,
        description="Token budget per micro-batch; null means actor.ppo_max_token_len_per_gpu.",
    )
    ulysses_sequence_parallel_size: int | None = Field(
        default=None, ge=1, description="Ulysses sequence parallelism of the reference; null means the actor's."
    )
    use_torch_compile: bool | None = Field(
        default=None, description="torch.compile the reference's log-prob formula (see actor); null: the actor's."
    )
    entropy_from_logits_with_chunking: bool = Field(
        default=False, description="Accepted for verl, no effect: the reference computes no entropy."
    )
    entropy_checkpointing: bool = Field(
        default=False, description="Accepted for verl, no effect: the reference computes no entropy and no backward."
    )
    fsdp_config: FsdpConfig = Field(default_factory=FsdpConfig, description="Sharding and offload.")
    profiler: RoleProfilerConfig = Field(default_factory=RoleProfilerConfig, description=PROFILER_DOC)


class SamplingConfig(Section):
    """Sampling parameters for validation generations."""

    top_k: int = Field(default=-1, ge=-1, description="Top-k; -1 (or 0) disables it.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass.")
    temperature: float = Field(default=0.0, ge=0, description="Temperature; 0 is greedy.")
    n: int = Field(default=1, gt=0, description="Responses per prompt.")
    do_sample: bool = Field(default=False, description="Sample (true) or decode greedily (false).")


def _check_over_sample_rate(value: float) -> float:
    """over_sample_rate is a share of the batch left to cut: 0 <= rate < 1 (1 would cut every trajectory)."""
    if not 0 <= value < 1:
        raise ValueError(
            f"{value:g} is not in [0, 1): it is the share of a batch's trajectories cut once the others are complete "
            "(0.1 cuts the slowest 10%); use 0 to let every trajectory finish"
        )
    return value


class RolloutConfig(Section):
    """Generation engine and sampling for training rollouts."""

    name: RolloutName = Field(default="vllm", description="Engine: vllm, sglang, or hf (plain generate).")
    mode: Literal["sync", "async"] = Field(
        default="sync",
        description="sync: batch generate inside the actor's processes. async (verl's server mode): rollout "
        "replicas serve requests (vLLM AsyncLLM) and agent loops (single-turn, or multi-turn with tools) drive "
        "them through a router. sync stays the default until bench.rollout_server shows async as fast here.",
    )
    replicas: int | None = Field(
        default=None,
        gt=0,
        description="HybridFlow: rollout server replicas in async mode; null: one per tensor_model_parallel_size "
        "GPUs of the actor's (world size / TP, as verl sizes them), one on CPU (an engine uses every core).",
    )
    n: int = Field(default=1, gt=0, description="Responses sampled per prompt (> 1 for group estimators).")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")
    top_k: int = Field(default=-1, ge=-1, description="Top-k; -1 (or 0) disables it.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass.")
    prompt_length: int | None = Field(default=None, gt=0, description="Null means data.max_prompt_length.")
    response_length: int | None = Field(
        default=None, gt=0, description="Null means data.max_response_length."
    )
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = Field(
        default="bfloat16", description="Engine weight dtype; keep it equal to the actor's compute dtype."
    )
    gpu_memory_utilization: float = Field(
        default=0.5, gt=0, le=1, description="Share of device memory for the engine (of RAM on vLLM-CPU)."
    )
    ignore_eos: bool = Field(default=False, description="Keep generating past end-of-sequence.")
    enforce_eager: bool = Field(
        default=False, description="Disable CUDA graphs (faster start, slower decode)."
    )
    free_cache_engine: bool = Field(default=True, description="Free the KV cache between rollouts.")
    tensor_model_parallel_size: int = Field(
        default=1, gt=0, description="Devices per engine replica; must divide n_gpus_per_node."
    )
    max_num_batched_tokens: int = Field(default=8192, gt=0, description="Engine token budget per step.")
    max_model_len: int | None = Field(default=None, gt=0, description="Engine context limit; null: derived.")
    max_num_seqs: int = Field(default=1024, gt=0, description="Engine concurrent sequences.")
    enable_chunked_prefill: bool = Field(default=True, description="Split long prefills into chunks.")
    enable_prefix_caching: bool = Field(default=True, description="Reuse KV blocks of shared prefixes.")
    load_format: str = Field(
        default="dummy",
        description="How the engine loads weights; dummy: random, the actor pushes real ones.",
    )
    log_prob_micro_batch_size_per_gpu: int | None = Field(
        default=None, gt=0, description="Responses per forward when recomputing old log-probs."
    )
    log_prob_use_dynamic_bsz: bool | None = Field(
        default=None, description="Pack by token count; null means actor.use_dynamic_bsz."
    )
    log_prob_max_token_len_per_gpu: int | None = Field(
        default=None,
        gt=0,
        description="Token budget per micro-batch; null means actor.ppo_max_token_len_per_gpu.",
    )
    do_sample: bool = Field(default=True, description="Sample (true) or decode greedily (false).")
    calculate_log_probs: bool | None = Field(
        default=None,
        description="Return the engine's log-probs with the samples. null: true when something reads them "
        "(async training, algorithm.rollout_correction), else false.",
    )
    engine_kwargs: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Extra engine arguments by engine name, e.g. {vllm: {swap_space: 4}}.",
    )
    over_sample_rate: Annotated[float, AfterValidator(_check_over_sample_rate)] = Field(
        default=0.0,
        description="verl's early termination of a training batch's rollout (server mode): once (1 - over_sample_rate) "
        "x the batch's trajectories are complete, the rest are cut (their engine requests aborted); a cut trajectory "
        "keeps the tokens it had, is counted in agent/aborted and agent/over_sample_cut/mean, has response_mask 0 "
        "everywhere and no reward, and is left out of its group's advantage baseline, of the per-sequence metrics "
        "(critic/score, response_length, ...) and of DAPO's filter_groups decision. In [0, 1); 0: every trajectory "
        "runs to completion. Validation batches are never cut.",
    )
    val_kwargs: SamplingConfig = Field(default_factory=SamplingConfig, description="Validation sampling.")
    profiler: RoleProfilerConfig = Field(default_factory=RoleProfilerConfig, description=PROFILER_DOC)
    multi_turn: MultiTurnConfig = Field(
        default_factory=lambda: MultiTurnConfig(), description="Multi-turn tool calling (async mode)."
    )
    agent: AgentLoopConfig = Field(
        default_factory=lambda: AgentLoopConfig(), description="Agent loops driving the rollout servers (async mode)."
    )


class MultiTurnConfig(Section):
    """verl's `rollout.multi_turn`: tool calling and interactions in the agent loop (async mode)."""

    enable: bool = Field(
        default=False,
        description="Samples without an agent_name use the tool agent loop (true) or the single-turn one (false).",
    )
    max_assistant_turns: int | None = Field(default=None, gt=0, description="Model turns per trajectory; null: no limit.")
    max_user_turns: int | None = Field(
        default=None, gt=0, description="Tool/user turns per trajectory; null: no limit."
    )
    max_parallel_calls: int = Field(default=1, gt=0, description="Tool calls executed per model turn (the rest dropped).")
    max_tool_response_length: int = Field(default=256, gt=0, description="Characters of a tool's output kept.")
    tool_response_truncate_side: Literal["left", "middle", "right"] = Field(
        default="middle", description="Which part of a long tool output is cut away: left keeps the start."
    )
    tool_config_path: str | None = Field(default=None, description="verl tool-config YAML (tools: class_name, config, tool_schema).")
    interaction_config_path: str | None = Field(
        default=None,
        description="verl interaction config YAML (interaction: name, class_name, config): simulated user turns "
        "after model turns without tool calls, chosen per sample by extra_info.interaction_kwargs.name.",
    )
    use_inference_chat_template: bool = Field(
        default=False,
        description="Must stay false: the trajectory keeps the exact token ids the engine produced.",
    )
    tokenization_sanity_check_mode: Literal["disable", "strict", "ignore_strippable"] = Field(
        default="strict",
        description="Accepted for verl compatibility; token ids are never re-tokenised here, so there is nothing to check.",
    )
    format: str = Field(
        default="hermes",
        description="Tool-call format of the model's turns (verl's tool parsers): hermes (<tool_call>{json}</tool_call>, "
        "as Qwen's chat templates write; verl configs' qwen is read as it, with a note) or gpt-oss (Harmony: a "
        "commentary-channel message to=functions.NAME with JSON arguments; its turns are decoded with special tokens).",
    )
    max_tokens_per_turn: int | None = Field(
        default=None, gt=0, description="HybridFlow: new tokens per model turn; null: what is left of response_length."
    )


class AgentLoopConfig(Section):
    """verl's `rollout.agent`: how many agent-loop workers and where custom loops come from."""

    num_workers: int = Field(default=8, gt=0, description="Accepted for verl; trajectories run concurrently in the driver's event loop, bounded by max_concurrency.")
    max_concurrency: int = Field(default=256, gt=0, description="HybridFlow: trajectories in flight at once.")
    openai_host: str = Field(default="127.0.0.1", min_length=1, description="HybridFlow: the address the OpenAI-compatible endpoint (for OpenAIAgentLoop agents) listens on; on a cluster the pod's IP, so agents in other pods can reach it.")
    openai_port: int = Field(default=0, ge=0, le=65535, description="HybridFlow: its port (0: any free port; the loop hands each agent its session's URL).")
    agent_loop_config_path: str | None = Field(
        default=None, description="YAML list of {name, _target_: module.Class, ...kwargs} registering custom agent loops."
    )
    default_agent_loop: str | None = Field(
        default=None,
        description="Loop for samples without agent_name; null: tool_agent with multi_turn.enable, else single_turn_agent.",
    )
    custom_async_server: dict[str, Any] = Field(
        default_factory=dict, description="verl's custom server class; not supported here (refused when path is set)."
    )


# RolloutConfig names these two before they exist: resolve its fields now, so that model_fields (read by the
# error messages' "valid keys here" and the docs) holds the classes, not ForwardRef strings.
RolloutConfig.model_rebuild(force=True)


class ActorRolloutRefConfig(Section):
    """The policy model and the three roles built from it: actor, rollout, reference."""

    hybrid_engine: bool = Field(
        default=True,
        description="Actor and rollout share one worker (verl's hybrid engine); must stay true, as in verl: "
        "separate rollout workers are trainer.placement=split.",
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy model.")
    actor: ActorConfig = Field(default_factory=ActorConfig, description="PPO actor.")
    ref: RefConfig = Field(default_factory=RefConfig, description="Reference policy.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Generation.")


class CriticModelConfig(Section):
    """The value model."""

    path: str | None = Field(default=None, description="Model to start the critic from; null: the policy's.")
    tokenizer_path: str | None = Field(
        default=None, description="Tokenizer; null means the policy model's path."
    )
    trust_remote_code: bool = Field(default=False, description="Allow the model's own Python code to run.")
    use_remove_padding: bool = Field(
        default=False,
        description="verl's sequence packing; accepted, no effect on results: padding common to a micro-batch "
        "is trimmed instead.",
    )
    enable_gradient_checkpointing: bool = Field(
        default=True, description="Recompute activations in backward."
    )
    enable_activation_offload: bool = Field(default=False, description=_ACTIVATION_OFFLOAD_DOC)
    override_config: dict[str, Any] = Field(
        default_factory=dict, description="Hugging Face config overrides."
    )
    external_lib: str | None = Field(default=None, description="Module to import before loading.")
    fsdp_config: FsdpConfig = Field(
        default_factory=FsdpConfig, description="Sharding and offload (verl's place)."
    )
    use_liger: bool = Field(default=False, description=_LIGER_DOC)


class CriticConfig(Section):
    """PPO value function (needed by GAE)."""

    enable: bool | None = Field(
        default=None, description="Train a critic; null means: only when algorithm.adv_estimator is gae."
    )
    strategy: Strategy = Field(default="fsdp2", description=STRATEGY_DOC)
    model: CriticModelConfig = Field(default_factory=CriticModelConfig, description="The value model.")
    optim: OptimConfig = Field(
        default_factory=lambda: OptimConfig(lr=1e-5),
        description="Optimizer and schedule (lr 1e-5 by default).",
    )
    ppo_mini_batch_size: int | None = Field(
        default=None, gt=0, description="Prompts per optimizer step; null means the actor's."
    )
    ppo_micro_batch_size_per_gpu: int | None = Field(
        default=None, gt=0, description="Responses per forward/backward on one rank; null: the whole share."
    )
    use_dynamic_bsz: bool | None = Field(default=None, description="Pack by token count; null: the actor's.")
    ppo_max_token_len_per_gpu: int = Field(default=32768, gt=0, description="Token budget per micro-batch.")
    forward_max_token_len_per_gpu: int | None = Field(
        default=None,
        gt=0,
        description="Token budget per micro-batch of the value forward (compute_values, no backward) with "
        "use_dynamic_bsz; null means ppo_max_token_len_per_gpu.",
    )
    ulysses_sequence_parallel_size: int = Field(default=1, ge=1, description=SP_DOC)
    ppo_epochs: int | None = Field(
        default=None, gt=0, description="Passes over each batch; null: the actor's."
    )
    shuffle: bool | None = Field(default=None, description="Shuffle between epochs; null: the actor's.")
    grad_clip: float = Field(default=1.0, gt=0, description="Clip the global gradient norm to this.")
    cliprange_value: float = Field(
        default=0.5, gt=0, description="Clip of the value update around old values."
    )
    loss_agg_mode: LossAggMode | None = Field(default=None, description="Loss reduction; null: the actor's.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoint contents.")
    profiler: RoleProfilerConfig = Field(default_factory=RoleProfilerConfig, description=PROFILER_DOC)


class RewardModelModelConfig(Section):
    """The reward model itself."""

    path: str | None = Field(
        default=None,
        description="Reward model folder or hub id: a sequence- or token-classification checkpoint with one "
        "label (its 'score' head). Required when reward_model.enable is true.",
    )
    input_tokenizer: str | None = Field(
        default=None,
        description="The policy's tokenizer: responses are decoded with it and re-rendered with the reward "
        "model's chat template (needs data.return_raw_chat=true); null: the reward model reads the policy's "
        "token ids as they are (same tokenizer).",
    )
    trust_remote_code: bool = Field(default=False, description="Allow the model's own Python code to run.")
    use_remove_padding: bool = Field(
        default=False,
        description="verl's sequence packing; accepted, no effect on results: padding common to a micro-batch "
        "is trimmed instead.",
    )
    external_lib: str | None = Field(default=None, description="Module to import before loading.")
    fsdp_config: FsdpConfig = Field(default_factory=FsdpConfig, description="Sharding and offload.")


class OverlongBuffer(Section):
    """DAPO soft overlong punishment (arXiv:2503.14476, section 3.4)."""

    enable: bool = Field(default=False, description="Penalise responses that run into the last len tokens.")
    len: int = Field(default=0, ge=0, description="Buffer length in tokens before max_response_length.")
    penalty_factor: float = Field(default=1.0, ge=0, description="Penalty at the very end of the buffer (DAPO recipe default 1.0).")
    log: bool = Field(default=False, description="Log the penalty as a metric.")


class SandboxFusionConfig(Section):
    """Where the test cases of code problems run (the codecontests, apps, codeforces, taco data sources)."""

    url: str | None = Field(
        default=None,
        description="A SandboxFusion run_code endpoint (e.g. http://sandbox:8080/run_code; "
        "`python -m hybridflow.tools.sandbox_server` serves one); null: the local sandbox, in the scoring processes.",
    )
    max_concurrent: int = Field(
        default=64,
        gt=0,
        description="Sandbox runs at once: the scoring processes (up to 4, one per CPU) are "
        "capped at this.",
    )
    memory_limit_mb: int = Field(default=1024, gt=0, description="Memory limit of each test-case run, in MiB.")


class RewardModelConfig(Section):
    """Scoring: a reward model, or rule-based scorers through a reward manager."""

    enable: bool = Field(
        default=False,
        description="Score responses with a reward model (reward_model.model.path) instead of rules or a "
        "function: its output at each response's last token is the reward.",
    )
    strategy: Strategy = Field(default="fsdp2", description=STRATEGY_DOC)
    model: RewardModelModelConfig = Field(
        default_factory=RewardModelModelConfig, description="The reward model."
    )
    micro_batch_size_per_gpu: int | None = Field(
        default=None, gt=0, description="Responses per reward-model forward per rank; null: the whole share."
    )
    max_length: int | None = Field(
        default=None,
        gt=0,
        description="With input_tokenizer: longest re-rendered input, longer ones lose their end (as in verl); "
        "null: prompt + response length.",
    )
    use_dynamic_bsz: bool = Field(default=False, description="Pack reward-model micro-batches by token count.")
    forward_max_token_len_per_gpu: int | None = Field(
        default=None,
        gt=0,
        description="Token budget per micro-batch with use_dynamic_bsz; null: critic.ppo_max_token_len_per_gpu.",
    )
    reward_manager: RewardManager = Field(default="naive", description="How scores are computed and batched.")
    profiler: RoleProfilerConfig = Field(default_factory=RoleProfilerConfig, description=PROFILER_DOC)
    score_timeout_s: float | None = Field(
        default=5.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds one response's rule or custom scoring may take (a batch manager's one call: this "
        "times the batch size); an overrun or an exception scores 0 and counts in reward/timeouts or "
        "reward/errors; null: no limit, scorers run in the trainer process.",
    )
    launch_reward_fn_async: bool = Field(
        default=False, description="Accepted for verl compatibility, no effect: scoring runs before log-probs."
    )
    overlong_buffer: OverlongBuffer = Field(
        default_factory=OverlongBuffer, description="DAPO overlong shaping."
    )
    reward_kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra reward-manager arguments.")
    sandbox_fusion: SandboxFusionConfig = Field(
        default_factory=SandboxFusionConfig,
        description="The code sandbox of the built-in code scorers (verl's reward_model.sandbox_fusion); time them "
        "with score_timeout_s, which covers all of a response's test cases.",
    )
    enable_resource_pool: bool = Field(
        default=False,
        description="Give the reward model devices of its own (nnodes x n_gpus_per_node), apart from the trainer's; "
        "false: it shares the actor's. A generative reward model needs its own pool.",
    )
    nnodes: int = Field(default=0, ge=0, description="Nodes of the reward model's own pool (enable_resource_pool).")
    n_gpus_per_node: int = Field(
        default=0, ge=0, description="Devices per node of the reward model's own pool (enable_resource_pool; on CPU: "
        "worker slots)."
    )
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig,
        description="How a generative reward model (a causal LM at reward_model.model.path, verl's GenRM) is served: "
        "engine (name), tensor_model_parallel_size, gpu_memory_utilization, lengths, ... of its server replicas, "
        "whose address custom_reward_function receives as reward_router_address. A classifier reward model is a "
        "forward pass on its FSDP worker and reads none of it (said at start-up).",
    )
