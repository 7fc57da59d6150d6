"""AdamW and the learning-rate schedule (linear warm-up, then constant or cosine), from an optim config.

Reads verl's `optim` keys: lr, weight_decay, betas, lr_warmup_steps (negative: use
lr_warmup_steps_ratio x total_training_steps), lr_scheduler_type (constant | cosine), min_lr_ratio,
num_cycles, total_training_steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch


def _get(cfg: Any, key: str, default: Any) -> Any:
    value = cfg.get(key, default) if isinstance(cfg, dict) else getattr(cfg, key, default)
    return default if value is None else value


def build_optimizer(params: Iterable[torch.nn.Parameter], optim_cfg: Any) -> torch.optim.AdamW:
    """AdamW over `params` with the config's lr, betas and decoupled weight decay."""
    betas = tuple(_get(optim_cfg, "betas", (0.9, 0.999)))
    return torch.optim.AdamW(
        params,
        lr=float(_get(optim_cfg, "lr", 1e-6)),
        betas=(float(betas[0]), float(betas[1])),
        weight_decay=float(_get(optim_cfg, "weight_decay", 0.01)),
    )


def warmup_steps(optim_cfg: Any, total_steps: int) -> int:
    """Warm-up length: `lr_warmup_steps` when >= 0, else `lr_warmup_steps_ratio` x total steps."""
    explicit = int(_get(optim_cfg, "lr_warmup_steps", -1))
    if explicit >= 0:
        return explicit
    return int(float(_get(optim_cfg, "lr_warmup_steps_ratio", 0.0)) * max(total_steps, 0))


def lr_factor(
    step: int,
    warmup: int,
    total_steps: int,
    schedule: str,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup  # linear warm-up reaching the peak on the last warm-up step
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        # Cosine decay to min_lr_ratio (Loshchilov & Hutter 2017, SGDR, arXiv:1608.03983, no restarts).
        span = max(1, total_steps - warmup)
        progress = min(1.0, (step - warmup) / span)
        cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_cycles * progress))
        return min_lr_ratio + (1.0 - min_lr_ratio) * cosine
    raise ValueError(f"unknown lr_scheduler_type {schedule!r}; use constant or cosine")


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, optim_cfg: Any, total_steps: int | None = None
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR stepping once per optimizer step; `total_steps` defaults to the config's."""
    total = int(total_steps if total_steps is not None else _get(optim_cfg, "total_training_steps", -1))
    schedule = str(_get(optim_cfg, "lr_scheduler_type", None) or _get(optim_cfg, "warmup_style", "constant"))
    if schedule == "cosine" and total <= 0:
        raise ValueError(
            "optim.lr_scheduler_type=cosine needs optim.total_training_steps > 0 (the trainer fills it "
            "in from the data size and epochs; set it when building an engine by hand)"
        )
    warmup = warmup_steps(optim_cfg, total)
    min_ratio = float(_get(optim_cfg, "min_lr_ratio", 0.0))
    cycles = float(_get(optim_cfg, "num_cycles", 0.5))
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup, total, schedule, min_ratio, cycles)
    )
