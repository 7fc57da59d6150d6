"""Offline training on an `FSDPEngine`: one gradient-accumulation loop, two objectives (SFT and DPO).

`OfflineLearner.update(batch, micro_batch_size)` cuts this rank's rows into micro-batches, asks the
objective for each micro-batch's summed loss, scales it by world size / the global number of loss units
(tokens for SFT, pairs for DPO) and steps the optimizer once: any world size and any micro-batch size
give the gradient of the same global mean (FSDP averages gradients over ranks). Objectives also return
per-row statistics (detached), which the driver reduces with `summarize` into the logged metrics, so
training and validation metrics, over any number of ranks, come from one formula.

Sequences are left-padded with a `loss_mask` marking the target tokens (`hybridflow.data.sft_dataset`).
Only the positions from the micro-batch's first target on reach the LM head (`response_logits`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from hybridflow.algorithms.dpo import compute_dpo_loss, sequence_log_prob
from hybridflow.algorithms.torch_functional import logprobs_from_logits
from hybridflow.data.sft_dataset import SEQUENCE_KEYS
from hybridflow.engines.actor import response_logits
from hybridflow.engines.batching import plan_micro_batches
from hybridflow.engines.fsdp_engine import FSDPEngine
from hybridflow.protocol import DataProto

RowStats = dict[str, torch.Tensor]


def target_log_probs(engine: FSDPEngine, seq: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs of the target tokens, their mask and whether each is the model's argmax, from the first target on.

    Returns three (rows, R) tensors for the last R positions, R = the sequence length minus the first column
    where any row has a target: what the LM head computes is the targets' span, not the padded prompt.
    """
    loss_mask = seq["loss_mask"]
    columns = loss_mask.bool().any(dim=0).nonzero()
    # Position 0 is never a target (nothing predicts it); an all-zero mask still yields one column.
    first = max(int(columns[0]), 1) if len(columns) else loss_mask.shape[1] - 1
    targets = seq["input_ids"][:, first:]
    micro = DataProto.from_dict({
        "input_ids": seq["input_ids"], "attention_mask": seq["attention_mask"],
        "position_ids": seq["position_ids"], "responses": targets,
    })
    logits = response_logits(engine, micro, temperature=1.0)
    targets = targets.to(logits.device)
    log_probs = logprobs_from_logits(logits, targets)
    with torch.no_grad():
        correct = logits.argmax(dim=-1) == targets
    return log_probs, loss_mask[:, first:].to(logits.device), correct


class Objective(Protocol):
    """What an offline loss provides to the shared loop."""

    def units(self, batch: DataProto) -> float:
        """What the loss is a mean over, in this rank's rows (tokens, pairs)."""
        ...

    def loss(self, engine: FSDPEngine, micro: DataProto) -> tuple[torch.Tensor, RowStats]:
        """The micro-batch's loss summed over its units, and detached per-row statistics."""
        ...


class SftObjective:
    """Cross-entropy of the target tokens (token mean over the global batch, as verl's SFT trainer)."""

    def units(self, batch: DataProto) -> float:
        """Target tokens."""
        return float(batch.batch["loss_mask"].sum())

    def loss(self, engine: FSDPEngine, micro: DataProto) -> tuple[torch.Tensor, RowStats]:
        """Summed negative log-likelihood of the targets; per row: nll, tokens, correct tokens, exact match."""
        log_probs, mask, correct = target_log_probs(engine, {k: micro.batch[k] for k in SEQUENCE_KEYS})
        mask_f = mask.to(log_probs.dtype)
        nll = -(log_probs * mask_f).sum(-1)
        on_mask = mask.bool()
        stats = {
            "nll": nll.detach().float().cpu(),
            "tokens": mask_f.sum(-1).cpu(),
            "correct": (correct & on_mask).sum(-1).float().cpu(),
            # Every target is the argmax: greedy decoding from the prompt writes exactly this response.
            "exact": (correct | ~on_mask).all(-1).float().cpu(),
        }
        return nll.sum(), stats


class DpoObjective:
    """DPO / IPO on (chosen, rejected) pairs against a frozen reference engine (mean over the global pairs)."""

    def __init__(self, reference: FSDPEngine, beta: float, loss_type: str) -> None:
        self.reference = reference
        self.beta = beta
        self.loss_type = loss_type

    def units(self, batch: DataProto) -> float:
        """Pairs."""
        return float(len(batch))

    def loss(self, engine: FSDPEngine, micro: DataProto) -> tuple[torch.Tensor, RowStats]:
        """Summed pair losses; chosen and rejected go through one forward each of policy and reference."""
        pairs = len(micro)
        seq = {k: torch.cat([micro.batch[f"chosen_{k}"], micro.batch[f"rejected_{k}"]]) for k in SEQUENCE_KEYS}
        log_probs, mask, correct = target_log_probs(engine, seq)
        policy = sequence_log_prob(log_probs, mask, self.loss_type)
        with torch.no_grad():
            ref_log_probs, _, _ = target_log_probs(self.reference, seq)
            reference = sequence_log_prob(ref_log_probs, mask, self.loss_type)
        out = compute_dpo_loss(policy[:pairs], policy[pairs:], reference[:pairs], reference[pairs:],
                               self.beta, self.loss_type)
        stats = {
            "loss": out.losses.detach().float().cpu(),
            "chosen_reward": out.chosen_rewards.float().cpu(),
            "rejected_reward": out.rejected_rewards.float().cpu(),
            "chosen_logp": policy[:pairs].detach().float().cpu(),
            "rejected_logp": policy[pairs:].detach().float().cpu(),
            "chosen_exact": (correct[:pairs] | ~mask[:pairs].bool()).all(-1).float().cpu(),
        }
        return out.losses.sum(), stats


def summarize_sft(stats: RowStats) -> dict[str, float]:
    """verl's train|val/loss (token mean) plus TRL's mean_token_accuracy and the share of exactly right responses."""
    tokens = float(stats["tokens"].sum().clamp(min=1))
    return {
        "loss": float(stats["nll"].sum()) / tokens,
        "mean_token_accuracy": float(stats["correct"].sum()) / tokens,
        "exact_match": float(stats["exact"].mean()),
    }


def summarize_dpo(stats: RowStats) -> dict[str, float]:
    """TRL's DPO metrics (loss, rewards/*, logps/*) and how often greedy decoding writes the chosen response."""
    chosen, rejected = stats["chosen_reward"], stats["rejected_reward"]
    return {
        "loss": float(stats["loss"].mean()),
        "rewards/chosen": float(chosen.mean()),
        "rewards/rejected": float(rejected.mean()),
        "rewards/accuracies": float((chosen > rejected).float().mean()),
        "rewards/margins": float((chosen - rejected).mean()),
        "logps/chosen": float(stats["chosen_logp"].mean()),
        "logps/rejected": float(stats["rejected_logp"].mean()),
        "chosen_exact_match": float(stats["chosen_exact"].mean()),
    }


SUMMARIZERS: dict[str, Callable[[RowStats], dict[str, float]]] = {"sft": summarize_sft, "dpo": summarize_dpo}


def _concat(parts: list[RowStats]) -> RowStats:
    return {key: torch.cat([p[key] for p in parts]) for key in parts[0]} if parts else {}


class OfflineLearner:
    """One model, one objective: gradient accumulation, the optimizer step, evaluation."""

    def __init__(self, engine: FSDPEngine, objective: Objective) -> None:
        self.engine = engine
        self.objective = objective

    def accumulate_gradients(self, batch: DataProto, micro_batch_size: int | None) -> RowStats:
        """Forward and backward over this rank's rows (no optimizer step); the per-row statistics."""
        global_units = float(self.engine.all_reduce_sum(self.objective.units(batch)))
        # A summed loss x world / global units: FSDP's gradient average over ranks then yields the global mean.
        scale = self.engine.world_size / global_units if global_units > 0 else 0.0
        parts = []
        for idx in plan_micro_batches(batch, micro_batch_size):
            loss, stats = self.objective.loss(self.engine, batch.select_idxs(idx))
            (loss * scale).backward()
            parts.append(stats)
        return _concat(parts)

    def update(self, batch: DataProto, micro_batch_size: int | None) -> tuple[RowStats, dict[str, float]]:
        """One optimizer step on this rank's rows; per-row statistics and the lr / gradient norm of the step."""
        self.engine.module.train()
        lr = self.engine.current_lr()
        stats = self.accumulate_gradients(batch, micro_batch_size)
        return stats, {"lr": lr, "grad_norm": self.engine.optimizer_step()}

    def evaluate(self, batch: DataProto, micro_batch_size: int | None) -> RowStats:
        """Per-row statistics without gradients (validation)."""
        was_training = self.engine.module.training
        self.engine.module.eval()
        parts = []
        with torch.no_grad():
            for idx in plan_micro_batches(batch, micro_batch_size):
                parts.append(self.objective.loss(self.engine, batch.select_idxs(idx))[1])
        self.engine.module.train(was_training)
        return _concat(parts)


def build_objective(recipe: str, config: Any, reference: Callable[[], FSDPEngine]) -> Objective:
    """The objective of a recipe; `reference()` builds the frozen reference engine (DPO only)."""
    if recipe == "sft":
        return SftObjective()
    if recipe == "dpo":
        return DpoObjective(reference(), float(config.dpo.beta), str(config.dpo.loss_type))
    raise ValueError(f"unknown offline recipe {recipe!r}; use sft or dpo")
