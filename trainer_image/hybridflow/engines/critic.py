"""PPO critic on an `FSDPEngine` (value model: a 1-label token-classification head): values and update."""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.algorithms import compute_value_loss, masked_mean
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

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


def response_values(engine: FSDPEngine, micro: DataProto) -> torch.Tensor:
    """V(s_t) for each response token: the value at the position that predicts it (verl's alignment)."""
    b = micro.batch
    resp_len = b["responses"].shape[1]
    values = engine.forward(b["input_ids"], b["attention_mask"], b["position_ids"]).squeeze(-1)
    return values[:, -resp_len - 1 : -1].float()


class PPOCritic:
    """Value prediction and clipped value-loss training for one rank's share of a batch."""

    def __init__(self, engine: FSDPEngine, config: Any = None, seed: int = 0) -> None:
        self.engine = engine
        self.config = config
        self.seed = seed
        self._updates = 0

    def compute_values(
        self, data: DataProto, micro_batch_size: int | None = None, max_token_len: int | None = None
    ) -> torch.Tensor:
        """Values (b, R), zero on padding positions of the response (micro-batches as in the actor)."""
        inputs = data.select(list(MODEL_INPUTS))
        out = torch.zeros(inputs.batch["responses"].shape)
        was_training = self.engine.module.training
        self.engine.module.eval()
        with torch.no_grad():
            for idx in plan_micro_batches(inputs, micro_batch_size, max_token_len, self.engine.max_over_ranks):
                micro = inputs.select_idxs(idx)
                values = response_values(self.engine, micro)
                out[idx] = (values * micro.batch["response_mask"].to(values.device)).float().cpu()
        self.engine.module.train(was_training)
        return out

    def update_critic(
        self, data: DataProto, mini_batch_size: int, micro_batch_size: int | None, max_token_len: int | None = None
    ) -> dict[str, float]:
        """PPO epochs of clipped value regression onto `returns`; verl-named metric means."""
        cfg = self.config
        mode = str(_get(cfg, "loss_agg_mode", "token-mean"))
        clip = float(_get(cfg, "cliprange_value", 0.5))
        batch = data.select([*MODEL_INPUTS, "values", "returns"])
        acc = MetricAccumulator()
        self.engine.module.train()
        for epoch in range(int(_get(cfg, "ppo_epochs", 1))):
            if bool(_get(cfg, "shuffle", False)):
                batch = shuffled(batch, seed=self.seed + 1000 * self._updates + epoch)
            for mini in split_batch(batch, mini_batch_size):
                global_units = self.engine.all_reduce_sum(loss_units(mini.batch["response_mask"], mode))
                for idx in plan_micro_batches(mini, micro_batch_size, max_token_len, self.engine.max_over_ranks):
                    micro = mini.select_idxs(idx)
                    with self.engine.training_step():  # model.enable_activation_offload
                        b = micro.batch
                        device = self.engine.device
                        mask = b["response_mask"].to(device)
                        vpreds = response_values(self.engine, micro)
                        vf_loss, vf_clipfrac = compute_value_loss(
                            vpreds=vpreds,
                            returns=b["returns"].to(device),
                            values=b["values"].to(device),
                            response_mask=mask,
                            cliprange_value=clip,
                            loss_agg_mode=mode,
                        )
                        scale = accumulation_scale(loss_units(mask, mode), global_units, self.engine.world_size)
                        (vf_loss * scale).backward()
                    acc.add(
                        {
                            "critic/vf_loss": vf_loss.detach(),
                            "critic/vf_clipfrac": vf_clipfrac.detach(),
                            "critic/vpred_mean": masked_mean(vpreds.detach(), mask),
                        }
                    )
                acc.add({"critic/lr": self.engine.current_lr()})
                acc.add({"critic/grad_norm": self.engine.optimizer_step()})
        self._updates += 1
        return acc.means()
