"""Per-step metrics with verl's names, computed from a finished batch and phase timings (pure)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from hybridflow.engines.batching import reduce_metric
from hybridflow.protocol import DataProto
from hybridflow.trainer.batch_ops import cut_rows


@contextmanager
def timed(name: str, timings: dict[str, float]) -> Iterator[None]:
    """Add the wall time of the block to `timings[name]` (seconds)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def compute_data_metrics(batch: DataProto, use_critic: bool) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths of one training batch.

    Trajectories cut by over-sampling (rollout.over_sample_rate) are left out of the per-sequence stats: they
    are unfinished and not trained on (response_mask 0), so counting them would pull the score and the response
    length down by the share cut (agent/over_sample_cut/mean says how many there were)."""
    tensors = batch.batch
    rows = torch.from_numpy(~cut_rows(batch))
    response_length = tensors["responses"].shape[-1]
    response_mask = tensors["response_mask"].bool()
    prompt_mask = tensors["attention_mask"][:, :-response_length].bool()
    prompt_lengths = prompt_mask.sum(-1).float()[rows]
    response_lengths = response_mask.sum(-1).float()[rows]
    max_prompt_length = prompt_mask.shape[-1]

    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", tensors["token_level_scores"].sum(-1)[rows]))
    metrics.update(_stats("critic/rewards", tensors["token_level_rewards"].sum(-1)[rows]))
    metrics.update(_stats("critic/advantages", torch.masked_select(tensors["advantages"], response_mask)))
    metrics.update(_stats("critic/returns", torch.masked_select(tensors["returns"], response_mask)))
    if use_critic and "values" in tensors:
        values = torch.masked_select(tensors["values"], response_mask)
        returns = torch.masked_select(tensors["returns"], response_mask)
        metrics.update(_stats("critic/values", values))
        # Explained variance of the value head: 1 - Var(returns - values) / Var(returns).
        if returns.numel() > 1:
            metrics["critic/vf_explained_var"] = float(
                1.0 - torch.var(returns - values) / (torch.var(returns) + 1e-5)
            )
    metrics.update(_stats("response_length", response_lengths))
    metrics["response_length/clip_ratio"] = float((response_lengths == response_length).float().mean())
    metrics.update(_stats("prompt_length", prompt_lengths))
    metrics["prompt_length/clip_ratio"] = float((prompt_lengths == max_prompt_length).float().mean())
    return metrics


def compute_timing_metrics(timings: dict[str, float]) -> dict[str, float]:
    """`timing_s/<phase>` for every timed phase."""
    return {f"timing_s/{name}": seconds for name, seconds in timings.items()}


def compute_throughput_metrics(batch: DataProto, step_seconds: float, n_workers: int) -> dict[str, float]:
    """Tokens processed per second per worker (verl's `perf/throughput`) and the token count."""
    total_tokens = int(batch.batch["attention_mask"].sum())
    return {
        "perf/total_num_tokens": float(total_tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": total_tokens / max(step_seconds, 1e-9) / max(n_workers, 1),
    }


def reduce_worker_metrics(metrics: dict[str, object]) -> dict[str, float]:
    """Reduce list-valued metrics (one value per micro-batch or rank) to floats: means, maxima for `*_max`."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, list | tuple):
            numbers = [float(v) for v in value]
            if numbers:
                out[key] = reduce_metric(key, numbers)
        elif isinstance(value, int | float) or hasattr(value, "item"):
            out[key] = float(value)  # type: ignore[arg-type]
    return out
