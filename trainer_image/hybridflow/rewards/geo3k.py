r"""Geometry3K (``hiyouga/geometry3k``): the last ``\boxed{}`` against the answer, plus a small format reward.

verl's default scorer for this data source weighs accuracy 0.9 and format 0.1: accuracy is 1 when the boxed
answer equals the ground truth (here: `hybridflow.rewards.math.is_equiv`, the MATH normalisation with exact
numeric values), format is 1 when the completion is ``<think>...</think>`` followed by a ``\boxed{...}``. The
format check is done with `str.find` (linear in the completion), not a backtracking regular expression.
"""

from __future__ import annotations

from typing import Any

from hybridflow.rewards import math

FORMAT_SCORE = 0.1


def format_ok(solution_str: str) -> bool:
    r"""Whether the completion starts with ``<think>``, closes it, and then holds a closed ``\boxed{...}``."""
    if not solution_str.startswith("<think>"):
        return False
    end_think = solution_str.find("</think>", len("<think>"))
    if end_think < 0:
        return False
    box = solution_str.find("\\boxed{", end_think + len("</think>"))
    return box >= 0 and solution_str.find("}", box + len("\\boxed{")) >= 0


def accuracy(solution_str: str, ground_truth: Any) -> float:
    r"""1.0 when the last ``\boxed{}`` of the completion equals the ground truth, else 0.0."""
    return math.compute_score(solution_str, ground_truth)


def compute_score(solution_str: str, ground_truth: Any, format_score: float = FORMAT_SCORE) -> float:
    """(1 - format_score) x accuracy + format_score x format."""
    return (1.0 - format_score) * accuracy(solution_str, ground_truth) + format_score * float(format_ok(solution_str))
