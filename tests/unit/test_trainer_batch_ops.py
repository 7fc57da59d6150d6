"""Pure pieces of the RL loop: group ids, masks, KL-in-reward, advantages, group filtering, metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.agent.over_sample import CUT_KEY
from hybridflow.algorithms import FixedKLController, get_kl_controller
from hybridflow.config import load_config
from hybridflow.protocol import DataProto
from hybridflow.trainer import batch_ops
from hybridflow.trainer.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    reduce_worker_metrics,
    timed,
)
from hybridflow.trainer.ray_trainer import compute_total_training_steps


def _batch(scores: list[float], uids: list[str], response_len: int = 3) -> DataProto:
    bs = len(scores)
    response_mask = torch.ones(bs, response_len)
    response_mask[0, -1] = 0  # first response one token shorter
    token_scores = torch.zeros(bs, response_len)
    for i, s in enumerate(scores):
        last = int(response_mask[i].sum()) - 1
        token_scores[i, last] = s
    attention = torch.cat([torch.tensor([[0, 1]] * bs), response_mask], dim=1)
    return DataProto.from_dict(
        {
            "responses": torch.ones(bs, response_len, dtype=torch.long),
            "attention_mask": attention.long(),
            "token_level_scores": token_scores,
            "old_log_probs": torch.full((bs, response_len), -1.0),
            "ref_log_prob": torch.full((bs, response_len), -1.5),
        },
        {"uid": np.array(uids, dtype=object)},
    )


def test_group_ids_survive_interleaved_repeat() -> None:
    batch = batch_ops.add_group_ids(DataProto.from_dict({"x": torch.arange(2)}))
    repeated = batch.repeat(3, interleave=True)
    uids = list(repeated.non_tensor_batch["uid"])
    assert uids[:3] == [uids[0]] * 3 and uids[3:] == [uids[3]] * 3 and uids[0] != uids[3]


def test_response_mask_derived_from_attention_mask() -> None:
    batch = _batch([1.0, 0.0], ["a", "a"])
    assert batch_ops.response_mask_of(batch).tolist() == [[1, 1, 0], [1, 1, 1]]


def test_kl_in_reward_subtracts_beta_times_kl_on_valid_tokens() -> None:
    batch = _batch([1.0, 0.0], ["a", "a"])
    metrics = batch_ops.apply_kl_in_reward(batch, FixedKLController(0.1), "kl")
    rewards = batch.batch["token_level_rewards"]
    # kl = old - ref = 0.5 per valid token; beta 0.1 -> -0.05 each, padding untouched.
    assert torch.allclose(rewards[0], torch.tensor([-0.05, 1.0 - 0.05, 0.0]))
    assert torch.allclose(rewards[1], torch.tensor([-0.05, -0.05, -0.05]))
    assert metrics == pytest.approx({"actor/reward_kl_penalty": 0.5, "actor/reward_kl_penalty_coeff": 0.1})


def test_adaptive_kl_controller_moves_with_observed_kl() -> None:
    ctrl = get_kl_controller(
        load_config(
            None, ["algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.target_kl=0.1"]
        ).algorithm.kl_ctrl
    )
    before = ctrl.value
    batch_ops.apply_kl_in_reward(_batch([1.0, 0.0], ["a", "a"]), ctrl, "kl")  # KL 0.5 >> target
    assert ctrl.value > before


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_compute_advantage_outcome_estimators_rank_better_answers_higher(estimator: str) -> None:
    cfg = load_config(None, [f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.n=2"])
    batch = _batch([1.0, 0.0, 0.0, 1.0], ["a", "a", "b", "b"])
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch_ops.compute_advantage(batch, cfg.algorithm)
    adv = batch.batch["advantages"]
    assert adv.shape == (4, 3)
    assert adv[0, 0] > adv[1, 0] and adv[3, 0] > adv[2, 0]
    assert adv[0, 2] == 0  # masked token of the shorter response


def test_compute_advantage_gae_uses_values() -> None:
    cfg = load_config(None, ["algorithm.adv_estimator=gae", "algorithm.lam=1.0", "algorithm.gamma=1.0"])
    batch = _batch([1.0, 0.0], ["a", "b"])
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch.batch["values"] = torch.zeros(2, 3)
    batch_ops.compute_advantage(batch, cfg.algorithm)
    assert torch.allclose(batch.batch["returns"][1], torch.zeros(3))
    assert torch.allclose(batch.batch["returns"][0], torch.tensor([1.0, 1.0, 0.0]))


def test_group_filter_metric_sources() -> None:
    batch = _batch([1.0, 0.0], ["a", "a"])
    assert batch_ops.group_filter_metric(batch, "acc", {"acc": [True, False]}).tolist() == [1.0, 0.0]
    assert batch_ops.group_filter_metric(batch, "seq_reward", {}).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="filter_groups.metric"):
        batch_ops.group_filter_metric(batch, "nonsense", {"acc": [1, 0]})


def test_truncate_groups_keeps_whole_groups_in_order() -> None:
    batch = _batch([1.0, 0.0, 1.0, 0.0, 1.0, 0.0], ["a", "a", "b", "b", "c", "c"])
    kept = batch_ops.truncate_groups(batch, 2)
    assert list(kept.non_tensor_batch["uid"]) == ["a", "a", "b", "b"]


def test_data_metrics_use_verl_names() -> None:
    batch = _batch([1.0, 0.0], ["a", "a"])
    batch.batch["response_mask"] = batch_ops.response_mask_of(batch)
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch.batch["advantages"] = torch.ones(2, 3)
    batch.batch["returns"] = torch.ones(2, 3)
    batch.batch["values"] = torch.zeros(2, 3)
    metrics = compute_data_metrics(batch, use_critic=True)
    assert metrics["critic/score/mean"] == 0.5
    assert metrics["response_length/mean"] == 2.5
    assert metrics["response_length/clip_ratio"] == 0.5
    assert metrics["prompt_length/mean"] == 1.0
    assert "critic/values/mean" in metrics and "critic/vf_explained_var" in metrics
    perf = compute_throughput_metrics(batch, step_seconds=2.0, n_workers=2)
    assert perf["perf/total_num_tokens"] == 7.0 and perf["perf/throughput"] == 7.0 / 2.0 / 2


def test_data_metrics_leave_out_trajectories_cut_by_over_sampling() -> None:
    """A cut row (unfinished, response_mask 0, not trained) would pull the score and the length down."""
    batch = _batch([1.0, 0.0, 0.0], ["a", "a", "a"])
    batch.batch["response_mask"] = batch_ops.response_mask_of(batch)
    batch.batch["response_mask"][2] = 0  # cut: what the agent manager hands back
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch.batch["advantages"] = batch.batch["returns"] = torch.ones(3, 3)
    batch.non_tensor_batch[CUT_KEY] = np.array([False, False, True])
    metrics = compute_data_metrics(batch, use_critic=False)
    assert metrics["critic/score/mean"] == 0.5 and metrics["critic/rewards/min"] == 0.0
    assert metrics["response_length/mean"] == 2.5 and metrics["response_length/min"] == 2.0
    assert metrics["prompt_length/mean"] == 1.0
    del batch.non_tensor_batch[CUT_KEY]  # without over-sampling every row counts
    assert compute_data_metrics(batch, use_critic=False)["critic/score/mean"] == pytest.approx(1 / 3)


def test_reduce_worker_metrics_and_timer() -> None:
    assert reduce_worker_metrics({"a": [1.0, 3.0], "b": 2, "c": torch.tensor(1.5), "d": "x"}) == {
        "a": 2.0,
        "b": 2.0,
        "c": 1.5,
    }
    timings: dict[str, float] = {}
    with timed("gen", timings):
        pass
    assert timings["gen"] >= 0


def test_total_training_steps_rule() -> None:
    assert compute_total_training_steps(load_config(None, ["trainer.total_epochs=3"]), 5) == 15
    assert compute_total_training_steps(load_config(None, ["trainer.total_training_steps=4"]), 5) == 4


def test_balanced_order_equal_sizes_and_even_sums() -> None:
    lengths = [10, 9, 1, 1, 8, 2, 7, 2]
    parts = batch_ops.balanced_order(lengths, 2)
    assert [len(p) for p in parts] == [4, 4]
    assert sorted(i for p in parts for i in p) == list(range(8))
    sums = [sum(lengths[i] for i in p) for p in parts]
    assert sums == [20, 20]  # contiguous halves: 21 vs 19
    lopsided = [10, 10, 10, 10, 1, 1, 1, 1]  # contiguous halves: 40 vs 4
    sums = [sum(lopsided[i] for i in p) for p in batch_ops.balanced_order(lopsided, 2)]
    assert sums == [22, 22]
    with pytest.raises(ValueError, match="7 rows cannot be split into 2 equal parts"):
        batch_ops.balanced_order([1] * 7, 2)


def test_balance_batch_moves_whole_rows_and_reports_verl_metrics() -> None:
    mask = torch.zeros(4, 6, dtype=torch.long)
    for i, n in enumerate([6, 5, 1, 2]):  # ranks would get 11 and 3 tokens in order
        mask[i, -n:] = 1
    batch = DataProto.from_dict(
        {"attention_mask": mask, "row": torch.arange(4)}, {"uid": np.array(["a", "b", "c", "d"], dtype=object)}
    )
    balanced, metrics = batch_ops.balance_batch(batch, 2)
    assert metrics["global_seqlen/minmax_diff"] == 8.0
    assert metrics["global_seqlen/balanced_max"] - metrics["global_seqlen/balanced_min"] <= 2.0
    assert metrics["global_seqlen/mean"] == 7.0
    rows = balanced.batch["row"].tolist()
    assert sorted(rows) == [0, 1, 2, 3] and rows != [0, 1, 2, 3]
    # every field moves with its row
    assert [balanced.non_tensor_batch["uid"][k] for k in range(4)] == ["abcd"[r] for r in rows]
    assert torch.equal(balanced.batch["attention_mask"], mask[rows])
    same, none = batch_ops.balance_batch(batch, 1)
    assert same is batch and none == {}


def test_pick_samples_is_a_fixed_choice_of_prompts() -> None:
    samples = [(f"q{i}", f"a{i}", float(i % 2)) for i in range(10)]
    first = batch_ops.pick_samples(samples, 3)
    later = batch_ops.pick_samples([(q, a + "!", s) for q, a, s in reversed(samples)], 3)
    assert len(first) == 3 and [q for q, _, _ in first] == [q for q, _, _ in later]
    assert sorted(batch_ops.pick_samples(samples, 50)) == samples  # more than there are: all of them


def test_decode_samples_drops_padding() -> None:
    class Chars:
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return "".join(chr(96 + i) for i in ids)

    prompts = torch.tensor([[0, 1, 2], [3, 4, 5]])
    responses = torch.tensor([[6, 0], [7, 8]])
    attention = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    batch = DataProto.from_dict({"prompts": prompts, "responses": responses, "attention_mask": attention})
    assert batch_ops.decode_samples(batch, Chars()) == (["ab", "cde"], ["f", "gh"])
