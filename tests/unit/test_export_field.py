"""spec.export, end to end through the pure layers: RLJob field -> trainer config (trainer.export) -> the trainer's
progress record -> status.export; and the messages for what cannot work."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

import pytest

from hybridflow import progress
from hybridflow._config.export import export_uri
from rljob_operator import api, builders, trainer_progress
from rljob_operator.status import compute_status
from rljob_operator.validation import check_rljob

NOW = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
BASE: dict[str, Any] = {
    "apiVersion": "rl.hybridflow.dev/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "demo", "namespace": "default"},
    "spec": {
        "config": {
            "algorithm": {"adv_estimator": "grpo"},
            "data": {"train_files": "s3://b/train.parquet", "train_batch_size": 64},
            "actor_rollout_ref": {"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct", "lora_rank": 32},
                                  "actor": {"ppo_mini_batch_size": 16, "ppo_micro_batch_size_per_gpu": 2},
                                  "rollout": {"n": 4}},
            "trainer": {"nnodes": 1, "n_gpus_per_node": 8, "save_freq": 50},
        },
        "checkpoint": {"uri": "s3://b/ckpt", "secretRef": {"name": "s3"}},
        "export": {"maxShardSize": "2GB"},
    },
}


def _job(**spec: Any) -> dict[str, Any]:
    obj = copy.deepcopy(BASE)
    obj["spec"].update(spec)
    return obj


def test_the_field_sets_the_trainers_export_under_the_checkpoint_location() -> None:
    rljob = api.RLJob.model_validate(_job())
    cfg = builders.trainer_config(rljob)
    assert cfg.trainer.export.enable and cfg.trainer.export.max_shard_size == "2GB"
    assert export_uri(cfg, 100) == "s3://b/ckpt/export/global_step_100"
    assert check_rljob(_job()).errors == []
    off = builders.trainer_config(api.RLJob.model_validate(_job(export={"enabled": False})))
    assert not off.trainer.export.enable
    assert not builders.trainer_config(api.RLJob.model_validate(_job(export=None))).trainer.export.enable


@pytest.mark.parametrize(("change", "expected"), [
    ({"export": {"maxShardSize": "huge"}}, "spec.export.maxShardSize"),
    ({"recipe": "sft"}, "spec.export: exporting at the end of the run is built for the RL trainer"),
])
def test_what_cannot_work_is_named(change: dict[str, Any], expected: str) -> None:
    errors = check_rljob(_job(**change)).errors
    assert any(expected in e for e in errors), errors


def test_a_user_value_and_a_run_without_a_final_checkpoint_are_refused() -> None:
    job = _job()
    job["spec"]["config"]["trainer"]["export"] = {"enable": False}
    assert "spec.config.trainer.export: set by the operator from spec.export" in " ".join(check_rljob(job).errors)
    job = _job()
    job["spec"]["config"]["trainer"]["save_freq"] = -1
    (error,) = [e for e in check_rljob(job).errors if "export" in e]
    assert "spec.export sets it" in error and "set trainer.save_freq to a positive N" in error


def test_the_progress_record_becomes_status_export_and_stays(tmp_path: Any) -> None:
    root = str(tmp_path)
    progress.write_progress(root, progress.Progress(step=100, total_steps=100))
    progress.record_export(root, 100, "s3://b/ckpt/export/global_step_100", lora=True, clock=lambda: 1.7e9)
    raw = (tmp_path / progress.PROGRESS_FILE).read_bytes()
    assert json.loads(raw)["step"] == 100 and progress.Progress.from_json(raw).export.lora is True
    fragment = trainer_progress.build_progress_status(trainer_progress.parse_progress_record(raw), "s3://b/ckpt")
    assert fragment["export"] == {"step": 100, "uri": "s3://b/ckpt/export/global_step_100",
                                  "time": "2023-11-14T22:13:20Z", "lora": True}
    api.RLJobStatus.model_validate({"export": fragment["export"]})  # the CRD's status schema has it
    done = {"metadata": {"name": "demo", "namespace": "default", "generation": 1}, "spec": {"config": {}},
            "status": {"phase": "Running", **fragment}}
    rayjob = {"metadata": {"name": "demo-a1", "labels": {"rl.hybridflow.dev/attempt": "1"}},
              "status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}}
    status = compute_status(done, rayjob, [], NOW, attempt=1)
    assert status["phase"] == "Succeeded" and status["export"] == fragment["export"]
    # a record without an export (or a broken one) adds nothing
    assert "export" not in trainer_progress.build_progress_status(
        trainer_progress.parse_progress_record(json.dumps({"step": 3, "export": {"uri": 5}})))


def test_the_lora_example_trains_an_adapter_and_exports_under_its_checkpoint_uri() -> None:
    from pathlib import Path

    import yaml

    job = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "rljob_gsm8k_qwen_lora.yaml").read_text())
    cfg = builders.trainer_config(api.RLJob.model_validate(job))
    model = cfg.actor_rollout_ref.model
    assert model.lora_rank > 0 and model.target_modules == "all-linear" and cfg.actor_rollout_ref.actor.use_kl_loss
    assert cfg.trainer.export.enable and cfg.trainer.save_freq > 0
    assert export_uri(cfg, 7).startswith(job["spec"]["checkpoint"]["uri"] + "/export/")
