"""Config group `distillation`: on-policy distillation from a frozen teacher, in verl's keys (verl's docs/algo/opd.md).

Built here: one teacher (`teacher_models.teacher_model`), loaded from its Hugging Face folder as a frozen FSDP
group on the trainer's devices (like the reference policy), and verl's policy-gradient variant (PG OPD,
`use_policy_gradient=true`): minus the per-token divergence is the advantage. Not built: verl's served teacher
pool (`nnodes` > 0), several teachers routed by `teacher_key`, GKD OPD (`use_policy_gradient=false`) and the
top-k losses; each is refused by `check` with what to set instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from pydantic import Field

from . import verl_features
from .common import Section

if TYPE_CHECKING:
    from .root import HybridFlowConfig

DistillationLossMode = Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]
DISTILLATION_LOSS_MODES: tuple[str, ...] = get_args(DistillationLossMode)
"""Single-sample estimators of KL(student || teacher) (`distillation.distillation_loss.loss_mode`); kept equal to
hybridflow.algorithms.distillation.DISTILLATION_LOSS_MODES (a unit test checks it)."""

PG_LOSS_MODES: tuple[str, ...] = ("k1", "kl")
"""The loss modes whose negative is an unbiased per-token reward for the reverse KL (policy-gradient OPD)."""

KEY = "distillation"
LOSS = f"{KEY}.distillation_loss"
TEACHER = "teacher_model"


class DistillationLossConfig(Section):
    """How the teacher's log-probs become the training signal (verl's DistillationLossConfig)."""

    loss_mode: DistillationLossMode = Field(
        default="k3",
        description="Per-token estimator D_t of KL(student || teacher) from the two log-probs of the sampled token: "
        "k1 (kl) = log pi - log nu, abs, k2 (mse), k3 (low_var_kl), verl's names. The advantage is -D_t, for which "
        "only k1 is right (its policy gradient is the reverse KL's; verl's PG recipes use it): the others serve "
        "GKD's supervised loss, not built here, and are refused with use_policy_gradient=true.",
    )
    topk: int | None = Field(
        default=32, ge=1, description="verl's k of its top-k losses (forward_kl_topk), which are not built here."
    )
    use_task_rewards: bool = Field(
        default=True,
        description="true: the estimator's task advantages plus -distillation_loss_coef x D_t; false: -D_t alone (the "
        "task reward is still computed and logged as critic/score, but trains nothing).",
    )
    distillation_loss_coef: float = Field(
        default=1.0, ge=0, description="Weight of -D_t beside the task advantages (use_task_rewards=true only)."
    )
    loss_max_clamp: float | None = Field(
        default=None, gt=0, description="Clamp D_t to [-clamp, clamp] per token; null: no clamp (verl's recipes: 10)."
    )
    log_prob_min_clamp: float | None = Field(
        default=None,
        le=0,
        description="Floor both log-probs at this value before D_t (a token the teacher all but rules out would "
        "otherwise dominate the batch); null: no floor (verl's recipes: -10).",
    )
    use_policy_gradient: bool = Field(
        default=False,
        description="true (PG OPD, Thinking Machines 2025): -D_t as the per-token advantage of the PPO loss, the "
        "variant built here. false (GKD OPD, Agarwal et al. 2024: D_t back-propagated as a supervised loss) is "
        "verl's default and not built here: set true.",
    )
    policy_loss_mode: Literal["vanilla"] = Field(
        default="vanilla", description="Policy loss that applies -D_t: vanilla PPO clipping, as in verl."
    )
    clip_ratio: float | None = Field(
        default=None, gt=0, description="PPO clip range of the distillation term; null: the actor's clip_ratio."
    )
    clip_ratio_low: float | None = Field(
        default=None, gt=0, description="Lower clip range; null: the actor's clip_ratio_low."
    )
    clip_ratio_high: float | None = Field(
        default=None, gt=0, description="Upper clip range; null: the actor's clip_ratio_high."
    )


class DistillationTeacherModelConfig(Section):
    """One teacher (verl's DistillationTeacherModelConfig); it must share the student's tokenizer.

    verl's `inference.*` (the teacher's server) and `num_replicas` are accepted with a start-up note (see
    verl_features): the teacher here is one frozen FSDP group, sharded and micro-batched like the reference
    policy (`actor_rollout_ref.ref.fsdp_config`, `log_prob_micro_batch_size_per_gpu`, dynamic batch settings).
    """

    key: str | None = Field(
        default=None, description="Value of distillation.teacher_key routed to this teacher (several teachers only)."
    )
    model_path: str | None = Field(
        default=None,
        description="The teacher's Hugging Face folder, hub id or checkpoint `huggingface/` folder. Required when "
        "distillation.enabled; its vocabulary must be the student's.",
    )


def _one_teacher() -> dict[str, DistillationTeacherModelConfig]:
    return {TEACHER: DistillationTeacherModelConfig()}


class DistillationConfig(Section):
    """On-policy distillation: the teacher scores the student's samples token by token (verl's DistillationConfig)."""

    enabled: bool = Field(default=False, description="Turn on-policy distillation on.")
    n_gpus_per_node: int = Field(
        default=8, ge=0, description="verl: GPUs per node of a separate teacher pool; no effect while nnodes=0."
    )
    nnodes: int = Field(
        default=0,
        ge=0,
        description="verl: nodes of a separate teacher pool. 0: the teacher shares the trainer's devices (colocated, "
        "like the reference policy), the only placement built here.",
    )
    teacher_key: str = Field(
        default="data_source", description="Sample field that routes to a teacher (several teachers only)."
    )
    teacher_models: dict[str, DistillationTeacherModelConfig] = Field(
        default_factory=_one_teacher,
        description="The teacher, under verl's entry name teacher_model (one teacher is built here).",
    )
    distillation_loss: DistillationLossConfig = Field(
        default_factory=DistillationLossConfig, description="How the teacher's log-probs become the signal."
    )

    @property
    def teacher(self) -> DistillationTeacherModelConfig:
        """The single teacher's settings (the first entry when a config names it otherwise)."""
        return next(iter(self.teacher_models.values()), DistillationTeacherModelConfig())

    @property
    def replaces_task_advantages(self) -> bool:
        """Whether -D_t alone trains the student (enabled, use_task_rewards=false): no estimator output is read."""
        return self.enabled and not self.distillation_loss.use_task_rewards

    @property
    def teacher_path_key(self) -> str:
        """The dotted key of the teacher's model_path, for messages."""
        name = next(iter(self.teacher_models), TEACHER)
        return f"{KEY}.teacher_models.{name}.model_path"


def check(cfg: HybridFlowConfig) -> list[str]:
    """Cross-field problems of an enabled distillation group: what is not built, and settings that contradict."""
    d = cfg.distillation
    if not d.enabled:
        return []
    loss, actor, out = d.distillation_loss, cfg.actor_rollout_ref.actor, []
    if not loss.use_policy_gradient:
        out.append(f"{LOSS}.use_policy_gradient: {verl_features.DISTILL_GKD.message}")
    elif loss.loss_mode not in PG_LOSS_MODES:
        # E_pi[-D(y) grad log pi(y)] = -grad KL(pi || nu) for k1 only; for k3 it is -grad KL(pi || nu) + grad
        # KL(nu || pi), which can point away from the teacher (tests/unit/test_algorithms_distillation.py).
        out.append(
            f"{LOSS}.loss_mode: {loss.loss_mode} as a per-token reward does not follow the reverse KL (only k1's "
            f"policy gradient is the gradient of KL(student || teacher)); set loss_mode=k1, as verl's policy-gradient "
            "recipes do"
        )
    if d.nnodes > 0:
        out.append(f"{KEY}.nnodes: {verl_features.DISTILL_POOL.message}")
    if len(d.teacher_models) != 1:
        names = ", ".join(d.teacher_models) or "none"
        out.append(f"{KEY}.teacher_models: {verl_features.MULTI_TEACHER.message} (got {names})")
    for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        own, actors = getattr(loss, name), getattr(actor, name)
        if own is not None and own != actors:
            out.append(
                f"{LOSS}.{name}: {own} differs from actor_rollout_ref.actor.{name}={actors}; one PPO loss applies the "
                f"task and the distillation advantages here, so set both to the same value (or remove {LOSS}.{name})"
            )
    if actor.policy_loss.loss_mode != "vanilla":
        out.append(
            f"actor_rollout_ref.actor.policy_loss.loss_mode: distillation's per-token advantages need the vanilla PPO "
            f"loss (verl's {LOSS}.policy_loss_mode), got {actor.policy_loss.loss_mode}; set it to vanilla"
        )
    if not loss.use_task_rewards:
        dropped = f"{LOSS}.use_task_rewards=false trains on the teacher's signal alone"
        if cfg.algorithm.use_kl_in_reward:
            out.append(
                f"algorithm.use_kl_in_reward: {dropped}, so a KL penalty in the task reward has no effect; set "
                "use_kl_in_reward=false (actor.use_kl_loss still keeps the student near the reference), or "
                "use_task_rewards=true"
            )
        if cfg.critic_enabled:
            out.append(
                f"critic.enable: {dropped}, so the critic's values would train nothing; use a critic-free estimator "
                "(algorithm.adv_estimator=grpo, as verl's distillation recipes) or use_task_rewards=true"
            )
    return out


def check_runnable(cfg: HybridFlowConfig) -> list[str]:
    """The teacher's model folder, which a run needs and nothing defaults."""
    d = cfg.distillation
    if d.enabled and not d.teacher.model_path:
        return [
            f"{d.teacher_path_key}: required when distillation.enabled is true; set it to the teacher's Hugging Face "
            "folder or hub id (it must use the student's tokenizer), or set distillation.enabled=false"
        ]
    return []
