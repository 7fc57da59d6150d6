"""The data sources of verl's default scorer added in issue 13: numina_*, hiyouga/geometry3k, searchR1_*.

Each case is hand-made: a completion, the ground truth in the layout verl's preprocessing scripts write, and the
score verl's default_compute_score gives it (by the rules its docs and the papers state).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from hybridflow.rewards import (
    check_reward_sources,
    default_compute_score,
    geo3k,
    known_data_sources,
    math,
    qa_em,
)

NUMINA = ["numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc", "numina_cn_k12",
          "numina_olympiads"]


@pytest.mark.parametrize("source", NUMINA)
@pytest.mark.parametrize(
    ("solution", "truth", "expected"),
    [
        (r"Step 1: ... Step 2: so the sum is $\boxed{\dfrac{3}{4}}$.", r"\frac{3}{4}", 1.0),
        (r"... thus \boxed{0.75}", r"\frac{3}{4}", 1.0),  # equal by value
        (r"... thus \boxed{7}", "8", 0.0),
        ("We add them up. The answer is 42.", "42", 1.0),  # no box: the phrase after "answer is"
        ("so x = 2.\nAnswer: $-3$", "-3", 1.0),
        ("I think it is 42", "42", 0.0),  # no final-answer marker
        (r"\boxed{(1, 2)}", "(1,2)", 1.0),
        (r"\boxed{5} ... the answer is 6", "5", 1.0),  # a box wins over a phrase
        ("", "1", 0.0),
    ],
)
def test_numina_sources_grade_the_final_answer(source: str, solution: str, truth: str, expected: float) -> None:
    assert default_compute_score(source, solution, truth) == expected


def test_numina_is_not_a_prefix() -> None:
    """verl lists the six NuminaMath subsets by name; another numina_ name has no scorer, as in verl."""
    assert all(s in known_data_sources() for s in NUMINA)
    with pytest.raises(ValueError, match="numina_other"):
        check_reward_sources(["numina_other"])


def test_extract_numina_answer() -> None:
    assert math.extract_numina_answer(r"\boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert math.extract_numina_answer("The final answer is: 12.") == "12"
    assert math.extract_numina_answer("nothing here") is None


@pytest.mark.parametrize(
    ("solution", "truth", "expected"),
    [
        (r"<think>angles sum to 180</think> The angle is \boxed{30}.", "30", 1.0),
        (r"<think>...</think> \boxed{30}", "31", 0.1),  # format only
        (r"The angle is \boxed{30}.", "30", 0.9),  # right answer, no <think>
        (r"<think>x</think> the angle is 30", "30", 0.0),  # no box: neither
        (r"<think>x</think> \boxed{2\sqrt{3}}", r"2\sqrt{3}", 1.0),
        (r"<think>x</think> \boxed{\frac{1}{2}}", "0.5", 1.0),
        (r" <think>x</think> \boxed{3}", "3", 0.9),  # must start with <think>
        (r"<think>x \boxed{3}</think>", "3", 0.9),  # the box must follow </think>
    ],
)
def test_geometry3k(solution: str, truth: str, expected: float) -> None:
    assert default_compute_score("hiyouga/geometry3k", solution, truth) == pytest.approx(expected)


def test_geometry3k_format_check_is_linear() -> None:
    """A long completion of repeated tags is checked in linear time (a backtracking regex would not be)."""
    text = "<think>" + "</think>\\boxed{" * 50_000
    started = time.perf_counter()
    assert geo3k.format_ok(text) is False  # no closing brace after the last \boxed{
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize("source", ["searchR1_nq", "searchR1_hotpotqa", "searchR1_2wikimultihopqa"])
@pytest.mark.parametrize(
    ("solution", "target", "expected"),
    [
        ("<search>capital of France</search> ... <answer>Paris</answer>", ["Paris"], 1.0),
        ("<answer> The Eiffel Tower! </answer>", ["eiffel tower"], 1.0),  # case, article, punctuation
        ("<answer>an apple</answer>", ["Apple", "the pear"], 1.0),
        ("<answer>Lyon</answer>", ["Paris", "City of Light"], 0.0),
        ("Paris", ["Paris"], 0.0),  # no answer span
        ("<answer>Lyon</answer> then <answer>Paris</answer>", ["Paris"], 1.0),  # the last span
        ("<answer>Paris</answer>" * 11, ["Paris"], 0.25),  # more than 10 answer tags: a quarter
        ("<answer>Paris</answer>" * 10, ["Paris"], 1.0),
        ("<answer>Parisian</answer>", ["Paris"], 0.0),  # exact, not substring, match
        ("<answer>paris france</answer>", ["Paris, France"], 1.0),
    ],
)
def test_search_r1_exact_match(source: str, solution: str, target: list[str], expected: float) -> None:
    assert default_compute_score(source, solution, {"target": target}) == expected


def test_search_r1_ground_truth_layouts() -> None:
    """The golden answers as verl's search_r1 preprocessing writes them (a numpy array from parquet), a string,
    or a bare list."""
    assert qa_em.compute_score("<answer>Paris</answer>", {"target": np.array(["paris", "x"])}) == 1.0
    assert qa_em.compute_score("<answer>Paris</answer>", {"target": "Paris"}) == 1.0
    assert qa_em.compute_score("<answer>Paris</answer>", ["Rome", "Paris"]) == 1.0
    assert qa_em.compute_score("<answer>Paris</answer>", {"target": []}) == 0.0


def test_search_r1_normalisation() -> None:
    assert qa_em.normalize_answer("  The  Quick, brown fox! ") == "quick brown fox"
    assert qa_em.normalize_answer("A theory") == "theory"  # whole words only: "theory" keeps its "the"
    assert qa_em.extract_answer("<answer>unclosed") is None
    assert qa_em.extract_answer("</answer> <answer>") is None


def test_search_r1_long_degenerate_completion_is_fast() -> None:
    text = "<answer>" * 200_000 + "x"
    started = time.perf_counter()
    assert qa_em.compute_score(text, {"target": ["x"]}) == 0.0
    assert time.perf_counter() - started < 0.5
