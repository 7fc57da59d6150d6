"""Built-in scorers: gsm8k, MATH (boxed), DAPO math, toy tasks, and dispatch by data_source."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from hybridflow.rewards import (
    UnknownDataSourceError,
    check_reward_sources,
    default_compute_score,
    get_scorer,
    gsm8k,
    known_data_sources,
    math,
    toy,
)


@pytest.mark.parametrize(
    ("solution", "truth", "method", "expected"),
    [
        ("She pays 5 + 3 = 8 dollars.\n#### 8", "8", "strict", 1.0),
        ("#### 8", "9", "strict", 0.0),
        ("The answer is 8", "8", "strict", 0.0),  # strict needs the #### marker
        ("The answer is 8", "8", "flexible", 1.0),
        ("first 3 then 8.", "8", "flexible", 1.0),  # the last number wins, trailing "." dropped
        ("#### 1,234", "1234", "strict", 1.0),  # thousands separators
        ("#### $1,234.00", "1234", "strict", 1.0),
        ("#### -7", "-7", "strict", 1.0),  # negative numbers
        ("#### 7", "-7", "strict", 0.0),
        ("#### 3 then #### 4", "4", "strict", 1.0),  # the last marker wins
        ("#### 2.50", "2.5", "strict", 1.0),
        ("no digits here", "3", "flexible", 0.0),
        ("####", "3", "strict", 0.0),  # malformed: marker without a number
        ("", "3", "strict", 0.0),
        ("Lots of work.\n#### 72", "Natalia sold 48/2 = 24 clips.\n#### 72", "strict", 1.0),  # full reference
    ],
)
def test_gsm8k_scores(solution: str, truth: str, method: gsm8k.Method, expected: float) -> None:
    assert gsm8k.compute_score(solution, truth, method=method) == expected


def test_gsm8k_format_score_for_wrong_answer_but_none_for_missing() -> None:
    assert gsm8k.compute_score("#### 5", "6", format_score=0.1) == 0.1
    assert gsm8k.compute_score("five", "6", format_score=0.1) == 0.0


def test_gsm8k_only_reads_the_tail_of_long_outputs() -> None:
    assert gsm8k.compute_score("#### 42" + " blah" * 100, "42") == 0.0
    assert gsm8k.compute_score("x" * 10_000 + "#### 42", "42") == 1.0


def test_gsm8k_rejects_unknown_method() -> None:
    with pytest.raises(ValueError, match="strict.*flexible"):
        gsm8k.extract_solution("#### 1", method="loose")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{5}", "5"),
        (r"\boxed{1} and then \boxed{2}", "2"),
        (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{1}{\sqrt{2}}"),  # nested braces
        (r"\boxed{{a}{b}{c}}", "{a}{b}{c}"),
        (r"\boxed 7$", "7"),
        (r"\fbox{3}", "3"),
        (r"\boxed{unclosed", None),
        ("no box at all", None),
        (r"\boxed", None),
    ],
)
def test_last_boxed_content(text: str, expected: str | None) -> None:
    assert math.last_boxed_content(text) == expected


@pytest.mark.parametrize(
    ("prediction", "truth"),
    [
        (r"\dfrac{1}{2}", r"\frac{1}{2}"),
        (r"\tfrac12", r"\frac{1}{2}"),
        ("0.5", r"\frac{1}{2}"),
        ("1/2", r"\frac{1}{2}"),
        (r"-\frac{3}{4}", "-0.75"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"10\text{ cm}", "10"),
        ("10 cm", "10"),
        (r"90^\circ", "90"),
        (r"50\%", "50"),
        (r"\$5", "5"),
        ("5.", "5"),
        ("x = 3", "3"),
        (r"\text{(A)}", "(A)"),
        ("1,000", "1000"),
        (r"\sqrt2", r"\sqrt{2}"),
        (".5", "0.5"),
        ("3.0", "3"),
    ],
)
def test_math_equivalences(prediction: str, truth: str) -> None:
    assert math.is_equiv(prediction, truth), (math.normalize_answer(prediction), math.normalize_answer(truth))


@pytest.mark.parametrize(
    ("prediction", "truth"),
    [("3", "4"), (r"\frac{1}{3}", "0.33"), ("(1,2)", "(2,1)"), ("x+1", "x-1"), ("1,2", "12")],
)
def test_math_non_equivalences(prediction: str, truth: str) -> None:
    assert not math.is_equiv(prediction, truth)


def test_math_numeric_equivalence_can_be_turned_off() -> None:
    assert not math.is_equiv("0.5", r"\frac{1}{2}", numeric=False)


def test_math_compute_score() -> None:
    assert math.compute_score(r"The area is $\boxed{\dfrac{\pi}{2}}$.", r"\frac{\pi}{2}") == 1.0
    assert math.compute_score(r"The area is $\boxed{\pi}$.", r"\frac{\pi}{2}") == 0.0
    assert math.compute_score(r"The answer is \frac{\pi}{2}", r"\frac{\pi}{2}") == 0.0  # no box
    # a ground truth that is a whole reference solution: its last box is the answer
    assert math.compute_score(r"\boxed{4}", r"Since 2+2=4, the answer is $\boxed{4}$.") == 1.0


def test_math_dapo_plus_minus_one_and_answer_marker() -> None:
    assert math.compute_score_dapo("work...\nAnswer: 12", "12") == {"score": 1.0, "acc": True, "pred": "12"}
    assert math.compute_score_dapo(r"\boxed{13}", "12")["score"] == -1.0
    assert math.compute_score_dapo("I give up", "12") == {"score": -1.0, "acc": False, "pred": ""}


@pytest.mark.parametrize(
    ("data_source", "solution", "truth", "expected"),
    [
        ("openai/gsm8k", "#### 3", "3", 1.0),
        ("openai/gsm8k", "3", "3", 0.0),
        ("lighteval/MATH", r"\boxed{3}", "3", 1.0),
        ("DigitalLearningGmbH/MATH-lighteval", r"\boxed{2}", "3", 0.0),
        ("math_dapo", r"\boxed{3}", "3", 1.0),
        ("aime2024", r"\boxed{3}", "4", -1.0),
        ("toy/arithmetic", "7", "7", 1.0),
        ("toy/arithmetic", "8", "7", 0.0),
        ("toy/copy", "abc", "abc", 1.0),
        ("toy/count", "2", "3", 0.0),
    ],
)
def test_default_compute_score_dispatch(data_source: str, solution: str, truth: str, expected: float) -> None:
    result = default_compute_score(data_source, solution, truth)
    score = result["score"] if isinstance(result, dict) else result
    assert score == expected


@pytest.mark.parametrize(
    ("scorer", "solution", "truth", "expected"),
    [
        (toy.score_integer, "7", "7", 1.0),
        (toy.score_integer, " 7<junk>", "7", 1.0),  # the answer at the start counts
        (toy.score_integer, "-3", "-3", 1.0),
        (toy.score_integer, "3", "-3", 0.0),
        (toy.score_integer, "73", "7", 0.0),
        (toy.score_integer, "x7", "7", 0.0),
        (toy.score_integer, "", "7", 0.0),
        (toy.score_copy, "abc", "abc", 1.0),
        (toy.score_copy, "abc def", "abc", 1.0),
        (toy.score_copy, "abcd", "abc", 0.0),
        (toy.score_copy, "ab", "abc", 0.0),
        (toy.score_copy, "   ", "abc", 0.0),
    ],
)
def test_toy_scorers(scorer, solution: str, truth: str, expected: float) -> None:  # type: ignore[no-untyped-def]
    result = scorer(solution, truth)
    assert result["score"] == expected
    assert result["acc"] is (expected == 1.0)


def test_unknown_data_source_error_names_it_and_the_fix() -> None:
    with pytest.raises(UnknownDataSourceError) as info:
        default_compute_score("my/dataset", "x", "y")
    message = str(info.value)
    assert "'my/dataset'" in message
    assert "openai/gsm8k" in message and "toy/arithmetic" in message
    assert "custom_reward_function.path" in message and "custom_reward_function.name" in message


def test_check_reward_sources() -> None:
    check_reward_sources(["openai/gsm8k", "toy/copy", "aime25"])
    with pytest.raises(UnknownDataSourceError, match="'a/b'.*'c/d'"):
        check_reward_sources(["openai/gsm8k", "c/d", "a/b", "c/d"])
    check_reward_sources(["a/b"], custom_fn=lambda **kw: 0.0)  # a custom function scores everything


def test_registry_lookup() -> None:
    assert get_scorer("aime_2025") is get_scorer("aime")
    assert get_scorer("nope") is None
    assert "aime*" in known_data_sources()


def test_scorers_import_without_torch() -> None:
    code = "import sys, hybridflow.rewards; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- adversarial answers (issue 12): every scorer call is fast and clean -----------------------------


def _timed(fn, *args):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - started


@pytest.mark.timeout(60, method="thread")  # a regression kills the run instead of hanging it
@pytest.mark.parametrize("spaces", [4_000, 8_000, 100_000])
def test_math_spaces_inside_text_are_linear(spaces: int) -> None:
    # `\s*[a-zA-Z ]+\s*` in the unit regex backtracked cubically: 1.2 s at 1,000 spaces, 35 s at 4,000
    answer = "1\\text{" + " " * spaces + "1}"
    normalized, seconds = _timed(math.normalize_answer, answer)
    assert normalized == "11" and seconds < 1.0
    for scorer in (math.compute_score, math.compute_score_dapo):
        result, seconds = _timed(scorer, f"\\boxed{{{answer}}}", "1")
        score = result["score"] if isinstance(result, dict) else result
        assert score in (0.0, -1.0) and seconds < 1.0


@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize(
    "prediction", ["1e100000000", "-1E+100000000", "1e-100000000", "5e99999999999999999999", "1.5e100000000"]
)
def test_huge_exponents_are_not_valued(prediction: str) -> None:
    # Fraction("1e100000000") builds a 100-million-digit integer: the scorers stalled
    for solution in (f"\\boxed{{{prediction}}}", f"Answer: {prediction}"):
        result, seconds = _timed(math.compute_score_dapo, solution, "1")
        assert result["score"] == -1.0 and seconds < 1.0
    assert _timed(math.compute_score, f"\\boxed{{{prediction}}}", "1")[0] == 0.0
    assert math.is_equiv(prediction, prediction)  # the same text still matches
    assert math.numeric_value(prediction) is None
    assert gsm8k.normalize_number(prediction) is None  # a ground truth spelt so does not stall gsm8k either


@pytest.mark.parametrize(
    "prediction",
    [
        "\\frac{" + "1" * 5_000 + "}{3}",
        "1" * 5_000 + "/3",
        "1" * 5_000,
        "0." + "3" * 5_000,
        "\\frac{3}{" + "9" * 5_000 + "}",
    ],
)
def test_numbers_over_the_int_digit_limit_are_not_equal(prediction: str) -> None:
    # int() refuses more than 4,300 digits (ValueError): now a clean "not equal"
    assert math.compute_score(f"\\boxed{{{prediction}}}", "1") == 0.0
    assert math.compute_score_dapo(f"Answer: {prediction}", "1")["score"] == -1.0
    assert math.compute_score(f"\\boxed{{{prediction}}}", prediction) == 1.0  # identical text still counts


def test_numeric_value_within_the_bounds() -> None:
    assert math.numeric_value("1e400") == 10**400
    assert math.numeric_value("1" * 400) == int("1" * 400)
    assert math.numeric_value("1e401") is None and math.numeric_value("1" * 401) is None
    assert math.is_equiv("1e3", "1000") and math.is_equiv(r"\frac{2}{4}", "0.5")


def test_long_answers_compare_as_plain_strings() -> None:
    long = "x+" * 600 + "1"
    assert math.is_equiv(long, " " + long) and not math.is_equiv(long, long + "1")
    assert not math.is_equiv(r"\text{" * 400 + "1" + "}" * 400, "1")


def test_toy_integer_scorer_with_thousands_of_digits() -> None:
    assert toy.score_integer("7" * 5_000, "7")["score"] == 0.0  # no ValueError from int()
    assert toy.score_integer("7" * 100, "7" * 100)["score"] == 1.0


def test_gsm8k_non_finite_ground_truth() -> None:
    assert gsm8k.normalize_number("inf") is None and gsm8k.normalize_number("NaN") is None
    assert gsm8k.compute_score("#### 8", float("inf")) == 0.0
