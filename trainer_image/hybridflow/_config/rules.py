"""Cross-field rules: each returns `path: what is wrong; what to do` lines, all checked at once."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from . import data_extras, distillation, export, profiler, verl_features
from .errors import shorten
from .names import GROUP_ESTIMATORS, SERVER_ROLLOUT_NAMES, SUM_PI_SQUARED_ESTIMATORS, TOOL_CALL_FORMATS

if TYPE_CHECKING:
    from .root import HybridFlowConfig

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"


def check(cfg: HybridFlowConfig) -> list[str]:
    """Every cross-field problem of a config (empty when consistent)."""
    problems: list[str] = []
    for rule in (
        _cluster, _batch_sizes, _algorithm, _sampling, _dynamic_bsz, _lengths, _reward_model, _trainer, _agent_rollout,
        _async_training, _rollout_correction, distillation.check, export.check, data_extras.check, profiler.check,
    ):
        problems.extend(rule(cfg))
    return problems


def check_runnable(cfg: HybridFlowConfig) -> list[str]:
    """Problems that matter only for a real run: inputs that have no sensible default."""
    problems: list[str] = []
    if not cfg.actor_rollout_ref.model.path:
        problems.append(
            "actor_rollout_ref.model.path: required to run; set it to a Hugging Face model folder or hub id"
        )
    if not cfg.data.train_files:
        problems.append(
            "data.train_files: required to run; set it to a parquet file or URI (or a list of them)"
        )
    problems += distillation.check_runnable(cfg)
    if cfg.reward_model.enable and not cfg.reward_model.model.path:
        problems.append(
            "reward_model.model.path: required when reward_model.enable is true; set it to a reward model folder or "
            "hub id (a sequence- or token-classification checkpoint with one label), or set reward_model.enable=false "
            "to score with rules or custom_reward_function"
        )
    return problems


#: Trial divisions a divisor hint may spend: the hint is for people, not a factorisation service.
_DIVISOR_SEARCH = 10_000
_DIVISORS_SHOWN = 12


def _divisors(n: int) -> str:
    """Divisors of n for a message: all of them when there are few, else the smallest and largest few.

    Pairs d and n // d are found by trial division up to sqrt(n), stopping after _DIVISOR_SEARCH tries,
    so any n (e.g. n_gpus_per_node: 1000000001, issue 12) answers at once.
    """
    if n < 1:
        return "1"
    root = math.isqrt(n)
    small = [d for d in range(1, min(root, _DIVISOR_SEARCH) + 1) if n % d == 0]
    large = [n // d for d in reversed(small) if d * d != n]
    complete = root <= _DIVISOR_SEARCH
    if complete and len(small) + len(large) <= _DIVISORS_SHOWN:
        return ", ".join(str(d) for d in small + large)
    half = _DIVISORS_SHOWN // 2
    return ", ".join(str(d) for d in small[:half]) + ", ..., " + ", ".join(str(d) for d in large[-half:])


def _cluster(cfg: HybridFlowConfig) -> list[str]:
    """Tensor parallelism and FSDP shard groups fit the nodes and the engine."""
    out = []
    ro = cfg.actor_rollout_ref.rollout
    tp = ro.tensor_model_parallel_size
    per_node = cfg.trainer.n_gpus_per_node
    sync_tp = ro.mode == "sync" and tp > 1
    if sync_tp and cfg.trainer.device == "cpu":
        out.append(
            f"{ROLLOUT}.tensor_model_parallel_size: {tp} in sync mode shards one engine over the trainer's GPU ranks; "
            f"on CPU each worker runs an engine of its own: set {ROLLOUT}.mode=async (a replica of {tp} engine "
            "processes) or tensor_model_parallel_size=1"
        )
    elif sync_tp and ro.name == "sglang":
        out.append(
            f"{ROLLOUT}.tensor_model_parallel_size: {tp} with SGLang in sync mode is not built (each worker would start "
            f"a {tp}-GPU engine of its own); set {ROLLOUT}.mode=async (SGLang replicas span {tp} GPUs) or "
            "tensor_model_parallel_size=1"
        )
    elif sync_tp and ro.name == "vllm" and tp > per_node:
        # one vLLM engine over tp consecutive ranks of the trainer's world (hybridflow.workers.rollout_tp): it may
        # span nodes, whole ones
        world = cfg.trainer.nnodes * per_node
        if tp % per_node or world % tp:
            out.append(
                f"{ROLLOUT}.tensor_model_parallel_size: {tp} GPUs per engine span nodes of {per_node} GPUs, so it must "
                f"be a multiple of trainer.n_gpus_per_node that divides the {world} GPUs (trainer.nnodes x "
                f"n_gpus_per_node); use one of {_divisors(per_node)}, or such a multiple"
            )
    elif tp > per_node:
        out.append(
            f"{ROLLOUT}.tensor_model_parallel_size: {tp} GPUs per engine, more than a node has ({per_node}): "
            f"{verl_features.ROLLOUT_TP_NODES.message}: one of {_divisors(per_node)}"
        )
    elif per_node % tp:
        out.append(
            f"{ROLLOUT}.tensor_model_parallel_size: {tp} does not divide trainer.n_gpus_per_node ({per_node}); "
            f"use one of {_divisors(per_node)}"
        )
    if ro.name == "hf" and tp != 1:
        out.append(f"{ROLLOUT}.tensor_model_parallel_size: the hf rollout does not shard; set it to 1")
    if not cfg.actor_rollout_ref.hybrid_engine:
        out.append(
            "actor_rollout_ref.hybrid_engine: false is not supported (nor by verl); keep it true and use "
            "trainer.placement=split for rollout workers of their own"
        )
    world = cfg.world_size
    fsdp_configs = [
        (f"{ACTOR}.fsdp_config.fsdp_size", cfg.actor_rollout_ref.actor.fsdp_config),
        ("actor_rollout_ref.ref.fsdp_config.fsdp_size", cfg.actor_rollout_ref.ref.fsdp_config),
        ("critic.model.fsdp_config.fsdp_size", cfg.critic.model.fsdp_config),
    ]
    for path, fsdp in fsdp_configs:
        size = fsdp.fsdp_size
        if 0 < size < world and world % size:
            out.append(
                f"{path}: {size} does not divide the {world} ranks (trainer.nnodes x trainer.n_gpus_per_node); "
                f"use one of {_divisors(world)} (the GPUs per node shards within a node) or -1"
            )
    return out + _sequence_parallel(cfg)


def _sequence_parallel(cfg: HybridFlowConfig) -> list[str]:
    """Ulysses sizes divide the ranks (the model's head counts are checked when it loads)."""
    arr, world = cfg.actor_rollout_ref, cfg.world_size
    sizes = [(ACTOR, arr.actor.ulysses_sequence_parallel_size)]
    if cfg.ref_enabled:
        sizes.append(("actor_rollout_ref.ref", arr.ref.ulysses_sequence_parallel_size or 1))
    if cfg.critic_enabled:
        sizes.append(("critic", cfg.critic.ulysses_sequence_parallel_size))
    return [
        f"{where}.ulysses_sequence_parallel_size: {sp} does not divide the {world} ranks (trainer.nnodes x "
        f"trainer.n_gpus_per_node); use one of {_divisors(world)} (data-parallel size = ranks // this)"
        for where, sp in sizes
        if world % sp
    ]


def _batch_sizes(cfg: HybridFlowConfig) -> list[str]:
    """Batches split evenly into mini-batches, ranks and micro-batches (as verl requires)."""
    n, world = cfg.actor_rollout_ref.rollout.n, cfg.world_size
    train = cfg.data.train_batch_size
    out = []
    if (train * n) % world:
        out.append(
            f"data.train_batch_size: {train} prompts x rollout.n {n} = {train * n} responses do not split evenly "
            f"over {world} ranks (trainer.nnodes x trainer.n_gpus_per_node); make the product a multiple of {world}"
        )
    actor = cfg.actor_rollout_ref.actor
    out += _role_batches(
        ACTOR,
        train,
        n,
        world,
        actor.ppo_mini_batch_size,
        actor.ppo_micro_batch_size_per_gpu,
        actor.use_dynamic_bsz,
        sp=actor.ulysses_sequence_parallel_size,
    )
    critic = cfg.critic
    if cfg.critic_enabled and critic.ppo_mini_batch_size is not None:
        # The critic inherits the actor's sizes by default: do not report the same problem twice.
        seen = {p.split(": ", 1)[1] for p in out}
        out += [
            p
            for p in _role_batches(
                "critic",
                train,
                n,
                world,
                critic.ppo_mini_batch_size,
                critic.ppo_micro_batch_size_per_gpu,
                bool(critic.use_dynamic_bsz),
                sp=critic.ulysses_sequence_parallel_size,
            )
            if p.split(": ", 1)[1] not in seen
        ]
    return out


def _role_batches(
    where: str, train: int, n: int, world: int, mini: int, micro: int | None, dynamic: bool, sp: int = 1
) -> list[str]:
    """Mini-batch and micro-batch divisibility for one trained role.

    With Ulysses (`sp` > 1) the ranks of a sequence-parallel group share their rows, so mini-batches split
    over the world // sp data-parallel ranks (verl's rule); `_cluster` reports an sp that does not divide.
    """
    if world % sp:
        return []
    ranks = f"{world} ranks" if sp == 1 else f"{world // sp} data-parallel ranks ({world} ranks / ulysses {sp})"
    world //= sp
    if train % mini:
        lower = [m for m in (mini // 2, mini // 4) if m and train % m == 0]
        hint = f", e.g. {lower[0]}" if lower else ""
        return [
            f"{where}.ppo_mini_batch_size: {mini} does not divide data.train_batch_size ({train}); "
            f"use a divisor of {train}{hint}, or change train_batch_size"
        ]
    responses = mini * n
    if responses % world:
        return [
            f"{where}.ppo_mini_batch_size: {mini} prompts x rollout.n {n} = {responses} responses per mini-batch "
            f"do not split over {ranks}; make it a multiple of {world // _gcd(world, n)}"
        ]
    per_rank = responses // world
    if micro is not None and not dynamic and per_rank % micro:
        return [
            f"{where}.ppo_micro_batch_size_per_gpu: {micro} does not divide the {per_rank} responses each rank "
            f"gets per mini-batch (ppo_mini_batch_size x rollout.n / {ranks}); use one of {_divisors(per_rank)}"
        ]
    return []


def _gcd(a: int, b: int) -> int:
    """Greatest common divisor."""
    while b:
        a, b = b, a % b
    return a


def _algorithm(cfg: HybridFlowConfig) -> list[str]:
    """The estimator has what it needs: responses to compare, or a critic."""
    out = []
    est, n = cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.rollout.n
    # Distillation without task rewards reads no estimator output (verl's recipes keep grpo with n=1).
    if est in GROUP_ESTIMATORS and n < 2 and not cfg.distillation.replaces_task_advantages:
        out.append(
            f"{ROLLOUT}.n: {est} compares several responses per prompt, so it needs n > 1 (got {n}); "
            "set e.g. actor_rollout_ref.rollout.n=8"
        )
    if est == "online_dpo":
        actor = cfg.actor_rollout_ref.actor
        if actor.loss_agg_mode != "seq-mean-token-sum":
            out.append(
                f"actor_rollout_ref.actor.loss_agg_mode: online_dpo weighs whole responses (the DPO loss reads "
                f"sequence log-probs), so it needs seq-mean-token-sum (got {actor.loss_agg_mode}); set "
                "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum"
            )
        if cfg.algorithm.use_kl_in_reward:
            out.append(
                "algorithm.use_kl_in_reward: online_dpo pairs responses by their scores and keeps the policy near "
                "the reference through its own loss (algorithm.dpo_beta); set use_kl_in_reward=false"
            )
        if actor.policy_loss.loss_mode != "vanilla":
            out.append(
                f"actor_rollout_ref.actor.policy_loss.loss_mode: online_dpo's weights give the DPO gradient through "
                f"the vanilla policy loss only (got {actor.policy_loss.loss_mode}); set it to vanilla"
            )
    out += _estimator_inputs(cfg)
    if est in ("gae", "gae_vectorized") and cfg.critic.enable is False:
        out.append(
            "critic.enable: gae needs a critic (value estimates); set critic.enable=true (or null), "
            "or pick a critic-free estimator such as algorithm.adv_estimator=grpo"
        )
    if cfg.trainer.critic_warmup > 0 and not cfg.critic_enabled:
        out.append("trainer.critic_warmup: there is no critic to warm up; set it to 0 or enable the critic")
    groups = cfg.algorithm.filter_groups
    if groups.enable and groups.metric is None:
        out.append(
            "algorithm.filter_groups.metric: required when filter_groups.enable is true; set it to acc, score, "
            "seq_reward or seq_final_reward"
        )
    if groups.enable and n < 2:
        out.append(
            f"algorithm.filter_groups.enable: dynamic sampling filters groups of responses, so it needs "
            f"{ROLLOUT}.n > 1 (got {n}); raise n or disable filter_groups"
        )
    return out


def _sampling(cfg: HybridFlowConfig) -> list[str]:
    """Several responses per prompt must be able to differ."""
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.n > 1 and (not rollout.do_sample or rollout.temperature == 0):
        return [
            f"{ROLLOUT}.do_sample: with greedy decoding (do_sample false or temperature 0) all {rollout.n} "
            "responses to a prompt are identical and group advantages are zero; set do_sample=true and "
            "temperature > 0, or n=1"
        ]
    return []


def _dynamic_bsz(cfg: HybridFlowConfig) -> list[str]:
    """With token-budget micro-batches, one full-length sequence must fit the budget."""
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    arr = cfg.actor_rollout_ref
    budgets = [
        (
            f"{ACTOR}.ppo_max_token_len_per_gpu",
            arr.actor.use_dynamic_bsz,
            arr.actor.ppo_max_token_len_per_gpu,
        ),
        (
            "critic.ppo_max_token_len_per_gpu",
            cfg.critic_enabled and cfg.critic.use_dynamic_bsz,
            cfg.critic.ppo_max_token_len_per_gpu,
        ),
        (
            "critic.forward_max_token_len_per_gpu",
            cfg.critic_enabled and cfg.critic.use_dynamic_bsz,
            cfg.critic.forward_max_token_len_per_gpu,
        ),
        (
            "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
            arr.ref.log_prob_use_dynamic_bsz,
            arr.ref.log_prob_max_token_len_per_gpu,
        ),
        (
            f"{ROLLOUT}.log_prob_max_token_len_per_gpu",
            arr.rollout.log_prob_use_dynamic_bsz,
            arr.rollout.log_prob_max_token_len_per_gpu,
        ),
    ]
    # Ulysses: each rank of a sequence-parallel group holds 1/sp of every sequence (verl multiplies the
    # budget by sp); the rollout's log-probs run on the actor's engine.
    sp = {"critic": cfg.critic.ulysses_sequence_parallel_size, "actor_rollout_ref.ref": arr.ref.ulysses_sequence_parallel_size or 1}

    def needed(path: str) -> int:
        return -(-longest // sp.get(path.rsplit(".", 1)[0], arr.actor.ulysses_sequence_parallel_size))

    return [
        f"{path}: {budget} tokens cannot hold one sequence of max_prompt_length + max_response_length = "
        f"{longest}{'' if needed(path) == longest else ' split over its Ulysses group'}; raise it to at least "
        f"{needed(path)}"
        for path, dynamic, budget in budgets
        if dynamic and budget is not None and budget < needed(path)
    ]


def _lengths(cfg: HybridFlowConfig) -> list[str]:
    """Engine context and DAPO overlong buffer fit the configured lengths."""
    out = []
    rollout = cfg.actor_rollout_ref.rollout
    prompt, response = rollout.prompt_length or 0, rollout.response_length or 0
    if rollout.max_model_len is not None and rollout.max_model_len < prompt + response:
        out.append(
            f"{ROLLOUT}.max_model_len: {rollout.max_model_len} is less than prompt_length + response_length "
            f"({prompt + response}); raise it or leave it null"
        )
    buffer = cfg.reward_model.overlong_buffer
    if buffer.enable and not 0 < buffer.len <= response:
        out.append(
            f"reward_model.overlong_buffer.len: must be between 1 and the response length ({response}) when "
            f"the overlong buffer is enabled (got {buffer.len}); e.g. {max(1, response // 4)}"
        )
    return out


def changed_fields(section: Any) -> list[str]:
    """The fields of a config section whose values differ from the section's defaults (a saved and reloaded config
    sets every field, so `model_fields_set` would name them all)."""
    default = type(section)()
    return [name for name in type(section).model_fields if getattr(section, name) != getattr(default, name)]


RM_SERVING_KEYS = (
    "name", "mode", "tensor_model_parallel_size", "gpu_memory_utilization", "prompt_length", "response_length",
    "max_model_len", "max_num_seqs", "max_num_batched_tokens", "free_cache_engine", "enforce_eager", "dtype",
    "load_format", "enable_chunked_prefill", "enable_prefix_caching", "engine_kwargs", "replicas", "seed",
)
"""What a served reward model's replicas read of `reward_model.rollout` (mode: always server replicas)."""


def _reward_model(cfg: HybridFlowConfig) -> list[str]:
    """An enabled reward model gets what it reads: the prompt chats to re-render, a token budget that fits, a pool
    of its own that exists."""
    rm = cfg.reward_model
    out = []
    if rm.enable_resource_pool and (rm.nnodes < 1 or rm.n_gpus_per_node < 1):
        out.append(
            f"reward_model.enable_resource_pool: the reward model's own pool needs reward_model.nnodes >= 1 and "
            f"reward_model.n_gpus_per_node >= 1 (got {rm.nnodes} x {rm.n_gpus_per_node}); set both, or "
            "enable_resource_pool=false to share the actor's devices"
        )
    if not rm.enable_resource_pool and (rm.nnodes or rm.n_gpus_per_node):
        out.append(
            f"reward_model.nnodes / n_gpus_per_node ({rm.nnodes} x {rm.n_gpus_per_node}) size the reward model's own "
            "pool, which is off; set reward_model.enable_resource_pool=true, or set them to 0"
        )
    stray = sorted(set(changed_fields(rm.rollout)) - set(RM_SERVING_KEYS))
    if stray:
        out.append(
            f"reward_model.rollout.{stray[0]}: the reward model's replicas read only their serving settings "
            f"({', '.join(RM_SERVING_KEYS)}); a generative reward model samples as the custom reward function's "
            f"request asks (sampling_params of /generate, or the OpenAI request); remove "
            + ", ".join(f"reward_model.rollout.{k}" for k in stray)
        )
    if rm.enable_resource_pool and not rm.enable:
        out.append("reward_model.enable_resource_pool: there is no reward model to place (reward_model.enable=false); "
                   "set reward_model.enable=true with reward_model.model.path, or enable_resource_pool=false")
    if not rm.enable:
        return out
    if rm.model.input_tokenizer and not cfg.data.return_raw_chat:
        out.append(
            "data.return_raw_chat: reward_model.model.input_tokenizer is set, so each prompt's chat messages are "
            "re-rendered with the reward model's template and must reach it; set data.return_raw_chat=true (or "
            "input_tokenizer=null when the reward model shares the policy's tokenizer)"
        )
    if rm.use_dynamic_bsz:
        budget = rm.forward_max_token_len_per_gpu  # filled from the critic's by _fill_derived when null
        longest = cfg.data.max_prompt_length + cfg.data.max_response_length
        if rm.model.input_tokenizer and rm.max_length:
            longest = rm.max_length
        if budget is not None and budget < longest:
            out.append(
                f"reward_model.forward_max_token_len_per_gpu: {budget} tokens cannot hold one reward-model input of "
                f"up to {longest} tokens; raise it to at least {longest}"
            )
    return out


def _trainer(cfg: HybridFlowConfig) -> list[str]:
    """Resume settings agree."""
    if cfg.trainer.resume_mode == "resume_path" and not cfg.trainer.resume_from_path:
        return [
            "trainer.resume_from_path: required when trainer.resume_mode is resume_path; set the checkpoint "
            "to resume from, or use resume_mode=auto"
        ]
    return []


def _agent_rollout(cfg: HybridFlowConfig) -> list[str]:
    """Server-mode rollout (mode=async) and the multi-turn keys it reads agree with what is built here."""
    ro = cfg.actor_rollout_ref.rollout
    mt, out = ro.multi_turn, []
    if ro.mode == "async" and ro.name not in SERVER_ROLLOUT_NAMES:
        out.append(
            f"{ROLLOUT}.mode: async serves rollouts from engine replicas (vLLM AsyncLLM or SGLang), and the hf "
            f"rollout is not a server; set {ROLLOUT}.name=vllm (CPU: `make vllm`) or sglang (GPU), or mode=sync"
        )
    if ro.mode == "async" and mt.enable and cfg.data.image_key is not None:
        # a vision-language model is only known once its folder is read (main_ppo.multimodal_problem); naming the
        # image column says the run means image prompts
        out.append(f"{ROLLOUT}.multi_turn.enable: {verl_features.MULTIMODAL_AGENTS.message} (data.image_key is set)")
    slots = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    if ro.mode == "async" and ro.replicas and ro.replicas * ro.tensor_model_parallel_size > slots:
        out.append(
            f"{ROLLOUT}.replicas: {ro.replicas} replicas x tensor_model_parallel_size {ro.tensor_model_parallel_size} "
            f"need {ro.replicas * ro.tensor_model_parallel_size} slots of the rollout pool, which has {slots} "
            f"(trainer.nnodes x trainer.n_gpus_per_node); set it to at most "
            f"{max(1, slots // ro.tensor_model_parallel_size)}, leave it null (one per tensor-parallel group), or add "
            "nodes"
        )
    if ro.mode == "sync" and (mt.enable or mt.tool_config_path or mt.interaction_config_path
                              or ro.agent.agent_loop_config_path):
        out.append(
            f"{ROLLOUT}.multi_turn / agent: tool calling and agent loops run in server mode only; set "
            f"{ROLLOUT}.mode=async"
        )
    if mt.format not in TOOL_CALL_FORMATS:
        out.append(f"{ROLLOUT}.multi_turn.format: {verl_features.TOOL_FORMATS.message} (got {shorten(mt.format)})")
    if mt.use_inference_chat_template:
        out.append(
            f"{ROLLOUT}.multi_turn.use_inference_chat_template: true re-renders turns with the chat template, which "
            "breaks token-in/token-out training; it is not supported here, set it to false"
        )
    if ro.agent.custom_async_server.get("path"):
        out.append(f"{ROLLOUT}.agent.custom_async_server: {verl_features.CUSTOM_SERVER.message}")
    if ro.over_sample_rate > 0 and ro.mode == "sync":
        out.append(
            f"{ROLLOUT}.over_sample_rate: {ro.over_sample_rate:g} cuts the slowest trajectories of a batch in server "
            f"mode, where each is a request that can be aborted; a sync-mode batch is one generate call. Set "
            f"{ROLLOUT}.mode=async, or over_sample_rate=0"
        )
    if ro.over_sample_rate > 0 and cfg.async_training.enabled:
        out.append(
            f"{ROLLOUT}.over_sample_rate: {ro.over_sample_rate:g} cuts the tail of a synchronous batch; with "
            f"async_training.mode={cfg.async_training.mode} generation streams whole groups while the trainer trains, "
            f"so slow trajectories do not hold a step back. Set over_sample_rate=0, or async_training.mode=sync"
        )
    return out


def _async_training(cfg: HybridFlowConfig) -> list[str]:
    """Asynchronous training has standalone replicas to stream from, whole groups to fill a batch, and a mode
    whose fixed settings are not contradicted."""
    at, ro = cfg.async_training, cfg.actor_rollout_ref.rollout
    if not at.enabled:
        return []
    out, mode = [], f"async_training.mode={at.mode}"
    if ro.mode != "async":
        out.append(f"{ROLLOUT}.mode: {mode} streams samples from rollout server replicas; set {ROLLOUT}.mode=async")
    if cfg.trainer.placement != "split":
        out.append(
            f"trainer.placement: {mode} generates while the trainer updates, so the rollout replicas need devices of "
            "their own; set trainer.placement=split (the rollout gets a pool of the trainer's shape)"
        )
    if at.mode == "one_step_off":
        if at.staleness_threshold not in (None, 1.0):
            out.append(
                f"async_training.staleness_threshold: one_step_off is exactly one step behind (1), got "
                f"{at.staleness_threshold}; remove it, or use async_training.mode=fully_async to choose the staleness"
            )
        if at.partial_rollout:
            out.append(
                "async_training.partial_rollout: one_step_off pushes weights between whole batches; set it to false, "
                "or use async_training.mode=fully_async"
            )
    mini, batch = cfg.actor_rollout_ref.actor.ppo_mini_batch_size, cfg.data.train_batch_size
    if at.require_batches is not None and at.require_batches * mini != batch:
        out.append(
            f"async_training.require_batches: a step trains data.train_batch_size={batch} prompts, not "
            f"require_batches x ppo_mini_batch_size = {at.require_batches} x {mini}; set data.train_batch_size="
            f"{at.require_batches * mini} or remove require_batches"
        )
    if cfg.algorithm.adv_estimator == "remax":
        out.append(
            f"algorithm.adv_estimator: remax generates a greedy baseline with the current weights for every batch, "
            f"which {mode} cannot do for samples generated earlier; pick grpo, rloo or reinforce_plus_plus"
        )
    if ro.calculate_log_probs is False:
        out.append(
            f"{ROLLOUT}.calculate_log_probs: {mode} corrects for stale samples with the rollout's log-probs; set it "
            "to true (or remove it)"
        )
    return out


def _estimator_inputs(cfg: HybridFlowConfig) -> list[str]:
    """The optimal token baselines read sum(pi^2); gdpo reads named reward components, one weight each."""
    algo, out = cfg.algorithm, []
    if algo.adv_estimator in SUM_PI_SQUARED_ESTIMATORS and not cfg.actor_rollout_ref.actor.calculate_sum_pi_squared:
        out.append(
            f"{ACTOR}.calculate_sum_pi_squared: {algo.adv_estimator} weighs each token by sum(pi^2) of the actor's "
            "distribution; set it to true"
        )
    if algo.adv_estimator in SUM_PI_SQUARED_ESTIMATORS and algo.rollout_correction.bypass_mode:
        out.append(
            f"algorithm.rollout_correction.bypass_mode: {algo.adv_estimator} reads sum_pi_squared from the actor's "
            "old-log-prob pass, which bypass mode skips; set bypass_mode=false"
        )
    if algo.adv_estimator == "gdpo" and not algo.gdpo_reward_keys:
        out.append(
            "algorithm.gdpo_reward_keys: gdpo normalises each reward component separately; list the keys your reward "
            "function returns, e.g. algorithm.gdpo_reward_keys='[format_reward,accuracy_reward]'"
        )
    weights, keys = algo.gdpo_reward_weights, algo.gdpo_reward_keys or []
    if weights is not None and len(weights) != len(keys):
        out.append(
            f"algorithm.gdpo_reward_weights: {len(weights)} weights for {len(keys)} gdpo_reward_keys; give one per key"
        )
    if cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "dro" and cfg.actor_rollout_ref.actor.policy_loss.dro_beta is None:
        out.append(f"{ACTOR}.policy_loss.dro_beta: loss_mode=dro needs a positive dro_beta; set e.g. 0.1")
    return out


def _rollout_correction(cfg: HybridFlowConfig) -> list[str]:
    """The correction options parse, and the mode can compute what they need."""
    rc, out, key = cfg.algorithm.rollout_correction, [], "algorithm.rollout_correction"
    try:
        rc.rs_options()
    except ValueError as err:
        out.append(f"{key}.{err}")
    loss_mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if loss_mode == "bypass_mode" and not rc.bypass_mode:
        out.append(
            f"{ACTOR}.policy_loss.loss_mode: bypass_mode takes the rollout's log-probs as pi_old; set "
            f"{key}.bypass_mode=true (which selects it) or pick another loss_mode"
        )
    elif rc.bypass_mode and (rc.enabled or rc.loss_type == "reinforce") and loss_mode != "bypass_mode":
        out.append(
            f"{ACTOR}.policy_loss.loss_mode: bypass mode with rollout_is / rollout_rs or loss_type=reinforce computes "
            f"verl's bypass-mode loss (PPO clip or REINFORCE), not {loss_mode}; set loss_mode=vanilla (or remove it)"
        )
    given = cfg.actor_rollout_ref.actor.policy_loss.rollout_correction
    if given is not None and (loss_mode != "bypass_mode" or given != rc):
        out.append(
            f"{ACTOR}.policy_loss.rollout_correction: filled from {key} for loss_mode=bypass_mode (as verl does); "
            f"remove it and set {key} instead"
        )
    if rc.loss_type == "reinforce" and not rc.bypass_mode:
        out.append(
            f"{key}.loss_type: reinforce is the bypass-mode loss; set {key}.bypass_mode=true, or loss_type=ppo_clip"
        )
    at = cfg.async_training
    if at.use_rollout_log_probs is not None and rc.bypass_mode is not None and at.use_rollout_log_probs != rc.bypass_mode:
        out.append(
            f"async_training.use_rollout_log_probs: {at.use_rollout_log_probs} contradicts {key}.bypass_mode="
            f"{rc.bypass_mode}; set only one of the two"
        )
    if (rc.enabled or rc.bypass_mode) and cfg.actor_rollout_ref.rollout.calculate_log_probs is False:
        out.append(
            f"{ROLLOUT}.calculate_log_probs: {key} reads the rollout's log-probs; set it to true (or remove it)"
        )
    return out
