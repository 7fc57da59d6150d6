"""Known names shared by the config validators, the operator and the algorithm registries.

Each set is written once as a `Literal` type (used by the pydantic models, so a wrong name is
rejected with the list of valid ones) and exported as a plain tuple. No torch, no Ray: anything may
import this cheaply. The spellings follow verl's, so a verl user's overrides keep working.
"""

from __future__ import annotations

from typing import Literal, get_args

AdvEstimator = Literal[
    "gae", "grpo", "rloo", "remax", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo", "gpg",
    "online_dpo", "grpo_passk", "gdpo", "grpo_vectorized", "rloo_vectorized", "gae_vectorized",
    "optimal_token_baseline", "tir_optimal_token_baseline",
]
PolicyLoss = Literal[
    "vanilla", "gspo", "gpg", "cispo", "sapo", "geo_mean", "clip_cov", "kl_cov", "up", "dppo_tv", "dppo_kl", "dro",
    "bypass_mode",
]
KlPenalty = Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k2+", "k3+", "low_var_kl+"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
RolloutName = Literal["vllm", "sglang", "hf"]
SERVER_ROLLOUT_NAMES = ("vllm", "sglang")
"""Engines with server replicas (`rollout.mode=async`); `hybridflow.rollout.SERVER_ENGINES` holds their classes."""
TOOL_CALL_FORMATS = ("hermes", "gpt-oss", "qwen3_coder")
"""Tool-call formats (`multi_turn.format`), verl's tool-parser names; `hybridflow.agent.tool_parser.PARSERS` holds
their parsers. verl configs' `qwen` is read as `hermes` (`_config/verl_compat.py`)."""
LoggerName = Literal["console", "file", "tensorboard", "wandb", "prometheus", "mlflow"]
RewardManager = Literal["naive", "dapo", "batch", "prime"]
FilterGroupMetric = Literal["acc", "score", "seq_reward", "seq_final_reward"]

ADV_ESTIMATORS: tuple[str, ...] = get_args(AdvEstimator)
"""Advantage estimators (`algorithm.adv_estimator`)."""

GROUP_ESTIMATORS: tuple[str, ...] = (
    "grpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline", "online_dpo", "grpo_passk", "gdpo",
    "grpo_vectorized", "rloo_vectorized",
)
"""Estimators whose baseline comes from the other responses to the same prompt: need `rollout.n > 1`."""

SUM_PI_SQUARED_ESTIMATORS: tuple[str, ...] = ("optimal_token_baseline", "tir_optimal_token_baseline")
"""Estimators that read the actor's sum of pi^2 per token: need `actor.calculate_sum_pi_squared=true`."""

POLICY_LOSSES: tuple[str, ...] = get_args(PolicyLoss)
"""Policy losses (`actor_rollout_ref.actor.policy_loss.loss_mode`)."""

KL_PENALTIES: tuple[str, ...] = get_args(KlPenalty)
"""KL estimators (`algorithm.kl_penalty`, `actor_rollout_ref.actor.kl_loss_type`)."""

LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)
"""How a per-token loss is reduced to a scalar (`loss_agg_mode`)."""

ROLLOUT_NAMES: tuple[str, ...] = get_args(RolloutName)
"""Rollout engines (`actor_rollout_ref.rollout.name`); `hf` is plain `generate`, for machines without either."""

LOGGERS: tuple[str, ...] = get_args(LoggerName)
"""Experiment loggers (`trainer.logger`); `file` writes JSON lines, as in verl."""

REWARD_MANAGERS: tuple[str, ...] = get_args(RewardManager)
"""Reward managers (`reward_model.reward_manager`)."""

FILTER_GROUP_METRICS: tuple[str, ...] = get_args(FilterGroupMetric)
"""Per-response metrics DAPO dynamic sampling can filter groups on (`algorithm.filter_groups.metric`)."""
