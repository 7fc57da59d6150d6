"""Built-in verifiable scorers selected by a sample's ``data_source`` (verl's ``default_compute_score``).

Every registered scorer has one signature, ``fn(solution_str, ground_truth, extra_info) -> float | dict``
(a dict carries ``score`` plus extras such as ``acc``). User functions with verl's signature are loaded
by `hybridflow.rewards.custom`; `check_reward_sources` runs at start-up so a data source without a
scorer fails before any training step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from hybridflow.rewards import code, geo3k, gsm8k, math, qa_em, toy

Score = float | dict[str, Any]
Scorer = Callable[[str, Any, "dict[str, Any] | None"], Score]

_EXACT: dict[str, Scorer] = {}
_PREFIXES: dict[str, Scorer] = {}


def register_scorer(data_source: str, scorer: Scorer, *, prefix: bool = False) -> None:
    """Register ``scorer`` for ``data_source`` (or for every data source starting with it if ``prefix``)."""
    (_PREFIXES if prefix else _EXACT)[data_source] = scorer


def known_data_sources() -> list[str]:
    """The data sources with a built-in scorer (prefix entries end with ``*``)."""
    return sorted(_EXACT) + sorted(f"{p}*" for p in _PREFIXES)


def get_scorer(data_source: str) -> Scorer | None:
    """The scorer for ``data_source``: an exact entry first, then the longest matching prefix; or None."""
    if data_source in _EXACT:
        return _EXACT[data_source]
    matches = [p for p in _PREFIXES if data_source.startswith(p)]
    return _PREFIXES[max(matches, key=len)] if matches else None


class UnknownDataSourceError(ValueError):
    """A sample's data_source has no built-in scorer and no custom reward function was configured."""


def _unknown_message(data_sources: Iterable[str]) -> str:
    """The error text for data sources without a scorer: which ones, the known ones, and the fix."""
    names = ", ".join(repr(d) for d in sorted(set(data_sources)))
    return (
        f"no reward scorer for data_source {names}. Built-in scorers exist for: "
        f"{', '.join(known_data_sources())}. Either set the dataset's data_source column to one of "
        "those, or write a function `compute_score(data_source, solution_str, ground_truth, "
        "extra_info=None, **kwargs)` in a Python file and set custom_reward_function.path=<file> "
        "(and custom_reward_function.name=<function> if it is not called compute_score)."
    )


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    sandbox_fusion_url: str | None = None,
    memory_limit_mb: int = 1024,
) -> Score:
    """Score one completion with the built-in scorer of its data source; raises for unknown sources.

    ``sandbox_fusion_url`` / ``memory_limit_mb`` (verl's keywords, from ``reward_model.sandbox_fusion``) say
    where the code sources' test cases run: that SandboxFusion service, or (None) the local sandbox.
    """
    scorer = get_scorer(data_source)
    if scorer is None:
        raise UnknownDataSourceError(_unknown_message([data_source]))
    if scorer is _code:
        return _code(solution_str, ground_truth, extra_info, sandbox=code.Sandbox(sandbox_fusion_url, memory_limit_mb))
    return scorer(solution_str, ground_truth, extra_info)


def check_reward_sources(data_sources: Iterable[str], custom_fn: Callable[..., Any] | None = None) -> None:
    """Fail fast (before training) if any data source has neither a built-in scorer nor a custom function."""
    if custom_fn is not None:
        return
    missing = [d for d in set(data_sources) if get_scorer(str(d)) is None]
    if missing:
        raise UnknownDataSourceError(_unknown_message(missing))


def _gsm8k(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None) -> Score:
    """GSM8K in strict mode (the answer must follow ``####``), as verl scores it by default."""
    return gsm8k.compute_score(solution_str, ground_truth, method="strict")


def _math(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None) -> Score:
    r"""MATH: last ``\boxed{}`` against the ground truth, 1.0 or 0.0."""
    return math.compute_score(solution_str, ground_truth)


def _math_dapo(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None) -> Score:
    """DAPO-style math: +1 / -1 with ``acc`` and ``pred``."""
    return math.compute_score_dapo(solution_str, ground_truth)


def _numina(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None) -> Score:
    r"""NuminaMath (verl's prime_math route): the boxed (or "answer is") final answer, 1.0 or 0.0."""
    return math.compute_score_numina(solution_str, ground_truth)


def _geo3k(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None) -> Score:
    r"""Geometry3K: 0.9 x the boxed answer's match + 0.1 x the ``<think>...</think> ... \boxed{}`` format."""
    return geo3k.compute_score(solution_str, ground_truth)


def _search_r1(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None) -> Score:
    """Search-R1 QA: exact match of the last <answer> span against ground_truth["target"], 1.0 or 0.0."""
    return qa_em.compute_score(solution_str, ground_truth)


def _code(
    solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None, *, sandbox: code.Sandbox | None = None
) -> Score:
    """Code problems: the last fenced code block run on the ground truth's test cases; the fraction passed."""
    return code.compute_score(solution_str, ground_truth, sandbox)


register_scorer("openai/gsm8k", _gsm8k)
for _name in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
    register_scorer(_name, _math)
for _name in ("math_dapo", "math", "math_dapo_reasoning"):
    register_scorer(_name, _math_dapo)
register_scorer("aime", _math_dapo, prefix=True)
# The NuminaMath subsets verl's default scorer lists (PRIME's Eurus-2-RL-Data names them so).
for _name in ("aops_forum", "synthetic_math", "amc_aime", "synthetic_amc", "cn_k12", "olympiads"):
    register_scorer(f"numina_{_name}", _numina)
register_scorer("hiyouga/geometry3k", _geo3k)
for _name in code.SOURCES:
    register_scorer(_name, _code)
register_scorer("searchR1_", _search_r1, prefix=True)  # searchR1_nq, searchR1_hotpotqa, ...
for _name, _scorer in toy.SCORERS.items():
    register_scorer(_name, _scorer)
