"""StatefulDataLoader: seeded per-epoch shuffles, drop_last, and exact resume from state_dict."""

from __future__ import annotations

import itertools

import pytest

from hybridflow.data.sampler import StatefulDataLoader


def _loader(n: int = 10, batch_size: int = 3, **kwargs: object) -> StatefulDataLoader:
    return StatefulDataLoader(list(range(n)), batch_size, collate_fn=list, **kwargs)  # type: ignore[arg-type]


def _take(loader: StatefulDataLoader, k: int) -> list[list[int]]:
    """k batches, running across epochs the way a trainer's epoch loop does."""
    out: list[list[int]] = []
    while len(out) < k:
        for batch in loader:
            out.append(batch)
            if len(out) == k:
                break
    return out


def test_epoch_is_a_seeded_permutation_without_repeats() -> None:
    loader = _loader(seed=7)
    assert len(loader) == 3  # 10 // 3, last partial batch dropped
    epoch0 = list(loader)
    assert loader.epoch == 1
    flat = list(itertools.chain.from_iterable(epoch0))
    assert len(flat) == 9 and len(set(flat)) == 9
    epoch1 = list(loader)
    assert epoch1 != epoch0  # reshuffled per epoch
    again = _loader(seed=7)
    assert list(again) == epoch0 and list(again) == epoch1  # same (seed, epoch) -> same order
    assert list(_loader(seed=8)) != epoch0


def test_no_shuffle_and_keep_last() -> None:
    loader = _loader(shuffle=False, drop_last=False)
    assert len(loader) == 4
    assert list(loader) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 7])
def test_resume_yields_exactly_the_next_batches(k: int) -> None:
    reference = _take(_loader(seed=3), k + 5)
    original = _loader(seed=3)
    assert _take(original, k) == reference[:k]
    state = original.state_dict()
    resumed = _loader(seed=3)
    resumed.load_state_dict(state)
    assert resumed.epoch == original.epoch
    assert _take(resumed, 5) == reference[k:]


def test_state_after_last_batch_points_at_next_epoch() -> None:
    loader = _loader()
    list(loader)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["position"] == 0


def test_resume_refuses_changed_data_or_settings() -> None:
    state = _loader(seed=1).state_dict()
    with pytest.raises(ValueError, match="dataset_len=10.*dataset_len=11"):
        _loader(n=11, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size"):
        _loader(batch_size=2, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        _loader(seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="position=5"):
        _loader(seed=1).load_state_dict({**state, "position": 5})


def test_dataset_smaller_than_a_batch() -> None:
    with pytest.raises(ValueError, match="fewer than one batch of 4.*train_batch_size"):
        _loader(n=3, batch_size=4)
