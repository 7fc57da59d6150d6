"""The example catalog: each RLJob example configures what its name promises, and README lists them all."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_operator import api
from rljob_operator.builders import build_rayjob, merged_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
RLJOBS = sorted(EXAMPLES.glob("rljob_*.yaml"))


def _job(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


def _config(name: str) -> dict[str, Any]:
    return _job(name)["spec"]["config"]


@pytest.mark.parametrize("path", RLJOBS, ids=lambda p: p.name)
def test_example_starts_with_what_it_runs_needs_and_how_to_apply(path: Path) -> None:
    text = path.read_text()
    header = text[: text.index("apiVersion:")]
    assert all(line.startswith("#") or not line.strip() for line in header.splitlines()), path.name
    assert f"rljob validate -f examples/{path.name}" in header
    assert "kubectl apply -f" in header or "rljob run -f" in header
    assert len(header.splitlines()) >= 5, f"{path.name}: say what it runs and what it needs (GPUs, data, a Secret)"


@pytest.mark.parametrize("path", RLJOBS, ids=lambda p: p.name)
def test_no_bare_yaml11_boolean_keys(path: Path) -> None:
    # kubectl reads YAML 1.1, where a bare key n/y/no/yes/on/off is a boolean: such keys must be quoted.
    assert not re.search(r"^\s*(n|y|no|yes|on|off):", path.read_text(), re.MULTILINE | re.IGNORECASE)


@pytest.mark.parametrize("path", RLJOBS, ids=lambda p: p.name)
def test_secret_is_named_where_the_checkpoint_needs_one(path: Path) -> None:
    job = _job(path.name)
    uri = job["spec"]["checkpoint"]["uri"]
    if uri.startswith(("s3://", "gs://")):
        secret = job["spec"]["checkpoint"]["secretRef"]["name"]
        assert f"kubectl create secret generic {secret}" in path.read_text() or f"`{secret}`" in path.read_text()


def test_cpu_tiny_is_the_demo_config() -> None:
    """rljob_cpu_tiny.yaml runs `make run`'s config: tiny_grpo.yaml minus what the operator sets."""
    demo = yaml.safe_load((EXAMPLES / "tiny_grpo.yaml").read_text())
    keep = demo["trainer"].pop("max_actor_ckpt_to_keep")
    del demo["trainer"]["resume_mode"], demo["trainer"]["default_local_dir"]
    assert _config("rljob_cpu_tiny.yaml") == demo
    assert _job("rljob_cpu_tiny.yaml")["spec"]["checkpoint"]["keep"] == keep  # the operator sets the key from it
    assert "copy one letter" in (EXAMPLES / "rljob_cpu_tiny.yaml").read_text()


def test_ppo_trains_a_critic_with_gae() -> None:
    cfg = _config("rljob_ppo_qwen_critic.yaml")
    assert cfg["algorithm"]["adv_estimator"] == "gae"
    assert cfg["actor_rollout_ref"]["rollout"]["n"] == 1
    assert cfg["critic"]["model"]["path"] == cfg["actor_rollout_ref"]["model"]["path"] == "Qwen/Qwen2.5-0.5B-Instruct"


def test_dapo_has_the_papers_four_changes_and_no_kl() -> None:
    cfg = _config("rljob_dapo_math.yaml")
    actor = cfg["actor_rollout_ref"]["actor"]
    assert (actor["clip_ratio_low"], actor["clip_ratio_high"]) == (0.2, 0.28)
    assert actor["loss_agg_mode"] == "token-mean"
    buffer = cfg["reward_model"]["overlong_buffer"]
    assert buffer["enable"] and 0 < buffer["len"] < cfg["data"]["max_response_length"]
    assert cfg["reward_model"]["reward_manager"] == "dapo"
    assert cfg["algorithm"]["filter_groups"]["enable"] and cfg["algorithm"]["filter_groups"]["metric"] == "acc"
    assert not actor["use_kl_loss"] and not cfg["algorithm"]["use_kl_in_reward"]


def test_two_node_job_is_queued_tolerates_gpu_taints_and_has_a_priority() -> None:
    job = _job("rljob_grpo_2node.yaml")
    trainer = job["spec"]["config"]["trainer"]
    assert (trainer["nnodes"], trainer["n_gpus_per_node"]) == (2, 8)
    assert job["spec"]["config"]["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"] == 2
    rljob = api.RLJob.model_validate({**job, "metadata": {**job["metadata"], "uid": "u"}})
    rayjob = build_rayjob(rljob, 1)
    assert job["spec"]["scheduling"]["scheduler"] == "kueue"
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == job["spec"]["scheduling"]["queue"]
    assert rayjob["spec"]["suspend"] is True  # Kueue admits it by unsuspending
    (workers,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert workers["replicas"] == 2
    pod = workers["template"]["spec"]
    assert pod["priorityClassName"] == "rl-training"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_kueue_queues_admit_the_two_node_job_whole() -> None:
    """examples/kueue_queues.yaml: the LocalQueue the 2-node job names, with quota for its head and workers."""
    from rljob_operator.validation import parse_quantity

    docs = {d["kind"]: d for d in yaml.safe_load_all((EXAMPLES / "kueue_queues.yaml").read_text())}
    job = _job("rljob_grpo_2node.yaml")
    assert docs["LocalQueue"]["metadata"]["name"] == job["spec"]["scheduling"]["queue"]
    assert docs["LocalQueue"]["spec"]["clusterQueue"] == docs["ClusterQueue"]["metadata"]["name"]
    (group,) = docs["ClusterQueue"]["spec"]["resourceGroups"]
    (flavor,) = group["flavors"]
    assert flavor["name"] == docs["ResourceFlavor"]["metadata"]["name"]
    quota = {r["name"]: parse_quantity(r["nominalQuota"]) for r in flavor["resources"]}
    rljob = api.RLJob.model_validate({**job, "metadata": {**job["metadata"], "uid": "u"}})
    cluster = build_rayjob(rljob, 1)["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]] + [
        g["template"] for g in cluster["workerGroupSpecs"] for _ in range(g["replicas"])]
    needed: dict[str, Any] = {}
    for pod in pods:
        for name, amount in pod["spec"]["containers"][0]["resources"]["requests"].items():
            needed[name] = needed.get(name, 0) + parse_quantity(amount)
    assert set(needed) == set(group["coveredResources"])
    for name, amount in needed.items():
        assert quota[name] >= amount, f"ClusterQueue quota of {name} is below the job's {amount}"


def test_drgrpo_drops_std_and_length_normalisation() -> None:
    cfg = _config("rljob_drgrpo.yaml")
    assert cfg["algorithm"]["adv_estimator"] == "grpo"
    assert cfg["algorithm"]["norm_adv_by_std_in_grpo"] is False
    assert cfg["actor_rollout_ref"]["actor"]["loss_agg_mode"] == "seq-mean-token-sum-norm"


def test_online_dpo_pairs_samples_against_the_reference_on_policy() -> None:
    cfg = _config("rljob_online_dpo_gsm8k.yaml")
    actor = cfg["actor_rollout_ref"]["actor"]
    assert cfg["algorithm"]["adv_estimator"] == "online_dpo" and cfg["algorithm"]["dpo_beta"] > 0
    assert actor["loss_agg_mode"] == "seq-mean-token-sum"
    assert actor["ppo_mini_batch_size"] == cfg["data"]["train_batch_size"]  # one update: the exact DPO gradient
    assert cfg["actor_rollout_ref"]["rollout"]["n"] >= 2


def _gpus_requested(rayjob: dict[str, Any]) -> int:
    """GPUs the RayCluster of a RayJob asks Kubernetes for, over all worker pods."""
    total = 0
    for group in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        (container,) = group["template"]["spec"]["containers"]
        total += group["replicas"] * int(container["resources"]["limits"].get("nvidia.com/gpu", 0))
    return total


def test_split_example_uses_split_placement() -> None:
    trainer = _config("rljob_grpo_split.yaml")["trainer"]
    assert trainer["placement"] == "split"
    assert (trainer["nnodes"], trainer["n_gpus_per_node"]) == (1, 4)  # 2 pools x 4 = 8 GPUs, one node


def test_operator_requests_the_gpus_a_split_job_uses() -> None:
    job = _job("rljob_grpo_split.yaml")
    rljob = api.RLJob.model_validate({**job, "metadata": {**job["metadata"], "uid": "u"}})
    trainer = merged_config(rljob)["trainer"]
    needed = 2 * trainer["nnodes"] * trainer["n_gpus_per_node"]  # training pool + rollout pool
    assert _gpus_requested(build_rayjob(rljob, 1)) == needed


def test_readme_lists_every_example() -> None:
    readme = (EXAMPLES / "README.md").read_text()
    listed = set(re.findall(r"^\| \[`([^`]+)`\]", readme, re.MULTILINE))
    assert listed == {p.name for p in (*EXAMPLES.glob("*.yaml"), *EXAMPLES.glob("*.py"))}


def test_tiny_tool_agent_rljob_is_the_tool_agent_config() -> None:
    """rljob_tiny_tool_agent.yaml runs examples/tiny_tool_agent.yaml's config minus what the operator sets."""
    config = yaml.safe_load((EXAMPLES / "tiny_tool_agent.yaml").read_text())
    del config["trainer"]["resume_mode"], config["trainer"]["default_local_dir"]
    assert _config("rljob_tiny_tool_agent.yaml") == config
