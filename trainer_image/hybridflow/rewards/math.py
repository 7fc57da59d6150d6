r"""MATH-style scorer: take the last ``\boxed{...}`` of a completion and compare it with the ground truth.

The MATH benchmark (Hendrycks et al. 2021) marks final answers with ``\boxed{}``; equivalence is checked
after normalising the LaTeX variants models and references write for the same answer (``\dfrac`` vs
``\frac``, ``\frac12``, spaces, ``\text{}`` units, ``^\circ``, ``\%``, a trailing ``.``, ``x = 5``).
Optionally numbers are compared by value, so ``0.5`` matches ``\frac{1}{2}``.

DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", rule-based
reward) scores +1 for a correct answer and -1 otherwise and asks for ``Answer: ...``; `compute_score_dapo`
follows that convention and accepts both markers.

Inputs come from a policy under training, so every step here is bounded: answers longer than
`MAX_ANSWER_CHARS` are compared as plain strings, and numbers are valued only when they have at most
`MAX_NUMBER_CHARS` characters and an exponent of at most `MAX_EXPONENT` (``1e100000000`` would otherwise
build a 100-million-digit integer, and Python refuses to parse integers of more than 4,300 digits).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

_BOX_COMMANDS = ("\\boxed", "\\fbox")

# A MATH final answer is a number, an expression, a tuple or an interval: a few hundred characters at most.
MAX_ANSWER_CHARS = 1_000
MAX_NUMBER_CHARS = 400
MAX_EXPONENT = 400


def last_boxed_content(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` (nested braces allowed) or ``\boxed x``; None if absent or unclosed."""
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(cmd) :]
    if rest.startswith(" "):
        # "\boxed 5": the argument runs to the next "$" or whitespace.
        return re.split(r"[\s$]", rest.lstrip(), maxsplit=1)[0] or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None


_UNIT_WORDS = (
    "degrees",
    "degree",
    "cm",
    "centimeters",
    "meters",
    "km",
    "inches",
    "inch",
    "feet",
    "units",
    "unit",
    "dollars",
    "cents",
    "square units",
    "sq units",
    "hours",
    "minutes",
    "seconds",
    "days",
)
# One character class inside the braces: `\s*[a-zA-Z ]+\s*` (three ways to match each space) backtracked
# cubically on an unclosed `\text{` full of spaces (issue 12: 35 s at 4,000 spaces).
_UNIT_RE = re.compile(
    r"^(.*?\d)\s*(?:\\(?:text|mbox|mathrm)\{[a-zA-Z\s]+\}|(?:" + "|".join(_UNIT_WORDS) + r"))$"
)
_TEXT_RE = re.compile(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}")
_FRAC_SHORT_RE = re.compile(r"\\frac(\d)(\d)")
_FRAC_HALF_SHORT_RE = re.compile(r"\\frac(\d)\{")
_SQRT_SHORT_RE = re.compile(r"\\sqrt(\w)")
_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")
_LHS_RE = re.compile(r"^[a-zA-Z]\w{0,2}\s*=\s*")


def normalize_answer(answer: str) -> str:
    """Canonical form of a final answer so that equivalent LaTeX spellings compare equal."""
    s = answer.strip()
    s = s.replace("\n", "").replace("\\!", "")
    for spacing in ("\\,", "\\;", "\\:", "\\ ", "~"):
        s = s.replace(spacing, " ")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\circ", "")
    s = s.replace("\\%", "").replace("%", "").replace("\\$", "").replace("$", "")
    s = s.strip()
    unit = _UNIT_RE.match(s)
    if unit:
        s = unit.group(1)
    while _TEXT_RE.search(s):
        s = _TEXT_RE.sub(r"\1", s)
    s = _LHS_RE.sub("", s) if s.count("=") == 1 else s
    s = s.strip().rstrip(".").strip()
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF_SHORT_RE.sub(r"\\frac{\1}{", s)
    s = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s)
    s = s.replace(" ", "")
    if s.startswith("."):
        s = "0" + s
    if s.startswith("-."):
        s = "-0" + s[1:]
    return s


_FRAC_VALUE_RE = re.compile(r"^(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}$")
_SLASH_VALUE_RE = re.compile(r"^(-?\d+)/(-?\d+)$")
_EXPONENT_RE = re.compile(r"[eE]([+-]?\d+)$")


def _is_bounded_number(text: str) -> bool:
    """Whether ``text`` is short enough, and its exponent small enough, to be valued exactly and fast."""
    if len(text) > MAX_NUMBER_CHARS:
        return False
    exponent = _EXPONENT_RE.search(text)
    return exponent is None or abs(int(exponent.group(1))) <= MAX_EXPONENT


def numeric_value(normalized: str) -> Fraction | None:
    r"""Exact value of a normalised plain number (``3``, ``-0.25``, ``\frac{1}{2}``, ``3/4``), else None.

    None as well for numbers beyond `MAX_NUMBER_CHARS` / `MAX_EXPONENT`: they are compared as strings only.
    """
    if not _is_bounded_number(normalized):
        return None
    try:
        return Fraction(normalized)
    except (ValueError, ZeroDivisionError):
        pass
    match = _FRAC_VALUE_RE.match(normalized) or _SLASH_VALUE_RE.match(normalized)
    if not match:
        return None
    groups = match.groups()
    sign, num, den = ("", *groups) if len(groups) == 2 else groups
    if int(den) == 0:
        return None
    value = Fraction(int(num), int(den))
    return -value if sign == "-" else value


def is_equiv(prediction: str, ground_truth: str, numeric: bool = True) -> bool:
    """Whether two answers are the same after normalisation (and, if ``numeric``, by exact value).

    Answers longer than `MAX_ANSWER_CHARS` are equal only when identical up to surrounding whitespace.
    """
    if max(len(prediction), len(ground_truth)) > MAX_ANSWER_CHARS:
        return prediction.strip() == ground_truth.strip()
    pred, truth = normalize_answer(prediction), normalize_answer(ground_truth)
    if pred == truth:
        return True
    if not numeric:
        return False
    pred_value, truth_value = numeric_value(pred), numeric_value(truth)
    return pred_value is not None and pred_value == truth_value


def _ground_truth_answer(ground_truth: Any) -> str:
    """The answer of a ground truth that may be a full boxed reference solution."""
    text = str(ground_truth)
    boxed = last_boxed_content(text)
    return boxed if boxed is not None else text


def compute_score(solution_str: str, ground_truth: Any, numeric: bool = True) -> float:
    r"""1.0 when the last ``\boxed{}`` of the completion equals the ground truth, else 0.0."""
    prediction = last_boxed_content(solution_str)
    if prediction is None:
        return 0.0
    return 1.0 if is_equiv(prediction, _ground_truth_answer(ground_truth), numeric=numeric) else 0.0


# DAPO asks the model to end with "Answer: $Answer" and reads it from the tail of the completion.
_ANSWER_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_DAPO_TAIL_CHARS = 300


def compute_score_dapo(solution_str: str, ground_truth: Any, numeric: bool = True) -> dict[str, Any]:
    r"""DAPO's rule reward: ``score`` +1 if correct else -1, plus ``acc`` and the parsed ``pred``."""
    tail = solution_str[-_DAPO_TAIL_CHARS:]
    prediction = last_boxed_content(tail)
    if prediction is None:
        answers = _ANSWER_RE.findall(tail)
        prediction = answers[-1].strip() if answers else None
    correct = prediction is not None and is_equiv(prediction, _ground_truth_answer(ground_truth), numeric)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": prediction or ""}


# NuminaMath (PRIME's Eurus-2 RL data, `numina_*` sources): a boxed answer, else the phrase after "answer is" /
# "answer:" on the completion's last lines, graded 1 / 0 as verl's default scorer grades them.
_ANSWER_PHRASE_RE = re.compile(r"(?i)(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)\s*:?\s*([^\n]+)")


def extract_numina_answer(solution_str: str) -> str | None:
    r"""The last ``\boxed{}`` of the completion, else the last "answer is X" / "Answer: X" of its tail, else None."""
    boxed = last_boxed_content(solution_str)
    if boxed is not None:
        return boxed
    phrases = _ANSWER_PHRASE_RE.findall(solution_str[-_DAPO_TAIL_CHARS:])
    if not phrases:
        return None
    answer = phrases[-1].strip().strip("$").strip()
    return answer.rstrip(".").strip() or None


def compute_score_numina(solution_str: str, ground_truth: Any, numeric: bool = True) -> float:
    """1.0 when the completion's final answer (boxed, or after "answer is") equals the ground truth, else 0.0."""
    prediction = extract_numina_answer(solution_str)
    if prediction is None:
        return 0.0
    return 1.0 if is_equiv(prediction, _ground_truth_answer(ground_truth), numeric=numeric) else 0.0
