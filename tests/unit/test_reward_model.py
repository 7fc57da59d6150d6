"""Reward-model scoring, the pure parts: score placement, chat re-rendering, head checks, config, manager."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hybridflow.config import ConfigError, load_config
from hybridflow.data.toy import build_toy_tokenizer
from hybridflow.engines.reward_model import (
    head_has_bias,
    last_valid_index,
    place_scores,
    positions_from_mask,
    render_chats,
    reward_head_problem,
    valid_response_lengths,
)
from hybridflow.rewards import RewardManager
from tests.support.rm_batches import rollout_batch

# The toy template without the newline after each turn: a rendered (prompt, response) chat is then
# exactly the prompt rendered with a generation prompt followed by the response and its EOS.
TIGHT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% else %}{{ '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_toy_tokenizer()


def test_scores_sit_on_the_last_valid_response_token_for_uneven_lengths() -> None:
    scores = torch.tensor([0.5, -1.25, 2.0, 7.0])
    lengths = torch.tensor([1, 4, 3, 0])  # the last response is empty: no score lands anywhere
    out = place_scores(scores, lengths, response_width=4)
    expected = torch.zeros(4, 4)
    expected[0, 0], expected[1, 3], expected[2, 2] = 0.5, -1.25, 2.0
    assert out.dtype == torch.float32 and torch.equal(out, expected)
    assert torch.equal(out.sum(-1), torch.tensor([0.5, -1.25, 2.0, 0.0]))


def test_last_valid_index_for_left_and_right_padding() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    assert last_valid_index(mask).tolist() == [4, 1, 5, 0]


def test_valid_response_lengths_prefers_response_mask(tokenizer: Any) -> None:
    data = rollout_batch(tokenizer, [("copy a", "a"), ("copy bcd", "bcd")], resp_len=5)
    assert valid_response_lengths(data).tolist() == [2, 4]
    data.batch["response_mask"][0, 1] = 0
    assert valid_response_lengths(data).tolist() == [1, 4]
    del data.batch["response_mask"]
    assert valid_response_lengths(data).tolist() == [2, 4]


def test_render_chats_with_a_matching_template_reproduces_the_policy_ids(tokenizer: Any) -> None:
    """Decode + re-render with the same vocabulary and a template ending the assistant turn with EOS gives
    back prompt + response token for token (left-padded), so a reward model sees the same input."""
    rm_tok = build_toy_tokenizer()
    rm_tok.chat_template = TIGHT_TEMPLATE
    data = rollout_batch(tokenizer, [("copy a", "a"), ("3+4=", "7"), ("count a in abba", "2")], resp_len=5)
    inputs = render_chats(data, tokenizer, rm_tok)
    mask = data.batch["attention_mask"]
    for i in range(len(data)):
        want = data.batch["input_ids"][i][mask[i].bool()]
        got = inputs.batch["input_ids"][i][inputs.batch["attention_mask"][i].bool()]
        assert got.tolist() == want.tolist()
        assert inputs.batch["attention_mask"][i, -1] == 1  # left-padded: the last column is the last token
    assert torch.equal(inputs.batch["position_ids"], positions_from_mask(inputs.batch["attention_mask"]))
    assert inputs.batch["responses"].shape == (3, 0)


def test_render_chats_uses_the_reward_models_template(tokenizer: Any) -> None:
    """The stock toy template ends every turn with a newline: the rendered input differs from the policy's."""
    data = rollout_batch(tokenizer, [("copy a", "a")], resp_len=5)
    inputs = render_chats(data, tokenizer, build_toy_tokenizer())
    text = tokenizer.decode(inputs.batch["input_ids"][0][inputs.batch["attention_mask"][0].bool()])
    assert text == "<bos>user: copy a\nassistant: a<eos>\n"


def test_render_chats_truncates_on_the_right_and_needs_raw_prompt(tokenizer: Any) -> None:
    data = rollout_batch(tokenizer, [("copy abc", "abc")], resp_len=5)
    inputs = render_chats(data, tokenizer, build_toy_tokenizer(), max_length=5)
    assert tokenizer.decode(inputs.batch["input_ids"][0]) == "<bos>user: c"  # <bos>, user, :, space, c
    del data.non_tensor_batch["raw_prompt"]
    with pytest.raises(ValueError, match="set data.return_raw_chat=true"):
        render_chats(data, tokenizer, build_toy_tokenizer())


def _fake_safetensors(folder: Path, shapes: dict[str, list[int]], arch: str = "LlamaForCausalLM") -> Path:
    """A safetensors file whose header lists these tensors (the header is all the checks read)."""
    folder.mkdir(parents=True, exist_ok=True)
    header = {k: {"dtype": "F32", "shape": v, "data_offsets": [0, 0]} for k, v in shapes.items()}
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
    (folder / "config.json").write_text(json.dumps({"architectures": [arch]}))
    return folder


def test_reward_head_checks(tmp_path: Path) -> None:
    lm = _fake_safetensors(tmp_path / "lm", {"lm_head.weight": [100, 64]})
    problem = reward_head_problem(str(lm))
    assert (
        problem
        and "no 'score' head (architectures: LlamaForCausalLM)" in problem
        and "num_labels=1" in problem
    )
    two = _fake_safetensors(tmp_path / "two", {"score.weight": [2, 64]}, "LlamaForSequenceClassification")
    assert "has 2 labels" in (reward_head_problem(str(two)) or "")
    seq = _fake_safetensors(tmp_path / "seq", {"score.weight": [1, 64]}, "LlamaForSequenceClassification")
    assert reward_head_problem(str(seq)) is None and head_has_bias(str(seq)) is False
    tok = _fake_safetensors(tmp_path / "tok", {"score.weight": [1, 64], "score.bias": [1]})
    assert head_has_bias(str(tok)) is True
    assert reward_head_problem("org/hub-id") is None and head_has_bias("org/hub-id") is None


def test_reward_manager_returns_rm_scores_even_without_a_rule_scorer(tokenizer: Any) -> None:
    data = rollout_batch(tokenizer, [("copy a", "a"), ("copy b", "b")], resp_len=5)
    data.non_tensor_batch["data_source"] = np.array(["no/such/source"] * 2, dtype=object)
    data.non_tensor_batch["reward_model"] = np.array(
        [{"ground_truth": "a"}, {"ground_truth": "b"}], dtype=object
    )
    rm_scores = place_scores(torch.tensor([0.3, -0.7]), valid_response_lengths(data), 5)
    data.batch["rm_scores"] = rm_scores
    result = RewardManager(tokenizer)(data, return_dict=True)
    assert torch.equal(result["reward_tensor"], rm_scores)
    del data.batch["rm_scores"]
    with pytest.raises(Exception, match="no/such/source"):
        RewardManager(tokenizer)(data)


BASE = ["actor_rollout_ref.model.path=/m", "data.train_files=/d/train.parquet", "reward_model.enable=true"]


def test_enabled_reward_model_needs_a_path() -> None:
    cfg = load_config(None, BASE)
    with pytest.raises(ConfigError) as info:
        cfg.validate_for_run()
    assert info.value.problems == [
        "reward_model.model.path: required when reward_model.enable is true; set it to a reward model folder or "
        "hub id (a sequence- or token-classification checkpoint with one label), or set reward_model.enable=false "
        "to score with rules or custom_reward_function"
    ]
    load_config(None, [*BASE, "reward_model.model.path=/rm"]).validate_for_run()


def problems(*overrides: str) -> list[str]:
    """Cross-field problems of a config (they are raised when it is loaded)."""
    try:
        load_config(None, list(overrides))
    except ConfigError as exc:
        return exc.problems
    return []


def test_input_tokenizer_needs_raw_chats_and_budget_fits() -> None:
    with_path = [*BASE, "reward_model.model.path=/rm"]
    found = problems(*with_path, "reward_model.model.input_tokenizer=/m")
    assert [p.split(":")[0] for p in found] == ["data.return_raw_chat"]
    assert "set data.return_raw_chat=true" in found[0]
    assert problems(*with_path, "reward_model.model.input_tokenizer=/m", "data.return_raw_chat=true") == []
    tight = [
        *with_path,
        "reward_model.use_dynamic_bsz=true",
        "reward_model.forward_max_token_len_per_gpu=100",
        "data.max_prompt_length=64",
        "data.max_response_length=64",
    ]
    assert problems(*tight) == [
        "reward_model.forward_max_token_len_per_gpu: 100 tokens cannot hold one reward-model input of up to 128 "
        "tokens; raise it to at least 128"
    ]
    # with re-rendering, reward_model.max_length bounds the inputs instead
    assert (
        problems(
            *tight,
            "reward_model.model.input_tokenizer=/m",
            "data.return_raw_chat=true",
            "reward_model.max_length=96",
        )
        == []
    )
    # disabled: nothing about the reward model is checked
    assert problems("reward_model.model.input_tokenizer=/m") == []
