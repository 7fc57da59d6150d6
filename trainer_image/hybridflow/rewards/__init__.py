"""Rewards: verifiable scorers by data source, user reward functions, and reward managers.

The scorers and the custom-function loader are pure Python (no torch); `RewardManager` needs torch and
is imported lazily on first access.
"""

from __future__ import annotations

from typing import Any

from hybridflow.rewards.custom import (
    CustomRewardError,
    CustomRewardFunction,
    load_custom_reward_fn,
    load_custom_reward_fn_from_config,
)
from hybridflow.rewards.registry import (
    UnknownDataSourceError,
    check_reward_sources,
    default_compute_score,
    get_scorer,
    known_data_sources,
    register_scorer,
)

__all__ = [
    "CustomRewardError",
    "CustomRewardFunction",
    "RewardManager",
    "UnknownDataSourceError",
    "check_reward_sources",
    "default_compute_score",
    "get_scorer",
    "known_data_sources",
    "load_custom_reward_fn",
    "load_custom_reward_fn_from_config",
    "register_scorer",
]


def __getattr__(name: str) -> Any:
    """Import `RewardManager` (torch) only when asked for."""
    if name == "RewardManager":
        from hybridflow.rewards.manager import RewardManager

        return RewardManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
