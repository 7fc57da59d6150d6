"""DAPO pieces as pure functions: overlong reward shaping and dynamic-sampling group filtering.

DAPO: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv 2503.14476).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch


def compute_overlong_penalty(
    response_lengths: torch.Tensor | np.ndarray | Sequence[int],
    max_response_length: int,
    overlong_buffer_len: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    """Soft overlong punishment (<= 0) to add to each response's reward.

    0 up to ``max_response_length - overlong_buffer_len`` tokens, then falling linearly to
    ``-penalty_factor`` at ``max_response_length`` (and staying there beyond it).
    """
    if not 0 < overlong_buffer_len <= max_response_length:
        raise ValueError(
            f"overlong_buffer_len={overlong_buffer_len} must be in (0, max_response_length="
            f"{max_response_length}]; fix reward_model.overlong_buffer.len (or disable the overlong buffer)."
        )
    if isinstance(response_lengths, torch.Tensor):
        lengths = response_lengths.detach().to(torch.float32)
    else:
        lengths = torch.as_tensor(np.asarray(response_lengths, dtype=np.float32))
    expected = max_response_length - overlong_buffer_len
    # DAPO eq. (13): R_length = ((L_max - L_cache) - |y|) / L_cache inside the buffer, -1 beyond L_max;
    # scaled by penalty_factor and capped at 0 below the buffer (verl's DAPO reward manager).
    shaped = -(lengths - expected) / overlong_buffer_len * penalty_factor
    return torch.clamp(shaped, min=-float(penalty_factor), max=0.0)


class GroupFilterResult(NamedTuple):
    """Result of ``filter_groups``: a per-sample keep mask and the kept group ids (first-seen order)."""

    kept_mask: np.ndarray
    kept_uids: list[Any]


def filter_groups(
    index: np.ndarray | Sequence[Any],
    metric_values: np.ndarray | torch.Tensor | Sequence[float],
    ignore: np.ndarray | None = None,
) -> GroupFilterResult:
    """Dynamic sampling: drop groups whose metric is identical for every sample (std == 0).

    Such groups (all correct or all wrong) have zero advantage under GRPO and only dilute the
    batch (DAPO section 3.2). A group with a single sample is kept, as in verl's DAPO trainer.
    Rows in `ignore` (trajectories cut by over-sampling: unfinished, not scored for what they are) stay
    with their group but do not decide; a group with no other row is dropped.
    """
    ids = np.asarray(index)
    if isinstance(metric_values, torch.Tensor):
        metric_values = metric_values.detach().cpu().numpy()
    values = np.asarray(metric_values, dtype=np.float64)
    if ids.shape[0] != values.shape[0]:
        raise ValueError(f"filter_groups: {ids.shape[0]} group ids but {values.shape[0]} metric values.")
    kept: list[Any] = []
    kept_mask = np.zeros(ids.shape[0], dtype=bool)
    seen: dict[Any, np.ndarray] = {}
    for uid in ids:
        if uid not in seen:
            seen[uid] = ids == uid
    deciding = np.ones(ids.shape[0], dtype=bool) if ignore is None else ~np.asarray(ignore, dtype=bool)
    for uid, members in seen.items():
        group_values = values[members & deciding]
        if group_values.size == 1 or (group_values.size > 1 and np.std(group_values) > 0):
            kept.append(uid)
            kept_mask |= members
    return GroupFilterResult(kept_mask=kept_mask, kept_uids=kept)
