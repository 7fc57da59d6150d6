"""The offline trainers learn: SFT and DPO on toy tasks, 2 FSDP2 workers on gloo under Ray, run as `rljob run` would.

Each test takes an example RLJob (examples/rljob_tiny_{sft,dpo}.yaml), points it at a fresh tiny model and
toy data, derives the local command exactly as `rljob run` does (`build_local_run`: the RayJob's entrypoint
and ConfigMap) and runs that trainer's `main` in-process on one Ray session per module. Learning is judged
from the JSONL metrics the file logger writes (what users and the operator read), and the SFT checkpoint
by greedy generation with plain transformers.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from hybridflow.data import preference, toy
from hybridflow.models.tiny import build_tiny_model
from rljob_operator import api
from rljob_operator.localrun import LocalRun, build_local_run
from tests.support.demo_run import read_metrics
from tests.support.ray_local import local_ray

pytestmark = [pytest.mark.ray, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module", autouse=True)
def ray_session() -> Iterator[None]:
    with local_ray(num_cpus=2):
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("offline") / "model")


def local_run(example: str, tmp_path: Path, model: Path, data: Path, *overrides: str) -> LocalRun:
    """The example RLJob on `model` and `data`, checkpoints under tmp_path, as `rljob run` would start it."""
    job: dict[str, Any] = yaml.safe_load((EXAMPLES / example).read_text())
    config = job["spec"]["config"]
    config["model"]["partial_pretrain"] = str(model)
    config["data"]["train_files"] = str(data / "train.parquet")
    config["data"]["val_files"] = str(data / "test.parquet")
    config["trainer"]["logger"] = ["file"]
    job["spec"]["checkpoint"]["uri"] = f"file://{tmp_path / 'checkpoints'}"
    run = build_local_run(api.RLJob.model_validate(job), tmp_path, overrides, python=sys.executable, environ={})
    run.config_path.write_text(run.config_text)
    return run


def val_rows(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [r for r in rows if r.get(key) is not None]


def greedy_exact_match(model: Path, rows: list[dict[str, Any]]) -> float:
    """Share of prompts whose greedy completion (`generate`) is exactly the ground truth."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.data.dataset import left_pad

    tokenizer = AutoTokenizer.from_pretrained(model)
    policy = AutoModelForCausalLM.from_pretrained(model).eval()
    texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    prompts = tokenizer(texts, add_special_tokens=False)["input_ids"]
    width = max(len(p) for p in prompts)
    ids, mask, _ = (torch.stack(t) for t in zip(*(left_pad(p, width, tokenizer.pad_token_id) for p in prompts), strict=True))
    out = policy.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    answers = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return sum(a == r["reward_model"]["ground_truth"] for a, r in zip(answers, rows, strict=True)) / len(rows)


def test_sft_learns_the_toy_copy_task_then_resumes_on_one_process(tmp_path: Path, model_dir: Path) -> None:
    from hybridflow.trainer import fsdp_sft_trainer

    data = tmp_path / "data"
    toy.generate("copy", 1024, 64, str(data))
    run = local_run("rljob_tiny_sft.yaml", tmp_path, model_dir, data)
    assert run.argv[1:3] == ["-m", "hybridflow.trainer.fsdp_sft_trainer"]
    assert fsdp_sft_trainer.main(run.argv[3:]) == 0

    ckpt = tmp_path / "checkpoints"
    rows = read_metrics(ckpt / "metrics.jsonl")
    val = val_rows(rows, "val/exact_match")
    before, after = val[0], val[-1]
    assert (before["step"], after["step"]) == (0, 60)
    assert before["val/exact_match"] < 0.05, "a random model should almost never copy right"
    assert after["val/exact_match"] >= 0.8, f"SFT should learn to copy: exact match {before['val/exact_match']:.2f} -> {after['val/exact_match']:.2f}"
    assert after["val/loss"] < before["val/loss"] / 5
    assert after["val/mean_token_accuracy"] > 0.9
    # The checkpoint has the RL actor's layout: verl's merge command exports it, and greedy decoding with the
    # exported model writes the learned answers (the metric means what it says).
    from hybridflow import model_merger

    export = tmp_path / "export"
    step = ckpt / "global_step_60" / "actor"
    assert model_merger.main(["merge", "--backend", "fsdp", "--local_dir", str(step), "--target_dir", str(export)]) == 0
    generated = greedy_exact_match(export, toy.build_rows("copy", 64, split="test"))
    assert abs(generated - after["val/exact_match"]) <= 2 / 64

    # Resume on one process (the checkpoint is world-size independent): steps 61-62 continue the trained model.
    assert fsdp_sft_trainer.main([*run.argv[3:], "trainer.total_training_steps=62", "trainer.n_gpus_per_node=1"]) == 0
    resumed = [r for r in read_metrics(ckpt / "metrics.jsonl") if r["step"] > 60 and "train/loss" in r]
    assert [r["step"] for r in resumed] == [61, 62]
    assert resumed[0]["train/loss"] < before["val/loss"] / 5  # not a fresh model
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "62"


def test_dpo_learns_the_toy_preference_task(tmp_path: Path, model_dir: Path) -> None:
    from hybridflow.trainer import fsdp_dpo_trainer

    data = tmp_path / "data"
    preference.generate("copy_letter", 1024, 64, str(data))
    run = local_run("rljob_tiny_dpo.yaml", tmp_path, model_dir, data)
    assert run.argv[1:3] == ["-m", "hybridflow.trainer.fsdp_dpo_trainer"]
    assert fsdp_dpo_trainer.main(run.argv[3:]) == 0

    rows = read_metrics(tmp_path / "checkpoints" / "metrics.jsonl")
    train = val_rows(rows, "train/loss")
    # Step 1: the policy is the reference, so every margin is 0 and the loss is log 2.
    assert train[0]["train/loss"] == pytest.approx(math.log(2), abs=1e-6)
    val = val_rows(rows, "val/loss")
    before, after = val[0], val[-1]
    assert before["val/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert after["step"] == 40
    assert after["val/loss"] < 0.5, f"DPO loss on held-out pairs: {before['val/loss']:.3f} -> {after['val/loss']:.3f}"
    assert after["val/rewards/accuracies"] >= 0.9 and after["val/rewards/margins"] > 0.5
    assert before["val/chosen_exact_match"] < 0.1
    assert after["val/chosen_exact_match"] >= 0.5, (
        f"greedy decoding should write the chosen letter: {before['val/chosen_exact_match']:.2f} -> "
        f"{after['val/chosen_exact_match']:.2f}"
    )
