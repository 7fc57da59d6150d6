"""Toy task generator (determinism, format, CLI) and the toy tokenizer (round trip, chat template)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hybridflow.data import toy
from hybridflow.rewards import default_compute_score


def _score(data_source: str, solution: str, truth: str) -> float:
    result = default_compute_score(data_source, solution, truth)
    return float(result["score"] if isinstance(result, dict) else result)


def test_same_seed_same_bytes_and_other_seed_differs(tmp_path: Path) -> None:
    a = toy.generate("arithmetic", 50, 10, str(tmp_path / "a"), seed=3)
    b = toy.generate("arithmetic", 50, 10, str(tmp_path / "b"), seed=3)
    c = toy.generate("arithmetic", 50, 10, str(tmp_path / "c"), seed=4)
    for pa_, pb in zip(a, b, strict=True):
        assert Path(pa_).read_bytes() == Path(pb).read_bytes()
    assert Path(a[0]).read_bytes() != Path(c[0]).read_bytes()
    # train and test are different streams, not the same prompts
    train, test = (pq.read_table(p).to_pylist() for p in a)
    assert [r["prompt"] for r in train[:10]] != [r["prompt"] for r in test]


@pytest.mark.parametrize("task", sorted(toy.TASKS))
def test_rows_are_verl_format_and_scorers_agree(task: str) -> None:
    rows = toy.build_rows(task, 40, seed=1, split="test")
    data_source = toy.TASKS[task][0]
    for i, row in enumerate(rows):
        assert row["data_source"] == data_source
        assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"]
        assert row["reward_model"]["style"] == "rule"
        assert row["extra_info"] == {"index": i, "split": "test"}
        truth = row["reward_model"]["ground_truth"]
        assert 1 <= len(truth) <= 3
        assert _score(data_source, truth, truth) == 1.0
        assert _score(data_source, truth + "<eos junk", truth) == 1.0
        wrong = "9" + truth if task != "copy" else truth + "a"
        assert _score(data_source, wrong, truth) == 0.0


def test_arithmetic_answers_are_correct() -> None:
    for row in toy.build_rows("arithmetic", 100, seed=0):
        question = row["prompt"][0]["content"]
        assert question.endswith("=")
        assert str(eval(question[:-1])) == row["reward_model"]["ground_truth"]  # noqa: S307 (trusted digits)


def test_unknown_task() -> None:
    with pytest.raises(ValueError, match="unknown toy task 'sort'.*arithmetic"):
        toy.build_rows("sort", 3)


def test_generate_to_fsspec_uris(tmp_path: Path) -> None:
    train, test = toy.generate("count", 4, 2, f"file://{tmp_path}/new/dir", seed=0)
    assert pq.read_table(str(tmp_path / "new/dir/train.parquet")).num_rows == 4
    toy.generate("count", 4, 2, "memory://toy/out")
    assert train.endswith("/new/dir/train.parquet") and test.endswith("test.parquet")


def test_cli_writes_and_prints_paths(tmp_path: Path) -> None:
    out = tmp_path / "data"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hybridflow.data.toy",
            "--task",
            "copy",
            "--n-train",
            "16",
            "--n-val",
            "4",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    assert proc.stdout.split() == [str(out / "train.parquet"), str(out / "test.parquet")]
    assert pq.read_table(out / "train.parquet").num_rows == 16
    assert pq.read_table(out / "test.parquet").num_rows == 4


def test_toy_tokenizer_round_trip_and_template(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    toy.build_toy_tokenizer(str(tmp_path / "tok"))
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert len(tok) < 128
    assert (tok.pad_token, tok.eos_token, tok.bos_token) == ("<pad>", "<eos>", "<bos>")
    assert tok.pad_token_id != tok.eos_token_id
    for text in ["3+4=", "copy abc", "count a in abba", "Hello, World! (x-1)/2 = 7?"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "3+4="}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == "<bos>user: 3+4=\nassistant: "
    ids = tok(rendered, add_special_tokens=False)["input_ids"]
    assert len(ids) == 12  # bos, "user", ":", " ", 4 chars, "\n", "assistant", ":", " "
    assert tok.decode(ids, skip_special_tokens=True) == "user: 3+4=\nassistant: "
    answer = tok("7", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tok.decode(answer, skip_special_tokens=True) == "7"
    assert tok("~", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]
