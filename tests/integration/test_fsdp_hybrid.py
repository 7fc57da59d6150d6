"""Hybrid sharding (fsdp_size < world size): 2 gloo ranks in groups of 1 replicate the model (HSDP's
replicate dimension only) and still train exactly like one process on the whole batch. Also the GPU
policies (mixed precision, offload) handed to fully_shard, built without a GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hybridflow.engines.fsdp_engine import FSDPEngine
from tests.integration.test_fsdp_engine import model_dir, run_two_ranks, single

__all__ = ["model_dir", "single"]  # module-scoped fixtures shared with test_fsdp_engine


@pytest.fixture(scope="module")
def replicated(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_two_ranks(model_dir, tmp_path_factory.mktemp("hsdp"), fsdp_config={"fsdp_size": 1})


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
        engine._shard(torch.nn.Linear(2, 2), {"fsdp_size": 3}, set())


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
