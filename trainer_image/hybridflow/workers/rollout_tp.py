"""Sync-mode rollout sharded over the trainer's ranks: a tensor-parallel group generates its prompts together.

In sync mode on GPU each worker rank drives one shard of a vLLM engine (`distributed_executor_backend=
external_launcher`, `hybridflow.rollout.vllm_rollout`): ranks g*tp .. g*tp+tp-1 of the worker group form one
engine of tensor_model_parallel_size = tp, and every rank of it must feed the engine the same requests. The
worker group hands each rank its own share of the batch (data parallel over all ranks), so before generating a
rank gathers its group's shares, all of them generate the concatenation, and each keeps the rows of its own
share. The groups are ranks of the trainer's world, so one may span nodes (tp larger than a node's GPUs).
"""

from __future__ import annotations

from typing import Any

from hybridflow.protocol import DataProto


class RolloutTPGroup:
    """This rank's tensor-parallel group of the sync rollout (a gloo subgroup for the prompt exchange)."""

    def __init__(self, tp: int) -> None:
        """Every rank of the world must build it (each subgroup is created collectively, in the same order)."""
        import torch.distributed as dist

        world, rank = dist.get_world_size(), dist.get_rank()
        if world % tp:
            raise ValueError(
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} does not divide the {world} rollout ranks; "
                "use a tensor_model_parallel_size that divides trainer.nnodes x trainer.n_gpus_per_node"
            )
        self.tp, self.index = tp, rank % tp
        groups = [dist.new_group(list(range(start, start + tp)), backend="gloo") for start in range(0, world, tp)]
        self.group = groups[rank // tp]

    def generate(self, engine: Any, prompts: DataProto) -> DataProto:
        """`engine.generate` on the group's prompts (the same on every rank of it); this rank's rows back."""
        import torch.distributed as dist

        shares: list[Any] = [None] * self.tp
        dist.all_gather_object(shares, prompts, group=self.group)
        return generate_shares(engine, shares, self.index)


def generate_shares(engine: Any, shares: list[DataProto], index: int) -> DataProto:
    """Generate for the concatenation of every rank's share (the same call on every rank of the group); the rows
    of share `index`."""
    sizes = [len(share) for share in shares]
    nonempty = [share for share in shares if len(share)]
    out = engine.generate(DataProto.concat(nonempty) if nonempty else shares[index])
    start = sum(sizes[:index])
    return out.slice(start, start + sizes[index])
