"""Tests for hybridflow.protocol: the DataProto batch type."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto, DataProtoItem, pad_dataproto_to_divisor, unpad_dataproto


def make(n: int = 4, meta: dict | None = None) -> DataProto:
    """A batch of ``n`` rows whose every field encodes the row number, so order is checkable."""
    rows = torch.arange(n)
    return DataProto.from_dict(
        tensors={"ids": torch.stack([rows * 10, rows * 10 + 1], dim=1), "score": rows.float() / 2},
        non_tensors={
            "uid": [f"u{i}" for i in range(n)],
            "reward_model": [{"ground_truth": str(i), "style": "rule"} for i in range(n)],
        },
        meta_info={"temperature": 1.0} if meta is None else meta,
    )


def rows_of(dp: DataProto) -> list[int]:
    """Row numbers held by a batch built with make(), checked to agree across all fields."""
    rows = (dp.batch["ids"][:, 0] // 10).tolist()
    assert (dp.batch["ids"][:, 1] - dp.batch["ids"][:, 0]).eq(1).all()
    assert dp.batch["score"].tolist() == [r / 2 for r in rows]
    assert dp.non_tensor_batch["uid"].tolist() == [f"u{r}" for r in rows]
    assert [d["ground_truth"] for d in dp.non_tensor_batch["reward_model"]] == [str(r) for r in rows]
    return rows


def assert_same(a: DataProto, b: DataProto) -> None:
    """Assert two DataProtos hold the same keys, dtypes and values."""
    assert a.batch.keys() == b.batch.keys()
    for k in a.batch:
        assert a.batch[k].dtype == b.batch[k].dtype and torch.equal(a.batch[k], b.batch[k]), k
    assert a.non_tensor_batch.keys() == b.non_tensor_batch.keys()
    for k in a.non_tensor_batch:
        assert a.non_tensor_batch[k].dtype == b.non_tensor_batch[k].dtype, k
        assert a.non_tensor_batch[k].tolist() == b.non_tensor_batch[k].tolist(), k
    assert a.meta_info == b.meta_info


# ---------------------------------------------------------------- construction and checks
def test_construction_defaults_and_len() -> None:
    empty = DataProto()
    assert len(empty) == 0 and empty.batch_size == 0
    assert empty.batch == {} and empty.non_tensor_batch == {} and empty.meta_info == {}
    dp = make(5)
    assert len(dp) == 5 and dp.batch_size == 5
    only_objects = DataProto(non_tensor_batch={"x": np.array([1, 2, 3])})
    assert len(only_objects) == 3


def test_list_of_lists_and_dicts_become_1d_object_arrays() -> None:
    dp = DataProto(
        non_tensor_batch={
            "pairs": [[1, 2], [3, 4], [5, 6]],  # equal inner lengths: np.array would make this 3x2
            "info": [{"a": 1}, {"a": 2}, {"a": 3}],
            "tup": ((1,), (2,), (3,)),
        }
    )
    for key in ("pairs", "info", "tup"):
        arr = dp.non_tensor_batch[key]
        assert isinstance(arr, np.ndarray) and arr.dtype == object and arr.shape == (3,), key
    assert dp.non_tensor_batch["pairs"][1] == [3, 4]
    assert dp.non_tensor_batch["info"][2] == {"a": 3}


def test_caller_dicts_are_not_mutated() -> None:
    non_tensors = {"x": [1, 2]}
    DataProto(non_tensor_batch=non_tensors)
    assert non_tensors == {"x": [1, 2]}


def test_mismatched_lengths_error_names_key_and_lengths() -> None:
    with pytest.raises(ValueError, match=r"non_tensor_batch\['uid'\] has 2 rows but batch\['ids'\] has 3"):
        DataProto.from_dict({"ids": torch.zeros(3, 2)}, {"uid": ["a", "b"]})
    with pytest.raises(ValueError, match=r"batch\['b'\] has 4 rows but batch\['a'\] has 3"):
        DataProto.from_dict({"a": torch.zeros(3), "b": torch.zeros(4)})


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch": {"x": [1, 2]}}, TypeError, r"batch\['x'\] is a list, not a torch.Tensor"),
        ({"batch": {"x": torch.tensor(1.0)}}, ValueError, "0-dim tensor"),
        ({"non_tensor_batch": {"x": torch.zeros(2)}}, TypeError, "put tensors into batch"),
        ({"non_tensor_batch": {"x": 3}}, TypeError, "put batch-wide values into meta_info"),
        ({"non_tensor_batch": {"x": np.array(3)}}, ValueError, "0-dim array"),
    ],
)
def test_bad_values_are_rejected(kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        DataProto(**kwargs)


def test_check_consistency_catches_later_edits() -> None:
    dp = make(3)
    dp.check_consistency()
    dp.batch["extra"] = torch.zeros(2)
    with pytest.raises(ValueError, match=r"batch\['extra'\] has 2 rows"):
        dp.check_consistency()


def test_from_single_dict_splits_by_type() -> None:
    dp = DataProto.from_single_dict(
        {"ids": torch.zeros(2, 3), "uid": np.array(["a", "b"], dtype=object), "msgs": [[{"r": "u"}], []]},
        meta_info={"step": 1},
    )
    assert set(dp.batch) == {"ids"}
    assert set(dp.non_tensor_batch) == {"uid", "msgs"}
    assert dp.non_tensor_batch["msgs"].shape == (2,)
    assert dp.meta_info == {"step": 1}


def test_repr_summarises_keys_and_shapes() -> None:
    text = repr(make(3))
    assert "batch_size=3" in text and "ids: int64[3, 2]" in text and "score: float32[3]" in text
    assert "uid: object[3]" in text and "temperature" in text


# ---------------------------------------------------------------- indexing
def test_int_index_returns_item_with_row_values() -> None:
    dp = make(4)
    item = dp[2]
    assert isinstance(item, DataProtoItem)
    assert item.batch["ids"].tolist() == [20, 21]
    assert item.non_tensor_batch["reward_model"] == {"ground_truth": "2", "style": "rule"}
    assert item.meta_info == {"temperature": 1.0}
    assert dp[-1].non_tensor_batch["uid"] == "u3"
    assert dp[np.int64(1)].non_tensor_batch["uid"] == "u1"
    assert dp[torch.tensor(0)].non_tensor_batch["uid"] == "u0"
    with pytest.raises(IndexError, match="out of range for a batch of 4"):
        dp[4]


def test_iteration_yields_items_in_order() -> None:
    assert [item.non_tensor_batch["uid"] for item in make(3)] == ["u0", "u1", "u2"]


def test_slice_indexing_and_slice_method() -> None:
    dp = make(6)
    assert rows_of(dp[1:4]) == [1, 2, 3]
    assert rows_of(dp[::2]) == [0, 2, 4]
    assert rows_of(dp.slice(2, 6, 2)) == [2, 4]
    assert rows_of(dp.slice(4)) == [4, 5]
    assert len(dp[10:]) == 0
    assert dp[1:3].meta_info == dp.meta_info
    with pytest.raises(ValueError, match="positive step"):
        dp[::-1]


@pytest.mark.parametrize(
    "index",
    [[3, 0, 0], np.array([3, 0, 0]), torch.tensor([3, 0, 0]), torch.tensor([-1, 0, 0]), (3, 0, 0)],
)
def test_index_selection_with_lists_arrays_tensors(index: object) -> None:
    assert rows_of(make(4)[index]) == [3, 0, 0]


def test_boolean_mask_selection() -> None:
    dp = make(4)
    assert rows_of(dp[torch.tensor([True, False, True, False])]) == [0, 2]
    assert rows_of(dp[np.array([False, False, False, True])]) == [3]
    with pytest.raises(IndexError, match="boolean mask has shape"):
        dp[[True, False]]


def test_index_selection_errors_and_empty() -> None:
    dp = make(4)
    assert len(dp[[]]) == 0 and set(dp[[]].batch) == {"ids", "score"}
    with pytest.raises(IndexError, match="out of range"):
        dp[[0, 4]]
    with pytest.raises(TypeError, match="integers or booleans"):
        dp[torch.tensor([0.0, 1.0])]
    with pytest.raises(TypeError, match="indices must be"):
        dp["ids"]  # type: ignore[index]


def test_index_selection_copies_while_slice_is_a_view() -> None:
    dp = make(3)
    picked = dp[[0, 1]]
    picked.batch["ids"][0, 0] = 99
    assert dp.batch["ids"][0, 0] == 0
    view = dp[0:2]
    view.batch["ids"][0, 0] = 77
    assert dp.batch["ids"][0, 0] == 77


# ---------------------------------------------------------------- keys
def test_select_keys_and_defaults() -> None:
    dp = make(3, meta={"a": 1, "b": 2})
    sub = dp.select(batch_keys=["ids"], non_tensor_batch_keys=[], meta_info_keys=["b"])
    assert set(sub.batch) == {"ids"} and sub.non_tensor_batch == {} and sub.meta_info == {"b": 2}
    everything = dp.select()
    assert_same(everything, dp)
    assert everything.batch["ids"] is dp.batch["ids"]  # no deepcopy: shared tensors
    with pytest.raises(KeyError, match=r"no batch key\(s\) \['nope'\]; available: \['ids', 'score'\]"):
        dp.select(batch_keys=["nope"])


def test_select_deepcopy_shares_nothing() -> None:
    dp = make(2, meta={"cfg": {"k": 1}})
    copied = dp.select(deepcopy=True)
    copied.batch["ids"][0, 0] = 5
    copied.non_tensor_batch["reward_model"][0]["ground_truth"] = "changed"
    copied.meta_info["cfg"]["k"] = 2
    assert dp.batch["ids"][0, 0] == 0
    assert dp.non_tensor_batch["reward_model"][0]["ground_truth"] == "0"
    assert dp.meta_info["cfg"] == {"k": 1}
    assert_same(make(2, meta={"cfg": {"k": 1}}).clone(), make(2, meta={"cfg": {"k": 1}}))


def test_pop_removes_keys() -> None:
    dp = make(3, meta={"a": 1, "b": 2})
    popped = dp.pop(batch_keys=["score"], non_tensor_batch_keys=["uid"], meta_info_keys=["a"])
    assert set(popped.batch) == {"score"} and set(popped.non_tensor_batch) == {"uid"}
    assert popped.meta_info == {"a": 1} and len(popped) == 3
    assert set(dp.batch) == {"ids"} and set(dp.non_tensor_batch) == {"reward_model"}
    assert dp.meta_info == {"b": 2}
    nothing = dp.pop()
    assert len(nothing) == 0 and set(dp.batch) == {"ids"}
    with pytest.raises(KeyError, match="no non_tensor_batch key"):
        dp.pop(non_tensor_batch_keys=["uid"])
    assert set(dp.batch) == {"ids"}  # a failed pop removes nothing


def test_rename() -> None:
    dp = make(2)
    assert dp.rename("score", "reward") is dp
    assert set(dp.batch) == {"ids", "reward"}
    dp.rename(["ids", "reward"], ["reward", "ids"])  # swapping is allowed
    assert dp.batch["ids"].dtype == torch.float32
    with pytest.raises(ValueError, match="would overwrite"):
        dp.rename("ids", "reward")
    with pytest.raises(ValueError, match="1 old keys but 2 new keys"):
        dp.rename(["ids"], ["a", "b"])
    with pytest.raises(KeyError, match="no batch key"):
        dp.rename("missing", "x")


def test_union_merges_and_returns_self() -> None:
    left = make(3).select(batch_keys=["ids"], non_tensor_batch_keys=["uid"])
    right = make(3).select(batch_keys=["ids", "score"], non_tensor_batch_keys=["reward_model"])
    right.meta_info["step"] = 7
    assert left.union(right) is left
    assert set(left.batch) == {"ids", "score"}
    assert set(left.non_tensor_batch) == {"uid", "reward_model"}
    assert left.meta_info == {"temperature": 1.0, "step": 7}
    rows_of(left)
    meta_only = DataProto(meta_info={"eos": 2})
    assert len(meta_only.union(make(3))) == 3 and meta_only.meta_info["eos"] == 2


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda dp: dp.batch["ids"].add_(1), r"batch\['ids'\] holds different values"),
        (
            lambda dp: dp.non_tensor_batch["reward_model"][0].update(style="x"),
            r"non_tensor_batch\['reward_model'\]",
        ),
        (lambda dp: dp.meta_info.update(temperature=0.5), r"meta_info\['temperature'\]"),
    ],
)
def test_union_conflict_raises(change, match: str) -> None:  # type: ignore[no-untyped-def]
    left, right = make(3), make(3)
    change(right)
    with pytest.raises(ValueError, match=match):
        left.union(right)


def test_union_length_mismatch_raises() -> None:
    with pytest.raises(ValueError, match=r"batch sizes differ \(3 vs 2\)"):
        make(3).union(make(2))


# ---------------------------------------------------------------- chunk / split / concat
def test_chunk_equal_parts() -> None:
    dp = make(6)
    parts = dp.chunk(3)
    assert [rows_of(p) for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert all(p.meta_info == {"temperature": 1.0} for p in parts)
    parts[0].meta_info["x"] = 1  # parts own their meta_info dict
    assert "x" not in dp.meta_info and "x" not in parts[1].meta_info
    (whole,) = dp.chunk(1)
    assert rows_of(whole) == list(range(6))


def test_chunk_errors() -> None:
    with pytest.raises(ValueError, match="6 samples do not split into 4 equal chunks; pad first"):
        make(6).chunk(4)
    with pytest.raises(ValueError, match="positive int"):
        make(6).chunk(0)


def test_chunk_meta_only_gives_meta_to_each_part() -> None:
    parts = DataProto(meta_info={"global_step": 3}).chunk(4)
    assert len(parts) == 4 and all(len(p) == 0 and p.meta_info == {"global_step": 3} for p in parts)


def test_split() -> None:
    dp = make(5)
    assert [rows_of(p) for p in dp.split(2)] == [[0, 1], [2, 3], [4]]
    assert [rows_of(p) for p in dp.split(10)] == [[0, 1, 2, 3, 4]]
    assert [rows_of(p) for p in dp.split(5)] == [[0, 1, 2, 3, 4]]
    with pytest.raises(ValueError, match="positive int split_size"):
        dp.split(0)


def test_concat_round_trips_chunk_and_split() -> None:
    dp = make(6)
    assert_same(DataProto.concat(dp.chunk(3)), dp)
    assert_same(DataProto.concat(dp.split(4)), dp)
    assert_same(DataProto.concat([dp]), dp)


def test_concat_merges_meta_info_and_gathers_metrics() -> None:
    a = make(2, meta={"temperature": 1.0, "a": 1, "metrics": {"loss": 0.5}})
    b = make(2, meta={"temperature": 1.0, "b": 2, "metrics": {"loss": 0.25}})
    out = DataProto.concat([a, b])
    assert len(out) == 4
    assert out.meta_info == {"temperature": 1.0, "a": 1, "b": 2, "metrics": {"loss": [0.5, 0.25]}}


def test_concat_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])
    with pytest.raises(ValueError, match=r"meta_info\['temperature'\] differs between parts"):
        DataProto.concat([make(2), make(2, meta={"temperature": 0.7})])
    with pytest.raises(
        ValueError, match=r"part 1 has batch keys \['ids'\] but part 0 has \['ids', 'score'\]"
    ):
        DataProto.concat([make(2), make(2).select(batch_keys=["ids"])])
    short = DataProto.from_dict({"x": torch.zeros(2, 3)})
    long = DataProto.from_dict({"x": torch.zeros(2, 5)})
    with pytest.raises(
        ValueError, match=r"batch\['x'\] cannot be concatenated \(shapes \[\(2, 3\), \(2, 5\)\]\)"
    ):
        DataProto.concat([short, long])


# ---------------------------------------------------------------- reorder / repeat / pad
def test_reorder_with_permutation_and_inverse() -> None:
    dp = make(5)
    perm = torch.tensor([3, 0, 4, 1, 2])
    assert dp.reorder(perm) is dp
    assert rows_of(dp) == [3, 0, 4, 1, 2]
    dp.reorder(torch.argsort(perm))
    assert rows_of(dp) == [0, 1, 2, 3, 4]
    dp.reorder([4, 3, 2, 1, 0])
    assert rows_of(dp) == [4, 3, 2, 1, 0]


@pytest.mark.parametrize("indices", [[0, 1], [0, 0, 1], [0, 1, 3]])
def test_reorder_rejects_non_permutations(indices: list[int]) -> None:
    dp = make(3)
    with pytest.raises(ValueError, match=r"permutation of range\(3\)"):
        dp.reorder(indices)
    assert rows_of(dp) == [0, 1, 2]


def test_repeat_interleave_both_ways() -> None:
    dp = make(3)
    assert rows_of(dp.repeat(2, interleave=True)) == [0, 0, 1, 1, 2, 2]
    assert rows_of(dp.repeat(repeat_times=3, interleave=False)) == [0, 1, 2, 0, 1, 2, 0, 1, 2]
    assert rows_of(dp.repeat()) == [0, 0, 1, 1, 2, 2]
    assert rows_of(dp.repeat(1)) == [0, 1, 2]
    assert len(dp.repeat(0, interleave=False)) == 0 and len(dp.repeat(0)) == 0
    assert dp.repeat(2).meta_info == dp.meta_info
    with pytest.raises(ValueError, match="non-negative"):
        dp.repeat(-1)


def test_repeat_keeps_object_arrays_one_dimensional() -> None:
    dp = DataProto(non_tensor_batch={"pairs": [[1, 2], [3, 4]]})
    for interleave in (True, False):
        out = dp.repeat(2, interleave=interleave).non_tensor_batch["pairs"]
        assert out.shape == (4,) and out.dtype == object


@pytest.mark.parametrize(
    ("n", "divisor", "expected_pad", "expected_rows"),
    [
        (6, 3, 0, [0, 1, 2, 3, 4, 5]),
        (5, 4, 3, [0, 1, 2, 3, 4, 0, 1, 2]),
        (2, 7, 5, [0, 1, 0, 1, 0, 1, 0]),  # more padding than rows: cycle from the start
        (3, 1, 0, [0, 1, 2]),
    ],
)
def test_pad_and_unpad_round_trip(n: int, divisor: int, expected_pad: int, expected_rows: list[int]) -> None:
    dp = make(n)
    padded, pad_size = pad_dataproto_to_divisor(dp, divisor)
    assert pad_size == expected_pad
    assert len(padded) % divisor == 0
    assert rows_of(padded) == expected_rows
    assert_same(unpad_dataproto(padded, pad_size), dp)
    if pad_size == 0:
        assert padded is dp


def test_pad_then_chunk_then_concat_then_unpad() -> None:
    dp = make(7)
    padded, pad_size = pad_dataproto_to_divisor(dp, 4)
    outputs = [part.select(batch_keys=["ids"]) for part in padded.chunk(4)]
    result = unpad_dataproto(DataProto.concat(outputs), pad_size)
    assert torch.equal(result.batch["ids"], dp.batch["ids"])


def test_pad_errors() -> None:
    assert pad_dataproto_to_divisor(DataProto(), 4)[1] == 0
    with pytest.raises(ValueError, match="positive int size_divisor"):
        pad_dataproto_to_divisor(make(3), 0)
    with pytest.raises(ValueError, match=r"pad_size must be in \[0, 3\]"):
        unpad_dataproto(make(3), 4)


# ---------------------------------------------------------------- devices and pickling
def test_to_moves_tensors_and_returns_self() -> None:
    dp = make(2)
    assert dp.to("cpu") is dp
    assert dp.to(torch.device("meta")).batch["ids"].device.type == "meta"
    assert dp.non_tensor_batch["uid"].tolist() == ["u0", "u1"]


def test_pickle_round_trip_keeps_values_and_cpu() -> None:
    dp = make(4, meta={"temperature": 0.7, "eos_token_id": [2, 3], "global_step": 5})
    dp.non_tensor_batch["extra_info"] = np.array(
        [{"index": i, "split": "train"} for i in range(4)], dtype=object
    )
    restored = pickle.loads(pickle.dumps(dp))
    assert isinstance(restored, DataProto)
    assert_same(restored, dp)
    assert all(t.device.type == "cpu" for t in restored.batch.values())
    assert restored.non_tensor_batch["extra_info"][2] == {"index": 2, "split": "train"}


def test_object_arrays_of_dicts_survive_every_operation() -> None:
    dp = make(4)

    def gt(d: DataProto) -> list[str]:
        return [x["ground_truth"] for x in d.non_tensor_batch["reward_model"]]

    assert gt(dp[[1, 3]]) == ["1", "3"]
    assert gt(dp[1:3]) == ["1", "2"]
    assert [gt(p) for p in dp.chunk(2)] == [["0", "1"], ["2", "3"]]
    assert gt(DataProto.concat(dp.split(3))) == ["0", "1", "2", "3"]
    assert gt(dp.repeat(2)) == ["0", "0", "1", "1", "2", "2", "3", "3"]
    assert gt(pad_dataproto_to_divisor(dp, 3)[0]) == ["0", "1", "2", "3", "0", "1"]
    assert gt(dp.select(deepcopy=True)) == ["0", "1", "2", "3"]
    assert gt(pickle.loads(pickle.dumps(dp))) == ["0", "1", "2", "3"]
    dp.reorder([2, 3, 0, 1])
    assert gt(dp) == ["2", "3", "0", "1"]
    assert dp.non_tensor_batch["reward_model"].shape == (4,)


def test_pickled_chunk_carries_only_its_own_rows() -> None:
    big = DataProto.from_dict({"x": torch.zeros(800, 64), "col": torch.zeros(800, 4)[:, 1]})
    whole = len(pickle.dumps(big))
    part = big.chunk(8)[3]
    size = len(pickle.dumps(part))
    assert size < whole / 6  # a view would otherwise pickle the parent's whole storage
    restored = pickle.loads(pickle.dumps(part))
    assert_same(restored, part)
    assert part.batch["x"].untyped_storage().data_ptr() == big.batch["x"].untyped_storage().data_ptr()


def test_save_and_load_from_disk(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dp = make(3)
    dp.save_to_disk(tmp_path / "batch.pkl")
    assert_same(DataProto.load_from_disk(tmp_path / "batch.pkl"), dp)
    (tmp_path / "other.pkl").write_bytes(pickle.dumps({"not": "a batch"}))
    with pytest.raises(TypeError, match="not a DataProto"):
        DataProto.load_from_disk(tmp_path / "other.pkl")


# ---------------------------------------------------------------- make_iterator
def test_make_iterator_in_order() -> None:
    batches = list(make(6).make_iterator(mini_batch_size=2, epochs=2))
    assert [rows_of(b) for b in batches] == [[0, 1], [2, 3], [4, 5]] * 2
    assert all(b.meta_info == {"temperature": 1.0} for b in batches)


def test_make_iterator_shuffle_is_seeded_and_covers_every_row() -> None:
    dp = make(8)

    def run(seed: int) -> list[list[int]]:
        batches = dp.make_iterator(4, 2, seed=seed, dataloader_kwargs={"shuffle": True})
        return [rows_of(b) for b in batches]

    first, again, other = run(1), run(1), run(2)
    assert first == again and first != other
    assert sorted(first[0] + first[1]) == list(range(8)) and sorted(first[2] + first[3]) == list(range(8))
    assert first[:2] != first[2:]  # each epoch draws a new order


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mini_batch_size": 4, "epochs": 1}, "must be a positive int that divides the batch size 6"),
        ({"mini_batch_size": 0, "epochs": 1}, "must be a positive int"),
        ({"mini_batch_size": 2, "epochs": -1}, "non-negative int epochs"),
        (
            {"mini_batch_size": 2, "epochs": 1, "dataloader_kwargs": {"num_workers": 2}},
            "only dataloader_kwargs",
        ),
    ],
)
def test_make_iterator_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make(6).make_iterator(**kwargs)


def test_single_key_names_are_accepted_as_strings() -> None:
    dp = make(3, meta={"a": 1, "b": 2})
    sub = dp.select(batch_keys="ids", non_tensor_batch_keys="uid", meta_info_keys="a")
    assert set(sub.batch) == {"ids"} and set(sub.non_tensor_batch) == {"uid"} and sub.meta_info == {"a": 1}
    popped = dp.pop(batch_keys="score", meta_info_keys="b")
    assert set(popped.batch) == {"score"} and set(dp.batch) == {"ids"} and dp.meta_info == {"a": 1}


def test_union_treats_equal_copies_and_nans_as_equal() -> None:
    scores = torch.tensor([1.0, float("nan")])
    left = DataProto.from_dict({"s": scores}, {"info": [{"v": float("nan")}, {"v": 1.0}]}, {"eos": [2, 3]})
    right = DataProto.from_dict(
        {"s": scores.clone(), "t": torch.ones(2)},
        {"info": np.array([{"v": float("nan")}, {"v": 1.0}], dtype=object)},
        {"eos": [2, 3]},
    )
    left.union(right)
    assert set(left.batch) == {"s", "t"}
    with pytest.raises(ValueError, match=r"batch\['s'\]"):
        left.union(DataProto.from_dict({"s": scores.double()}))  # same numbers, other dtype


def test_concat_of_meta_only_rank_outputs_gathers_metrics() -> None:
    outputs = [DataProto(meta_info={"metrics": {"actor/loss": float(rank)}}) for rank in range(3)]
    merged = DataProto.concat(outputs)
    assert len(merged) == 0 and merged.meta_info == {"metrics": {"actor/loss": [0.0, 1.0, 2.0]}}
    listed = DataProto.concat([DataProto(meta_info={"metrics": [{"x": 1}, {"x": 2}]}), DataProto()])
    assert listed.meta_info == {"metrics": {"x": [1, 2]}}
