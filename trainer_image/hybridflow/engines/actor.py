"""PPO actor on an `FSDPEngine`: log-probs and entropy of responses, and the policy update.

The update follows verl's actor: the rank's share of the batch is cut into mini-batches (one
optimizer step each), each mini-batch into micro-batches (gradient accumulation); `ppo_epochs`
passes. Loss = policy loss (from the registry) - entropy_coeff x entropy + kl_loss_coef x KL(ref),
all aggregated with `loss_agg_mode`, scaled by the mini-batch's global token/sequence count so any
world size gives the gradient of the same global mean.

On-policy updates (one epoch, one mini-batch: no optimizer step before any row's loss) need no
separate old-log-prob pass: the policy that sampled is the policy being differentiated, so the batch
may omit `old_log_probs` and the update uses its own log-probs, detached (ratio 1, gradient of the
log-prob), which is the same loss and gradient without one forward pass over the batch.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.algorithms import (
    agg_loss,
    entropy_from_logits,
    get_policy_loss_fn,
    kl_penalty,
    logprobs_from_logits,
)
from hybridflow.engines.batching import (
    MetricAccumulator,
    accumulation_scale,
    loss_units,
    plan_micro_batches,
    shuffled,
    split_batch,
)
from hybridflow.engines.fsdp_engine import FSDPEngine, _get
from hybridflow.protocol import DataProto

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses")


def response_logits(engine: FSDPEngine, micro: DataProto, temperature: float) -> torch.Tensor:
    """Logits that predict each response token: positions -R-1 .. -2 of the sequence, / temperature.

    Only those R positions reach the LM head (issue 17: a micro-batch's vocabulary-sized memory is
    rows x R x vocab), not the whole sequence nor R+1 positions.
    """
    b = micro.batch
    resp_len = b["responses"].shape[1]
    keep = torch.arange(-resp_len - 1, -1, device=engine.device)
    logits = engine.forward(b["input_ids"], b["attention_mask"], b["position_ids"], logits_to_keep=keep)
    if logits.shape[1] != resp_len:  # a model that cannot restrict its head returned every position
        logits = logits[:, -resp_len - 1 : -1, :]
    if temperature == 1.0:
        return logits
    # Without autograd divide in place (one vocabulary-sized tensor, not two). With it, out of place:
    # a head whose backward needs its output (final-logit softcapping's tanh) would break in place.
    return logits / temperature if torch.is_grad_enabled() else logits.div_(temperature)


def rollout_mismatch_metrics(
    actor_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far the inference engine's token probabilities are from the trainer's (verl's names).

    `training/rollout_probs_diff_mean|max`: |p_actor - p_rollout| over valid tokens. Near 0 when the
    engine holds the actor's weights in the same precision; bf16 rollouts show ~1e-3..1e-2.
    """
    with torch.no_grad():
        diff = (actor_log_prob.exp() - rollout_log_prob.exp()).abs()
        valid = mask.bool()
        if not valid.any():
            return {}
        return {
            "training/rollout_probs_diff_mean": diff[valid].mean(),
            "training/rollout_probs_diff_max": diff[valid].max(),
        }


class PPOActor:
    """Policy-gradient training and log-prob computation for one rank's share of a batch."""

    def __init__(self, engine: FSDPEngine, config: Any = None, seed: int = 0) -> None:
        self.engine = engine
        self.config = config
        self.seed = seed
        self._updates = 0

    def compute_log_prob(
        self,
        data: DataProto,
        micro_batch_size: int | None = None,
        calculate_entropy: bool = False,
        max_token_len: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs (b, R) of `responses` under the model, and entropies when asked.

        Micro-batches: `micro_batch_size` rows, or packed by a token budget (`max_token_len`, see
        `plan_micro_batches`); results come back in the rows' order either way.
        """
        temperature = float(data.meta_info.get("temperature", 1.0))
        inputs = data.select(list(MODEL_INPUTS))
        rows, resp_len = inputs.batch["responses"].shape
        log_probs = torch.zeros(rows, resp_len)
        entropys = torch.zeros(rows, resp_len) if calculate_entropy else None
        was_training = self.engine.module.training
        self.engine.module.eval()
        with torch.no_grad():
            for idx in plan_micro_batches(inputs, micro_batch_size, max_token_len, self.engine.max_over_ranks):
                micro = inputs.select_idxs(idx)
                logits = response_logits(self.engine, micro, temperature)
                responses = micro.batch["responses"].to(logits.device)
                log_probs[idx] = logprobs_from_logits(logits, responses).float().cpu()
                if entropys is not None:
                    entropys[idx] = entropy_from_logits(logits).float().cpu()
        self.engine.module.train(was_training)
        return log_probs, entropys

    def update_policy(
        self,
        data: DataProto,
        mini_batch_size: int,
        micro_batch_size: int | None,
        max_token_len: int | None = None,
    ) -> dict[str, float]:
        """PPO epochs over mini-batches of this rank's rows; returns verl-named metric means.

        Micro-batches (gradient accumulation) hold `micro_batch_size` rows, or are packed by the
        token budget `max_token_len` (verl's use_dynamic_bsz); the loss scaling makes any split give
        the gradient of the mini-batch mean.
        """
        cfg = self.config
        mode = str(_get(cfg, "loss_agg_mode", "token-mean"))
        entropy_coeff = float(_get(cfg, "entropy_coeff", 0.0))
        use_kl = bool(_get(cfg, "use_kl_loss", False))
        kl_coef = float(_get(cfg, "kl_loss_coef", 0.001))
        kl_type = str(_get(cfg, "kl_loss_type", "low_var_kl"))
        loss_mode = str(_get(_get(cfg, "policy_loss", None), "loss_mode", "vanilla"))
        policy_loss_fn = get_policy_loss_fn(loss_mode)
        temperature = float(data.meta_info.get("temperature", 1.0))

        epochs = int(_get(cfg, "ppo_epochs", 1))
        on_policy = "old_log_probs" not in data.batch
        if on_policy and (epochs != 1 or len(data) > mini_batch_size):
            raise ValueError(
                f"the batch has no old_log_probs, which is only valid for an on-policy update (ppo_epochs=1 "
                f"and one mini-batch); this update has ppo_epochs={epochs} and {len(data)} rows in mini-batches "
                f"of {mini_batch_size}: compute old log-probs with compute_log_prob first"
            )
        keys = [*MODEL_INPUTS, "advantages", "response_mask", *([] if on_policy else ["old_log_probs"])]
        if use_kl:
            if "ref_log_prob" not in data.batch:
                raise KeyError(
                    "actor.use_kl_loss=true needs ref_log_prob in the batch; compute it with "
                    "compute_ref_log_prob before update_actor (or set use_kl_loss=false)"
                )
            keys.append("ref_log_prob")
        keys += [k for k in ("rollout_log_probs", "rollout_is_weights") if k in data.batch]
        batch = data.select(keys)
        acc = MetricAccumulator()
        self.engine.module.train()
        for epoch in range(epochs):
            if bool(_get(cfg, "shuffle", False)):
                batch = shuffled(batch, seed=self.seed + 1000 * self._updates + epoch)
            for mini in split_batch(batch, mini_batch_size):
                mask_all = mini.batch["response_mask"]
                global_units = self.engine.all_reduce_sum(loss_units(mask_all, mode))
                for idx in plan_micro_batches(mini, micro_batch_size, max_token_len, self.engine.max_over_ranks):
                    micro = mini.select_idxs(idx)
                    b = micro.batch
                    device = self.engine.device
                    mask = b["response_mask"].to(device)
                    logits = response_logits(self.engine, micro, temperature)
                    log_prob = logprobs_from_logits(logits, b["responses"].to(device))
                    old_log_prob = log_prob.detach() if on_policy else b["old_log_probs"].to(device)
                    rollout_log_probs = b["rollout_log_probs"].to(device) if "rollout_log_probs" in b else None
                    pg_loss, pg_metrics = policy_loss_fn(
                        old_log_prob=old_log_prob,
                        log_prob=log_prob,
                        advantages=b["advantages"].to(device),
                        response_mask=mask,
                        loss_agg_mode=mode,
                        config=cfg,
                        rollout_log_probs=rollout_log_probs,
                        rollout_is_weights=b["rollout_is_weights"].to(device) if "rollout_is_weights" in b else None,
                    )
                    loss = pg_loss
                    metrics: dict[str, Any] = {"actor/pg_loss": pg_loss.detach(), **pg_metrics}
                    if rollout_log_probs is not None and epoch == 0:
                        metrics.update(rollout_mismatch_metrics(old_log_prob, rollout_log_probs, mask))
                    if entropy_coeff != 0:
                        entropy = agg_loss(entropy_from_logits(logits), mask, mode)
                        loss = loss - entropy_coeff * entropy
                        metrics["actor/entropy"] = entropy.detach()
                    elif on_policy:  # no old-log-prob pass logged the policy's entropy: log it here
                        with torch.no_grad():
                            metrics["actor/entropy"] = agg_loss(entropy_from_logits(logits), mask, "token-mean")
                    if use_kl:
                        kld = kl_penalty(log_prob, b["ref_log_prob"].to(device), kl_type)
                        kl_loss = agg_loss(kld, mask, mode)
                        loss = loss + kl_coef * kl_loss
                        metrics["actor/kl_loss"] = kl_loss.detach()
                        metrics["actor/kl_coef"] = kl_coef
                    scale = accumulation_scale(loss_units(mask, mode), global_units, self.engine.world_size)
                    (loss * scale).backward()
                    acc.add(metrics)
                acc.add({"actor/lr": self.engine.current_lr()})
                acc.add({"actor/grad_norm": self.engine.optimizer_step()})
        self._updates += 1
        return acc.means()
