"""RLHFDataset on verl-format parquet written here, with the toy tokenizer; collate_fn into DataProto."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hybridflow.data.dataset import RLHFDataset, collate_fn, truncate_ids
from hybridflow.data.toy import build_toy_tokenizer, write_parquet
from hybridflow.protocol import DataProto

# Rendered prompt = bos, "user", ":", " ", <content chars>, "\n", "assistant", ":", " " -> 8 + len(content)
OVERHEAD = 8


def _row(content: str, index: int, truth: str = "1") -> dict[str, Any]:
    return {
        "data_source": "toy/arithmetic",
        "prompt": [{"role": "user", "content": content}],
        "ability": "toy",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"index": index, "split": "train"},
    }


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_toy_tokenizer()


@pytest.fixture
def parquet(tmp_path: Path) -> str:
    # prompt lengths 8+4=12, 8+2=10, 8+12=20, 8+1=9 tokens
    rows = [_row("1+2=", 10, "3"), _row("ab", 11), _row("abcdefghijkl", 12), _row("7", 13)]
    path = str(tmp_path / "train.parquet")
    write_parquet(rows, path)
    return path


def test_item_left_padded(parquet: str, tokenizer: Any) -> None:
    ds = RLHFDataset(parquet, tokenizer, max_prompt_length=24, return_raw_chat=True)
    assert len(ds) == 4 and ds.num_filtered == 0
    item = ds[0]
    expected = tokenizer("<bos>user: 1+2=\nassistant: ", add_special_tokens=False)["input_ids"]
    assert item["raw_prompt_ids"] == expected and len(expected) == 12
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert item[key].dtype == torch.long and item[key].shape == (24,)
    assert item["input_ids"][:12].tolist() == [tokenizer.pad_token_id] * 12
    assert item["input_ids"][12:].tolist() == expected
    assert item["attention_mask"].tolist() == [0] * 12 + [1] * 12
    assert item["position_ids"].tolist() == [0] * 12 + list(range(12))
    assert item["data_source"] == "toy/arithmetic"
    assert item["reward_model"] == {"style": "rule", "ground_truth": "3"}
    assert item["extra_info"] == {"index": 10, "split": "train"}
    assert item["index"] == 10 and item["ability"] == "toy"
    assert item["raw_prompt"] == [{"role": "user", "content": "1+2="}]
    assert "prompt" not in item
    assert "raw_prompt" not in RLHFDataset(parquet, tokenizer, max_prompt_length=24)[0]


def test_truncation_error_names_row_and_length(parquet: str, tokenizer: Any) -> None:
    with pytest.raises(ValueError) as info:
        RLHFDataset(parquet, tokenizer, max_prompt_length=16, truncation="error")
    message = str(info.value)
    assert "row 2" in message and "is 20 tokens" in message and "max_prompt_length=16" in message
    assert "filter_overlong_prompts" in message and "truncation" in message


@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_truncation_modes(parquet: str, tokenizer: Any, side: str) -> None:
    ds = RLHFDataset(parquet, tokenizer, max_prompt_length=16, truncation=side)  # type: ignore[arg-type]
    assert len(ds) == 4
    full = tokenizer("<bos>user: abcdefghijkl\nassistant: ", add_special_tokens=False)["input_ids"]
    item = ds[2]
    assert item["raw_prompt_ids"] == truncate_ids(full, 16, side)
    assert item["attention_mask"].sum() == 16 and item["input_ids"].tolist() == item["raw_prompt_ids"]
    assert (
        ds[1]["raw_prompt_ids"]
        == tokenizer("<bos>user: ab\nassistant: ", add_special_tokens=False)["input_ids"]
    )


def test_truncate_ids_sides() -> None:
    ids = list(range(10))
    assert truncate_ids(ids, 4, "left") == [6, 7, 8, 9]
    assert truncate_ids(ids, 4, "right") == [0, 1, 2, 3]
    assert truncate_ids(ids, 5, "middle") == [0, 1, 7, 8, 9]
    assert truncate_ids(ids, 1, "middle") == [9]
    assert truncate_ids(ids, 10, "left") == ids


def test_filter_overlong_counts(parquet: str, tokenizer: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="hybridflow.data.dataset"):
        ds = RLHFDataset(parquet, tokenizer, max_prompt_length=10, filter_overlong_prompts=True)
    assert ds.num_filtered == 2 and len(ds) == 2
    assert [ds[i]["index"] for i in range(len(ds))] == [11, 13]
    assert "dropped 2 of 4 prompts" in caplog.text
    with pytest.raises(ValueError, match="no prompts left out of 4"):
        RLHFDataset(parquet, tokenizer, max_prompt_length=5, filter_overlong_prompts=True)


def test_several_files_and_string_prompts(tmp_path: Path, tokenizer: Any) -> None:
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    write_parquet([_row("1", 0)], a)
    write_parquet(
        [{"data_source": "openai/gsm8k", "question": "2", "reward_model": {"ground_truth": "2"}}], b
    )
    ds_b = RLHFDataset(b, tokenizer, prompt_key="question", max_prompt_length=12)
    assert ds_b[0]["index"] == 0  # no extra_info.index: the row position
    assert (
        ds_b[0]["raw_prompt_ids"]
        == tokenizer("<bos>user: 2\nassistant: ", add_special_tokens=False)["input_ids"]
    )
    c = str(tmp_path / "c.parquet")
    write_parquet([{"data_source": "openai/gsm8k", "prompt": "2", "reward_model": {"ground_truth": "2"}}], c)
    ds = RLHFDataset([a, c], tokenizer, max_prompt_length=12)
    assert len(ds) == 2 and ds.data_sources() == ["openai/gsm8k", "toy/arithmetic"]
    assert ds[1]["raw_prompt_ids"] == ds_b[0]["raw_prompt_ids"]


def test_clear_errors(parquet: str, tmp_path: Path, tokenizer: Any) -> None:
    with pytest.raises(FileNotFoundError, match="missing.parquet.*data.train_files"):
        RLHFDataset(str(tmp_path / "missing.parquet"), tokenizer)
    with pytest.raises(KeyError, match="column 'question' missing.*data.prompt_key"):
        RLHFDataset(parquet, tokenizer, prompt_key="question")
    with pytest.raises(ValueError, match="data.truncation='cut'"):
        RLHFDataset(parquet, tokenizer, truncation="cut")  # type: ignore[arg-type]


def test_fsspec_uri(tokenizer: Any) -> None:
    write_parquet([_row("1+1=", 0, "2")], "memory://data/train.parquet")
    ds = RLHFDataset("memory://data/train.parquet", tokenizer, max_prompt_length=16)
    assert ds[0]["reward_model"]["ground_truth"] == "2"


def test_collate_into_dataproto(parquet: str, tokenizer: Any) -> None:
    ds = RLHFDataset(parquet, tokenizer, max_prompt_length=24, return_raw_chat=True)
    batch = collate_fn([ds[i] for i in range(3)])
    assert isinstance(batch, DataProto) and len(batch) == 3
    assert set(batch.batch) == {"input_ids", "attention_mask", "position_ids"}
    assert batch.batch["input_ids"].shape == (3, 24)
    for key in ("raw_prompt_ids", "data_source", "reward_model", "extra_info", "index", "raw_prompt"):
        array = batch.non_tensor_batch[key]
        assert isinstance(array, np.ndarray) and array.dtype == object and array.shape == (3,), key
    assert batch.non_tensor_batch["raw_prompt_ids"][0] == ds[0]["raw_prompt_ids"]
    assert batch.non_tensor_batch["reward_model"][2]["ground_truth"] == "1"


def test_from_config_with_the_trainer_config(parquet: str, tokenizer: Any) -> None:
    from hybridflow.config import parse_config
    from hybridflow.data.sampler import StatefulDataLoader

    cfg = parse_config(
        {
            "data": {
                "train_files": [parquet],
                "val_files": [parquet],
                "max_prompt_length": 10,
                "filter_overlong_prompts": True,
                "return_raw_chat": True,
                "train_batch_size": 2,
                "seed": 5,
            },
            "trainer": {"n_gpus_per_node": 1},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2}},
        }
    )
    ds = RLHFDataset.from_config(cfg, tokenizer, "val")
    assert len(ds) == 2 and ds.num_filtered == 2 and "raw_prompt" in ds[0]
    loader = StatefulDataLoader.from_config(cfg, ds)
    assert len(loader) == 1 and loader.seed == 5
    assert len(next(iter(loader))) == 2


def test_collate_rejects_mixed_items() -> None:
    with pytest.raises(ValueError, match="cannot collate 'x'"):
        collate_fn([{"x": torch.zeros(2)}, {"x": [0, 0]}])
    with pytest.raises(ValueError, match="empty"):
        collate_fn([])
