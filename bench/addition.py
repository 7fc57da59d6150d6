"""Single-digit addition with one worked example turn: the task of `bench.learn_vs_trl` (issue 17).

    system: Answer with the number only.
    user: What is 2 + 5?
    assistant: 7                   (the worked example, the same in every prompt)
    user: What is 4 + 8?           (the question)

Exact-answer reward: 1.0 when the response, stripped of leading and trailing whitespace, equals the sum
("12"), else 0.0; "12." or "The answer is 12" score 0, so the model learns the format as well as the sum.
Both trainers decode responses with special tokens skipped, so an end-of-turn token is not part of the text.
The 99 pairs other than the example's are split once, the same for every seed, into 30 held-out pairs
(greedy evaluation) and 69 training pairs; a seed only orders the training prompts.

This file is also our trainer's reward function: `custom_reward_function.path=bench/addition.py` (its
`compute_score` has verl's signature). The trainer imports it by path, so it uses the standard library only.
"""

from __future__ import annotations

import random
from typing import Any

DATA_SOURCE = "bench/addition"
SYSTEM = "Answer with the number only."
EXAMPLE = (2, 5)
HELD_OUT_PAIRS = 30

Pair = tuple[int, int]


def score_answer(response: str, answer: str) -> float:
    """1.0 when `response`, stripped, is exactly `answer`, else 0.0."""
    return 1.0 if response.strip() == str(answer).strip() else 0.0


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                  **_: Any) -> float:
    """verl's custom reward signature around `score_answer` (our trainer's custom_reward_function)."""
    return score_answer(solution_str, str(ground_truth))


def build_messages(a: int, b: int) -> list[dict[str, str]]:
    """The chat of one question: system line, the worked example turn, then `a + b`."""
    ea, eb = EXAMPLE
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"What is {ea} + {eb}?"},
        {"role": "assistant", "content": str(ea + eb)},
        {"role": "user", "content": f"What is {a} + {b}?"},
    ]


def split_pairs() -> tuple[list[Pair], list[Pair]]:
    """(training pairs, held-out pairs): a fixed split of every single-digit pair but the example's."""
    pairs = [(a, b) for a in range(10) for b in range(10) if (a, b) != EXAMPLE]
    random.Random("addition/split").shuffle(pairs)
    return sorted(pairs[HELD_OUT_PAIRS:]), sorted(pairs[:HELD_OUT_PAIRS])


def build_rows(pairs: list[Pair], split: str) -> list[dict[str, Any]]:
    """Verl-format rows (data_source, prompt, ability, reward_model, extra_info), one per pair, in order."""
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": build_messages(a, b),
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"index": index, "split": split},
        }
        for index, (a, b) in enumerate(pairs)
    ]


def build_train_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` training rows: passes over the training pairs, each pass shuffled by `seed`."""
    train, _ = split_pairs()
    rng = random.Random(f"addition/train/{seed}")
    order: list[Pair] = []
    while len(order) < n:
        chunk = list(train)
        rng.shuffle(chunk)
        order += chunk
    return build_rows(order[:n], "train")


def build_heldout_rows() -> list[dict[str, Any]]:
    """The held-out rows (the same for every seed)."""
    return build_rows(split_pairs()[1], "test")
