"""Mini/micro-batching helpers shared by the PPO actor and critic engines."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
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


def padded_cost(attention_mask: torch.Tensor, response_length: int) -> torch.Tensor:
    """Per row: the columns a forward over it computes once leading padding is trimmed.

    Prompts are left-padded (`FSDPEngine.forward` drops columns that are padding in every row) and the
    response block keeps its full width, so a row costs its real prompt length + the response width.
    """
    prompt_mask = attention_mask[:, : attention_mask.shape[1] - response_length]
    return prompt_mask.sum(-1) + response_length


def plan_micro_batches(
    data: DataProto,
    micro_batch_size: int | None,
    max_token_len: int | None = None,
    agree: Callable[[int], int] | None = None,
) -> list[torch.Tensor]:
    """Row indices of each micro-batch of `data`.

    Without `max_token_len`: consecutive rows, `micro_batch_size` at a time (None: one micro-batch).
    With it (verl's use_dynamic_bsz): rows sorted longest first and packed so that each micro-batch's
    padded size (rows x its longest row, see `padded_cost`) stays within `max_token_len`; a row longer
    than the budget gets a micro-batch of its own. `agree(count)` returns the largest count over the
    data-parallel ranks, and every rank then splits its largest micro-batches until it has that many:
    FSDP's collectives need the same number of forward/backward passes on every rank.
    """
    n = len(data)
    if max_token_len is None:
        step = n if micro_batch_size is None or micro_batch_size >= n else int(micro_batch_size)
        return [torch.arange(start, min(start + step, n)) for start in range(0, n, step)]
    cost = padded_cost(data.batch["attention_mask"], data.batch["responses"].shape[1])
    order = torch.argsort(cost, descending=True, stable=True).tolist()
    groups: list[list[int]] = []
    for idx in order:  # longest first: a group's first row is its longest
        if groups and cost[groups[-1][0]] * (len(groups[-1]) + 1) <= max_token_len:
            groups[-1].append(idx)
        else:
            groups.append([idx])
    wanted = agree(len(groups)) if agree is not None else len(groups)
    if wanted > n:
        raise ValueError(f"cannot split {n} rows into {wanted} micro-batches; ranks must hold equal row counts")
    while len(groups) < wanted:
        i = max(range(len(groups)), key=lambda g: (len(groups[g]) > 1, cost[groups[g][0]] * len(groups[g])))
        group = groups.pop(i)
        half = len(group) // 2
        groups[i:i] = [group[:half], group[half:]]
    return [torch.tensor(sorted(g)) for g in groups]


def shuffled(data: DataProto, seed: int) -> DataProto:
    """A row permutation of `data` that is the same on every rank for the same seed."""
    gen = torch.Generator().manual_seed(seed)
    return data.select_idxs(torch.randperm(len(data), generator=gen))


def reduce_metric(name: str, values: list[float]) -> float:
    """One value for a metric recorded several times (micro-batches, ranks): the max of `*_max`, else the mean."""
    return max(values) if name.endswith("_max") else sum(values) / len(values)


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
        return {name: reduce_metric(name, v) for name, v in self._values.items() if v}
