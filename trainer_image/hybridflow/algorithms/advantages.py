"""Advantage estimators behind one registry (``register_adv_est`` / ``get_adv_estimator_fn``).

Every estimator has the same signature: it accepts the whole keyword set ``token_level_rewards,
response_mask, index, epsilon, norm_adv_by_std_in_grpo, config, values, reward_baselines, gamma,
lam, old_log_probs, ref_log_prob`` (plus ``**kwargs``) and returns ``(advantages, returns)``, both
``(bs, response_length)`` and zero outside ``response_mask``. ``index`` holds one group id (the prompt's uid) per sample, as a
numpy array like verl's ``non_tensor_batch["uid"]``. Explicit arguments win over ``config``
(the ``algorithm`` config: ``gamma``, ``lam``, ``norm_adv_by_std_in_grpo``). Call by keyword.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import torch

from ._compat import cfg_get, lookup, register_in
from .torch_functional import masked_whiten

AdvEstimatorFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


class AdvantageEstimator(str, Enum):
    """Names of the built-in advantage estimators (``algorithm.adv_estimator``)."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GPG = "gpg"
    ONLINE_DPO = "online_dpo"
    GRPO_PASSK = "grpo_passk"
    GRPO_VECTORIZED = "grpo_vectorized"
    RLOO_VECTORIZED = "rloo_vectorized"
    GAE_VECTORIZED = "gae_vectorized"
    GDPO = "gdpo"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"


ADV_ESTIMATOR_REGISTRY: dict[str, AdvEstimatorFn] = {}


def register_adv_est(name_or_enum: str | AdvantageEstimator) -> Callable[[AdvEstimatorFn], AdvEstimatorFn]:
    """Decorator: register an advantage estimator under a name (a string or an ``AdvantageEstimator``)."""
    name = name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum

    def decorator(fn: AdvEstimatorFn) -> AdvEstimatorFn:
        register_in(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name, fn)
        return fn

    return decorator


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> AdvEstimatorFn:
    """Return the estimator registered under ``name_or_enum``; unknown names raise listing the valid ones."""
    return lookup(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name_or_enum, "algorithm.adv_estimator")


# ----------------------------------------------------------------------------- helpers


def _work_dtype(t: torch.Tensor) -> torch.dtype:
    """fp32 for half-precision inputs (group statistics in bf16 are too coarse), else the input dtype."""
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


def _check_shapes(name: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> None:
    if token_level_rewards.dim() != 2 or token_level_rewards.shape != response_mask.shape:
        raise ValueError(
            f"{name}: token_level_rewards and response_mask must both be (bs, response_length); got "
            f"{tuple(token_level_rewards.shape)} and {tuple(response_mask.shape)}."
        )


def _group_ids(name: str, index: Any, bsz: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Map each sample's group id (uid) to 0..n_groups-1."""
    if index is None:
        raise ValueError(
            f"{name} needs `index`: one group id (the prompt uid) per sample, e.g. "
            "batch.non_tensor_batch['uid']. Repeat each prompt rollout.n times with the same uid."
        )
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    ids = np.asarray(index)
    if ids.shape[0] != bsz:
        raise ValueError(f"{name}: index has {ids.shape[0]} entries but the batch has {bsz} samples.")
    uniques, inverse = np.unique(ids, return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device), len(uniques)


def _group_sum(x: torch.Tensor, group: torch.Tensor, n_groups: int) -> torch.Tensor:
    return torch.zeros(n_groups, dtype=x.dtype, device=x.device).index_add_(0, group, x)


def _group_mean_std(scores: torch.Tensor, group: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, ...]:
    """Per-sample group mean, unbiased std and group size; a group of one gets mean 0 and std 1 (as verl)."""
    count = _group_sum(torch.ones_like(scores), group, n_groups)
    mean = _group_sum(scores, group, n_groups) / count
    sq_dev = _group_sum((scores - mean[group]) ** 2, group, n_groups)
    std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[group], std[group], count[group]


def _outcome(adv: torch.Tensor, response_mask: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Broadcast one advantage per sequence over its valid tokens; returns equal the advantages."""
    out = (adv.unsqueeze(-1) * response_mask.to(adv.dtype)).to(like.dtype)
    return out, out


# ----------------------------------------------------------------------------- estimators


@register_adv_est(AdvantageEstimator.GAE)
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float | None = None,
    lam: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages (whitened over the mask) and returns = GAE + values, for PPO with a critic."""
    _check_shapes("gae", token_level_rewards, response_mask)
    if values is None:
        raise ValueError("gae needs `values` from the critic; enable the critic or pick a critic-free estimator.")
    gamma = float(gamma if gamma is not None else cfg_get(config, "gamma", 1.0))
    lam = float(lam if lam is not None else cfg_get(config, "lam", 1.0))
    dtype = _work_dtype(token_level_rewards)
    rewards, vals, mask = token_level_rewards.to(dtype), values.to(dtype), response_mask.to(dtype)
    bsz, length = rewards.shape
    next_value = torch.zeros(bsz, dtype=dtype, device=rewards.device)
    last_gae = torch.zeros_like(next_value)
    adv = torch.zeros_like(rewards)
    for t in reversed(range(length)):
        # GAE: Schulman et al. 2015 (arXiv 1506.02438), delta_t = r_t + gamma V_{t+1} - V_t,
        # A_t = delta_t + gamma lam A_{t+1}. Tokens outside the mask (padding, tool output in
        # multi-turn) are skipped: value and running GAE carry over them unchanged.
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        gae_t = delta + gamma * lam * last_gae
        m = mask[:, t]
        next_value = m * vals[:, t] + (1 - m) * next_value
        last_gae = m * gae_t + (1 - m) * last_gae
        adv[:, t] = last_gae
    returns = (adv + vals) * mask
    adv = masked_whiten(adv, mask) * mask
    return adv.to(token_level_rewards.dtype), returns.to(token_level_rewards.dtype)


@register_adv_est(AdvantageEstimator.GRPO)
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float | None = None,
    lam: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: outcome score minus its group mean, divided by the group std unless Dr.GRPO (no std)."""
    _check_shapes("grpo", token_level_rewards, response_mask)
    if norm_adv_by_std_in_grpo is None:
        norm_adv_by_std_in_grpo = bool(cfg_get(config, "norm_adv_by_std_in_grpo", True))
    scores = token_level_rewards.to(_work_dtype(token_level_rewards)).sum(dim=-1)
    group, n_groups = _group_ids("grpo", index, scores.shape[0], scores.device)
    mean, std, _ = _group_mean_std(scores, group, n_groups)
    # GRPO: Shao et al. 2024 (arXiv 2402.03300) A_i = (r_i - mean(r)) / std(r);
    # Dr.GRPO: Liu et al. 2025 (arXiv 2503.20783) drops the std: A_i = r_i - mean(r).
    adv = (scores - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores - mean
    return _outcome(adv, response_mask, token_level_rewards)


@register_adv_est(AdvantageEstimator.RLOO)
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float | None = None,
    lam: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: outcome score minus the mean score of the other samples of its group."""
    _check_shapes("rloo", token_level_rewards, response_mask)
    scores = token_level_rewards.to(_work_dtype(token_level_rewards)).sum(dim=-1)
    group, n_groups = _group_ids("rloo", index, scores.shape[0], scores.device)
    mean, _, count = _group_mean_std(scores, group, n_groups)
    # RLOO: Ahmadian et al. 2024 (arXiv 2402.14740) A_i = r_i - 1/(n-1) sum_{j!=i} r_j
    #       = n/(n-1) (r_i - mean(r)); a group of one keeps its raw score (as verl).
    adv = torch.where(count > 1, (scores - mean) * count / (count - 1).clamp(min=1), scores)
    return _outcome(adv, response_mask, token_level_rewards)


@register_adv_est(AdvantageEstimator.OPO)
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float | None = None,
    lam: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO: outcome score minus the length-weighted mean score of its group."""
    _check_shapes("opo", token_level_rewards, response_mask)
    dtype = _work_dtype(token_level_rewards)
    scores = token_level_rewards.to(dtype).sum(dim=-1)
    lengths = response_mask.to(dtype).sum(dim=-1)
    group, n_groups = _group_ids("opo", index, scores.shape[0], scores.device)
    # OPO: Hao et al. 2025 (arXiv 2505.23585) optimal baseline b = sum_i |y_i| r_i / sum_i |y_i|.
    weighted = _group_sum(lengths * scores, group, n_groups)
    total_len = _group_sum(lengths, group, n_groups)
    count = _group_sum(torch.ones_like(scores), group, n_groups)
    baseline = torch.where((count > 1) & (total_len > 0), weighted / total_len.clamp(min=1e-8), 0.0)
    return _outcome(scores - baseline[group], response_mask, token_level_rewards)


@register_adv_est(AdvantageEstimator.GPG)
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float | None = None,
    lam: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG: group-mean baseline scaled by bs / (number of samples with a non-zero score)."""
    _check_shapes("gpg", token_level_rewards, response_mask)
    f_norm = float(kwargs.get("f_norm", 1.0))
    scores = token_level_rewards.to(_work_dtype(token_level_rewards)).sum(dim=-1)
    bsz = scores.shape[0]
    group, n_groups = _group_ids("gpg", index, bsz, scores.device)
    mean, _, _ = _group_mean_std(scores, group, n_groups)
    # GPG: Chu et al. 2025 (arXiv 2504.02546) A_i = alpha (r_i - mean(r)) / F_norm,
    # alpha = B / M with M the number of samples whose reward is non-zero.
    alpha = bsz / torch.count_nonzero(scores).clamp(min=1).to(scores.dtype)
    return _outcome(alpha * (scores - mean) / f_norm, response_mask, token_level_rewards)


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float | None = None,
    lam: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: subtract the group mean, then whiten over the whole batch's tokens."""
    _check_shapes("reinforce_plus_plus_baseline", token_level_rewards, response_mask)
    dtype = _work_dtype(token_level_rewards)
    mask = response_mask.to(dtype)
    scores = token_level_rewards.to(dtype).sum(dim=-1)
    group, n_groups = _group_ids("reinforce_plus_plus_baseline", index, scores.shape[0], scores.device)
    mean, _, _ = _group_mean_std(scores, group, n_groups)
    # REINFORCE++: Hu 2025 (arXiv 2501.03262): group-mean baseline, then global batch normalisation.
    centred = (scores - mean).unsqueeze(-1) * mask
    adv = (masked_whiten(centred, mask) * mask).to(token_level_rewards.dtype)
    return adv, adv


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float | None = None,
    lam: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return-to-go per token, whitened over the batch (no critic, no groups)."""
    _check_shapes("reinforce_plus_plus", token_level_rewards, response_mask)
    gamma = float(gamma if gamma is not None else cfg_get(config, "gamma", 1.0))
    dtype = _work_dtype(token_level_rewards)
    rewards, mask = token_level_rewards.to(dtype), response_mask.to(dtype)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        # REINFORCE++: Hu 2025 (arXiv 2501.03262) G_t = r_t + gamma G_{t+1}; the chain restarts
        # after a masked token so nothing flows across the end of a response.
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    returns = returns * mask
    adv = masked_whiten(returns, mask) * mask
    return adv.to(token_level_rewards.dtype), returns.to(token_level_rewards.dtype)


@register_adv_est(AdvantageEstimator.REMAX)
@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float | None = None,
    lam: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: return-to-go minus the reward of the greedy response to the same prompt."""
    _check_shapes("remax", token_level_rewards, response_mask)
    if reward_baselines is None:
        raise ValueError(
            "remax needs `reward_baselines` (bs,): the reward of a greedy rollout per prompt, which the "
            "trainer computes when algorithm.adv_estimator=remax."
        )
    dtype = _work_dtype(token_level_rewards)
    mask = response_mask.to(dtype)
    # ReMax: Li et al. 2023 (arXiv 2310.10505) A_t = sum_{s>=t} r_s - r(x, greedy response).
    returns = (token_level_rewards.to(dtype) * mask).flip(-1).cumsum(-1).flip(-1)
    adv = (returns - reward_baselines.to(dtype).reshape(-1, 1)) * mask
    return adv.to(token_level_rewards.dtype), returns.to(token_level_rewards.dtype)


@dataclass(frozen=True)
class PreferencePairs:
    """One (chosen, rejected) pair per group whose scores differ, and the DPO margin of each pair.

    ``margin`` is beta times the difference of the implicit rewards, (log pi(chosen) - log ref(chosen))
    - (log pi(rejected) - log ref(rejected)), with sequence log-probs summed over the response.
    """

    chosen: torch.Tensor  # (pairs,) row indices
    rejected: torch.Tensor  # (pairs,) row indices
    margin: torch.Tensor  # (pairs,)

    def loss(self) -> torch.Tensor:
        """The mean DPO loss -log sigmoid(margin) over the pairs (0 without pairs)."""
        if self.margin.numel() == 0:
            return self.margin.new_zeros(())
        return -torch.nn.functional.logsigmoid(self.margin).mean()


def preference_pairs(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None,
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    beta: float,
) -> PreferencePairs:
    """Pair each group's best-scored response (chosen) with its worst (rejected); ties go to the first row.

    Groups whose responses all score the same carry no preference and give no pair (as in online DPO,
    Guo et al. 2024, arXiv 2402.04792, a pair is only formed when the judge prefers one response).
    Log-probs are per token, ``(bs, response_length)``, and summed over ``response_mask``.
    """
    dtype = torch.float64 if token_level_rewards.dtype == torch.float64 else torch.float32
    mask = response_mask.to(dtype)
    scores = token_level_rewards.to(dtype).sum(dim=-1)
    group, n_groups = _group_ids("online_dpo", index, scores.shape[0], scores.device)
    chosen, rejected = [], []
    for g in range(n_groups):
        rows = torch.nonzero(group == g).flatten()
        best, worst = rows[torch.argmax(scores[rows])], rows[torch.argmin(scores[rows])]
        if scores[best] > scores[worst]:
            chosen.append(int(best))
            rejected.append(int(worst))
    c = torch.tensor(chosen, dtype=torch.long, device=scores.device)
    r = torch.tensor(rejected, dtype=torch.long, device=scores.device)
    implicit = ((log_probs.to(dtype) - ref_log_probs.to(dtype)) * mask).sum(dim=-1)
    return PreferencePairs(c, r, beta * (implicit[c] - implicit[r]))


@register_adv_est(AdvantageEstimator.ONLINE_DPO)
@torch.no_grad()
def compute_online_dpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float | None = None,
    lam: float | None = None,
    old_log_probs: torch.Tensor | None = None,
    ref_log_prob: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Online DPO as per-sequence weights on the policy gradient.

    The DPO loss of a pair, -log sigmoid(m) with m = beta ((s_c - ref_c) - (s_r - ref_r)) and s the
    sequence log-prob, has gradient -beta sigmoid(-m) (grad s_c - grad s_r). So the chosen response
    gets advantage +beta sigmoid(-m), the rejected one -beta sigmoid(-m), every other response 0, all
    scaled by rows / pairs: a policy-gradient loss summed over each response's tokens and averaged
    over the rows (``loss_agg_mode=seq-mean-token-sum``, ratio 1 at the step's first update) then has
    exactly the gradient of the mean DPO loss over the batch's pairs (Rafailov et al. 2023,
    arXiv 2305.18290; online sampling and pairing as Guo et al. 2024, arXiv 2402.04792). Later
    mini-batches or epochs of the same step keep these weights, with PPO's clip bounding the drift.
    """
    _check_shapes("online_dpo", token_level_rewards, response_mask)
    if old_log_probs is None or ref_log_prob is None:
        raise ValueError(
            "online_dpo needs `old_log_probs` and `ref_log_prob` (bs, response_length): the policy's and the "
            "reference's log-probs of the responses, which the trainer computes when "
            "algorithm.adv_estimator=online_dpo."
        )
    beta = float(kwargs.get("beta") or cfg_get(config, "dpo_beta", 0.1))
    pairs = preference_pairs(token_level_rewards, response_mask, index, old_log_probs, ref_log_prob, beta)
    rows = token_level_rewards.shape[0]
    adv = torch.zeros(rows, dtype=pairs.margin.dtype, device=token_level_rewards.device)
    if pairs.chosen.numel():
        weight = beta * torch.sigmoid(-pairs.margin) * rows / pairs.chosen.numel()
        adv[pairs.chosen] = weight
        adv[pairs.rejected] = -weight
    return _outcome(adv, response_mask, token_level_rewards)
