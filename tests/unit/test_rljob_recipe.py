"""spec.recipe: an RLJob runs the RL, SFT or DPO trainer; entrypoint, config checks and `rljob run` follow it."""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from hybridflow._config.offline import load_offline_config
from hybridflow.trainer.offline import parse_command_line
from rljob_operator import api, builders, localrun
from rljob_operator.validation import check_rljob

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def job(name: str = "rljob_tiny_sft.yaml") -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


def rljob(obj: dict[str, Any]) -> api.RLJob:
    return api.RLJob.model_validate({**obj, "metadata": {**obj["metadata"], "uid": "u"}})


@pytest.mark.parametrize(
    ("name", "module"),
    [("rljob_tiny_sft.yaml", "hybridflow.trainer.fsdp_sft_trainer"), ("rljob_tiny_dpo.yaml", "hybridflow.trainer.fsdp_dpo_trainer"),
     ("rljob_cpu_tiny.yaml", "hybridflow.trainer.main_ppo")],
)
def test_the_recipe_picks_the_entrypoint(name: str, module: str) -> None:
    rayjob = builders.build_rayjob(rljob(job(name)), 1)
    assert shlex.split(rayjob["spec"]["entrypoint"])[:3] == ["python", "-m", module]


def test_the_configmap_holds_the_recipes_config_with_the_operators_values() -> None:
    obj = job()
    cm = builders.build_configmap(rljob(obj))
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["trainer"]["max_ckpt_to_keep"] == obj["spec"]["checkpoint"]["keep"]  # SFT's key, not the actor's
    assert config["trainer"]["default_local_dir"] == obj["spec"]["checkpoint"]["uri"]
    assert config["trainer"]["resume_mode"] == "auto"
    assert config["data"]["response_dict_keys"] == ["ground_truth"]
    assert "max_actor_ckpt_to_keep" not in config["trainer"]


def test_the_cluster_is_sized_from_the_offline_config() -> None:
    obj = job("rljob_tiny_dpo.yaml")
    obj["spec"]["config"]["trainer"].update({"device": "cuda", "nnodes": 2, "n_gpus_per_node": 4})
    obj["spec"]["checkpoint"]["uri"] = "s3://bucket/dpo"
    (workers,) = builders.build_rayjob(rljob(obj), 1)["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert workers["replicas"] == 2
    assert workers["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"


def test_validation_uses_the_recipes_models_and_points_at_the_recipe() -> None:
    sft_as_rl = copy.deepcopy(job())
    del sft_as_rl["spec"]["recipe"]
    errors = check_rljob(sft_as_rl).errors
    assert "spec.config.model: unknown key" in "\n".join(errors)
    assert errors[-1] == ("spec.recipe: is ppo (the default, the RL trainer) but spec.config has model, optim, groups of "
                          "the offline trainers; set spec.recipe: sft (or dpo for preference pairs)")
    rl_as_sft = job("rljob_cpu_tiny.yaml")
    rl_as_sft["spec"]["recipe"] = "sft"
    assert any(e.startswith("spec.config.actor_rollout_ref: not a key of the sft trainer") for e in check_rljob(rl_as_sft).errors)
    wrong = job()
    wrong["spec"]["recipe"] = "grpo"
    assert check_rljob(wrong).errors == ["spec.recipe: 'grpo' is not valid; use one of 'ppo', 'sft' or 'dpo'"]


def test_the_operator_decides_the_offline_checkpoint_retention() -> None:
    obj = job()
    obj["spec"]["config"]["trainer"]["max_ckpt_to_keep"] = 5
    assert check_rljob(obj).errors == [
        "spec.config.trainer.max_ckpt_to_keep: set by the operator from spec.checkpoint.keep, which replaces it; remove "
        "it and keep spec.checkpoint.keep"
    ]


def test_rljob_run_starts_the_recipes_trainer_on_the_configmaps_config(tmp_path: Path) -> None:
    run = localrun.build_local_run(rljob(job("rljob_tiny_dpo.yaml")), tmp_path, ["dpo.beta=0.2"], python="py", environ={})
    assert run.argv[:4] == ["py", "-m", "hybridflow.trainer.fsdp_dpo_trainer", str(tmp_path / "config.yaml")]
    assert run.argv[-1] == "dpo.beta=0.2" and run.config.dpo.beta == 0.2  # type: ignore[union-attr]
    run.config_path.write_text(run.config_text)
    path, overrides = parse_command_line(run.argv[3:])  # what the trainer itself does with the argv
    assert load_offline_config(path, overrides, "dpo") == run.config


@pytest.mark.parametrize("name", ["tiny_sft", "tiny_dpo"])
def test_offline_rljob_examples_are_their_trainer_configs(name: str) -> None:
    """rljob_tiny_{sft,dpo}.yaml run examples/tiny_{sft,dpo}.yaml's config minus what the operator sets."""
    config = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    keep = config["trainer"].pop("max_ckpt_to_keep")
    del config["trainer"]["resume_mode"], config["trainer"]["default_local_dir"]
    obj = job(f"rljob_{name}.yaml")
    assert obj["spec"]["config"] == config
    assert obj["spec"]["checkpoint"]["keep"] == keep
