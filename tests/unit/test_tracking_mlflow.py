"""The mlflow logger for real: a local MLflow file store beside the checkpoints (or $MLFLOW_TRACKING_URI), read back
with MLflow's own client: metrics per step (verl's names, `@` as `_at_`), the config as params, generations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridflow.config import load_config
from hybridflow.tracking import Tracking, flatten_params

mlflow = pytest.importorskip("mlflow", reason="the mlflow logger needs mlflow-skinny (pip install -e .[dev])")


def test_metrics_params_and_generations_land_in_a_local_file_store(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = load_config(None, ['trainer.logger=["console","mlflow"]', "trainer.n_gpus_per_node=1",
                             "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2"])
    assert cfg.trainer.logger == ["console", "mlflow"]
    tracker = Tracking("proj", "exp", ["mlflow"], cfg.to_dict(), default_local_dir=str(tmp_path / "ckpt"))
    tracker.log({"actor/pg_loss": 0.5, "val-core/toy/reward/mean@4": 0.25}, step=1)
    tracker.log({"actor/pg_loss": 0.4, "actor/entropy": float("nan")}, step=2)  # nan: not a value, skipped
    tracker.log_generations([("1+2=", "3", 1.0)], step=2)
    tracker.finish()
    logger = tracker.loggers["mlflow"]
    assert logger.tracking_uri == f"file://{tmp_path / 'ckpt' / 'mlruns'}"
    client = mlflow.MlflowClient(logger.tracking_uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "exp"
    assert client.get_experiment(run.info.experiment_id).name == "proj"  # verl: project -> experiment
    assert [(m.step, m.value) for m in client.get_metric_history(logger.run_id, "actor/pg_loss")] == [(1, 0.5), (2, 0.4)]
    assert run.data.metrics["val-core/toy/reward/mean_at_4"] == 0.25 and "actor/entropy" not in run.data.metrics
    assert run.data.params["data/train_batch_size"] == "2" and run.data.params["trainer/logger/1"] == "mlflow"
    text = Path(client.download_artifacts(logger.run_id, "val_generations/step_2.json", str(tmp_path))).read_text()
    assert json.loads(text) == [{"input": "1+2=", "output": "3", "score": 1.0}]


def test_the_tracking_uri_variable_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = f"file://{tmp_path / 'elsewhere'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    tracker = Tracking("p", "e", ["mlflow"], {}, default_local_dir=str(tmp_path / "ckpt"))
    tracker.log({"x": 1.0}, step=3)
    tracker.finish()
    run_id = tracker.loggers["mlflow"].run_id
    assert mlflow.MlflowClient(store).get_run(run_id).data.metrics == {"x": 1.0}
    assert not (tmp_path / "ckpt" / "mlruns").exists()


def test_flatten_params_joins_keys_and_list_items() -> None:
    assert flatten_params({"a": {"b": 1, "c": [2, {"d": None}]}, "e": [], "f": "x" * 7000}) == {
        "a/b": "1", "a/c/0": "2", "a/c/1/d": "None", "e": "[]", "f": "x" * 6000,
    }
