"""Pure batch transforms used by the RL loop (no Ray, no workers): masks, group ids, KL, advantages, distillation.

Each function takes a `DataProto` with verl's key names and returns new tensors or a new batch, so
the loop in `ray_trainer.py` stays a readable list of phases and these pieces are testable alone.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import torch

from hybridflow.agent.over_sample import CUT_KEY
from hybridflow.algorithms import get_adv_estimator_fn, kl_penalty, masked_mean, preference_pairs
from hybridflow.algorithms.distillation import (
    compute_distillation_advantages,
    compute_distillation_loss,
    distillation_metrics,
)
from hybridflow.algorithms.rollout_corr import correction_metrics, importance_weights, rejection_mask
from hybridflow.protocol import DataProto, response_mask_of


def add_group_ids(batch: DataProto) -> DataProto:
    """Give every prompt a fresh `uid`; its n samples keep it after `repeat` (GRPO-style grouping)."""
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    return batch


def apply_kl_in_reward(batch: DataProto, kl_ctrl: Any, kl_penalty_type: str) -> dict[str, float]:
    """Subtract beta * KL(actor_old || ref) per token from the scores (Ziegler et al. 2019, eq. 2).

    Sets `token_level_rewards`, updates the (adaptive) KL controller with the observed KL and returns
    verl's metrics `actor/reward_kl_penalty` and `actor/reward_kl_penalty_coeff`.
    """
    mask = response_mask_of(batch)
    kld = (
        kl_penalty(batch.batch["old_log_probs"], batch.batch["ref_log_prob"], kl_penalty=kl_penalty_type)
        * mask
    )
    beta = float(kl_ctrl.value)
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"] - beta * kld
    current_kl = float(masked_mean(kld, mask, axis=-1).mean())
    kl_ctrl.update(current_kl=current_kl, n_steps=len(batch))
    return {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def estimator_non_tensors(batch: DataProto) -> dict[str, Any]:
    """The batch's non-tensor data with the reward's extra outputs also under their own names, as verl's
    estimators see them (gdpo reads its reward components by name)."""
    prefix = "reward_extra/"
    ntb = dict(batch.non_tensor_batch)
    ntb.update({k[len(prefix):]: v for k, v in batch.non_tensor_batch.items() if k.startswith(prefix)})
    return ntb


def cut_rows(batch: DataProto) -> np.ndarray:
    """Which rows are trajectories cut by over-sampling (rollout.over_sample_rate): all False without it."""
    cut = batch.non_tensor_batch.get(CUT_KEY)
    return np.zeros(len(batch), dtype=bool) if cut is None else np.asarray(cut, dtype=bool)


def advantage_groups(batch: DataProto) -> np.ndarray:
    """The group id of each row for the advantage estimator: its prompt's `uid`, except that a trajectory cut by
    over-sampling (rollout.over_sample_rate, `over_sample_cut`) is a group of its own.

    Why not keep a cut row in its group with reward 0 (what padding it as an empty response amounts to in verl):
    it was cut for being slow, not for being wrong, and its reward is unknown. A 0 would lower the group's
    baseline and give its finished members a higher advantage for being faster than the cut one, a length bias
    the reward never asked for; and in a group where every finished response scored the same, it would make
    advantages that are not there. Alone in its group the cut row gets advantage 0 from every estimator that
    centres on the group (and its response_mask is 0 anyway), and the group's mean and std are those of its
    finished responses. A group left with one finished response is a group of one (GRPO: advantage = its score,
    verl's rule for single responses).
    """
    uid = np.asarray(batch.non_tensor_batch["uid"], dtype=object)
    cut = cut_rows(batch)
    if not cut.any():
        return uid
    groups = uid.copy()
    for i in np.flatnonzero(cut):
        groups[i] = f"{uid[i]}#over_sample_cut{i}"
    return groups


def compute_advantage(batch: DataProto, algorithm_cfg: Any, actor_cfg: Any = None) -> DataProto:
    """Fill `advantages` and `returns` with the configured estimator; every estimator gets the same call."""
    estimator = get_adv_estimator_fn(algorithm_cfg.adv_estimator)
    advantages, returns = estimator(
        token_level_rewards=batch.batch["token_level_rewards"],
        response_mask=response_mask_of(batch),
        index=advantage_groups(batch),
        values=batch.batch.get("values"),
        reward_baselines=batch.batch.get("reward_baselines"),
        gamma=algorithm_cfg.gamma,
        lam=algorithm_cfg.lam,
        norm_adv_by_std_in_grpo=algorithm_cfg.norm_adv_by_std_in_grpo,
        config=algorithm_cfg,
        old_log_probs=batch.batch.get("old_log_probs"),
        ref_log_prob=batch.batch.get("ref_log_prob"),
        sum_pi_squared=batch.batch.get("sum_pi_squared"),
        rollout_is_weights=batch.batch.get("rollout_is_weights"),
        non_tensor_batch=estimator_non_tensors(batch),
        batch=batch.batch,
    )
    if "distillation_losses" in batch.batch:  # on-policy distillation (see apply_distillation)
        distill = batch.meta_info["distillation"]
        advantages = compute_distillation_advantages(
            batch.batch["distillation_losses"],
            response_mask_of(batch),
            task_advantages=advantages if distill["use_task_rewards"] else None,
            distillation_loss_coef=distill["distillation_loss_coef"],
        )
    batch.batch["advantages"] = advantages
    batch.batch["returns"] = returns
    return batch


def apply_distillation(batch: DataProto, loss_cfg: Any) -> dict[str, float]:
    """Per-token distillation losses D_t of the student (`old_log_probs`) against the teacher (`teacher_log_prob`).

    Stores them as `distillation_losses` with how `compute_advantage` folds them into the advantages
    (`meta_info["distillation"]`: -D_t alone, or added to the task advantages times the coefficient), and
    returns verl's `actor/distillation/*` metrics. `loss_cfg` is `distillation.distillation_loss`.
    """
    mask = response_mask_of(batch)
    losses = compute_distillation_loss(
        batch.batch["old_log_probs"],
        batch.batch["teacher_log_prob"],
        loss_mode=loss_cfg.loss_mode,
        log_prob_min_clamp=loss_cfg.log_prob_min_clamp,
        loss_max_clamp=loss_cfg.loss_max_clamp,
    )
    batch.batch["distillation_losses"] = losses * mask
    batch.meta_info["distillation"] = {
        "use_task_rewards": bool(loss_cfg.use_task_rewards),
        "distillation_loss_coef": float(loss_cfg.distillation_loss_coef),
    }
    return distillation_metrics(losses, mask)


def apply_rollout_correction(batch: DataProto, correction: Any) -> dict[str, float]:
    """Decoupled rollout correction (`algorithm.rollout_correction`): `rollout_is_weights` for the policy loss,
    rejected tokens out of `response_mask`, and verl's `rollout_corr/*` metrics (diagnostics always)."""
    from hybridflow._config.async_training import parse_threshold

    mask = batch.batch["response_mask"]
    old, rollout = batch.batch["old_log_probs"], batch.batch["rollout_log_probs"]
    log_ratio = (old - rollout) * mask
    weights = keep = None
    lower, upper = parse_threshold(correction.rollout_is_threshold)
    if correction.rollout_is is not None:
        weights = importance_weights(log_ratio, mask, correction.rollout_is, lower, upper,
                                     correction.rollout_is_batch_normalize)
        batch.batch["rollout_is_weights"] = weights
    options = correction.rs_options()
    if options:
        keep = rejection_mask(log_ratio, mask, options)
        batch.batch["response_mask"] = mask * keep
    return correction_metrics(old, rollout, mask, weights, keep, upper if lower is None else None)


def online_dpo_metrics(batch: DataProto, beta: float) -> dict[str, float]:
    """The step's preference pairs as TRL's online DPO reports them: the DPO loss before the update, how
    many pairs, the mean margin beta x (implicit reward of chosen - of rejected) and the fraction of pairs
    the policy already ranks right (margin > 0); and `dpo/kl`, the policy's per-token KL from the
    reference on the batch's responses (k1 estimate, what `kl` shows in the console and the status)."""
    mask = response_mask_of(batch)
    pairs = preference_pairs(
        batch.batch["token_level_rewards"],
        mask,
        batch.non_tensor_batch["uid"],
        batch.batch["old_log_probs"],
        batch.batch["ref_log_prob"],
        beta,
    )
    n = pairs.margin.numel()
    return {
        "dpo/loss": float(pairs.loss()),
        "dpo/pairs": float(n),
        "dpo/margin_mean": float(pairs.margin.mean()) if n else 0.0,
        "dpo/accuracy": float((pairs.margin > 0).double().mean()) if n else 0.0,
        "dpo/kl": float(masked_mean(batch.batch["old_log_probs"] - batch.batch["ref_log_prob"], mask)),
    }


def add_counts(metrics: dict[str, float], counts: dict[str, float]) -> None:
    """Add ``counts`` (e.g. the reward manager's `reward/timeouts`) into ``metrics``, summing repeated keys."""
    for key, value in counts.items():
        metrics[key] = metrics.get(key, 0.0) + float(value)


def group_filter_metric(batch: DataProto, metric: str, extra_info: dict[str, list[Any]]) -> np.ndarray:
    """Per-sample value that DAPO's dynamic sampling groups on (arXiv 2503.14476, section 3.2).

    `acc` (or any per-sample key of the reward's extra info) when present; `seq_reward` /
    `score` are the summed scores; `seq_final_reward` the summed rewards after any KL penalty.
    """
    if metric in extra_info:
        return np.asarray(extra_info[metric], dtype=np.float64)
    if metric == "seq_final_reward" and "token_level_rewards" in batch.batch:
        return batch.batch["token_level_rewards"].sum(-1).double().numpy()
    if metric in ("seq_reward", "score", "acc", "seq_final_reward"):
        return batch.batch["token_level_scores"].sum(-1).double().numpy()
    raise ValueError(
        f"algorithm.filter_groups.metric={metric!r} is not available; use acc, score, seq_reward, "
        f"seq_final_reward or one of the reward's extra keys {sorted(extra_info)}"
    )


def balanced_order(lengths: list[int], parts: int) -> list[list[int]]:
    """Split row indices into `parts` lists of equal size with sums of `lengths` as even as possible.

    Longest-processing-time first with a cardinality bound: rows longest first, each to the part
    with the smallest sum that still has room (Graham 1969's LPT; within 4/3 of the best makespan
    without the size bound, close to it with one in practice). Deterministic: ties go to the lower index.
    """
    if parts < 1 or len(lengths) % parts:
        raise ValueError(f"{len(lengths)} rows cannot be split into {parts} equal parts")
    size = len(lengths) // parts
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    members: list[list[int]] = [[] for _ in range(parts)]
    sums = [0] * parts
    for i in order:
        k = min((k for k in range(parts) if len(members[k]) < size), key=lambda k: (sums[k], k))
        members[k].append(i)
        sums[k] += lengths[i]
    return [sorted(m) for m in members]


def balance_batch(batch: DataProto, world_size: int) -> tuple[DataProto, dict[str, float]]:
    """Reorder rows so each data-parallel rank's contiguous chunk holds a similar token count.

    verl's trainer.balance_batch: workers get `chunk(world_size)` of the batch, and a step waits for
    the slowest rank, so the tokens (attention_mask sums) are spread evenly. Returns the reordered
    batch and verl's `global_seqlen/*` metrics (per-rank token sums before and after).
    """
    lengths = batch.batch["attention_mask"].sum(-1).tolist()
    n = len(lengths)
    if world_size <= 1 or n % world_size:
        return batch, {}
    parts = balanced_order(lengths, world_size)
    size = n // world_size
    before = [sum(lengths[r * size : (r + 1) * size]) for r in range(world_size)]
    after = [sum(lengths[i] for i in part) for part in parts]
    metrics = {
        "global_seqlen/min": float(min(before)),
        "global_seqlen/max": float(max(before)),
        "global_seqlen/minmax_diff": float(max(before) - min(before)),
        "global_seqlen/balanced_min": float(min(after)),
        "global_seqlen/balanced_max": float(max(after)),
        "global_seqlen/mean": float(sum(lengths) / world_size),
    }
    return batch.select_idxs(torch.tensor([i for part in parts for i in part])), metrics


def decode_samples(batch: DataProto, tokenizer: Any) -> tuple[list[str], list[str]]:
    """Prompt and response texts of each row (padding and special tokens dropped)."""
    prompts, responses = batch.batch["prompts"], batch.batch["responses"]
    prompt_mask = batch.batch["attention_mask"][:, : prompts.shape[1]].bool()
    response_mask = response_mask_of(batch).bool()
    inputs = [tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(prompts, prompt_mask, strict=True)]
    outputs = [tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(responses, response_mask, strict=True)]
    return inputs, outputs


def pick_samples(samples: list[tuple[str, str, float]], count: int, seed: int = 42) -> list[tuple[str, str, float]]:
    """`count` samples, the same prompts at every call for the same data: sorted by input, then a seeded shuffle."""
    ordered = sorted(samples, key=lambda sample: sample[0])
    np.random.RandomState(seed).shuffle(ordered)
    return ordered[:count]


def truncate_groups(batch: DataProto, num_groups: int) -> DataProto:
    """Keep the first `num_groups` groups (rows of one uid are contiguous after interleaved repeat)."""
    uids = batch.non_tensor_batch["uid"]
    chosen = set(list(dict.fromkeys(uids))[:num_groups])
    return batch.select_idxs(np.array([uid in chosen for uid in uids]))
