"""RewardManager: decoding valid response tokens, score placement, extra info, DAPO overlong shaping."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hybridflow.data.toy import build_toy_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.rewards import RewardManager, load_custom_reward_fn
from hybridflow.rewards.manager import overlong_penalty

P, R = 4, 6


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_toy_tokenizer()


def _batch(
    tokenizer: Any, responses: list[str], truths: list[str], source: str = "toy/arithmetic"
) -> DataProto:
    """Left-padded dummy prompts, right-padded responses (text + eos), masks as rollout produces them."""
    bs = len(responses)
    prompts = torch.full((bs, P), tokenizer.pad_token_id)
    prompts[:, -2:] = 10
    resp = torch.full((bs, R), tokenizer.pad_token_id)
    resp_mask = torch.zeros((bs, R), dtype=torch.long)
    for i, text in enumerate(responses):
        ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])[:R]
        resp[i, : len(ids)] = torch.tensor(ids)
        resp_mask[i, : len(ids)] = 1
    prompt_mask = (prompts != tokenizer.pad_token_id).long()
    return DataProto.from_dict(
        {"prompts": prompts, "responses": resp, "attention_mask": torch.cat([prompt_mask, resp_mask], dim=1)},
        non_tensors={
            "data_source": np.array([source] * bs, dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": t} for t in truths], dtype=object),
            "extra_info": np.array([{"index": i} for i in range(bs)], dtype=object),
        },
    )


def test_score_on_last_valid_token(tokenizer: Any) -> None:
    # valid lengths: "7"+eos=2, "12"+eos=3, "3"+eos=2, "99999" + eos cut at R=6 -> 6
    data = _batch(tokenizer, ["7", "12", "3", "99999"], ["7", "12", "4", "99999"])
    scores = RewardManager(tokenizer)(data)
    assert scores.shape == (4, R) and scores.dtype == torch.float32
    expected = torch.zeros(4, R)
    expected[0, 1], expected[1, 2], expected[3, 5] = 1.0, 1.0, 1.0
    assert torch.equal(scores, expected)


def test_response_mask_takes_precedence(tokenizer: Any) -> None:
    data = _batch(tokenizer, ["7", "7"], ["7", "7"])
    data.batch["response_mask"] = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]])
    scores = RewardManager(tokenizer)(data)
    assert scores[0, 0] == 1.0 and scores[1, 2] == 1.0 and scores.sum() == 2.0


def test_return_dict_has_extra_info_and_tokenizer_per_call(tokenizer: Any) -> None:
    data = _batch(tokenizer, ["5", "6"], ["5", "5"])
    out = RewardManager()(data, tokenizer, return_dict=True)
    assert out["reward_tensor"].sum() == 1.0
    info = out["reward_extra_info"]
    assert info["acc"] == [True, False] and info["score"] == [1.0, 0.0] and info["pred"] == ["5", "6"]


def test_float_scores_and_custom_function(tmp_path: Path, tokenizer: Any) -> None:
    path = tmp_path / "r.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):\n"
        "    return scale * len(solution_str) + extra_info['index']\n"
    )
    fn = load_custom_reward_fn(str(path), reward_kwargs={"scale": 0.5})
    data = _batch(tokenizer, ["ab", "abcd"], ["x", "x"], source="my/own")
    manager = RewardManager(tokenizer, compute_score=fn)
    out = manager(data, return_dict=True)
    # eos is a special token: the decoded text is "ab" / "abcd"
    assert out["reward_tensor"][0, 2] == 1.0 and out["reward_tensor"][1, 4] == 3.0
    assert out["reward_extra_info"] == {"score": [1.0, 3.0]}
    clone = pickle.loads(pickle.dumps(manager))  # picklable for Ray actors
    assert torch.equal(clone(data), out["reward_tensor"])


def test_unknown_source_and_missing_tokenizer(tokenizer: Any) -> None:
    data = _batch(tokenizer, ["1"], ["1"], source="my/own")
    with pytest.raises(ValueError, match="custom_reward_function.path"):
        RewardManager(tokenizer)(data)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        RewardManager()(data)


def test_dict_without_score_is_rejected(tokenizer: Any) -> None:
    data = _batch(tokenizer, ["1"], ["1"])
    with pytest.raises(ValueError, match="without a 'score' key"):
        RewardManager(tokenizer, compute_score=lambda **kw: {"acc": 1})(data)


@pytest.mark.parametrize("kind", ["naive", "dapo", "batch"])
def test_rm_scores_pass_through(tokenizer: Any, kind: str) -> None:
    """With a reward model on, every manager returns its scores; batch needs no user function then."""
    from hybridflow.config import parse_config

    cfg = parse_config({"reward_model": {"enable": True, "reward_manager": kind}})
    data = _batch(tokenizer, ["1"], ["1"])
    data.batch["rm_scores"] = torch.full((1, R), 0.25)
    assert torch.equal(RewardManager.from_config(cfg, tokenizer)(data), data.batch["rm_scores"])


def test_overlong_penalty_ramp() -> None:
    # max 6, buffer 4: no penalty up to 2 tokens, then -factor/4 per token down to -factor at 6
    assert [overlong_penalty(n, 6, 4, 1.0) for n in range(1, 7)] == [0.0, 0.0, -0.25, -0.5, -0.75, -1.0]
    assert overlong_penalty(6, 6, 4, 0.5) == -0.5


def test_dapo_manager_applies_overlong_shaping(tokenizer: Any) -> None:
    data = _batch(tokenizer, ["7", "7777"], ["7", "7777"])  # valid lengths 2 and 5
    manager = RewardManager(
        tokenizer, kind="dapo", max_response_length=R, overlong_buffer_enable=True, overlong_buffer_len=4
    )
    out = manager(data, return_dict=True)
    assert out["reward_tensor"][0, 1] == 1.0
    assert out["reward_tensor"][1, 4] == pytest.approx(1.0 - 0.75)
    assert out["reward_extra_info"]["overlong"] == [False, True]
    assert out["reward_extra_info"]["overlong_reward"] == [0.0, -0.75]


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="reward_manager='collabllm'.*naive, dapo, batch, prime"):
        RewardManager(kind="collabllm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs reward_model.reward_manager=dapo"):
        RewardManager(overlong_buffer_enable=True, max_response_length=8, overlong_buffer_len=2)
    with pytest.raises(ValueError, match="overlong_buffer.len=9 must be between 1 and"):
        RewardManager(kind="dapo", overlong_buffer_enable=True, max_response_length=8, overlong_buffer_len=9)
    with pytest.raises(ValueError, match="reward_manager=batch .* custom_reward_function.path.*reward_model"):
        RewardManager(kind="batch")


def test_batch_manager_calls_the_user_function_once_with_lists(tmp_path: Path, tokenizer: Any) -> None:
    path = tmp_path / "batched.py"
    path.write_text(
        "CALLS = []\n"
        "def score_all(data_sources, solution_strs, ground_truths, extra_infos, bonus=0.0):\n"
        "    CALLS.append(len(solution_strs))\n"
        "    return [{'score': float(s == g) + bonus, 'n': len(CALLS)} for s, g in zip(solution_strs, ground_truths)]\n"
    )
    fn = load_custom_reward_fn(str(path), "score_all", {"bonus": 0.5})
    data = _batch(tokenizer, ["1", "2", "3"], ["1", "0", "3"])
    out = RewardManager(tokenizer, kind="batch", compute_score=fn)(data, return_dict=True)
    assert out["reward_tensor"][:, 1].tolist() == [1.5, 0.5, 1.5]
    assert out["reward_extra_info"]["n"] == [1, 1, 1]  # one call for the whole batch
    wrong = RewardManager(tokenizer, kind="batch", compute_score=lambda **kw: [0.0])
    with pytest.raises(ValueError, match="returned 1 scores for 3 responses"):
        wrong(data)


def test_from_config(tokenizer: Any) -> None:
    from types import SimpleNamespace as NS

    cfg = NS(
        data=NS(reward_fn_key="data_source", max_response_length=R),
        reward_model=NS(reward_manager="dapo", overlong_buffer=NS(enable=True, len=2, penalty_factor=2.0)),
    )
    manager = RewardManager.from_config(cfg, tokenizer)
    assert (manager.kind, manager.overlong_buffer_len, manager.overlong_penalty_factor) == ("dapo", 2, 2.0)
    data = _batch(tokenizer, ["77777"], ["77777"])  # 6 tokens: the end of the buffer, penalty -2
    assert manager(data)[0, 5] == pytest.approx(-1.0)


def test_from_the_trainer_config(tmp_path: Path, tokenizer: Any) -> None:
    from hybridflow.config import parse_config
    from hybridflow.rewards import load_custom_reward_fn_from_config

    path = tmp_path / "r.py"
    path.write_text(
        "def f(data_source, solution_str, ground_truth, extra_info=None, k=0):\n    return float(k)\n"
    )
    cfg = parse_config(
        {
            "custom_reward_function": {"path": str(path), "name": "f", "reward_kwargs": {"k": 3}},
            "reward_model": {"reward_manager": "naive"},
        }
    )
    manager = RewardManager.from_config(cfg, tokenizer, compute_score=load_custom_reward_fn_from_config(cfg))
    assert manager.kind == "naive" and manager.max_response_length == cfg.data.max_response_length
    assert manager(_batch(tokenizer, ["1"], ["1"]))[0, 1] == 3.0
