"""Config groups for off-policy work: `async_training` (verl's fully-async / one-step-off keys) and
`algorithm.rollout_correction` (verl's importance sampling and rejection sampling of rollout samples)."""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import Field, field_validator

from .common import Section

RS_AGGREGATIONS = ("token", "seq_sum", "seq_mean", "seq_max")
RS_STATISTICS = ("k1", "k2", "k3")
_RANGE = re.compile(r"^\s*([0-9.eE+-]+)_([0-9.eE+-]+)\s*$")


class AsyncTrainingConfig(Section):
    """Asynchronous RL: the rollout replicas generate the next samples while the trainer updates.

    verl ships these as separate recipes (one_step_off_policy, fully_async_policy) reading the same
    `async_training.*` keys; here one config key picks the mode and `python -m
    hybridflow.trainer.one_step_off_main` / `hybridflow.trainer.fully_async_main` set it for you.
    """

    mode: Literal["sync", "one_step_off", "fully_async"] = Field(
        default="sync",
        description="HybridFlow addition (verl picks the recipe by entry point): sync trains on fresh samples "
        "each step; one_step_off generates step k+1's batch with the weights of step k-1 while step k trains "
        "(staleness 1, whole batches); fully_async streams whole groups into a bounded queue (staleness_threshold, "
        "partial_rollout). Both need actor_rollout_ref.rollout.mode=async and trainer.placement=split.",
    )
    staleness_threshold: float | None = Field(
        default=None,
        ge=0,
        description="How far the rollout may run ahead, as a fraction of one sync window's samples (verl's "
        "freshness control): between two weight syncs at most (1 + staleness_threshold) x trigger_parameter_sync_step "
        "x train_batch_size groups are started. 0 is on-policy; 1 is one step off. null: 1 in one_step_off, 0.5 "
        "in fully_async.",
    )
    trigger_parameter_sync_step: int = Field(
        default=1, ge=1, description="Actor updates between two weight pushes to the rollout replicas."
    )
    require_batches: int | None = Field(
        default=None,
        ge=1,
        description="verl: mini-batches the trainer takes at once. Here a step takes data.train_batch_size "
        "prompts (whole groups); when set it must equal train_batch_size / actor.ppo_mini_batch_size.",
    )
    partial_rollout: bool = Field(
        default=False,
        description="fully_async: at a weight push, pause the generations in flight and continue them with the "
        "new weights (every token keeps the version that produced it) instead of waiting for them to finish.",
    )
    use_rollout_log_probs: bool | None = Field(
        default=None,
        description="Use the rollout's log-probs as the PPO anchor (verl's bypass mode); the same as "
        "algorithm.rollout_correction.bypass_mode (set one). null: false, the decoupled mode.",
    )
    max_staleness: int | None = Field(
        default=None,
        ge=0,
        description="HybridFlow addition: a group whose oldest token is more than this many policy versions "
        "behind the trainer is dropped and its prompt generated again. null: max(1, ceil(staleness_threshold)) x "
        "trigger_parameter_sync_step.",
    )

    @property
    def enabled(self) -> bool:
        """Whether training is asynchronous."""
        return self.mode != "sync"

    @property
    def effective_staleness_threshold(self) -> float:
        """The threshold in force: the one set, else the mode's default."""
        if self.staleness_threshold is not None:
            return float(self.staleness_threshold)
        return 1.0 if self.mode == "one_step_off" else 0.5

    @property
    def effective_max_staleness(self) -> int:
        """The version lag beyond which a group is regenerated."""
        if self.max_staleness is not None:
            return int(self.max_staleness)
        return max(1, math.ceil(self.effective_staleness_threshold)) * self.trigger_parameter_sync_step


def parse_threshold(value: float | str) -> tuple[float | None, float]:
    """A threshold spec: a float (upper bound) or verl's 'lower_upper' string; returns (lower or None, upper)."""
    if isinstance(value, (int, float)):
        return None, float(value)
    text = str(value).strip()
    match = _RANGE.match(text)
    if match:
        return float(match.group(1)), float(match.group(2))
    return None, float(text)


class RolloutCorrectionConfig(Section):
    """verl's `algorithm.rollout_correction`: correct for samples drawn by a policy other than the one trained
    (engine/trainer mismatch, stale asynchronous samples) with importance weights and rejection masks.

    Decoupled mode (bypass_mode=false) keeps three policies: the trainer recomputes pi_old, the weights are
    pi_old / pi_rollout. Bypass mode uses the rollout's log-probs as pi_old, so the PPO ratio itself is the
    correction (Liu, Li et al. 2025, "When Speed Kills Stability", https://richardli.xyz/rl-collapse).
    """

    rollout_is: Literal["token", "sequence"] | None = Field(
        default=None, description="Importance weights per token, per sequence (product of ratios), or none."
    )
    rollout_is_threshold: float | str = Field(
        default=2.0,
        description="Upper truncation of the weights (TIS), or 'lower_upper' (IcePop: weights outside are 0).",
    )
    rollout_is_batch_normalize: bool = Field(default=False, description="Scale the weights to mean 1 per batch.")
    rollout_rs: str | None = Field(
        default=None,
        description="Rejection sampling: comma-separated {token,seq_sum,seq_mean,seq_max}_{k1,k2,k3} options; "
        "rejected tokens or sequences leave the loss (response_mask 0).",
    )
    rollout_rs_threshold: float | str | None = Field(
        default=None,
        description="One threshold per rollout_rs option (comma-separated; one is broadcast): 'lower_upper' "
        "ratio bounds for k1, an upper bound for k2/k3.",
    )
    bypass_mode: bool | None = Field(
        default=None,
        description="Use the rollout's log-probs as pi_old and skip the trainer's recomputation (the PPO clip "
        "then also limits how far the update may move from a stale behaviour policy). null: "
        "async_training.use_rollout_log_probs, else false (decoupled: the trainer recomputes pi_old).",
    )
    loss_type: Literal["ppo_clip", "reinforce"] = Field(
        default="ppo_clip", description="Loss in bypass mode; only ppo_clip is built here."
    )

    @field_validator("rollout_is_threshold")
    @classmethod
    def _threshold(cls, value: float | str) -> float | str:
        try:
            lower, upper = parse_threshold(value)
        except ValueError:
            raise ValueError(f"must be a number or 'lower_upper' such as '0.5_5.0', got {value!r}") from None
        if upper <= 0 or (lower is not None and not 0 <= lower < upper):
            raise ValueError(f"needs 0 <= lower < upper and upper > 0, got {value!r}")
        return value

    @property
    def enabled(self) -> bool:
        """Whether weights or masks are computed (otherwise only diagnostics are logged)."""
        return self.rollout_is is not None or bool(self.rollout_rs)

    def rs_options(self) -> list[tuple[str, str, float | None, float]]:
        """The rejection options as (aggregation, statistic, lower, upper); raises ValueError naming the fix."""
        if not self.rollout_rs:
            return []
        names = [n.strip() for n in self.rollout_rs.split(",") if n.strip()]
        if self.rollout_rs_threshold is None:
            raise ValueError("rollout_rs_threshold: needed when rollout_rs is set (e.g. '0.5_2.0' for k1, 2.5 for k2)")
        specs = [s.strip() for s in str(self.rollout_rs_threshold).split(",") if s.strip()]
        if len(specs) == 1:
            specs = specs * len(names)
        if len(specs) != len(names):
            raise ValueError(
                f"rollout_rs_threshold: {len(specs)} thresholds for {len(names)} rollout_rs options; give one, "
                "or one per option"
            )
        out = []
        for name, spec in zip(names, specs, strict=True):
            agg, _, stat = name.rpartition("_")
            if agg not in RS_AGGREGATIONS or stat not in RS_STATISTICS or (agg == "seq_max" and stat == "k1"):
                valid = [f"{a}_{s}" for a in RS_AGGREGATIONS for s in RS_STATISTICS if (a, s) != ("seq_max", "k1")]
                raise ValueError(f"rollout_rs: unknown option {name!r}; valid: {', '.join(valid)}")
            try:
                lower, upper = parse_threshold(spec)
            except ValueError:
                raise ValueError(f"rollout_rs_threshold: {spec!r} is not a number or 'lower_upper'") from None
            if stat == "k1":
                lower = 1.0 / upper if lower is None else lower
                if not 0 < lower < 1 < upper:
                    raise ValueError(f"rollout_rs_threshold: k1 ratio bounds need 0 < lower < 1 < upper, got {spec!r}")
            elif lower is not None or upper <= 0:
                raise ValueError(f"rollout_rs_threshold: {stat} takes one positive upper bound, got {spec!r}")
            out.append((agg, stat, lower, upper))
        return out
