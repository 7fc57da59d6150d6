"""Split placement: ship the actor's weights to a rollout group on other resources via Ray's object store."""

from __future__ import annotations

from typing import Any


def sync_weights(actor_wg: Any, rollout_wg: Any) -> None:
    """Gather the actor's full weights (collective on all actor ranks) and load them on every rollout rank.

    Call after each `update_actor` (and after `load_checkpoint`) when the rollout runs in its own group
    (`trainer.placement=split`). Rank 0's state dict goes into the object store once; every rollout
    worker reads it from there; the driver never holds the tensors.
    """
    import ray

    # All actor ranks must enter the gather together (it is a collective), so launch them at once.
    refs = [w.full_state_dict_rank0.remote() for w in actor_wg.workers]
    loads = [w.update_rollout_weights.remote(refs[0]) for w in rollout_wg.workers]
    ray.get(loads + refs[1:])
