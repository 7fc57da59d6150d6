"""verl's other registered advantage estimators: grpo_passk, gdpo, the optimal token baselines, the vectorized names.

Same registry and signature as ``advantages`` (call by keyword; ``(advantages, returns)``, both
``(bs, response_length)``), verl's names, keyword arguments and numbers:

- ``grpo_vectorized`` and ``gae_vectorized`` are the same functions as ``grpo`` and ``gae`` here (those
  are already vectorized and give verl's numbers); ``rloo_vectorized`` differs from ``rloo`` as in verl:
  a group of one gets advantage 0 there (``rloo`` keeps its raw score).
- ``optimal_token_baseline`` / ``tir_optimal_token_baseline`` need ``old_log_probs`` and ``sum_pi_squared``
  (sum over the vocabulary of pi^2 per token; ``actor.calculate_sum_pi_squared=true``), optionally
  ``rollout_is_weights``.
- ``gdpo`` needs the reward components named by ``algorithm.gdpo_reward_keys`` in ``non_tensor_batch`` (one
  number per response) and ``batch`` (``prompts``, ``attention_mask``) to place them on the last token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ._compat import cfg_get, register_in
from .advantages import (
    ADV_ESTIMATOR_REGISTRY,
    _check_shapes,
    _group_ids,
    _group_mean_std,
    _group_sum,
    _outcome,
    _work_dtype,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    register_adv_est,
)
from .torch_functional import masked_whiten

# verl registers vectorized copies of grpo and gae; ours already are (same numbers): one function, two names.
register_in(ADV_ESTIMATOR_REGISTRY, "advantage estimator", "grpo_vectorized", compute_grpo_outcome_advantage)
register_in(ADV_ESTIMATOR_REGISTRY, "advantage estimator", "gae_vectorized", compute_gae_advantage_return)


@register_adv_est("rloo_vectorized")
@torch.no_grad()
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO, verl's vectorized form: (n r_i - sum_j r_j) / (n - 1); a group of one gets 0."""
    _check_shapes("rloo_vectorized", token_level_rewards, response_mask)
    scores = token_level_rewards.to(_work_dtype(token_level_rewards)).sum(dim=-1)
    group, n_groups = _group_ids("rloo_vectorized", index, scores.shape[0], scores.device)
    count = _group_sum(torch.ones_like(scores), group, n_groups)[group]
    total = _group_sum(scores, group, n_groups)[group]
    adv = torch.where(count > 1, (count * scores - total) / (count - 1).clamp(min=1), 0.0)
    return _outcome(adv, response_mask, token_level_rewards)


@register_adv_est("grpo_passk")
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k: only each group's best response gets an advantage, r_max - r_second (over the group std)."""
    _check_shapes("grpo_passk", token_level_rewards, response_mask)
    if norm_adv_by_std_in_grpo is None:
        norm_adv_by_std_in_grpo = bool(cfg_get(config, "norm_adv_by_std_in_grpo", True))
    scores = token_level_rewards.to(_work_dtype(token_level_rewards)).sum(dim=-1)
    group, n_groups = _group_ids("grpo_passk", index, scores.shape[0], scores.device)
    _, std, count = _group_mean_std(scores, group, n_groups)
    if bool((count < 2).any()):
        raise ValueError(
            "grpo_passk needs at least 2 responses per prompt; set actor_rollout_ref.rollout.n >= 2."
        )
    adv = torch.zeros_like(scores)
    # Pass@k training: Chen et al. 2025 (arXiv 2503.19595): A_best = r_max - r_second_max, others 0;
    # ties for the best go to the first row of the group.
    for g in range(n_groups):
        rows = torch.nonzero(group == g).flatten()
        ordered = torch.sort(scores[rows], descending=True, stable=True)
        best = rows[ordered.indices[0]]
        gap = ordered.values[0] - ordered.values[1]
        adv[best] = gap / (std[best] + epsilon) if norm_adv_by_std_in_grpo else gap
    return _outcome(adv, response_mask, token_level_rewards)


def _component_rewards(
    keys: Sequence[str], non_tensor_batch: dict[str, Any], batch: Any, response_mask: torch.Tensor
) -> list[torch.Tensor]:
    """Each reward component as a (bs, response_length) tensor holding its value on the response's last token."""
    prompt_length = batch["prompts"].shape[1]
    last = (batch["attention_mask"][:, prompt_length:].sum(dim=1) - 1).clamp(min=0).long()
    rows = torch.arange(response_mask.shape[0])
    out = []
    for key in keys:
        if key not in non_tensor_batch:
            raise ValueError(
                f"gdpo reward component {key!r} is not among the reward's extra outputs "
                f"{sorted(k for k in non_tensor_batch if not k.startswith('_'))}; return it from the reward function "
                "(a dict with 'score' and one number per component) or fix algorithm.gdpo_reward_keys."
            )
        values = torch.as_tensor(np.asarray(non_tensor_batch[key], dtype=np.float32))
        component = torch.zeros(response_mask.shape, dtype=torch.float32)
        component[rows, last] = values
        out.append(component.to(response_mask.device))
    return out


@register_adv_est("gdpo")
@torch.no_grad()
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    non_tensor_batch: dict[str, Any] | None = None,
    batch: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO: normalise each reward component within its group (GRPO), sum with weights, whiten over the batch.

    Without ``config`` / ``non_tensor_batch`` / ``batch`` the only component is ``token_level_rewards``.
    """
    _check_shapes("gdpo", token_level_rewards, response_mask)
    components = [token_level_rewards]
    weights: list[float] | None = None
    if config is not None and non_tensor_batch is not None and batch is not None:
        keys = cfg_get(config, "gdpo_reward_keys", None)
        if not keys:
            raise ValueError(
                "gdpo needs algorithm.gdpo_reward_keys: the reward components the reward function returns, "
                "e.g. algorithm.gdpo_reward_keys='[format_reward,accuracy_reward]'."
            )
        components = _component_rewards(list(keys), non_tensor_batch, batch, response_mask)
        configured = cfg_get(config, "gdpo_reward_weights", None)
        weights = [float(w) for w in configured] if configured is not None else None
    if weights is not None and len(weights) != len(components):
        raise ValueError(
            f"algorithm.gdpo_reward_weights has {len(weights)} weights for {len(components)} gdpo_reward_keys; "
            "give one weight per key."
        )
    weights = weights or [1.0] * len(components)
    # GDPO (arXiv 2601.05242): A = whiten(sum_k w_k GRPO(r_k)) with GRPO normalising within the prompt group.
    total = None
    for weight, component in zip(weights, components, strict=True):
        normalised, _ = compute_grpo_outcome_advantage(
            token_level_rewards=component, response_mask=response_mask, index=index, epsilon=epsilon,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, config=config,
        )
        total = weight * normalised if total is None else total + weight * normalised
    mask = response_mask.to(total.dtype)
    adv = (masked_whiten(total, mask) * mask).to(token_level_rewards.dtype)
    return adv, adv


def _token_weights(
    old_log_probs: torch.Tensor | None,
    sum_pi_squared: torch.Tensor | None,
    rollout_is_weights: torch.Tensor | None,
    response_mask: torch.Tensor,
    name: str,
) -> torch.Tensor:
    """W_t = sum_{j<=t} (1 - 2 pi_j + sum pi_j^2) (x rho_j^2 with rollout IS): the cumulative path-variance proxy."""
    if old_log_probs is None or sum_pi_squared is None:
        raise ValueError(
            f"{name} needs `old_log_probs` and `sum_pi_squared` (bs, response_length); set "
            "actor_rollout_ref.actor.calculate_sum_pi_squared=true so the actor computes sum(pi^2) per token."
        )
    dtype = torch.float64 if old_log_probs.dtype == torch.float64 else torch.float32
    # ||s_j||^2 = 1 - 2 pi_j + sum_v pi_v^2, the squared norm of the log-softmax gradient w.r.t. the logits.
    w = 1 - 2 * torch.exp(old_log_probs.to(dtype)) + sum_pi_squared.to(dtype)
    if rollout_is_weights is not None:  # minimise the MSE under truncated IS: scale by rho^2
        w = w * rollout_is_weights.to(dtype) ** 2
    return (w * response_mask.to(dtype)).cumsum(dim=-1)


def _returns_to_go(token_level_rewards: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (token_level_rewards.to(dtype) * mask).flip(-1).cumsum(-1).flip(-1)


def _zero_tail(baselines: torch.Tensor, rows: list[int], lengths: torch.Tensor) -> None:
    """Zero the baseline of a group's single longest response past the second-longest length (nobody else is there)."""
    group_lengths = lengths[rows]
    ordered = torch.sort(group_lengths).values
    longest, second = int(ordered[-1]), int(ordered[-2])
    at_max = torch.nonzero(group_lengths == longest).flatten()
    if at_max.numel() == 1 and longest > second:
        baselines[rows[int(at_max[0])], second:] = 0.0


def _groups(index: Any, bsz: int, name: str, keep: torch.Tensor | None = None) -> list[list[int]]:
    group, n_groups = _group_ids(name, index, bsz, torch.device("cpu"))
    members: list[list[int]] = [[] for _ in range(n_groups)]
    for row, g in enumerate(group.tolist()):
        if keep is None or bool(keep[row]):
            members[g].append(row)
    return [m for m in members if m]


@register_adv_est("optimal_token_baseline")
@torch.no_grad()
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB: per-position baseline B_t = sum_i G_t W_t / sum_i W_t over the group, advantage G_t - B_t.

    Positions are the padded response columns; a group of one keeps A_t = G_t (the return-to-go).
    """
    _check_shapes("optimal_token_baseline", token_level_rewards, response_mask)
    w_cum = _token_weights(old_log_probs, sum_pi_squared, rollout_is_weights, response_mask, "optimal_token_baseline")
    mask = response_mask.to(w_cum.dtype)
    returns = _returns_to_go(token_level_rewards, mask, w_cum.dtype)
    baselines = torch.zeros_like(returns)
    lengths = mask.sum(dim=-1)
    # Optimal token baseline: Li et al. 2026 (arXiv 2602.07078), B*_t = E[G_t W_t] / E[W_t].
    for rows in _groups(index, returns.shape[0], "optimal_token_baseline"):
        if len(rows) == 1:
            continue
        num = (returns[rows] * w_cum[rows] * mask[rows]).sum(dim=0)
        den = (w_cum[rows] * mask[rows]).sum(dim=0) + epsilon
        baselines[rows] = (num / den).unsqueeze(0).expand(len(rows), -1)
        if handle_zero_tail:
            _zero_tail(baselines, rows, lengths)
    adv = (returns - baselines) * mask
    return adv.to(token_level_rewards.dtype), returns.to(token_level_rewards.dtype)


@register_adv_est("tir_optimal_token_baseline")
@torch.no_grad()
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | None = None,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB for multi-turn trajectories: the baseline is taken per *generated-token* position.

    The responses' valid tokens (tool outputs are masked out) are packed to the left first, so the k-th
    generated token of each response shares one baseline, then scattered back to their columns.
    """
    _check_shapes("tir_optimal_token_baseline", token_level_rewards, response_mask)
    w_cum = _token_weights(old_log_probs, sum_pi_squared, rollout_is_weights, response_mask,
                           "tir_optimal_token_baseline")
    mask = response_mask.to(w_cum.dtype)
    token_returns = _returns_to_go(token_level_rewards, mask, w_cum.dtype)
    valid = response_mask.bool()
    lengths = valid.sum(dim=-1)
    width = int(lengths.max()) if lengths.numel() else 0
    packed_w = w_cum.new_zeros((len(lengths), width))
    packed_g = torch.zeros_like(packed_w)
    for i in range(len(lengths)):
        packed_w[i, : lengths[i]] = w_cum[i, valid[i]]
        packed_g[i, : lengths[i]] = token_returns[i, valid[i]]
    baselines = torch.zeros_like(packed_g)
    for rows in _groups(index, len(lengths), "tir_optimal_token_baseline", keep=lengths > 0):
        if len(rows) == 1:
            continue
        b_star = (packed_g[rows] * packed_w[rows]).sum(dim=0) / (packed_w[rows].sum(dim=0) + epsilon)
        baselines[rows] = b_star.to(baselines.dtype)
        if handle_zero_tail:
            _zero_tail(baselines, rows, lengths)
    packed_adv = packed_g - baselines
    adv = torch.zeros_like(token_returns)
    for i in range(len(lengths)):
        adv[i, valid[i]] = packed_adv[i, : lengths[i]]
    adv = adv * mask
    return adv.to(token_level_rewards.dtype), token_returns.to(token_level_rewards.dtype)
