"""spec.runPolicy.smokeRun: the smallest shape the trainer accepts, its config, its children, its validation."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from hybridflow.recipes import get_recipe
from rljob_operator import api, builders, names, smoke
from rljob_operator.validation import check_rljob, validate_rljob

REPO = Path(__file__).resolve().parents[2]

#: GRPO on 2 nodes x 8 GPUs, vLLM with tensor parallel 2: the smoke run needs 2 GPUs (one engine).
GRPO_TP2 = {
    "algorithm": {"adv_estimator": "grpo"},
    "data": {"train_batch_size": 1024, "train_files": "s3://b/t.parquet"},
    "actor_rollout_ref": {
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
        "actor": {"ppo_mini_batch_size": 256, "ppo_micro_batch_size_per_gpu": 16},
        "rollout": {"name": "vllm", "n": 8, "tensor_model_parallel_size": 2},
    },
    "trainer": {"nnodes": 2, "n_gpus_per_node": 8, "device": "cuda", "experiment_name": "big", "save_freq": 50},
}
#: PPO with a critic (n=1) and tensor parallel 4: 4 GPUs, and 4 prompts so that each rank gets one response.
PPO_TP4 = {
    "algorithm": {"adv_estimator": "gae"},
    "data": {"train_batch_size": 512, "train_files": "s3://b/t.parquet"},
    "actor_rollout_ref": {
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
        "actor": {"ppo_mini_batch_size": 128, "ppo_micro_batch_size_per_gpu": 4},
        "rollout": {"name": "vllm", "n": 1, "tensor_model_parallel_size": 4},
    },
    "critic": {"ppo_mini_batch_size": 128, "ppo_micro_batch_size_per_gpu": 4},
    "trainer": {"nnodes": 4, "n_gpus_per_node": 8, "device": "cuda"},
}
CPU_TINY = yaml.safe_load((REPO / "examples" / "rljob_cpu_tiny.yaml").read_text())["spec"]["config"]


def rljob(config: dict[str, Any], smoke_run: dict[str, Any] | None = None, **spec: Any) -> api.RLJob:
    return api.RLJob.model_validate({
        "metadata": {"name": "demo", "namespace": "ml", "uid": "u-1", "generation": 1},
        "spec": {"config": copy.deepcopy(config), "checkpoint": {"uri": "s3://bucket/demo"},
                 "runPolicy": {"smokeRun": {} if smoke_run is None else smoke_run}, **spec}})  # fmt: skip


# name -> (config, smokeRun, expected (GPUs per node, train batch, mini-batch, micro-batch per GPU))
SHAPES = {
    "grpo tp2: one engine, one prompt of 8 responses": (GRPO_TP2, {}, (2, 1, 1, 4)),
    "ppo tp4 with a critic: 4 prompts of 1 response": (PPO_TP4, {}, (4, 4, 4, 1)),
    "cpu tiny: one process, one prompt": (CPU_TINY, {"steps": 3}, (1, 1, 1, 8)),
    "user batch": (GRPO_TP2, {"trainBatchSize": 4}, (2, 4, 4, 16)),
    "user GPUs": (GRPO_TP2, {"nGpusPerNode": 4}, (4, 1, 1, 2)),
}  # fmt: skip


@pytest.mark.parametrize("case", SHAPES)
def test_smallest_shape_the_trainer_accepts(case: str) -> None:
    config, smoke_run, (gpus, batch, mini, micro) = SHAPES[case]
    shape = smoke.derive(rljob(config, smoke_run))
    cfg = shape.config
    got = (shape.n_gpus_per_node, shape.train_batch_size, cfg.actor_rollout_ref.actor.ppo_mini_batch_size,
           cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu)
    assert got == (gpus, batch, mini, micro)
    assert (shape.nnodes, cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node, cfg.data.train_batch_size) == (1, 1, gpus, batch)
    if cfg.critic_enabled:
        assert (cfg.critic.ppo_mini_batch_size, cfg.critic.ppo_micro_batch_size_per_gpu) == (mini, micro)
    get_recipe("ppo").parse(cfg.to_dict())  # the trainer's own models accept it as it is written to the ConfigMap


@pytest.mark.parametrize("case", [c for c in SHAPES if "user" not in c])
def test_nothing_smaller_passes_the_trainers_rules(case: str) -> None:
    """Reference: the trainer refuses every smaller GPU count, and on the chosen one every smaller batch."""
    config, smoke_run, (gpus, batch, *_) = SHAPES[case]
    for fewer in range(1, gpus):
        with pytest.raises(smoke.SmokeRunError):
            smoke.derive(rljob(config, {**smoke_run, "nGpusPerNode": fewer}))
    for smaller in range(1, batch):
        with pytest.raises(smoke.SmokeRunError):
            smoke.derive(rljob(config, {**smoke_run, "nGpusPerNode": gpus, "trainBatchSize": smaller}))


def test_smoke_config_runs_briefly_and_writes_elsewhere() -> None:
    cfg = smoke.derive(rljob(GRPO_TP2, {"steps": 3})).config
    full = builders.trainer_config(rljob(GRPO_TP2))
    trainer = cfg.trainer
    assert (trainer.total_training_steps, trainer.save_freq, trainer.test_freq, trainer.val_before_train) == (3, 3, -1, False)
    assert trainer.resume_mode == "disable" and trainer.experiment_name == "big-smoke"
    assert full.trainer.default_local_dir == "s3://bucket/demo"
    assert trainer.default_local_dir == "s3://bucket/demo/smoke-run"
    assert cfg.actor_rollout_ref.rollout.n == 8 and cfg.algorithm.adv_estimator == "grpo"  # the algorithm is kept


def test_offline_recipes_shrink_rows_and_drop_validation() -> None:
    config = {"data": {"train_files": ["t.parquet"], "val_files": ["v.parquet"], "train_batch_size": 64,
                       "micro_batch_size_per_gpu": 4},
              "model": {"partial_pretrain": "m"}, "trainer": {"nnodes": 2, "n_gpus_per_node": 4, "device": "cuda"}}
    shape = smoke.derive(rljob(config, {"nGpusPerNode": 2}, recipe="sft"))
    assert (shape.train_batch_size, shape.config.data.micro_batch_size_per_gpu, shape.config.data.val_files) == (2, 1, [])


REFUSED = {
    "more nodes than the job": (GRPO_TP2, {"nnodes": 3}, ["spec.runPolicy.smokeRun.nnodes: 3 is more than",
                                                           "trainer.nnodes (2)", "lower it"]),
    "more GPUs than a node": (GRPO_TP2, {"nGpusPerNode": 9}, ["spec.runPolicy.smokeRun.nGpusPerNode: 9",
                                                               "n_gpus_per_node (8)", "unset it"]),
    "GPUs that split the engine": (GRPO_TP2, {"nGpusPerNode": 3}, [
        "tensor_model_parallel_size: 2 does not divide", "change spec.runPolicy.smokeRun.nGpusPerNode"]),
    "a batch that does not split": (PPO_TP4, {"trainBatchSize": 2}, [
        "(1 node(s) x 4 GPUs, data.train_batch_size 2)", "do not split evenly over 4 ranks",
        "change spec.runPolicy.smokeRun.trainBatchSize"]),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSED)
def test_impossible_smoke_runs_are_refused_at_validation_with_the_fix(case: str) -> None:
    config, smoke_run, needles = REFUSED[case]
    job = rljob(config, smoke_run).model_dump(mode="json", exclude_none=True)
    errors = validate_rljob(job)
    assert errors, case
    text = "\n".join(errors)
    assert all(needle in text for needle in needles), text
    assert all(e.startswith("spec.runPolicy.smokeRun") for e in errors), errors


def test_a_valid_smoke_run_adds_no_problem_and_counts_in_the_name_limit() -> None:
    job = rljob(CPU_TINY).model_dump(mode="json", exclude_none=True)
    assert validate_rljob(job) == []
    job["metadata"]["name"] = "a" * 42  # "-a4" fits 47 characters, "-smoke" does not
    errors = check_rljob(job).errors
    assert any("and a smoke run" in e and "a" * 42 + "-smoke" in e and "at most 41" in e for e in errors), errors
    del job["spec"]["runPolicy"]["smokeRun"]
    assert validate_rljob(job) == []


def test_smoke_children() -> None:
    job = rljob(GRPO_TP2, pod={"labels": {"team": "rl"}})
    configmap, rayjob = builders.build_smoke_children(job, {"a": "b"})
    assert set(configmap["data"]) == {names.CONFIG_KEY, names.SMOKE_CONFIG_KEY}
    smoke_cfg = yaml.safe_load(configmap["data"][names.SMOKE_CONFIG_KEY])
    assert smoke_cfg["trainer"]["n_gpus_per_node"] == 2 and smoke_cfg["data"]["train_batch_size"] == 1
    assert yaml.safe_load(configmap["data"][names.CONFIG_KEY])["trainer"]["n_gpus_per_node"] == 8
    meta = rayjob["metadata"]
    assert meta["name"] == "demo-smoke" and meta["annotations"] == {"a": "b"}
    assert meta["labels"][names.LABEL_SMOKE_RUN] == "true" and names.LABEL_ATTEMPT not in meta["labels"]
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (1, 1, 1)
    worker = group["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert {"name": "HYBRIDFLOW_ATTEMPT", "value": "0"} in worker["env"]
    assert group["template"]["metadata"]["labels"]["team"] == "rl"
    assert rayjob["spec"]["entrypoint"] == ("python -m hybridflow.trainer.main_ppo /etc/hybridflow/smoke-config.yaml "
                                            "trainer.default_local_dir=s3://bucket/demo/smoke-run trainer.resume_mode=disable")
    full = builders.build_rayjob(job, 1)["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert (full["replicas"], full["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) == (2, "8")


def test_without_a_smoke_run_the_configmap_has_one_key() -> None:
    job = rljob(GRPO_TP2).model_copy(deep=True)
    job.spec.run_policy.smoke_run = None
    assert set(builders.build_configmap(job)["data"]) == {names.CONFIG_KEY}
    with pytest.raises(smoke.SmokeRunError, match="not set"):
        builders.build_smoke_rayjob(job)
