"""Sync-mode rollout sharded over the trainer's ranks (`hybridflow.workers.rollout_tp`): a tensor-parallel group
generates its ranks' prompts together, and each rank gets its own rows back. Two gloo ranks run the real
exchange with a stand-in engine (a vLLM engine with external_launcher needs GPUs); the config rules say where
such an engine may run."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from hybridflow.config import ConfigError
from hybridflow.protocol import DataProto
from hybridflow.trainer.main_ppo import load_run_config
from hybridflow.workers.rollout_tp import generate_shares


class EchoEngine:
    """Responds to each prompt with its last token + 1; records every batch it was given."""

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def generate(self, prompts: DataProto) -> DataProto:
        ids = prompts.batch["input_ids"]
        self.seen.append(ids[:, -1].tolist())
        out = prompts.select(list(prompts.batch), list(prompts.non_tensor_batch), list(prompts.meta_info))
        out.batch["responses"] = ids[:, -1:] + 1
        return out


def share(values: list[int]) -> DataProto:
    return DataProto.from_dict(
        tensors={"input_ids": torch.tensor([[0, v] for v in values], dtype=torch.long).reshape(len(values), 2)},
        non_tensors={"uid": np.array([f"u{v}" for v in values], dtype=object)}, meta_info={"n": 1},
    )


def test_each_rank_generates_the_whole_group_and_keeps_its_rows() -> None:
    shares = [share([1, 2]), share([]), share([3, 4, 5])]
    for index, expected in ((0, [2, 3]), (1, []), (2, [4, 5, 6])):
        engine = EchoEngine()
        out = generate_shares(engine, shares, index)
        assert engine.seen == [[1, 2, 3, 4, 5]]  # every rank of the group feeds the engine the same requests
        assert out.batch["responses"][:, 0].tolist() == expected
        assert list(out.non_tensor_batch["uid"]) == [f"u{v - 1}" for v in expected]


def _rank(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    import torch.distributed as dist

    from hybridflow.workers.rollout_tp import RolloutTPGroup

    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        group = RolloutTPGroup(2)
        engine = EchoEngine()
        result = group.generate(engine, share([10, 11] if rank == 0 else [20]))
        torch.save({"seen": engine.seen, "responses": result.batch["responses"][:, 0].tolist()}, Path(out) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_ranks_of_one_engine_exchange_their_prompts(tmp_path: Path) -> None:
    from tests.support.server_process import free_port

    mp.start_processes(_rank, args=(free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    results = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    assert results[0]["seen"] == results[1]["seen"] == [[10, 11, 20]]
    assert results[0]["responses"] == [11, 12] and results[1]["responses"] == [21]


RUN = ["actor_rollout_ref.model.path=/m", "data.train_files=/d"]
RO = "actor_rollout_ref.rollout"


def _problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_run_config([*RUN, *overrides])
    return info.value.problems


def test_a_sync_vllm_engine_may_span_whole_nodes() -> None:
    cfg, _ = load_run_config([*RUN, f"{RO}.tensor_model_parallel_size=16", "trainer.nnodes=4", "trainer.n_gpus_per_node=8"])
    assert (cfg.actor_rollout_ref.rollout.mode, cfg.actor_rollout_ref.rollout.tensor_model_parallel_size) == ("sync", 16)
    problems = _problems(f"{RO}.tensor_model_parallel_size=12", "trainer.nnodes=3", "trainer.n_gpus_per_node=8")
    assert any("12 GPUs per engine span nodes of 8 GPUs, so it must be a multiple of trainer.n_gpus_per_node" in p
               for p in problems)
    # a server replica stays on one node
    (problem,) = _problems(f"{RO}.mode=async", f"{RO}.tensor_model_parallel_size=16", "trainer.nnodes=2",
                           "trainer.n_gpus_per_node=8")
    assert "a server replica (rollout.mode=async) spanning nodes is not built" in problem


def test_sync_tensor_parallelism_where_it_cannot_run_is_refused_or_served() -> None:
    (problem,) = _problems(f"{RO}.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2", "trainer.device=cpu")
    assert "on CPU each worker runs an engine of its own: set actor_rollout_ref.rollout.mode=async" in problem
    (problem,) = _problems(f"{RO}.name=sglang", f"{RO}.mode=sync", f"{RO}.tensor_model_parallel_size=2",
                           "trainer.n_gpus_per_node=2")
    assert "with SGLang in sync mode is not built" in problem
    # no mode given (verl's default is async): SGLang with TP runs as server replicas, said at start-up
    cfg, notes = load_run_config([*RUN, f"{RO}.name=sglang", f"{RO}.tensor_model_parallel_size=2",
                                  "trainer.n_gpus_per_node=2"])
    assert cfg.actor_rollout_ref.rollout.mode == "async"
    assert any("SGLang with tensor_model_parallel_size=2 runs (a replica spans its GPUs) in server mode" in n for n in notes)
