"""Micro-batch planning: fixed row counts, or packed by a token budget with the same count on every rank."""

from __future__ import annotations

import pytest
import torch

from hybridflow.engines.batching import padded_cost, plan_micro_batches
from hybridflow.protocol import DataProto

R = 4


def batch(prompt_lens: list[int], width: int = 10) -> DataProto:
    """Left-padded prompts of the given real lengths (prompt block `width`) + a response block of R."""
    n = len(prompt_lens)
    mask = torch.zeros(n, width + R, dtype=torch.long)
    for i, length in enumerate(prompt_lens):
        mask[i, width - length : width] = 1
    mask[:, width:] = 1
    return DataProto.from_dict(tensors={"attention_mask": mask, "responses": torch.zeros(n, R, dtype=torch.long)})


def covered(parts: list[torch.Tensor], n: int) -> bool:
    return sorted(i for p in parts for i in p.tolist()) == list(range(n))


def test_fixed_micro_batches_are_consecutive_rows() -> None:
    parts = plan_micro_batches(batch([3] * 7), micro_batch_size=3)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [p.tolist() for p in plan_micro_batches(batch([3] * 4), None)] == [[0, 1, 2, 3]]


def test_padded_cost_is_real_prompt_plus_response_width() -> None:
    assert padded_cost(batch([3, 10, 0]).batch["attention_mask"], R).tolist() == [7, 14, 4]


def test_token_budget_packs_within_the_budget_and_covers_every_row_once() -> None:
    lens = [9, 1, 5, 2, 8, 3, 3, 7, 1, 6]
    data = batch(lens)
    cost = padded_cost(data.batch["attention_mask"], R)
    parts = plan_micro_batches(data, micro_batch_size=1, max_token_len=30)  # the row count is ignored
    assert covered(parts, len(lens))
    for p in parts:
        assert int(cost[p].max()) * len(p) <= 30
        assert p.tolist() == sorted(p.tolist())  # rows keep their order inside a micro-batch
    # packing beats one row per micro-batch: long rows together, short rows together
    assert len(parts) < len(lens)


def test_a_row_over_the_budget_gets_its_own_micro_batch() -> None:
    parts = plan_micro_batches(batch([9, 1, 1]), None, max_token_len=10)
    assert [p.tolist() for p in parts] == [[0], [1, 2]]


def test_every_rank_gets_the_agreed_micro_batch_count() -> None:
    data = batch([1] * 8)  # fits one micro-batch alone
    parts = plan_micro_batches(data, None, max_token_len=1000, agree=lambda count: max(count, 3))
    assert len(parts) == 3 and covered(parts, 8)
    with pytest.raises(ValueError, match="cannot split 8 rows into 9 micro-batches"):
        plan_micro_batches(data, None, max_token_len=1000, agree=lambda count: 9)
