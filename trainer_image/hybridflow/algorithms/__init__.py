"""RL math for HybridFlow: pure torch, no Ray; names and arguments follow verl's ``core_algos``.

``from hybridflow.algorithms import get_adv_estimator_fn, get_policy_loss_fn, agg_loss, kl_penalty``.
``hybridflow.algorithms.core_algos`` re-exports the same names for code ported from
``verl.trainer.ppo.core_algos``.
"""

from .advantages import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    PreferencePairs,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_online_dpo_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator_fn,
    preference_pairs,
    register_adv_est,
)
from .advantages_more import (
    compute_gdpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from .aggregation import LOSS_AGG_MODES, agg_loss
from .controllers import KL_CTRL_TYPES, AdaptiveKLController, FixedKLController, get_kl_controller
from .dapo import GroupFilterResult, compute_overlong_penalty, filter_groups
from .kl import KL_PENALTIES, apply_kl_penalty, compute_rewards, kl_penalty, kl_penalty_forward
from .policy_loss import (
    POLICY_LOSS_REGISTRY,
    compute_policy_loss_cispo,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    register_policy_loss,
)
from .policy_loss_more import (
    compute_policy_loss_bypass_mode,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_kl_cov,
    compute_policy_loss_reinforce,
    compute_policy_loss_sapo,
    compute_policy_loss_up,
)
from .torch_functional import (
    clip_by_value,
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from .value import compute_entropy_loss, compute_value_loss

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "KL_CTRL_TYPES",
    "KL_PENALTIES",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "FixedKLController",
    "GroupFilterResult",
    "PreferencePairs",
    "agg_loss",
    "apply_kl_penalty",
    "clip_by_value",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_online_dpo_advantage",
    "compute_opo_outcome_advantage",
    "compute_overlong_penalty",
    "compute_policy_loss_cispo",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_value_loss",
    "entropy_from_logits",
    "filter_groups",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "preference_pairs",
    "kl_penalty_forward",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "register_adv_est",
    "register_policy_loss",
    "compute_gdpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_up",
]
