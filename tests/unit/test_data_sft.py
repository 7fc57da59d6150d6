"""SFT and preference datasets: which tokens are learned, padding, and bad input that names its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.data.preference import PreferenceDataset, build_preference_rows, task_rows
from hybridflow.data.sft_dataset import SFTDataset
from hybridflow.data.toy import build_toy_tokenizer, write_parquet


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_toy_tokenizer()


def parquet(tmp_path: Path, rows: list[dict[str, Any]], name: str = "data.parquet") -> str:
    path = str(tmp_path / name)
    write_parquet(rows, path)
    return path


def learned_text(tokenizer: Any, item: dict[str, torch.Tensor], prefix: str = "") -> str:
    ids = item[f"{prefix}input_ids"][item[f"{prefix}loss_mask"].bool()]
    return "".join(tokenizer.convert_ids_to_tokens(ids.tolist()))


def real_text(tokenizer: Any, item: dict[str, torch.Tensor], prefix: str = "") -> str:
    ids = item[f"{prefix}input_ids"][item[f"{prefix}attention_mask"].bool()]
    return "".join(tokenizer.convert_ids_to_tokens(ids.tolist()))


def test_single_turn_learns_the_response_and_its_end_of_turn_only(tmp_path: Path, tokenizer: Any) -> None:
    first = SFTDataset(parquet(tmp_path, [{"question": "copy ab", "answer": "ab"}]), tokenizer, max_length=24)[0]
    assert real_text(tokenizer, first) == "<bos>user: copy ab\nassistant: ab<eos>\n"
    assert learned_text(tokenizer, first) == "ab<eos>\n"  # what the template writes for the assistant's turn
    as_chat = [{"question": [{"role": "user", "content": "copy ab"}], "answer": "ab"}]  # the prompt as chat messages
    assert all(torch.equal(v, first[k]) for k, v in SFTDataset(parquet(tmp_path, as_chat, "chat.parquet"), tokenizer,
                                                                max_length=24)[0].items())
    # Left-padded to max_length; positions count real tokens only.
    assert first["input_ids"].shape == (24,) and first["attention_mask"][0] == 0
    real = first["attention_mask"].bool()
    assert first["position_ids"][real].tolist() == list(range(int(real.sum())))
    assert not (first["loss_mask"].bool() & ~real).any()


def test_nested_keys_read_a_verl_rl_parquet(tmp_path: Path, tokenizer: Any) -> None:
    rows = task_rows("copy", 3, seed=1)
    data = SFTDataset(parquet(tmp_path, rows), tokenizer, prompt_key="prompt", response_key="reward_model",
                      response_dict_keys=["ground_truth"], max_length=32)
    assert [learned_text(tokenizer, data[i]) for i in range(3)] == [f"{r['reward_model']['ground_truth']}<eos>\n" for r in rows]


def test_multi_turn_learns_every_assistant_turn(tmp_path: Path, tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2+2="},
        {"role": "assistant", "content": "4"},
    ]
    data = SFTDataset(parquet(tmp_path, [{"messages": messages}]), tokenizer, multiturn=True, max_length=64)
    assert learned_text(tokenizer, data[0]) == "2<eos>\n4<eos>\n"
    assert real_text(tokenizer, data[0]).endswith("user: 2+2=\nassistant: 4<eos>\n")


def test_truncation(tmp_path: Path, tokenizer: Any) -> None:
    path = parquet(tmp_path, [{"question": "copy abcde" * 3, "answer": "ab"}])
    with pytest.raises(ValueError, match=r"row 0 of .* is \d+ tokens, longer than data.max_length=16; raise data.max_length"):
        SFTDataset(path, tokenizer, max_length=16)
    left = SFTDataset(path, tokenizer, max_length=16, truncation="left")[0]
    assert int(left["attention_mask"].sum()) == 16 and learned_text(tokenizer, left) == "ab<eos>\n"
    with pytest.raises(ValueError, match="no response token is left to learn .*use truncation=left"):
        SFTDataset(path, tokenizer, max_length=16, truncation="right")


@pytest.mark.parametrize(
    ("rows", "kwargs", "message"),
    [
        ([{"prompt": "x", "answer": "y"}], {}, r"column 'question' missing .*\['answer', 'prompt'\].*set data.prompt_key"),
        ([{"question": "x", "response": "y"}], {}, "column 'answer' missing .*set data.response_key"),
        ([{"question": "x", "answer": {"text": "y"}}], {"response_dict_keys": ["ground_truth"]},
         r"'answer' has no key 'ground_truth' \(it holds \['text'\]\); fix data.response_dict_keys"),
        ([{"question": "x", "answer": 3}], {}, "the response must be a string, got int; point data.response_key"),
        ([{"question": [{"text": "x"}], "answer": "y"}], {}, "the prompt must be a string or a non-empty list of"),
        ([{"messages": [{"role": "user", "content": "hi"}]}], {"multiturn": True}, "no assistant message to learn from"),
        ([{"question": "x"}], {"multiturn": True}, "column 'messages' missing .*set data.multiturn.messages_key"),
    ],
)
def test_bad_rows_name_the_setting_to_fix(
    tmp_path: Path, tokenizer: Any, rows: list[dict[str, Any]], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises((KeyError, ValueError), match=message):
        SFTDataset(parquet(tmp_path, rows), tokenizer, max_length=64, **kwargs)


def test_empty_or_missing_files_and_a_tokenizer_without_template(tmp_path: Path, tokenizer: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    empty = str(tmp_path / "empty.parquet")
    pq.write_table(pa.table({"question": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), empty)
    with pytest.raises(ValueError, match="hold no rows; point data.train_files"):
        SFTDataset(empty, tokenizer)
    with pytest.raises(FileNotFoundError, match="not found; check data.train_files"):
        SFTDataset(str(tmp_path / "absent.parquet"), tokenizer)
    bare = build_toy_tokenizer()
    bare.chat_template = None
    with pytest.raises(ValueError, match="no chat template.*set data.chat_template"):
        SFTDataset(parquet(tmp_path, [{"question": "x", "answer": "y"}]), bare)


def test_preference_pairs_share_the_prompt_and_learn_their_own_response(tmp_path: Path, tokenizer: Any) -> None:
    standard = [{"prompt": "copy a", "chosen": "a", "rejected": "b"}]
    conversational = [{"prompt": [{"role": "user", "content": "copy a"}], "chosen": [{"role": "assistant", "content": "a"}],
                       "rejected": [{"role": "assistant", "content": "b"}]}]  # TRL's conversational format
    pair = PreferenceDataset(parquet(tmp_path, standard), tokenizer, max_length=24)[0]
    assert set(pair) == {f"{side}_{k}" for side in ("chosen", "rejected")
                         for k in ("input_ids", "attention_mask", "position_ids", "loss_mask")}
    assert (learned_text(tokenizer, pair, "chosen_"), learned_text(tokenizer, pair, "rejected_")) == ("a<eos>\n", "b<eos>\n")
    same = PreferenceDataset(parquet(tmp_path, conversational, "chat.parquet"), tokenizer, max_length=24)[0]
    assert all(torch.equal(same[k], pair[k]) for k in pair)
    with pytest.raises(KeyError, match="column 'rejected' missing .*set data.rejected_key"):
        PreferenceDataset(parquet(tmp_path, [{"prompt": "p", "chosen": "a"}], "bad.parquet"), tokenizer)


def test_toy_preference_rows_pair_the_right_answer_with_a_wrong_one() -> None:
    rows = task_rows("arithmetic", 50, seed=2)
    pairs = build_preference_rows(rows, seed=2)
    assert pairs == build_preference_rows(rows, seed=2)  # deterministic
    assert all(p["chosen"] == r["reward_model"]["ground_truth"] != p["rejected"] for p, r in zip(pairs, rows, strict=True))
    assert {p["rejected"] for p in pairs} <= {r["reward_model"]["ground_truth"] for r in rows}
    with pytest.raises(ValueError, match="a wrong answer needs at least two"):
        build_preference_rows(rows[:1])
