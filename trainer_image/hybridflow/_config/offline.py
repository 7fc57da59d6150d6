"""The config of the offline trainers: SFT (verl's `fsdp_sft_trainer` keys) and DPO (the same tree + TRL's names).

verl's `sft_trainer.yaml` shape: `data.*` (files, batch sizes, prompt/response or multi-turn keys,
max_length, truncation), `model.*` (`partial_pretrain`, FSDP settings), `optim.*` (lr, betas, warm-up,
`clip_grad`, `lr_scheduler`) and `trainer.*` (run length, loggers, checkpoints, resume, cluster size).
DPO reads a preference parquet (`data.prompt_key` / `chosen_key` / `rejected_key`) and adds a `dpo`
group with TRL's `DPOConfig` names (`beta`, `loss_type`). Torch- and Ray-free, like the RL config: the
operator validates an RLJob with `spec.recipe: sft|dpo` with these very models.

Where this differs from verl's SFT config, on purpose: `trainer.logger` is `[console]` (no wandb account
needed), `model.partial_pretrain` and `data.train_files` are empty (required to run), the trainer runs
on the RL stack's Ray worker groups (`trainer.ray_init`, `trainer.metrics_port`, `trainer.cpu_mixed_precision`
as in the RL config) and validates before training (`trainer.val_before_train`, as verl's RL trainer).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from .. import yamlio
from .common import Beta, CheckpointConfig, FsdpConfig, OptimConfig, Section
from .errors import RULES_ERROR, ConfigError, problems_from_validation_error
from .groups import MAX_DEVICES_PER_NODE, MAX_NODES, RayInitConfig, _as_list
from .interpolation import resolve_tree
from .names import LoggerName
from .overrides import apply_overrides, too_deep_problem
from .values import Location, Seed
from .workers import STRATEGY_DOC, Strategy

OfflineRecipe = Literal["sft", "dpo"]
DpoLossType = Literal["sigmoid", "ipo"]
DPO_LOSS_TYPES: tuple[str, ...] = ("sigmoid", "ipo")


# ------------------------------------------------------------------------------------------ data


class OfflineDataConfig(Section):
    """What both offline trainers read: parquet files, batch sizes, the sequence length limit."""

    train_files: list[Location] = Field(
        default_factory=list,
        description="Training parquet files: a path, URI (s3://, gs://, file://) or a list of them. Required to run.",
    )
    val_files: list[Location] = Field(
        default_factory=list, description="Validation parquet files, as train_files; empty means no validation."
    )
    train_batch_size: int = Field(
        default=256, gt=0, description="Rows per optimizer step over all processes (SFT: examples; DPO: pairs)."
    )
    micro_batch_size_per_gpu: int = Field(
        default=4, gt=0,
        description="Rows per forward/backward on one process (gradient accumulation); also the validation batch "
        "per process. DPO: pairs, each a chosen and a rejected sequence.",
    )
    micro_batch_size: int | None = Field(
        default=None,
        description="verl's deprecated global micro batch; must stay null: set micro_batch_size_per_gpu instead.",
    )
    max_length: int = Field(default=1024, gt=0, description="Tokens per sequence (prompt + response), at most.")
    truncation: Literal["error", "left", "right"] = Field(
        default="error",
        description="A sequence over max_length: error (fail at start-up, naming the row), left (drop its start, "
        "keep the end with the response) or right (drop its end).",
    )
    chat_template: str | None = Field(
        default=None, description="A Jinja chat template replacing the tokenizer's; null keeps the tokenizer's."
    )
    shuffle: bool = Field(default=True, description="Shuffle the training rows every epoch.")
    seed: Seed = Field(default=1, description="Seed of the shuffling sampler (0 to 2**32 - 1).")

    _to_list = field_validator("train_files", "val_files", mode="before")(_as_list)

    @field_validator("micro_batch_size")
    @classmethod
    def _no_global_micro_batch(cls, value: int | None) -> None:
        """verl deprecated the global micro batch size; one per-process key says what a process computes."""
        if value is not None:
            raise ValueError(
                f"verl's deprecated global micro batch ({value}); remove it and set data.micro_batch_size_per_gpu "
                "(rows per forward/backward on one process)"
            )
        return None


class MultiturnConfig(Section):
    """Multi-turn SFT: one column of chat messages per row; every assistant turn is trained on."""

    enable: bool = Field(default=False, description="Read data.multiturn.messages_key instead of prompt/response.")
    messages_key: str = Field(default="messages", description="Column holding the list of {role, content} messages.")


class SftDataConfig(OfflineDataConfig):
    """SFT data: a prompt and a response column (single-turn) or a messages column (multi-turn)."""

    prompt_key: str = Field(
        default="question", description="Column of the prompt: a string (one user message) or chat messages."
    )
    response_key: str = Field(default="answer", description="Column of the response the model learns to write.")
    prompt_dict_keys: list[str] = Field(
        default_factory=list,
        description="Keys leading into a nested prompt column, e.g. [question] reads row[prompt_key]['question'].",
    )
    response_dict_keys: list[str] = Field(
        default_factory=list,
        description="Keys leading into a nested response column, e.g. [ground_truth] with response_key "
        "reward_model reads the answer of a verl RL parquet.",
    )
    multiturn: MultiturnConfig = Field(default_factory=MultiturnConfig, description="Multi-turn conversations.")

    _dict_keys = field_validator("prompt_dict_keys", "response_dict_keys", mode="before")(_as_list)


class PreferenceDataConfig(OfflineDataConfig):
    """DPO data: a prompt and a chosen and a rejected response per row (TRL's column names)."""

    prompt_key: str = Field(
        default="prompt", description="Column of the prompt: a string (one user message) or chat messages."
    )
    chosen_key: str = Field(
        default="chosen", description="Column of the preferred response: a string or assistant messages."
    )
    rejected_key: str = Field(
        default="rejected", description="Column of the dispreferred response: a string or assistant messages."
    )


# ----------------------------------------------------------------------------------- model, optim


class OfflineFsdpConfig(FsdpConfig):
    """FSDP settings of the trained model; verl's SFT offload keys are accepted and served by offload_policy."""

    cpu_offload: bool = Field(default=False, description="verl SFT's offload switch; the same as offload_policy.")
    offload_params: bool = Field(default=False, description="verl SFT's parameter offload; the same as offload_policy.")

    @model_validator(mode="after")
    def _offload(self) -> OfflineFsdpConfig:
        """One offload mechanism (FSDP2's CPU offload policy) serves every spelling of the switch."""
        if self.cpu_offload or self.offload_params:
            object.__setattr__(self, "offload_policy", True)
        return self


class OfflineModelConfig(Section):
    """The model to fine-tune (DPO: also its frozen reference)."""

    partial_pretrain: str | None = Field(
        default=None, description="Hugging Face model folder or hub id to start from (and its tokenizer). Required to run."
    )
    strategy: Strategy = Field(default="fsdp2", description=STRATEGY_DOC)
    trust_remote_code: bool = Field(default=False, description="Allow the model's own Python code to run.")
    external_lib: str | None = Field(
        default=None, description="Module to import before loading (registers custom model classes)."
    )
    enable_gradient_checkpointing: bool = Field(
        default=True, description="Recompute activations in backward to save memory."
    )
    fsdp_config: OfflineFsdpConfig = Field(default_factory=OfflineFsdpConfig, description="Sharding and offload.")


class OfflineOptimConfig(OptimConfig):
    """AdamW and its schedule, with verl SFT's defaults and key names (warmup_steps_ratio, lr_scheduler, clip_grad)."""

    lr: float = Field(default=1e-5, ge=0, description="Peak learning rate.")
    betas: list[Beta] = Field(
        default_factory=lambda: [0.9, 0.95], min_length=2, max_length=2, description="AdamW (beta1, beta2), each in [0, 1)."
    )
    lr_warmup_steps_ratio: float = Field(
        default=0.1, ge=0, le=1, description="Warm-up length as a fraction of the total training steps."
    )
    lr_scheduler_type: Literal["constant", "cosine"] = Field(
        default="cosine", description="Schedule after warm-up: constant or cosine decay."
    )
    warmup_steps_ratio: float | None = Field(
        default=None, ge=0, le=1, description="verl SFT's name of lr_warmup_steps_ratio; when set it is copied there."
    )
    lr_scheduler: Literal["constant", "cosine"] | None = Field(
        default=None, description="verl SFT's name of lr_scheduler_type; when set it is copied there."
    )
    clip_grad: float = Field(default=1.0, gt=0, description="Clip the global gradient norm to this.")

    @model_validator(mode="after")
    def _copy_verl_sft_names(self) -> OfflineOptimConfig:
        """verl SFT's spellings set the keys the engine reads; both spellings at once must agree."""
        for old, new in (("warmup_steps_ratio", "lr_warmup_steps_ratio"), ("lr_scheduler", "lr_scheduler_type")):
            value = getattr(self, old)
            if value is None:
                continue
            if new in self.model_fields_set and getattr(self, new) != value:
                raise ValueError(f"{old}={value!r} contradicts {new}={getattr(self, new)!r}; set only one of the two")
            object.__setattr__(self, new, value)
        return self


# ------------------------------------------------------------------------------------------ dpo


class DpoLossConfig(Section):
    """The DPO objective (TRL's DPOConfig names)."""

    beta: float = Field(
        default=0.1, gt=0,
        description="How far the policy may move from the reference: the inverse temperature of the sigmoid loss "
        "(Rafailov et al. 2023), the regularisation of IPO (target margin 1 / (2 beta), Azar et al. 2023).",
    )
    loss_type: DpoLossType = Field(
        default="sigmoid",
        description="sigmoid: DPO's -log sigmoid(beta h) on summed log-prob ratios; ipo: (h - 1/(2 beta))^2 on "
        "log-prob ratios averaged over each response's tokens, as TRL computes it.",
    )


# --------------------------------------------------------------------------------------- trainer


def _default_loggers() -> list[LoggerName]:
    """Console only: verl's SFT default adds wandb, which needs an account and network."""
    return ["console"]


class OfflineTrainerConfig(Section):
    """Run length, cluster size, logging, checkpoints and resume (verl's SFT trainer keys)."""

    project_name: str = Field(default="hybridflow", description="Project name (loggers, checkpoint folder).")
    experiment_name: str = Field(default="default", description="Run name (loggers, checkpoint folder).")
    logger: list[LoggerName] = Field(default_factory=_default_loggers, description="Loggers; one name or a list.")
    total_epochs: int = Field(default=4, gt=0, description="Passes over the training data.")
    total_training_steps: int | None = Field(
        default=None, gt=0, description="Stop after this many steps; null means total_epochs decides."
    )
    save_freq: int = Field(default=-1, ge=-1, description="Checkpoint every N steps; -1 or 0 means only at the end.")
    test_freq: int = Field(default=-1, ge=-1, description="Validate every N steps; -1 or 0 means only at the end.")
    val_before_train: bool = Field(
        default=True, description="HybridFlow addition (verl's RL trainer has it): validate once before the first step."
    )
    nnodes: int = Field(default=1, ge=1, le=MAX_NODES, description="Nodes in the Ray cluster.")
    n_gpus_per_node: int = Field(
        default=8, ge=1, le=MAX_DEVICES_PER_NODE,
        description="Accelerators per node (trainer processes per node when device=cpu).",
    )
    device: Literal["cuda", "cpu"] = Field(default="cuda", description="Device type the workers use.")
    cpu_mixed_precision: bool = Field(
        default=False,
        description="On CPU, compute in model.fsdp_config.mixed_precision.param_dtype (bf16, torch.autocast) as GPUs "
        "always do; weights, gradients and optimizer state stay in model_dtype.",
    )
    seed: Seed = Field(default=1, description="Seed of the workers' torch, numpy and Python RNGs (0 to 2**32 - 1).")
    default_local_dir: Location = Field(
        default="checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        description="Where checkpoints go: a folder or an fsspec URI (s3://...). ${...} references are resolved.",
    )
    default_hdfs_dir: None = Field(
        default=None,
        description="Accepted for verl compatibility and must stay null: use an s3:// or gs:// default_local_dir.",
    )
    max_ckpt_to_keep: int | None = Field(default=None, gt=0, description="Keep only the newest N checkpoints; null keeps all.")
    resume_mode: Literal["auto", "disable", "resume_path"] = Field(
        default="auto",
        description="auto: continue from the latest committed checkpoint if any; disable: start fresh; "
        "resume_path: continue from resume_from_path.",
    )
    resume_from_path: Location | None = Field(default=None, description="Checkpoint to resume from (resume_path mode).")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoint contents.")
    metrics_port: int = Field(
        default=8000, ge=0, le=65535,
        description="Port of the driver's Prometheus endpoint, served when trainer.logger includes prometheus or "
        "$HYBRIDFLOW_METRICS_PORT is set (the variable wins; the operator sets it). 0 picks any free port.",
    )
    ray_init: RayInitConfig = Field(default_factory=RayInitConfig, description="ray.init arguments.")

    _to_list = field_validator("logger", mode="before")(_as_list)

    @property
    def placement(self) -> str:
        """The offline trainers use one pool of processes (what `placement: colocate` means in the RL config)."""
        return "colocate"


# ------------------------------------------------------------------------------------------ roots


class OfflineConfig(Section):
    """Groups shared by the SFT and DPO configs, and the rules both follow."""

    recipe: ClassVar[OfflineRecipe]

    model: OfflineModelConfig = Field(default_factory=OfflineModelConfig, description="The model to fine-tune.")
    optim: OfflineOptimConfig = Field(default_factory=OfflineOptimConfig, description="Optimizer and schedule.")
    trainer: OfflineTrainerConfig = Field(
        default_factory=OfflineTrainerConfig, description="Run, cluster, logging, checkpoints."
    )
    use_remove_padding: bool = Field(
        default=False,
        description="verl's sequence packing; accepted, no effect on results: padding common to a micro-batch is "
        "trimmed instead.",
    )
    ulysses_sequence_parallel_size: Literal[1] = Field(
        default=1, description="verl's Ulysses sequence parallelism; only 1 (off) is supported here."
    )
    data: OfflineDataConfig

    @property
    def world_size(self) -> int:
        """Trainer processes: trainer.nnodes x trainer.n_gpus_per_node."""
        return self.trainer.nnodes * self.trainer.n_gpus_per_node

    @model_validator(mode="after")
    def _batch_splits_over_ranks(self) -> OfflineConfig:
        """Every process gets the same number of rows (FSDP's collectives need equal micro-batch counts)."""
        world, batch = self.world_size, self.data.train_batch_size
        if batch % world:
            problem = (
                f"data.train_batch_size: {batch} rows do not split evenly over {world} processes "
                f"(trainer.nnodes x trainer.n_gpus_per_node); make it a multiple of {world}"
            )
            raise PydanticCustomError(RULES_ERROR, problem, {"problems": [problem]})
        return self

    def to_dict(self) -> dict[str, Any]:
        """The config as plain nested data (JSON types); parsing it again gives an equal config."""
        return self.model_dump(mode="json")

    def validate_for_run(self) -> None:
        """Raise ConfigError when something only a real run needs is missing (model, training data)."""
        problems = []
        if not self.model.partial_pretrain:
            problems.append("model.partial_pretrain: required to run; set it to a Hugging Face model folder or hub id")
        if not self.data.train_files:
            problems.append("data.train_files: required to run; set it to a parquet file or URI (or a list of them)")
        if problems:
            raise ConfigError(problems)


class SftConfig(OfflineConfig):
    """`python -m hybridflow.trainer.fsdp_sft_trainer`: supervised fine-tuning on response tokens."""

    recipe: ClassVar[OfflineRecipe] = "sft"
    data: SftDataConfig = Field(default_factory=SftDataConfig, description="SFT data and batch sizes.")


class DpoConfig(OfflineConfig):
    """`python -m hybridflow.trainer.fsdp_dpo_trainer`: offline DPO / IPO from preference pairs."""

    recipe: ClassVar[OfflineRecipe] = "dpo"
    data: PreferenceDataConfig = Field(default_factory=PreferenceDataConfig, description="Preference data.")
    dpo: DpoLossConfig = Field(default_factory=DpoLossConfig, description="The DPO objective.")


ROOTS: dict[str, type[OfflineConfig]] = {"sft": SftConfig, "dpo": DpoConfig}


# ------------------------------------------------------------------------------------------ parsing


def parse_offline_config(mapping: Mapping[str, Any], recipe: OfflineRecipe) -> OfflineConfig:
    """Validate a mapping in the SFT or DPO config's shape; ConfigError lists every problem found."""
    root = ROOTS[recipe]
    if not isinstance(mapping, Mapping):
        raise ConfigError([f"<root>: expected a mapping of groups (data, model, optim, trainer), got {type(mapping).__name__}"])
    deep = yamlio.find_too_deep(mapping)
    if deep is not None:
        raise ConfigError([too_deep_problem(deep)])
    resolved, problems = resolve_tree(mapping, functools.partial(_schema_default, recipe))
    try:
        cfg = root.model_validate(resolved)
    except ValidationError as exc:
        broken = {p.split(": ", 1)[0] for p in problems}
        problems += [p for p in problems_from_validation_error(exc, root) if p.split(": ", 1)[0] not in broken]
    if problems:
        raise ConfigError([_with_recipe_hint(p, recipe) for p in problems])
    _resolve_default_dir(cfg)
    return cfg


#: Top-level groups of the other trainers' configs, and which trainer reads them.
_FOREIGN_GROUPS = {
    "dpo": "dpo", "algorithm": "ppo", "actor_rollout_ref": "ppo", "critic": "ppo", "reward_model": "ppo",
    "custom_reward_function": "ppo",
}
_TRAINERS = {
    "sft": "python -m hybridflow.trainer.fsdp_sft_trainer",
    "dpo": "python -m hybridflow.trainer.fsdp_dpo_trainer",
    "ppo": "python -m hybridflow.trainer.main_ppo",
}


def _with_recipe_hint(problem: str, recipe: OfflineRecipe) -> str:
    """An unknown top-level group that another trainer reads: say which one (a config run by the wrong trainer)."""
    key, _, rest = problem.partition(": ")
    owner = _FOREIGN_GROUPS.get(key)
    if owner is None or owner == recipe or not rest.startswith("unknown key"):
        return problem
    return (f"{key}: not a key of the {recipe} trainer ({_TRAINERS[recipe]}); it belongs to the {owner} trainer's "
            f"config ({_TRAINERS[owner]}; in an RLJob: spec.recipe: {owner}). Remove it, or run that trainer")


def load_offline_config(
    path: str | Path | None, overrides: Iterable[str] = (), recipe: OfflineRecipe = "sft"
) -> OfflineConfig:
    """Read a YAML file (None: the defaults), apply Hydra-style overrides and validate."""
    mapping: Any = {}
    if path is not None:
        try:
            mapping = yamlio.read_mapping(Path(path), "groups", file="config file")
        except yamlio.YamlError as exc:
            raise ConfigError([str(exc)]) from None
        if "apiVersion" in mapping and "kind" in mapping:
            raise ConfigError([
                f"{path}: this is a Kubernetes manifest, not a trainer config; run it with `rljob run -f {path}`, "
                "or pass the mapping under its spec.config"
            ])
    return parse_offline_config(apply_overrides(mapping, list(overrides), _raw_defaults(recipe)), recipe)


@functools.cache
def _raw_defaults(recipe: OfflineRecipe) -> dict[str, Any]:
    return ROOTS[recipe].model_construct().model_dump()


def _schema_default(recipe: OfflineRecipe, path: tuple[str, ...]) -> Any:
    """The default at a dotted path (what `${...}` may reference); KeyError when the schema has no such key."""
    node: Any = _raw_defaults(recipe)
    for part in path:
        if not isinstance(node, dict) or part not in node:
            raise KeyError(path)
        node = node[part]
    return node


def _resolve_default_dir(cfg: OfflineConfig) -> None:
    """Resolve `${...}` in the default checkpoint folder (`checkpoints/${trainer.project_name}/...`)."""
    resolved, problems = resolve_tree(cfg.model_dump())
    if problems:
        raise ConfigError(problems)
    object.__setattr__(cfg.trainer, "default_local_dir", resolved["trainer"]["default_local_dir"])
