"""Mini/micro-batching helpers shared by the PPO actor and critic engines."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from hybridflow.protocol import DataProto


def loss_units(response_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """What `agg_loss` divides by: valid tokens (token-mean) or sequences with a valid token (seq-*)."""
    if loss_agg_mode == "token-mean":
        return response_mask.sum()
    return (response_mask.sum(dim=-1) > 0).sum()


def accumulation_scale(local_units: torch.Tensor, global_units: torch.Tensor, world_size: int) -> float:
    """Factor turning a micro-batch's local mean loss into its share of the global mini-batch mean.

    Gradients of `mean_micro * units_micro / units_global * world_size` summed over micro-batches and
    averaged over ranks (FSDP's reduce-scatter divides by world size) equal the gradient of the mean
    over the whole mini-batch on all ranks, so 2 ranks train exactly like 1 process on the full batch.
    """
    if float(global_units) <= 0:
        return 0.0
    return float(local_units) / float(global_units) * world_size


def split_batch(data: DataProto, size: int | None) -> list[DataProto]:
    """Rows in order, `size` at a time (None or >= len: one part)."""
    if size is None or size >= len(data):
        return [data]
    return data.split(int(size))


def shuffled(data: DataProto, seed: int) -> DataProto:
    """A row permutation of `data` that is the same on every rank for the same seed."""
    gen = torch.Generator().manual_seed(seed)
    return data.select_idxs(torch.randperm(len(data), generator=gen))


class MetricAccumulator:
    """Collects per-micro-batch metric values and reports their means (maxima for names ending `_max`)."""

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = defaultdict(list)

    def add(self, metrics: dict[str, Any]) -> None:
        """Record one value per metric name."""
        for name, value in metrics.items():
            self._values[name].append(float(value.item() if isinstance(value, torch.Tensor) else value))

    def means(self) -> dict[str, float]:
        """The mean of every metric recorded so far (the maximum of a `*_max` metric)."""
        return {name: max(v) if name.endswith("_max") else sum(v) / len(v) for name, v in self._values.items() if v}
