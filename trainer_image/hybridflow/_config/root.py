"""HybridFlowConfig: the whole trainer config, with derived values filled in and cross-field rules."""

from __future__ import annotations

from typing import Any

from pydantic import (
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from . import rules, verl_compat
from .async_training import AsyncTrainingConfig
from .common import Section
from .distillation import DistillationConfig
from .errors import RULES_ERROR, ConfigError, problems_from_validation_error
from .groups import AlgorithmConfig, CustomRewardFunction, DataConfig, TrainerConfig
from .interpolation import has_reference, resolve_tree
from .profiler import GlobalProfilerConfig
from .workers import ActorRolloutRefConfig, CriticConfig, RewardModelConfig


class HybridFlowConfig(Section):
    """The HybridFlow trainer config, in verl's nested shape and key names."""

    # Whole-config rules run once at construction; assigning to a group must not re-run them all.
    model_config = ConfigDict(extra="forbid", validate_assignment=False, coerce_numbers_to_str=True)

    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="RL algorithm.")
    data: DataConfig = Field(default_factory=DataConfig, description="Data and batch sizes.")
    actor_rollout_ref: ActorRolloutRefConfig = Field(
        default_factory=ActorRolloutRefConfig, description="Policy model; actor, rollout and reference roles."
    )
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Value model (GAE).")
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig, description="Reward scoring.")
    custom_reward_function: CustomRewardFunction = Field(
        default_factory=CustomRewardFunction, description="User reward function."
    )
    trainer: TrainerConfig = Field(
        default_factory=TrainerConfig, description="Run, cluster, logging, checkpoints."
    )
    async_training: AsyncTrainingConfig = Field(
        default_factory=AsyncTrainingConfig, description="Asynchronous (off-policy) training: verl's async_training."
    )
    distillation: DistillationConfig = Field(
        default_factory=DistillationConfig, description="On-policy distillation from a frozen teacher: verl's keys."
    )
    global_profiler: GlobalProfilerConfig = Field(
        default_factory=GlobalProfilerConfig, description="Profiling: which steps, which tool, where traces go."
    )

    _verl_notes: list[str] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _translate_verl_keys(cls, data: Any, handler: ModelWrapValidatorHandler[HybridFlowConfig]) -> HybridFlowConfig:
        """Read verl's aliases, deprecated keys and accepted no-op keys first (see verl_compat); keep the notes."""
        if not isinstance(data, dict):
            return handler(data)
        translation = verl_compat.translate(data)
        problems = translation.problems
        try:
            cfg = handler(translation.mapping)
        except ValidationError as exc:
            if not problems:
                raise
            problems = problems + problems_from_validation_error(exc, cls)
        if problems:  # every problem at once: the translation's and validation's
            raise PydanticCustomError(RULES_ERROR, "\n".join(problems), {"problems": problems})
        cfg._verl_notes = translation.notes
        return cfg

    def __eq__(self, other: object) -> bool:
        """Equal when the settings are: the notes describe how the input was spelled, not the config."""
        if not isinstance(other, HybridFlowConfig):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # mutable, like every pydantic model

    @property
    def verl_notes(self) -> list[str]:
        """What the verl spellings of this config did: keys accepted without effect, deprecated keys converted."""
        return list(self._verl_notes)

    @model_validator(mode="before")
    @classmethod
    def _move_top_level_ray_init(cls, data: Any) -> Any:
        """Accept verl's top-level `ray_init` group as `trainer.ray_init` (one place for one fact)."""
        if not isinstance(data, dict) or "ray_init" not in data:
            return data
        data = dict(data)
        ray_init = data.pop("ray_init")
        trainer = data.get("trainer")
        if trainer is None:
            trainer = {}
        if not isinstance(trainer, dict):
            return data  # the trainer group's own type error is reported
        if "ray_init" in trainer:
            raise PydanticCustomError(
                RULES_ERROR,
                "ray_init given twice",
                {"problems": ["ray_init: also set as trainer.ray_init; keep only one of the two"]},
            )
        data["trainer"] = {**trainer, "ray_init": ray_init}
        return data

    @model_validator(mode="after")
    def _derive_and_check(self) -> HybridFlowConfig:
        """Fill in values that default to other keys, then check every cross-field rule at once."""
        _fill_derived(self)
        problems = _resolve_default_references(self)
        problems += rules.check(self)
        if problems:
            raise PydanticCustomError(RULES_ERROR, "\n".join(problems), {"problems": problems})
        return self

    @property
    def world_size(self) -> int:
        """Trainer ranks in the cluster: trainer.nnodes x trainer.n_gpus_per_node."""
        return self.trainer.nnodes * self.trainer.n_gpus_per_node

    @property
    def critic_enabled(self) -> bool:
        """Whether a critic is trained: critic.enable, or (when null) whether the estimator is gae."""
        if self.critic.enable is not None:
            return self.critic.enable
        return self.algorithm.adv_estimator in ("gae", "gae_vectorized")

    @property
    def ref_enabled(self) -> bool:
        """Whether a reference policy is needed: a KL loss, a KL penalty in the reward, or online DPO."""
        return (
            self.actor_rollout_ref.actor.use_kl_loss
            or self.algorithm.use_kl_in_reward
            or self.algorithm.adv_estimator == "online_dpo"
        )

    def to_dict(self) -> dict[str, Any]:
        """The config as plain nested data (JSON types); `parse_config` of it gives an equal config."""
        return self.model_dump(mode="json")

    def validate_for_run(self) -> None:
        """Raise ConfigError when something only a real run needs is missing (model path, data)."""
        problems = rules.check_runnable(self)
        if problems:
            raise ConfigError(problems)


def _fill_derived(cfg: HybridFlowConfig) -> None:
    """Replace nulls that mean "same as another key" (verl writes these as `${...}` references)."""
    arr = cfg.actor_rollout_ref
    actor, ref, rollout, critic = arr.actor, arr.ref, arr.rollout, cfg.critic
    _default(actor, "clip_ratio_low", actor.clip_ratio)
    _default(actor, "clip_ratio_high", actor.clip_ratio)
    _default(arr.model, "tokenizer_path", arr.model.path)
    _default(ref, "strategy", actor.strategy)
    _default(ref, "ulysses_sequence_parallel_size", actor.ulysses_sequence_parallel_size)
    for role in (ref, rollout):
        _default(role, "log_prob_use_dynamic_bsz", actor.use_dynamic_bsz)
        _default(role, "log_prob_max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu)
    _default(rollout, "prompt_length", cfg.data.max_prompt_length)
    _default(rollout, "response_length", cfg.data.max_response_length)
    _default(critic.model, "path", arr.model.path)
    _default(critic.model, "tokenizer_path", arr.model.path)
    for name in ("ppo_mini_batch_size", "use_dynamic_bsz", "ppo_epochs", "shuffle", "loss_agg_mode"):
        _default(critic, name, getattr(actor, name))
    _default(cfg.reward_model, "forward_max_token_len_per_gpu", critic.ppo_max_token_len_per_gpu)
    _default(critic, "forward_max_token_len_per_gpu", critic.ppo_max_token_len_per_gpu)
    _default(ref, "use_torch_compile", actor.use_torch_compile)
    correction, async_cfg = cfg.algorithm.rollout_correction, cfg.async_training
    _default(correction, "bypass_mode", bool(async_cfg.use_rollout_log_probs))
    _default(rollout, "calculate_log_probs", async_cfg.enabled or correction.enabled or bool(correction.bypass_mode))
    _route_bypass_loss(actor.policy_loss, correction)


def _route_bypass_loss(policy_loss: Any, correction: Any) -> None:
    """verl's apply_bypass_mode: bypass mode with rollout correction or REINFORCE uses the bypass_mode loss, which
    reads the correction settings from the actor's policy_loss (other losses keep the rollout's log-probs as pi_old)."""
    if correction.bypass_mode and (correction.enabled or correction.loss_type == "reinforce"):
        if policy_loss.loss_mode == "vanilla":
            object.__setattr__(policy_loss, "loss_mode", "bypass_mode")
    if policy_loss.loss_mode == "bypass_mode" and policy_loss.rollout_correction is None:  # a given one is checked
        object.__setattr__(policy_loss, "rollout_correction", correction.model_copy())


def _default(section: Section, name: str, value: Any) -> None:
    """Set `section.name` to `value` if it is null (without re-validating the section)."""
    if getattr(section, name) is None:
        object.__setattr__(section, name, value)


def _resolve_default_references(cfg: HybridFlowConfig) -> list[str]:
    """Resolve `${...}` left in string values (defaults such as trainer.default_local_dir)."""
    if not has_reference(cfg.trainer.default_local_dir):
        return []
    resolved, problems = resolve_tree(cfg.model_dump())
    object.__setattr__(cfg.trainer, "default_local_dir", resolved["trainer"]["default_local_dir"])
    return problems
