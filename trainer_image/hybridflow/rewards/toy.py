"""Scorers for the toy tasks of `hybridflow.data.toy` (short exact answers a tiny model can learn).

Each scorer reads the answer at the start of the completion (leading spaces ignored) and ignores what
follows it, so a model that has learnt the answer but not yet to stop right after it is still rewarded;
returns ``{"score": 1.0 | 0.0, "acc": bool, "pred": str}``.
"""

from __future__ import annotations

import re
from typing import Any

ARITHMETIC = "toy/arithmetic"
COPY = "toy/copy"
COUNT = "toy/count"
LOOKUP = "toy/lookup"
CODE_ARITHMETIC = "toy/code_arithmetic"
COLOR = "toy/color"

# At most 100 digits: Python refuses to parse integers of more than 4,300 digits (and no toy answer is long).
_LEADING_INT_RE = re.compile(r"^\s*(-?\d{1,100})(?!\d)")
_LEADING_WORD_RE = re.compile(r"^\s*([A-Za-z]+)")


def _result(prediction: str | None, truth: str) -> dict[str, Any]:
    """The scorer's dict for a parsed prediction."""
    correct = prediction is not None and prediction == truth
    return {"score": 1.0 if correct else 0.0, "acc": correct, "pred": prediction or ""}


def score_integer(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict[str, Any]:
    """1.0 when the completion starts with the ground-truth integer (``"7"``, ``" -3 ..."``), else 0.0."""
    match = _LEADING_INT_RE.match(solution_str)
    prediction = str(int(match.group(1))) if match else None
    return _result(prediction, str(int(str(ground_truth).strip())))


def score_copy(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict[str, Any]:
    """1.0 when the leading run of letters of the completion equals the string to copy, else 0.0."""
    match = _LEADING_WORD_RE.match(solution_str)
    return _result(match.group(1) if match else None, str(ground_truth).strip())


def score_lookup(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict[str, Any]:
    """The tool task: the final answer (after the last ``assistant:`` turn marker) must be the looked-up value.

    A response of several turns decodes as ``<call>tool: v\nassistant: <answer>``; a single-turn one is
    all answer.
    """
    final = solution_str.rsplit("assistant:", 1)[-1]
    return score_copy(final, ground_truth, extra_info)


def score_final_integer(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict[str, Any]:
    """The code-tool task (`hybridflow.data.code_arithmetic`): the last assistant turn starts with the number.

    The response decodes (special tokens skipped) as ``<tool_call>...</tool_call>\ntool\n413\nassistant\n413``
    with a ChatML template, so the final answer is what follows the last ``assistant`` marker; a response of
    one turn is all answer.
    """
    return score_integer(solution_str.rsplit("assistant", 1)[-1], ground_truth, extra_info)


SCORERS = {ARITHMETIC: score_integer, COPY: score_copy, COUNT: score_integer, LOOKUP: score_lookup,
           CODE_ARITHMETIC: score_final_integer, COLOR: score_copy}
