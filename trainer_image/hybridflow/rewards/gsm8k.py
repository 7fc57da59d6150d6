"""GSM8K scorer: extract the final number of a solution and compare it with the ground truth.

GSM8K reference solutions end with ``#### <answer>`` (Cobbe et al. 2021, "Training Verifiers to Solve
Math Word Problems"). Two extraction modes, with the names verl uses:

- ``strict``: the answer must follow ``####`` (the model learnt the format); the last such marker wins.
- ``flexible``: the last number anywhere in the text.

Numbers are normalised before comparing: thousands separators (``1,000``), a leading ``$`` and a trailing
``.`` are dropped, ``-0`` becomes ``0`` and ``3.0`` equals ``3``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Literal

# Only the tail of a long completion is searched: a final answer sits at the end, and scanning megabytes
# of a degenerate completion with a regex would stall the reward step.
_TAIL_CHARS = 300
# Bigger numbers are no GSM8K answer (an extracted one has under 300 digits); the bound keeps `int()` of a
# ground truth such as "1e100000000" from building a 100-million-digit integer.
_MAX_EXPONENT = 1_000

_STRICT_RE = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
_NUMBER_RE = re.compile(r"-?\$?[0-9][0-9,]*(?:\.[0-9]+)?|-?\.[0-9]+")

Method = Literal["strict", "flexible"]


def normalize_number(text: str) -> str | None:
    """Canonical string of a number written as in GSM8K (``"1,234.50"`` -> ``"1234.5"``), else None."""
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    if not cleaned or cleaned in {"-", "."}:
        return None
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite() or abs(value.adjusted()) > _MAX_EXPONENT:
        return None  # int(Decimal("1e100000000")) would build a 100-million-digit integer
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def extract_solution(solution_str: str, method: Method = "strict") -> str | None:
    """The answer a completion commits to (normalised), or None when it has none in the chosen mode."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-_TAIL_CHARS:]
    if method == "strict":
        matches = _STRICT_RE.findall(tail)
        return normalize_number(matches[-1]) if matches else None
    for candidate in reversed(_NUMBER_RE.findall(tail)):
        number = normalize_number(candidate)
        if number is not None:
            return number
    return None


def compute_score(
    solution_str: str,
    ground_truth: str | int | float,
    method: Method = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """``score`` when the extracted answer equals the ground truth, ``format_score`` when an answer was
    found but is wrong, 0.0 when none was found."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    truth = normalize_number(str(ground_truth))
    if truth is None:
        # The ground truth may carry the full reference solution; take its #### answer.
        truth = extract_solution(str(ground_truth), method="strict")
    return score if answer == truth else format_score
