"""Pure: the smoke run of an RLJob (spec.runPolicy.smokeRun), derived from spec.config by the trainer's rules.

A smoke run is the full job at its smallest: `steps` training steps on one node (smokeRun.nnodes) with the
fewest GPUs the config allows, the smallest batch that splits over them, no validation, no export, one
checkpoint after the last step, written to `<checkpoint location>/smoke-run` (the full run resumes from
`<checkpoint location>` itself: `latest_checkpointed_iteration.txt` and `global_step_N/` at its top level,
hybridflow.checkpoint), and `trainer.resume_mode=disable`, so a smoke run started again after a spec edit
tests the new spec from step 0 instead of finding the last one finished.

Which sizes are valid is decided by the trainer itself: each candidate (GPUs ascending) is parsed by the
recipe's own config models (hybridflow.recipes), the first one they accept wins; when none does, the
trainer's messages come back under `spec.runPolicy.smokeRun` with what to change. Results are memoised
per spec (validation and the builders both ask, on every reconcile).
"""

from __future__ import annotations

import copy
import functools
import json
import math
from dataclasses import dataclass
from typing import Any

from hybridflow.config import ConfigError
from hybridflow.recipes import TrainerConfigTree, get_recipe
from rljob_operator import api, builders

#: Folder of the smoke run's checkpoints and progress.json, under the job's checkpoint location.
SMOKE_DIR = "smoke-run"
FIELD = "spec.runPolicy.smokeRun"


class SmokeRunError(ValueError):
    """The smoke run cannot be derived: `problems` say what to change (validation reports them)."""

    def __init__(self, problems: list[str]) -> None:
        """Keep every problem; the message joins them."""
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class SmokeShape:
    """The smoke run's size and its full trainer config (parsed by the recipe's models)."""

    steps: int
    train_batch_size: int
    nnodes: int
    n_gpus_per_node: int
    location: str
    config: TrainerConfigTree

    def describe(self) -> str:
        """E.g. `2 steps on 1 node x 2 GPUs, data.train_batch_size 1`."""
        unit = "process" if self.config.trainer.device == "cpu" else "GPU"
        return (f"{self.steps} step{'s' * (self.steps != 1)} on {self.nnodes} node{'s' * (self.nnodes != 1)} x "
                f"{self.n_gpus_per_node} {unit}{'s' * (self.n_gpus_per_node != 1)}, data.train_batch_size "
                f"{self.train_batch_size}")


def smoke_location(full_location: str) -> str:
    """`<checkpoint location>/smoke-run`: beside the full run's checkpoints, never the folder it resumes from."""
    return f"{full_location.rstrip('/')}/{SMOKE_DIR}"


def derive(rljob: api.RLJob) -> SmokeShape:
    """The smoke run of a valid RLJob that sets spec.runPolicy.smokeRun; raises SmokeRunError."""
    smoke = rljob.spec.run_policy.smoke_run
    if smoke is None:
        raise SmokeRunError([f"{FIELD}: not set; this job has no smoke run"])
    # Everything the trainer config is made of (builders.merged_config reads these fields only).
    spec = rljob.spec.model_dump(mode="json", include={"config", "recipe", "checkpoint", "export", "run_policy"})
    return _derive_cached(json.dumps(spec, sort_keys=True, default=str))


@functools.lru_cache(maxsize=256)
def _derive_cached(key: str) -> SmokeShape:
    spec = api.RLJobSpec.model_validate(json.loads(key))
    full = builders.trainer_config(api.RLJob(metadata=api.ObjectMeta(name="smoke"), spec=spec))  # raises ConfigError
    assert spec.run_policy.smoke_run is not None
    return _derive(spec.recipe, full.to_dict(), spec.run_policy.smoke_run)


def _derive(recipe: str, resolved: dict[str, Any], smoke: api.SmokeRunSpec) -> SmokeShape:
    trainer = resolved["trainer"]
    full_nodes, per_node = int(trainer["nnodes"]), int(trainer["n_gpus_per_node"])
    unit = "processes" if trainer.get("device") == "cpu" else "GPUs"
    bounds = []
    if smoke.nnodes > full_nodes:
        bounds.append(f"{FIELD}.nnodes: {smoke.nnodes} is more than the full run's spec.config.trainer.nnodes "
                      f"({full_nodes}); a smoke run is at most the full size: lower it (1 is the default)")
    if smoke.n_gpus_per_node is not None and smoke.n_gpus_per_node > per_node:
        bounds.append(f"{FIELD}.nGpusPerNode: {smoke.n_gpus_per_node} is more than the full run's "
                      f"spec.config.trainer.n_gpus_per_node ({per_node}); the nodes have no more {unit}: lower it, "
                      "or unset it to use the fewest the config allows")
    if bounds:
        raise SmokeRunError(bounds)
    tp = _tensor_parallel(recipe, resolved)
    if smoke.n_gpus_per_node is not None:
        candidates = [smoke.n_gpus_per_node]
    else:  # the rollout engine needs whole tensor-parallel groups on a node (hybridflow._config.rules._cluster)
        candidates = [g for g in range(1, per_node + 1) if g % tp == 0] or [per_node]
    tried: list[tuple[int, int, list[str]]] = []
    for gpus in candidates:
        mapping, batch = _shrunk(recipe, resolved, smoke, gpus)
        try:
            config = get_recipe(recipe).parse(mapping)
        except ConfigError as err:
            tried.append((gpus, batch, list(err.problems)))
            continue
        return SmokeShape(smoke.steps, batch, smoke.nnodes, gpus, mapping["trainer"]["default_local_dir"], config)
    raise SmokeRunError(_refusal(smoke, tried, unit))


def _tensor_parallel(recipe: str, resolved: dict[str, Any]) -> int:
    if recipe != "ppo":
        return 1
    return int(resolved["actor_rollout_ref"]["rollout"].get("tensor_model_parallel_size") or 1)


def _shrunk(recipe: str, resolved: dict[str, Any], smoke: api.SmokeRunSpec, gpus: int) -> tuple[dict[str, Any], int]:
    """The smoke config on `gpus` GPUs per node, and its train batch size (not yet checked)."""
    mapping = copy.deepcopy(resolved)
    trainer = mapping["trainer"]
    world = smoke.nnodes * gpus
    trainer.update(
        nnodes=smoke.nnodes, n_gpus_per_node=gpus, total_training_steps=smoke.steps,
        save_freq=smoke.steps,  # one checkpoint, after the last step: storage and credentials are tested too
        test_freq=-1, val_before_train=False, resume_mode="disable",
        default_local_dir=smoke_location(str(trainer["default_local_dir"])),
        experiment_name=f"{trainer.get('experiment_name') or 'default'}-smoke",  # loggers keep it apart
    )
    if recipe == "ppo":
        trainer.pop("export", None)  # the smoke run's weights are not worth an export
        batch = _shrink_rl_batches(mapping, smoke, world)
    else:
        mapping["data"]["val_files"] = []  # the offline trainers validate at the end when they have files
        batch = _shrink_offline_batches(mapping, smoke, world)
    return mapping, batch


def _shrink_rl_batches(mapping: dict[str, Any], smoke: api.SmokeRunSpec, world: int) -> int:
    """RL: one mini-batch per step (or async_training.require_batches), the fewest prompts whose responses split
    over the ranks (hybridflow._config.rules._batch_sizes), micro-batches no larger than a rank's share."""
    data, arr = mapping["data"], mapping["actor_rollout_ref"]
    actor, critic = arr["actor"], mapping.get("critic") or {}
    n = int(arr["rollout"].get("n") or 1)
    asynchronous = mapping.get("async_training") or {}
    per_step = int(asynchronous.get("require_batches") or 1) if asynchronous.get("enabled") else 1
    full_batch = int(data["train_batch_size"])
    if smoke.train_batch_size is not None:
        batch = smoke.train_batch_size
        mini = max(1, batch // per_step)
    else:
        mini = world // math.gcd(world, n)  # the fewest prompts whose responses split evenly over the ranks
        batch = mini * per_step
    if data.get("gen_batch_size") is not None:  # DAPO draws gen_batch_size prompts per round: keep the ratio
        data["gen_batch_size"] = batch * max(1, round(int(data["gen_batch_size"]) / full_batch))
    data["train_batch_size"] = batch
    actor["ppo_mini_batch_size"] = mini
    if critic.get("ppo_mini_batch_size") is not None:
        critic["ppo_mini_batch_size"] = mini
    share = max(1, mini * n // world)
    for role in (actor, critic):
        if role.get("ppo_micro_batch_size_per_gpu") is not None:
            role["ppo_micro_batch_size_per_gpu"] = _largest_divisor(share, int(role["ppo_micro_batch_size_per_gpu"]))
    return batch


def _shrink_offline_batches(mapping: dict[str, Any], smoke: api.SmokeRunSpec, world: int) -> int:
    """SFT/DPO: the fewest rows that split over the processes (OfflineConfig._batch_splits_over_ranks)."""
    data = mapping["data"]
    batch = smoke.train_batch_size if smoke.train_batch_size is not None else world
    data["train_batch_size"] = batch
    data["micro_batch_size_per_gpu"] = _largest_divisor(max(1, batch // world), int(data["micro_batch_size_per_gpu"]))
    return batch


def _largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of n that is at most `at_most` (1 at least)."""
    return max(d for d in range(1, max(1, min(n, at_most)) + 1) if n % d == 0)


def _refusal(smoke: api.SmokeRunSpec, tried: list[tuple[int, int, list[str]]], unit: str) -> list[str]:
    """The trainer's problems with each candidate, under spec.runPolicy.smokeRun, and what to set."""
    if smoke.train_batch_size is not None and smoke.n_gpus_per_node is not None:
        fix = (f"change {FIELD}.trainBatchSize or {FIELD}.nGpusPerNode, or unset them to let the operator pick the "
               "smallest valid sizes")
    elif smoke.train_batch_size is not None:
        fix = f"change {FIELD}.trainBatchSize, or unset it to use the smallest batch the trainer accepts"
    elif smoke.n_gpus_per_node is not None:
        fix = f"change {FIELD}.nGpusPerNode, or unset it to use the fewest {unit} the config allows"
    else:
        fix = (f"set {FIELD}.nGpusPerNode and trainBatchSize to sizes the trainer accepts, or remove {FIELD}")
    problems = []
    for gpus, batch, found in tried[:3]:  # the first few are enough to see the pattern
        shape = f"{smoke.nnodes} node(s) x {gpus} {unit}, data.train_batch_size {batch}"
        problems += [f"{FIELD}: the smoke run ({shape}) breaks a trainer rule: {p}; {fix}" for p in found]
    return problems
