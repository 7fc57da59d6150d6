"""A RayWorkerGroup of 2 real Ray actors: dispatch modes, rendezvous env, torch.distributed, futures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from hybridflow.controller import (
    Dispatch,
    Execute,
    GroupFuture,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    register,
)
from hybridflow.protocol import DataProto
from tests.support.ray_local import local_ray

pytestmark = pytest.mark.ray


class EchoWorker(Worker):
    """Records its rank on every row it sees; sums a tensor over the group with gloo."""

    def __init__(self, offset: int) -> None:
        super().__init__()
        self.offset = offset

    @register(Dispatch.DP_COMPUTE_PROTO)
    def tag_rows(self, data: DataProto) -> DataProto:
        n = len(data)
        return DataProto.from_dict(
            tensors={"x": data.batch["x"] + self.offset, "rank": torch.full((n,), self.rank)},
            non_tensors={"uid": data.non_tensor_batch["uid"]},
            meta_info={"metrics": {"rows": n}},
        )

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self) -> int:
        import torch.distributed as dist

        self.init_distributed("gloo")
        t = torch.tensor([self.rank + 1])
        dist.all_reduce(t)
        return int(t.item())

    @register(Dispatch.ALL_TO_ALL)
    def scale(self, value: int) -> int:
        return value * (self.rank + 10)

    @register(Dispatch.RANK_ZERO, execute_mode=Execute.RANK_ZERO)
    def whoami(self) -> int:
        return self.rank

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def group() -> Iterator[RayWorkerGroup]:
    import sys

    import ray
    import ray.cloudpickle

    # Test modules are not importable inside Ray workers: ship this module's classes by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with local_ray(2):
        pool = RayResourcePool([2], cpus_per_process=1.0, max_colocate_count=2, name_prefix="test")
        wg = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker, offset=100))
        try:
            yield wg
        finally:
            wg.shutdown()
            pool.release()


def test_ranks_and_rendezvous_env(group: RayWorkerGroup) -> None:
    infos = group.get_dist_info()
    assert [i["rank"] for i in infos] == [0, 1]
    assert {i["world_size"] for i in infos} == {2}
    assert infos[0]["master_addr"] == infos[1]["master_addr"]
    assert infos[0]["master_port"] == infos[1]["master_port"] is not None
    assert infos[0]["pid"] != infos[1]["pid"]


def test_dp_compute_proto_splits_by_rank_and_restores_order(group: RayWorkerGroup) -> None:
    batch = DataProto.from_dict(
        tensors={"x": torch.arange(5)}, non_tensors={"uid": np.array(list("abcde"), dtype=object)}
    )
    out = group.tag_rows(batch)
    assert torch.equal(out.batch["x"], torch.arange(5) + 100)
    # 5 rows pad to 6: rank 0 gets rows 0-2, rank 1 rows 3-4 (+ one padding row, dropped)
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1]
    assert list(out.non_tensor_batch["uid"]) == list("abcde")
    assert out.meta_info["metrics"] == {"rows": [3, 3]}


def test_gloo_process_group_spans_the_group(group: RayWorkerGroup) -> None:
    assert group.all_reduce_rank() == [3, 3]


def test_all_to_all_and_rank_zero(group: RayWorkerGroup) -> None:
    assert group.scale([1, 2]) == [10, 22]
    assert group.whoami() == 0


def test_non_blocking_method_returns_future(group: RayWorkerGroup) -> None:
    future = group.pid()
    assert isinstance(future, GroupFuture)
    pids = future.get(timeout=60)
    assert len(set(pids)) == 2 and os.getpid() not in pids
