"""verl's `prime` reward manager against a hand-written loop of what verl's PrimeRewardManager computes, and verl's
reward-loop keys: accepted where they map onto HybridFlow's scoring (with a start-up note), refused otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hybridflow.config import ConfigError, load_config
from hybridflow.data.toy import build_toy_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.rewards import RewardManager, load_custom_reward_fn

R = 5
SCORER = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "boom":
        raise RuntimeError("scorer failed")
    if solution_str.startswith("t"):
        return (1.5, "tuple extras")  # PRIME reads a sequence by its first element
    if solution_str.startswith("d"):
        return {"score": 0.25, "acc": True}
    return float(solution_str == ground_truth)
'''


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_toy_tokenizer()


def _batch(tokenizer: Any, responses: list[str], truth: str = "7") -> DataProto:
    bs = len(responses)
    resp = torch.full((bs, R), tokenizer.pad_token_id)
    mask = torch.zeros((bs, R), dtype=torch.long)
    for i, text in enumerate(responses):
        ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])[:R]
        resp[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
    prompts = torch.full((bs, 3), 10)
    return DataProto.from_dict(
        {"prompts": prompts, "responses": resp, "attention_mask": torch.cat([torch.ones(bs, 3, dtype=torch.long), mask], 1)},
        non_tensors={
            "data_source": np.array(["my/source"] * bs, dtype=object),
            "reward_model": np.array([{"ground_truth": truth}] * bs, dtype=object),
        },
    )


def _reference(tokenizer: Any, data: DataProto, fn: Any) -> torch.Tensor:
    """verl's PrimeRewardManager, written out: each score (0 on failure, a sequence's first element) on the last
    valid response token."""
    prompt_len = data.batch["prompts"].shape[-1]
    out = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
    for i in range(len(data)):
        length = int(data.batch["attention_mask"][i, prompt_len:].sum())
        text = tokenizer.decode(data.batch["responses"][i, :length].tolist(), skip_special_tokens=True)
        try:
            result = fn("my/source", text, "7", None)
            score = float(result[0] if isinstance(result, tuple) else result["score"] if isinstance(result, dict) else result)
        except RuntimeError:
            score = 0.0
        out[i, length - 1] = score
    return out


def test_prime_scores_as_verls_prime_manager(tokenizer: Any, tmp_path: Path) -> None:
    path = tmp_path / "score.py"
    path.write_text(SCORER)
    fn = load_custom_reward_fn(str(path))
    data = _batch(tokenizer, ["7", "8", "tt", "d", "boom", "7"])
    cfg = load_config(None, ["reward_model.reward_manager=prime", "trainer.n_gpus_per_node=1",
                             "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2"])
    assert RewardManager.from_config(cfg, tokenizer, compute_score=fn).kind == "prime"
    manager = RewardManager(tokenizer, compute_score=fn, kind="prime", score_workers=1)
    try:
        out = manager(data, return_dict=True)
    finally:
        manager.close()
    torch.testing.assert_close(out["reward_tensor"], _reference(tokenizer, data, fn))
    assert out["reward_extra_info"] == {"acc": [1.0, 0.0, 1.5, 0.25, 0.0, 1.0]}  # the batch's accuracy, as PRIME's
    assert out["reward_metrics"] == {"reward/timeouts": 0.0, "reward/errors": 1.0}


def test_prime_with_the_built_in_scorers(tokenizer: Any) -> None:
    data = _batch(tokenizer, ["7", "8"])
    data.non_tensor_batch["data_source"] = np.array(["toy/arithmetic"] * 2, dtype=object)
    manager = RewardManager(tokenizer, kind="prime", score_timeout_s=None)
    scores = manager(data)
    naive = RewardManager(tokenizer, score_timeout_s=None)(data)
    assert torch.equal(scores, naive) and scores.sum() == 1.0


RM_LOOP = [
    "reward_model.enable=True", "reward_model.model.path=/models/rm", "reward_model.use_reward_loop=True",
    "reward_model.rollout.name=vllm", "reward_model.rollout.gpu_memory_utilization=0.8",
    "reward_model.rollout.tensor_model_parallel_size=1", "reward_model.rollout.prompt_length=8192",
    "reward_model.rollout.response_length=4096", "reward_model.num_workers=8",
]


def test_the_reward_loop_keys_are_the_served_reward_model_settings() -> None:
    """verl's reward-loop keys: use_reward_loop is noted; reward_model.rollout holds how a generative reward model
    is served (a classifier one says at start-up that it reads none of it, hybridflow.workers.reward_service)."""
    cfg = load_config(None, RM_LOOP)
    assert cfg.reward_model.enable and cfg.reward_model.model.path == "/models/rm"
    assert "reward_model.use_reward_loop=true" in " ".join(cfg.verl_notes)
    ro = cfg.reward_model.rollout
    assert (ro.name, ro.gpu_memory_utilization, ro.prompt_length, ro.response_length) == ("vllm", 0.8, 8192, 4096)
    rules = load_config(None, ["reward_model.use_reward_loop=True"])  # rule scoring in the loop: our manager
    assert not rules.reward_model.enable and "reward_model.use_reward_loop=true" in " ".join(rules.verl_notes)


def test_reward_model_sampling_keys_are_refused_with_where_sampling_comes_from() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [*RM_LOOP, "reward_model.rollout.temperature=0.7"])
    (problem,) = info.value.problems
    assert problem.startswith("reward_model.rollout.temperature: the reward model's replicas read only their serving")
    assert "sampling_params of /generate" in problem


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["reward_model.enable_resource_pool=true", "reward_model.nnodes=1"], "n_gpus_per_node >= 1 (got 1 x 0)"),
        (["reward_model.nnodes=2"], "which is off; set reward_model.enable_resource_pool=true"),
    ],
)
def test_the_reward_pool_must_have_a_shape_and_be_on_to_be_sized(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", "\\(").replace(")", "\\)")):
        load_config(None, [*RM_LOOP, *overrides])
    cfg = load_config(None, [*RM_LOOP, "reward_model.enable_resource_pool=true", "reward_model.nnodes=2",
                             "reward_model.n_gpus_per_node=8"])
    assert (cfg.reward_model.nnodes, cfg.reward_model.n_gpus_per_node) == (2, 8)
