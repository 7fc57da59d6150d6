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

Log-probs and entropies come from the logits (the response positions only), or, with the engine's fused
head (`model.use_fused_kernels`, see `hybridflow.engines.fused_head`), from hidden states without the
logits. `LogProbKernels` holds a role's other kernel/memory keys: torch.compile of the per-chunk
log-prob/entropy formulas, entropy recomputed in backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from hybridflow.algorithms import (
    agg_loss,
    entropy_from_logits,
    get_policy_loss_fn,
    kl_penalty,
    logprobs_from_logits,
)
from hybridflow.algorithms.torch_functional import (
    CompiledOrEager,
    entropy_checkpointed,
    entropy_rows,
    logprob_rows,
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
#: image prompts' processor tensors, one dict per row (hybridflow.data.vision)
IMAGE_INPUTS = "multi_modal_inputs"


def select_inputs(data: DataProto, keys: Sequence[str]) -> DataProto:
    """The tensors `keys` of `data` and, for image prompts, each row's processor tensors."""
    return data.select(list(keys), [IMAGE_INPUTS] if IMAGE_INPUTS in data.non_tensor_batch else [])


def response_logits(engine: FSDPEngine, micro: DataProto, temperature: float) -> torch.Tensor:
    """Logits that predict each response token: positions -R-1 .. -2 of the sequence, / temperature.

    Only those R positions reach the LM head (issue 17: a micro-batch's vocabulary-sized memory is
    rows x R x vocab), not the whole sequence nor R+1 positions.
    """
    b = micro.batch
    resp_len = b["responses"].shape[1]
    keep = torch.arange(-resp_len - 1, -1, device=engine.device)
    logits = engine.forward(b["input_ids"], b["attention_mask"], b["position_ids"], logits_to_keep=keep,
                            multi_modal_inputs=micro.non_tensor_batch.get(IMAGE_INPUTS))
    if logits.shape[1] != resp_len:  # a model that cannot restrict its head returned every position
        logits = logits[:, -resp_len - 1 : -1, :]
    if temperature != 1.0:
        # Without autograd divide in place (one vocabulary-sized tensor, not two). With it, out of place:
        # a head whose backward needs its output (final-logit softcapping's tanh) would break in place.
        logits = logits / temperature if torch.is_grad_enabled() else logits.div_(temperature)
    bias = engine.placeholder_bias  # a vision-language model's image tokens: the policy the rollout samples from
    if bias is None:
        return logits
    return logits + bias if torch.is_grad_enabled() else logits.add_(bias)


def fused_response_log_probs(
    engine: FSDPEngine, micro: DataProto, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of `responses` from the engine's fused head: no vocabulary-sized logits."""
    b = micro.batch
    fused = {"labels": b["responses"].to(engine.device), "temperature": temperature, "with_entropy": with_entropy}
    out = engine.forward(b["input_ids"], b["attention_mask"], b["position_ids"], fused=fused,
                         multi_modal_inputs=micro.non_tensor_batch.get(IMAGE_INPUTS))
    return out["log_probs"], out["entropy"]


@dataclass(frozen=True)
class LogProbKernels:
    """A role's log-prob/entropy kernel keys (verl's names on actor and ref)."""

    use_torch_compile: bool = False
    """torch.compile the per-chunk log-prob and entropy formulas (verl compiles its entropy function)."""
    entropy_checkpointing: bool = False
    """Recompute the entropy's softmax in backward instead of saving it (training only)."""

    @classmethod
    def of(cls, role: Any) -> LogProbKernels:
        """The kernel keys of a role config (actor or ref section; missing keys: off)."""
        return cls(
            use_torch_compile=bool(_get(role, "use_torch_compile", False)),
            entropy_checkpointing=bool(_get(role, "entropy_checkpointing", False)),
        )


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

    def __init__(self, engine: FSDPEngine, config: Any = None, seed: int = 0, kernels: LogProbKernels | None = None) -> None:
        self.engine = engine
        self.config = config
        self.seed = seed
        self._updates = 0
        self.kernels = kernels if kernels is not None else LogProbKernels.of(config)
        compile_ = self.kernels.use_torch_compile and engine.fused_head is None  # the fused head has no logits
        self._logprob_rows = CompiledOrEager(logprob_rows, "the log-prob from logits") if compile_ else None
        self._entropy_rows = CompiledOrEager(entropy_rows, "the entropy from logits") if compile_ else None

    def response_log_probs(
        self, micro: DataProto, temperature: float, with_entropy: bool = False, entropy_grad: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (b, R) of the micro-batch's responses and, when asked, entropies (fp32, on the device).

        `entropy_grad=False`: the entropy is only logged, so no graph is kept for it.
        """
        if self.engine.fused_head is not None:
            log_prob, entropy = fused_response_log_probs(self.engine, micro, temperature, with_entropy)
            return log_prob, entropy.detach() if entropy is not None and not entropy_grad else entropy
        logits = response_logits(self.engine, micro, temperature)
        log_prob = logprobs_from_logits(logits, micro.batch["responses"].to(logits.device), rows_fn=self._logprob_rows)
        if not with_entropy:
            return log_prob, None
        entropy_fn = partial(entropy_from_logits, rows_fn=self._entropy_rows)
        with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
            if self.kernels.entropy_checkpointing:
                return log_prob, entropy_checkpointed(logits, entropy_fn)
            return log_prob, entropy_fn(logits)

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
        inputs = select_inputs(data, MODEL_INPUTS)
        rows, resp_len = inputs.batch["responses"].shape
        log_probs = torch.zeros(rows, resp_len)
        entropys = torch.zeros(rows, resp_len) if calculate_entropy else None
        was_training = self.engine.module.training
        self.engine.module.eval()
        with torch.no_grad():
            for idx in plan_micro_batches(inputs, micro_batch_size, max_token_len, self.engine.max_over_ranks):
                micro = inputs.select_idxs(idx)
                log_prob, entropy = self.response_log_probs(micro, temperature, with_entropy=entropys is not None)
                log_probs[idx] = log_prob.float().cpu()
                if entropys is not None and entropy is not None:
                    entropys[idx] = entropy.float().cpu()
        self.engine.module.train(was_training)
        return log_probs, entropys

    def compute_sum_pi_squared(
        self, data: DataProto, micro_batch_size: int | None = None, max_token_len: int | None = None
    ) -> torch.Tensor:
        """Sum over the vocabulary of pi^2 per response token (b, R), for the optimal token baselines.

        sum_v pi_v^2 = exp(logsumexp(2 z) - 2 logsumexp(z)) of the logits z (verl's logit-gradient proxy,
        arXiv 2602.07078). Its own forward pass (actor.calculate_sum_pi_squared=true only).
        """
        if self.engine.fused_head is not None:
            raise ValueError(
                "actor.calculate_sum_pi_squared needs the logits, which the fused log-prob kernel never builds; "
                "turn the fused kernels off (use_fused_kernels=false) to use the optimal_token_baseline estimators"
            )
        temperature = float(data.meta_info.get("temperature", 1.0))
        inputs = select_inputs(data, MODEL_INPUTS)
        out = torch.zeros(inputs.batch["responses"].shape)
        was_training = self.engine.module.training
        self.engine.module.eval()
        with torch.no_grad():
            for idx in plan_micro_batches(inputs, micro_batch_size, max_token_len, self.engine.max_over_ranks):
                logits = response_logits(self.engine, inputs.select_idxs(idx), temperature).float()
                out[idx] = torch.exp(torch.logsumexp(2 * logits, -1) - 2 * torch.logsumexp(logits, -1)).cpu()
        self.engine.module.train(was_training)
        return out

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
        batch = select_inputs(data, keys)
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
                    with self.engine.training_step():  # model.enable_activation_offload
                        b = micro.batch
                        device = self.engine.device
                        mask = b["response_mask"].to(device)
                        log_prob, entropy_tok = self.response_log_probs(
                            micro, temperature, with_entropy=entropy_coeff != 0 or on_policy, entropy_grad=entropy_coeff != 0
                        )
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
                        if entropy_coeff != 0 and entropy_tok is not None:
                            entropy = agg_loss(entropy_tok, mask, mode)
                            loss = loss - entropy_coeff * entropy
                            metrics["actor/entropy"] = entropy.detach()
                        elif on_policy and entropy_tok is not None:  # no old-log-prob pass logged the entropy: log it here
                            with torch.no_grad():
                                metrics["actor/entropy"] = agg_loss(entropy_tok.detach(), mask, "token-mean")
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
