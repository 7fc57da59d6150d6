"""Config groups `algorithm`, `data`, `custom_reward_function` and `trainer`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from .async_training import RolloutCorrectionConfig
from .common import Section
from .data_extras import CustomDatasetClass, SamplerClass
from .export import ExportConfig
from .names import AdvEstimator, FilterGroupMetric, KlPenalty, LoggerName
from .sandbox import SandboxServiceConfig
from .values import Location, Seed

#: Upper bounds that no real cluster reaches; they keep a typo (an extra digit or ten) from sizing one.
MAX_NODES = 65536
MAX_DEVICES_PER_NODE = 1024


def _as_list(value: Any) -> Any:
    """Accept one string where a list of strings is expected (verl does); null means empty."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return value


class KlCtrl(Section):
    """Controller of the KL penalty folded into the reward (when algorithm.use_kl_in_reward)."""

    type: Literal["fixed", "adaptive"] = Field(
        default="fixed", description="fixed: constant coefficient; adaptive: steer the KL toward target_kl."
    )
    kl_coef: float = Field(default=0.001, ge=0, description="(Initial) KL coefficient.")
    horizon: int = Field(default=10000, gt=0, description="Adaptive controller: steps over which to adapt.")
    target_kl: float = Field(default=0.1, gt=0, description="Adaptive controller: KL to steer toward.")


class FilterGroups(Section):
    """DAPO dynamic sampling: drop prompt groups whose responses all score the same (arXiv:2503.14476)."""

    enable: bool = Field(default=False, description="Turn dynamic sampling on.")
    metric: FilterGroupMetric | None = Field(
        default=None, description="Per-response metric whose spread within a group must be non-zero."
    )
    max_num_gen_batches: int = Field(
        default=0, ge=0, description="Generation batches to draw per step before giving up; 0 means no limit."
    )


class AlgorithmConfig(Section):
    """RL algorithm: advantage estimator, discounting, KL handling."""

    adv_estimator: AdvEstimator = Field(default="gae", description="Advantage estimator.")
    gamma: float = Field(default=1.0, ge=0, le=1, description="Discount factor (GAE).")
    lam: float = Field(default=1.0, ge=0, le=1, description="GAE lambda; 1.0 is the Monte-Carlo return.")
    norm_adv_by_std_in_grpo: bool = Field(
        default=True, description="GRPO: divide by the group's std (false gives Dr. GRPO, arXiv:2503.20783)."
    )
    use_kl_in_reward: bool = Field(
        default=False, description="Subtract a KL penalty from the reward (PPO-style) instead of a KL loss."
    )
    kl_penalty: KlPenalty = Field(default="kl", description="KL estimator for the in-reward penalty.")
    kl_ctrl: KlCtrl = Field(default_factory=KlCtrl, description="KL coefficient controller.")
    filter_groups: FilterGroups = Field(default_factory=FilterGroups, description="DAPO dynamic sampling.")
    dpo_beta: float = Field(
        default=0.1,
        gt=0,
        description="online_dpo: beta of the DPO loss (how far the policy may move from the reference).",
    )
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig,
        description="Importance weights / rejection of samples the trained policy did not draw (verl's keys).",
    )
    gdpo_reward_keys: list[str] | None = Field(
        default=None,
        description="gdpo: the reward components (keys of the dict the reward function returns) normalised "
        "separately within each group before they are summed.",
    )
    gdpo_reward_weights: list[float] | None = Field(
        default=None, description="gdpo: one weight per gdpo_reward_keys entry; null: 1.0 each."
    )


class DataConfig(Section):
    """Training and validation data (parquet in verl's layout) and batch sizes."""

    train_files: list[Location] = Field(
        default_factory=list,
        description="Training parquet files: a path, URI (s3://, gs://, file://) or a list of them. Required to run.",
    )
    val_files: list[Location] = Field(
        default_factory=list,
        description="Validation parquet files, as train_files; empty means no validation.",
    )
    prompt_key: str = Field(default="prompt", description="Column holding the prompt (chat messages).")
    image_key: str | None = Field(
        default=None,
        description="Column holding a row's images (HF datasets' image dicts, paths or bytes), each placed where its "
        "`<image>` stands in the prompt; null: verl's `images`. Read when the model is a vision-language model; "
        "setting it says the run means image prompts (docs/multimodal.md).",
    )
    reward_fn_key: str = Field(default="data_source", description="Column that selects the reward function.")
    max_prompt_length: int = Field(default=512, gt=0, description="Prompt length limit in tokens.")
    max_response_length: int = Field(default=512, gt=0, description="Generated tokens per response, at most.")
    train_batch_size: int = Field(default=1024, gt=0, description="Prompts per training step.")
    val_batch_size: int | None = Field(
        default=None, gt=0, description="Prompts per validation batch; null means the whole set at once."
    )
    return_raw_chat: bool = Field(default=False, description="Also pass the un-templated chat messages on.")
    return_full_prompt: bool = Field(
        default=False, description="Also pass the rendered prompt text on, as `full_prompts` (verl's key)."
    )
    shuffle: bool = Field(default=True, description="Shuffle the training data every epoch.")
    seed: Seed = Field(default=1, description="Seed of the shuffling sampler (0 to 2**32 - 1).")
    filter_overlong_prompts: bool = Field(
        default=False, description="Drop prompts longer than max_prompt_length while loading."
    )
    truncation: Literal["error", "left", "right", "middle"] = Field(
        default="error", description="What to do with a prompt over max_prompt_length: fail, or cut a side."
    )
    dataloader_num_workers: int = Field(
        default=8,
        ge=0,
        description="Accepted for verl compatibility, no effect: batches are read in the driver (tokenised once).",
    )
    custom_cls: CustomDatasetClass = Field(
        default_factory=CustomDatasetClass, description="A user dataset class by file path and name (verl's custom_cls)."
    )
    sampler: SamplerClass = Field(
        default_factory=SamplerClass, description="A user (curriculum) sampler by file path and class name."
    )
    apply_chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments of the tokenizer's apply_chat_template when prompts, and the tool "
        "agent's tool and user turns, are rendered (e.g. reasoning_effort for gpt-oss, enable_thinking for Qwen3); "
        "the rendered ids are what the rollout sees.",
    )
    gen_batch_size: int | None = Field(
        default=None,
        gt=0,
        description="DAPO's generation batch: prompts drawn per round of dynamic sampling (algorithm.filter_groups), "
        "which keeps drawing until train_batch_size informative groups are found; null: train_batch_size.",
    )

    _to_list = field_validator("train_files", "val_files", mode="before")(_as_list)


class CustomRewardFunction(Section):
    """A user reward function `fn(data_source, solution_str, ground_truth, extra_info=None, **kwargs)`."""

    path: str | None = Field(
        default=None, description="Python file defining the function; null: built-in scorers."
    )
    name: str = Field(default="compute_score", description="Name of the function in that file.")
    reward_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments passed to the function."
    )


class RayInitConfig(Section):
    """Arguments for `ray.init` on the driver."""

    num_cpus: int | None = Field(
        default=None, gt=0, description="CPUs Ray may use; null means all (set it under SLURM or cgroups)."
    )
    address: str | None = Field(
        default=None, description="Ray cluster to join (e.g. 'auto'); null starts or finds a local one."
    )


def _default_loggers() -> list[LoggerName]:
    """Console only: verl also enables wandb, which needs an account and network."""
    return ["console"]


class TrainerConfig(Section):
    """Run length, cluster size, logging, checkpointing and resume."""

    project_name: str = Field(default="hybridflow", description="Project name (loggers, checkpoint folder).")
    experiment_name: str = Field(default="default", description="Run name (loggers, checkpoint folder).")
    logger: list[LoggerName] = Field(
        default_factory=_default_loggers,
        description="Loggers; one name or a list. verl's default adds wandb, ours does not (it needs an account).",
    )
    log_val_generations: int = Field(
        default=0, ge=0, description="Validation generations to log per validation."
    )
    nnodes: int = Field(default=1, ge=1, le=MAX_NODES, description="Nodes in the Ray cluster.")
    n_gpus_per_node: int = Field(
        default=8,
        ge=1,
        le=MAX_DEVICES_PER_NODE,
        description="Accelerators per node (trainer processes per node when device=cpu).",
    )
    device: Literal["cuda", "cpu", "npu"] = Field(default="cuda", description="Device type the workers use.")
    cpu_mixed_precision: bool = Field(
        default=False,
        description="On CPU, compute the actor, reference, critic and reward model in their "
        "fsdp_config.mixed_precision.param_dtype (bf16; torch.autocast) as GPUs always do; weights, gradients "
        "and optimizer state stay in model_dtype. ~1.7x faster forward/backward on CPUs with AVX-512 BF16 or AMX; "
        "off by default because it changes the numerics of CPU runs.",
    )
    total_epochs: int = Field(default=30, gt=0, description="Passes over the training data.")
    total_training_steps: int | None = Field(
        default=None, gt=0, description="Stop after this many steps; null means total_epochs decides."
    )
    save_freq: int = Field(
        default=-1, ge=-1, description="Checkpoint every N steps; -1 or 0 means only at the end."
    )
    test_freq: int = Field(
        default=-1, ge=-1, description="Validate every N steps; -1 or 0 means never during training."
    )
    val_before_train: bool = Field(default=True, description="Validate once before the first step.")
    critic_warmup: int = Field(
        default=0, ge=0, description="Steps that train only the critic, not the actor."
    )
    balance_batch: bool = Field(
        default=True, description="Reorder each batch so data-parallel ranks get similar token counts."
    )
    resume_mode: Literal["auto", "disable", "resume_path"] = Field(
        default="auto",
        description="auto: continue from the latest committed checkpoint if any; disable: start fresh; "
        "resume_path: continue from resume_from_path.",
    )
    resume_from_path: Location | None = Field(
        default=None, description="Checkpoint to resume from (resume_path mode)."
    )
    default_local_dir: Location = Field(
        default="checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        description="Where checkpoints go: a folder or an fsspec URI (s3://...). ${...} references are resolved.",
    )
    default_hdfs_dir: None = Field(
        default=None,
        description="Accepted for verl compatibility and must stay null: use an s3:// or gs:// default_local_dir.",
    )
    metrics_port: int = Field(
        default=8000,
        ge=0,
        le=65535,
        description="HybridFlow addition (not in verl): port of the driver's Prometheus endpoint, served when "
        "trainer.logger includes prometheus or $HYBRIDFLOW_METRICS_PORT is set (the variable wins; the operator "
        "sets it). 0 picks any free port.",
    )
    max_actor_ckpt_to_keep: int | None = Field(
        default=None, gt=0, description="Keep only the newest N actor checkpoints; null keeps all."
    )
    max_critic_ckpt_to_keep: int | None = Field(
        default=None,
        gt=0,
        description="Keep only the newest N critic checkpoints; null keeps all. A step folder holds actor and "
        "critic together, so the smaller of this and max_actor_ckpt_to_keep applies to both.",
    )
    seed: Seed = Field(default=42, description="Seed of every worker's torch, numpy and Python RNGs (0 to 2**32 - 1).")
    placement: Literal["colocate", "split"] = Field(
        default="colocate",
        description="HybridFlow addition (not in verl): colocate puts actor, ref and rollout on the same devices "
        "(weights pushed to the engine each step); split gives the rollout its own pool of devices, of the same "
        "shape (nnodes x n_gpus_per_node), so a split job uses twice as many.",
    )

    export: ExportConfig = Field(
        default_factory=ExportConfig,
        description="HybridFlow addition (not in verl): export the final checkpoint as a Hugging Face folder.",
    )
    sandbox: SandboxServiceConfig = Field(
        default_factory=SandboxServiceConfig,
        description="HybridFlow addition (not in verl): run_code servers on the RLJob's sandbox pods (spec.roles."
        "sandbox) for the code tool and the code scorers; replicas 0 (default): none.",
    )

    ray_init: RayInitConfig = Field(
        default_factory=RayInitConfig,
        description="ray.init arguments. verl keeps these at the top level (ray_init.*); that spelling is "
        "accepted too and moved here.",
    )

    _to_list = field_validator("logger", mode="before")(_as_list)
