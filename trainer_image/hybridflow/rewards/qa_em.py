"""Search-R1 question answering: exact match of the ``<answer>...</answer>`` span against the golden answers.

Search-R1 (Jin et al. 2025, "Search-R1: Training LLMs to Reason and Leverage Search Engines with Reinforcement
Learning", outcome reward) scores 1 when the final answer exactly matches one of the golden answers after the
SQuAD-style normalisation: lowercase, punctuation dropped, the articles "a", "an", "the" dropped, whitespace
collapsed. verl's default scorer routes every ``searchR1_*`` data source here, with the golden answers in
``ground_truth["target"]`` (a string or a list of them), and quarters the score of a completion that repeats the
answer tags more than `MAX_TAGS` times, so that spamming ``</answer>`` does not pay.

Inputs come from a policy under training: the span is found with `str.rfind` (linear), and answers longer than
`MAX_ANSWER_CHARS` are never equal to a golden answer (no golden answer is that long).
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from typing import Any

OPEN, CLOSE = "<answer>", "</answer>"
MAX_TAGS = 10
MAX_ANSWER_CHARS = 2_000

_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD / Search-R1 normalisation: lowercase, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def extract_answer(solution_str: str) -> str | None:
    """The last ``<answer>...</answer>`` span, stripped; None when there is none."""
    end = solution_str.rfind(CLOSE)
    if end < 0:
        return None
    start = solution_str.rfind(OPEN, 0, end)
    if start < 0:
        return None
    return solution_str[start + len(OPEN) : end].strip()


def golden_answers(ground_truth: Any) -> list[str]:
    """The golden answers of a ground truth: ``{"target": str | list}``, a list of answers, or one answer."""
    target = ground_truth.get("target", []) if isinstance(ground_truth, dict) else ground_truth
    if isinstance(target, str):
        return [target]
    if isinstance(target, Iterable):  # a list, a tuple, or the numpy array a parquet column gives
        return [str(t) for t in target]
    return [str(target)]


def exact_match(prediction: str, answers: Iterable[str]) -> bool:
    """Whether the normalised prediction equals one normalised golden answer."""
    if len(prediction) > MAX_ANSWER_CHARS:
        return False
    predicted = normalize_answer(prediction)
    return any(normalize_answer(a) == predicted for a in answers)


def compute_score(solution_str: str, ground_truth: Any, format_score: float = 0.0, score: float = 1.0) -> float:
    """``score`` for an exact match (a quarter of it with more than `MAX_TAGS` answer tags), ``format_score`` for
    a wrong answer in tags, 0 without an answer span."""
    prediction = extract_answer(solution_str)
    if prediction is None:
        return 0.0
    if not exact_match(prediction, golden_answers(ground_truth)):
        return format_score
    if max(solution_str.count(OPEN), solution_str.count(CLOSE)) > MAX_TAGS:
        return score / 4
    return score
