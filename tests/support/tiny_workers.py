"""FSDP worker groups under Ray over a tiny model on CPU: the set-up the worker tests share.

`tiny_worker_session` builds the model, the 2-rank config and a Ray session, and shuts down every
group made through it; `make_prompts` and `max_log_prob_gap` are the batch and the check the tests
feed and apply to those groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from hybridflow.config import HybridFlowConfig, load_config
from hybridflow.protocol import DataProto
from tests.support.ray_local import local_ray

if TYPE_CHECKING:  # the controller imports Ray: only when a group is made
    from hybridflow.controller import RayResourcePool, RayWorkerGroup

#: Tokens per generated response (data.max_response_length).
RESPONSE_LENGTH = 6
#: Tokens per prompt, left-padded (data.max_prompt_length).
PROMPT_LENGTH = 8
#: The 4 prompts of a batch (data.train_batch_size) and their uids.
PROMPTS = {"a": "1+2=", "b": "33+4=", "c": "5+66=", "d": "7="}


def tiny_worker_config(model_dir: str, *overrides: str) -> HybridFlowConfig:
    """The config the worker tests share (2 CPU ranks, n=2, mini-batches of 2), plus `overrides`."""
    return load_config(
        None,
        [
            "trainer.device=cpu",
            "trainer.n_gpus_per_node=2",
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.model.enable_gradient_checkpointing=false",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.optim.lr=0.02",
            f"data.max_response_length={RESPONSE_LENGTH}",
            f"data.max_prompt_length={PROMPT_LENGTH}",
            f"data.train_batch_size={len(PROMPTS)}",
            *overrides,
        ],
    )


def make_prompts(model_dir: str, n_rep: int) -> DataProto:
    """The PROMPTS, tokenized and left-padded to PROMPT_LENGTH, each repeated `n_rep` times in a row."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = tok(list(PROMPTS.values()), padding="max_length", max_length=PROMPT_LENGTH, return_tensors="pt")
    pos = (enc["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)
    batch = DataProto.from_dict(
        tensors={"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "position_ids": pos},
        non_tensors={"uid": np.array(list(PROMPTS), dtype=object)},
    )
    return batch.repeat(n_rep, interleave=True)


def max_log_prob_gap(actor: RayWorkerGroup, gen: DataProto) -> float:
    """Max |rollout log-prob - actor log-prob| over response tokens: ~0 only if the weights are synced."""
    old = actor.compute_log_prob(gen).batch["old_log_probs"]
    mask = gen.batch["response_mask"].bool()
    return float((old - gen.batch["rollout_log_probs"]).abs()[mask].max())


@dataclass
class WorkerSession:
    """The tiny model, the config and the worker groups of one Ray session."""

    model_dir: str
    config: HybridFlowConfig
    groups: list[RayWorkerGroup] = field(default_factory=list)

    def group(self, pool: RayResourcePool, worker_cls: type, **init_args: Any) -> RayWorkerGroup:
        """A RayWorkerGroup of `worker_cls(config=..., **init_args)` on `pool`, shut down with the session."""
        from hybridflow.controller import RayClassWithInitArgs, RayWorkerGroup

        group = RayWorkerGroup(pool, RayClassWithInitArgs(worker_cls, config=self.config, **init_args))
        self.groups.append(group)
        return group


@contextmanager
def tiny_worker_session(tmp_path_factory: pytest.TempPathFactory, *overrides: str,
                        num_cpus: int = 3) -> Iterator[WorkerSession]:
    """A tiny model, `tiny_worker_config(model, *overrides)` and a Ray session; its groups end with it."""
    from hybridflow.models.tiny import build_tiny_model

    model_dir = str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))
    session = WorkerSession(model_dir, tiny_worker_config(model_dir, *overrides))
    with local_ray(num_cpus):
        try:
            yield session
        finally:
            for group in session.groups:
                group.shutdown()
