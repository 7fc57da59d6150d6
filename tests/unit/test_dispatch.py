"""Dispatch and collect functions of the single controller, without Ray."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.controller.decorator import (
    Dispatch,
    Execute,
    MethodSpec,
    collect,
    dispatch,
    get_method_spec,
    register,
    registered_methods,
)
from hybridflow.controller.worker import Worker
from hybridflow.protocol import DataProto


def make_batch(n: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(n * 2).reshape(n, 2)},
        non_tensors={"uid": np.array([f"u{i}" for i in range(n)], dtype=object)},
        meta_info={"temperature": 1.0},
    )


def test_one_to_all_broadcasts_and_collects_list() -> None:
    planned = dispatch(Dispatch.ONE_TO_ALL, 3, 7, flag=True)
    assert planned.args == [(7,)] * 3
    assert planned.kwargs == [{"flag": True}] * 3
    assert collect(Dispatch.ONE_TO_ALL, ["a", "b", "c"], planned.context) == ["a", "b", "c"]


def test_rank_zero_returns_first_result() -> None:
    planned = dispatch(Dispatch.RANK_ZERO, 2, "path")
    assert planned.args == [("path",), ("path",)]
    assert collect(Dispatch.RANK_ZERO, ["r0", "r1"], planned.context) == "r0"


def test_all_to_all_hands_entry_i_to_rank_i() -> None:
    planned = dispatch(Dispatch.ALL_TO_ALL, 2, [1, 2], name=["a", "b"])
    assert planned.args == [(1,), (2,)]
    assert planned.kwargs == [{"name": "a"}, {"name": "b"}]


def test_all_to_all_rejects_wrong_length_with_clear_message() -> None:
    with pytest.raises(ValueError, match="one entry per rank"):
        dispatch(Dispatch.ALL_TO_ALL, 3, [1, 2])


@pytest.mark.parametrize("n,world", [(8, 2), (5, 2), (3, 4), (7, 3)])
def test_dp_compute_proto_roundtrip_pads_and_unpads(n: int, world: int) -> None:
    batch = make_batch(n)
    planned = dispatch(Dispatch.DP_COMPUTE_PROTO, world, batch, scale=2)
    chunks = [a[0] for a in planned.args]
    assert len(chunks) == world
    assert len({len(c) for c in chunks}) == 1  # equal chunks after padding
    assert planned.context["pad_size"] == (-n) % world
    assert all(k == {"scale": 2} for k in planned.kwargs)
    # each "rank" doubles x; collect must restore the original order and length
    outputs = [
        DataProto.from_dict(tensors={"y": c.batch["x"] * 2}, non_tensors={"uid": c.non_tensor_batch["uid"]})
        for c in chunks
    ]
    merged = collect(Dispatch.DP_COMPUTE_PROTO, outputs, planned.context)
    assert len(merged) == n
    assert torch.equal(merged.batch["y"], batch.batch["x"] * 2)
    assert list(merged.non_tensor_batch["uid"]) == list(batch.non_tensor_batch["uid"])


def test_dp_collect_unpads_outputs_with_several_rows_per_input() -> None:
    batch = make_batch(3)
    planned = dispatch(Dispatch.DP_COMPUTE_PROTO, 2, batch)  # padded to 4: chunks of 2
    outputs = [a[0].repeat(2, interleave=True) for a in planned.args]  # n=2 samples per row
    merged = collect(Dispatch.DP_COMPUTE_PROTO, outputs, planned.context)
    assert list(merged.non_tensor_batch["uid"]) == ["u0", "u0", "u1", "u1", "u2", "u2"]
    with pytest.raises(ValueError, match="same whole multiple"):
        collect(Dispatch.DP_COMPUTE_PROTO, [outputs[0], outputs[1][:1]], planned.context)


def test_dp_compute_proto_splits_keyword_dataproto_too() -> None:
    planned = dispatch(Dispatch.DP_COMPUTE_PROTO, 2, data=make_batch(4))
    assert [len(k["data"]) for k in planned.kwargs] == [2, 2]
    assert torch.equal(planned.kwargs[1]["data"].batch["x"], torch.tensor([[4, 5], [6, 7]]))


def test_dp_compute_proto_needs_a_dataproto() -> None:
    with pytest.raises(TypeError, match="no DataProto argument"):
        dispatch(Dispatch.DP_COMPUTE_PROTO, 2, [1, 2])


def test_dp_compute_proto_rejects_unequal_lengths() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        dispatch(Dispatch.DP_COMPUTE_PROTO, 2, make_batch(4), make_batch(6))


def test_dp_collect_gathers_metrics_and_handles_none() -> None:
    outputs = [DataProto(meta_info={"metrics": {"loss": float(r)}}) for r in range(2)]
    merged = collect(Dispatch.DP_COMPUTE_PROTO, outputs, {"pad_size": 0})
    assert merged.meta_info["metrics"] == {"loss": [0.0, 1.0]}
    assert collect(Dispatch.DP_COMPUTE_PROTO, [None, None], {}) is None
    with pytest.raises(TypeError, match="must return a DataProto"):
        collect(Dispatch.DP_COMPUTE_PROTO, [outputs[0], None], {})


def test_register_records_spec_and_inherits() -> None:
    class Base(Worker):
        @register(Dispatch.DP_COMPUTE_PROTO)
        def compute(self, data: DataProto) -> DataProto:
            return data

    class Child(Base):
        @register(Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO, blocking=False)
        def save(self, path: str) -> None:
            return None

        def helper(self) -> None:  # not registered: not exposed on the group
            return None

    specs = registered_methods(Child)
    assert specs["compute"] == MethodSpec(Dispatch.DP_COMPUTE_PROTO)
    assert specs["save"] == MethodSpec(Dispatch.ONE_TO_ALL, Execute.RANK_ZERO, blocking=False)
    assert "get_dist_info" in specs  # from Worker
    assert "helper" not in specs
    assert get_method_spec(Child.helper) is None


def test_register_rejects_non_enum_mode() -> None:
    with pytest.raises(TypeError, match="member of Dispatch"):
        register(dispatch_mode="dp_compute_proto")  # type: ignore[arg-type]
