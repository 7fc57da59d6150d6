"""A RayWorkerGroup of 2 real Ray actors: dispatch modes, rendezvous env, torch.distributed, futures; a worker
started under nsys by Ray's nsight runtime env (a stand-in `nsys` on the session's PATH)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

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


#: A stand-in for NVIDIA's `nsys profile OPTIONS COMMAND`: logs its pid and arguments, then runs COMMAND in its
#: place (exec: the same pid), with this test's interpreter for `python` (Ray's nsight plugin says `python`).
STAND_IN_NSYS = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write(json.dumps({{"pid": os.getpid(), "args": args}}) + "\\n")
i = 1
while i < len(args) and args[i].startswith("-"):
    i += 1 if args[i].startswith("--") else 2
command = args[i:]
if command[0] == "python":
    command[0] = sys.executable
os.execv(command[0], command)
"""


@pytest.fixture(scope="module")
def nsys_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the stand-in nsys on the Ray session's PATH logs its runs."""
    return tmp_path_factory.mktemp("nsys") / "runs.jsonl"


@pytest.fixture(scope="module")
def group(nsys_log: Path) -> Iterator[RayWorkerGroup]:
    import sys

    import ray
    import ray.cloudpickle

    # Test modules are not importable inside Ray workers: ship this module's classes by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    bin_dir = nsys_log.parent / "bin"
    bin_dir.mkdir()
    (bin_dir / "nsys").write_text(STAND_IN_NSYS.format(python=sys.executable, log=str(nsys_log)))
    (bin_dir / "nsys").chmod(0o755)
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{bin_dir}:{path}"  # Ray's processes, started by ray.init, look nsys up there
    try:
        with local_ray(3):  # 2 CPUs for `group`, 1 for the nsys test's group
            os.environ["PATH"] = path
            pool = RayResourcePool([2], cpus_per_process=1.0, max_colocate_count=2, name_prefix="test")
            wg = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker, offset=100))
            try:
                yield wg
            finally:
                wg.shutdown()
                pool.release()
    finally:
        os.environ["PATH"] = path


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


def test_a_profiled_rank_is_started_under_nsys_with_the_runs_options(
    group: RayWorkerGroup, nsys_log: Path, tmp_path: Path
) -> None:
    """tool=nsys: the chosen rank's actor runs under `nsys profile` with the options nsight_runtime_env made; the
    other rank runs as usual."""
    from hybridflow.config import load_config
    from hybridflow.profiling import nsight_runtime_env

    cfg = load_config(None, [
        "trainer.n_gpus_per_node=2", "global_profiler.tool=nsys", "global_profiler.steps=[1,3]",
        "critic.profiler.enable=True", "critic.profiler.ranks=[1]", f"global_profiler.save_path={tmp_path}",
    ])
    pool = RayResourcePool([2], cpus_per_process=0.5, max_colocate_count=1, name_prefix="nsys")
    profiled = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker, offset=0), name_prefix="critic",
                              runtime_env=nsight_runtime_env(cfg, ["critic"], "critic"))
    try:
        pids = profiled.pid().get(timeout=120)
    finally:
        profiled.shutdown()
        pool.release()
    runs = [json.loads(line) for line in nsys_log.read_text().splitlines()]
    (worker_run,) = [r for r in runs if r["pid"] == pids[1]]  # rank 1 is the nsys process, exec'd into the worker
    assert not any(r["pid"] == pids[0] for r in runs)
    args = worker_run["args"]
    assert args[0] == "profile" and "python" in args and "default_worker.py" in " ".join(args)
    options = args[1:args.index("python")]
    assert {"--trace=cuda,nvtx,cublas,ucx", "--capture-range=cudaProfilerApi", "--capture-range-end=repeat-shutdown:2",
            "--kill=none", "--cuda-memory-usage=true"} <= set(options)
    assert options[options.index("-o") + 1] == f"{tmp_path}/nsys/critic_%p"
