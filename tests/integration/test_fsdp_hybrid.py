"""Hybrid sharding (fsdp_size < world size): 2 gloo ranks in groups of 1 replicate the model (HSDP's
replicate dimension only) and still train exactly like one process on the whole batch. Also the GPU
policies (mixed precision, offload) handed to fully_shard, built without a GPU."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from hybridflow.controller.worker import find_free_port
from hybridflow.engines.fsdp_engine import FSDPEngine
from tests.integration.test_fsdp_engine import actor_config, make_batch, model_dir, single, train_once

__all__ = ["model_dir", "single"]  # module-scoped fixtures shared with test_fsdp_engine


def _rank_main(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cfg = actor_config()
        engine = FSDPEngine(model_dir, optim_config=cfg.optim, grad_clip=cfg.grad_clip, fsdp_config={"fsdp_size": 1})
        batch = make_batch(engine.hf_config.vocab_size).chunk(world)[rank]
        result = train_once(engine, batch, micro=len(batch))
        result["mesh"] = [tuple(p.device_mesh.mesh_dim_names) for p in engine.module.parameters()][0]
        result["local_numel"] = sum(p.to_local().numel() for p in engine.module.parameters())
        torch.save(result, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def replicated(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("hsdp")
    mp.start_processes(
        _rank_main, args=(2, find_free_port(), model_dir, str(out)), nprocs=2, join=True, start_method="spawn"
    )
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_groups_of_one_replicate_every_weight(replicated: list[dict[str, Any]], single: dict[str, Any]) -> None:
    assert replicated[0]["mesh"] == ("ddp", "fsdp")
    total = sum(v.numel() for v in single["state"].values())
    assert replicated[0]["local_numel"] == replicated[1]["local_numel"] == total


def test_replicated_ranks_train_like_one_process(replicated: list[dict[str, Any]], single: dict[str, Any]) -> None:
    torch.testing.assert_close(torch.cat([r["log_probs"] for r in replicated]), single["log_probs"], atol=1e-6, rtol=0)
    for name, value in single["state"].items():
        torch.testing.assert_close(replicated[0]["state"][name], value, atol=5e-6, rtol=1e-5)
        assert torch.equal(replicated[0]["state"][name], replicated[1]["state"][name])
    assert replicated[0]["metrics"]["actor/grad_norm"] == pytest.approx(single["metrics"]["actor/grad_norm"], rel=1e-5)


def test_a_group_size_that_does_not_divide_the_ranks_is_refused(model_dir: str) -> None:
    engine = FSDPEngine.__new__(FSDPEngine)
    engine.world_size, engine.device = 4, torch.device("cpu")
    with pytest.raises(ValueError, match="fsdp_size=3 does not divide the 4 ranks"):
        engine._shard(torch.nn.Linear(2, 2), {"fsdp_size": 3})


def test_gpu_shard_policies_mixed_precision_and_offload_keys() -> None:
    """Built without a GPU: the policies fully_shard gets on cuda, and none on CPU."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    from hybridflow.engines.fsdp_engine import shard_policies

    plain = shard_policies("cuda", {"mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "fp32"}})
    assert (plain["mp_policy"].param_dtype, plain["mp_policy"].reduce_dtype) == (torch.bfloat16, torch.float32)
    assert "offload_policy" not in plain
    for key in ("offload_policy", "param_offload", "optimizer_offload"):  # verl's FSDP1 keys are served too
        assert isinstance(shard_policies("cuda", {key: True})["offload_policy"], CPUOffloadPolicy)
    assert shard_policies("cpu", {"param_offload": True, "mixed_precision": {"param_dtype": "bf16"}}) == {}
