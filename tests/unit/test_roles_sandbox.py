"""The sandbox role (spec.roles.sandbox, rljob_operator/roles.py): CPU-only pods for the code sandbox's run_code
servers, a third KubeRay worker group sized from spec.config.trainer.sandbox.replicas; roles that would serve
nothing, or ask for GPUs, are refused with the fix."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hybridflow.controller.resource_pool import ROLE_RESOURCES_ENV, role_resources_from_env
from rljob_operator import api, builders, roles, validation
from tests.unit.test_roles import _advertised, _env, _groups
from tests.unit.test_roles import _with as roles_with

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
CRD_VALIDATE = SHARED / "tools" / "crd-validate"
RAYJOB_CRD = SHARED / "kuberay" / "ray.io_rayjobs.yaml"

CONFIG: dict[str, Any] = {
    "data": {"train_files": "s3://b/train.parquet", "train_batch_size": 32},
    "actor_rollout_ref": {
        "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
        "actor": {"ppo_mini_batch_size": 16},
        "rollout": {"mode": "async", "multi_turn": {"tool_config_path": "/config/tools.yaml"}},
    },
    "trainer": {"nnodes": 2, "n_gpus_per_node": 4, "device": "cuda", "placement": "split",
                "sandbox": {"replicas": 3}},
}
SANDBOX_ROLE: dict[str, Any] = {
    "resources": {"cpu": 8, "memory": "16Gi", "sharedMemory": "1Gi"},
    "nodeSelector": {"pool": "cpu"},
    "tolerations": [{"key": "cpu-only", "operator": "Exists", "effect": "NoSchedule"}],
}
ROLLOUT_ROLE: dict[str, Any] = {"nodeSelector": {"gpu.type": "l40s"}}
POD = {"nodeSelector": {"pool": "gpu"},
       "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}


def _obj(config: dict | None = None, sandbox: dict | None = None, rollout: dict | None = None,
         **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"config": copy.deepcopy(config or CONFIG), "checkpoint": {"uri": "s3://b/ckpt"},
                            "pod": copy.deepcopy(POD), **spec}
    own = {k: copy.deepcopy(v) for k, v in (("rollout", rollout), ("sandbox", sandbox)) if v is not None}
    if own:
        body["roles"] = own
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": "coder", "namespace": "ml", "uid": "u-1"}, "spec": body}


def _rljob(**kwargs: Any) -> api.RLJob:
    return api.RLJob.model_validate(_obj(**kwargs))


def _with(path: str, value: Any, config: dict | None = None) -> dict:
    return roles_with(path, value, config or CONFIG)


# ------------------------------------------------------------------------------------------- builders


def test_the_sandbox_is_a_third_cpu_only_worker_group_sized_from_the_config() -> None:
    rayjob = builders.build_rayjob(_rljob(sandbox=SANDBOX_ROLE, rollout=ROLLOUT_ROLE), 1)
    groups = _groups(rayjob)
    assert list(groups) == ["trainer", "rollout", "sandbox"]
    sandbox = groups["sandbox"]
    # one pod per run_code server, trainer.sandbox.replicas of them, one unit of the role's resource each
    assert sandbox["replicas"] == sandbox["minReplicas"] == sandbox["maxReplicas"] == 3
    assert _advertised(sandbox) == {"rljob.role/sandbox": 1}
    # Ray sees no CPUs there, so nothing asking for CPU alone is placed on the sandbox pods
    assert sandbox["rayStartParams"]["num-cpus"] == "0"
    assert "num-cpus" not in groups["trainer"]["rayStartParams"] and "num-cpus" not in groups["rollout"]["rayStartParams"]
    template = sandbox["template"]
    assert template["metadata"]["labels"][roles.LABEL_ROLE] == "sandbox"
    limits = template["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "8", "memory": "16Gi"}  # no GPU, though trainer.device is cuda
    assert template["spec"]["nodeSelector"] == {"pool": "cpu"}  # the role's key wins over spec.pod's
    assert template["spec"]["tolerations"] == POD["tolerations"] + SANDBOX_ROLE["tolerations"]
    assert {v["name"]: v for v in template["spec"]["volumes"]}["dshm"]["emptyDir"]["sizeLimit"] == "1Gi"
    # the rollout and trainer groups keep their shape: split placement, nnodes x n_gpus_per_node each
    assert groups["trainer"]["replicas"] == groups["rollout"]["replicas"] == 2
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    assert role_resources_from_env(_env(head)) == {
        "trainer": "rljob.role/trainer", "rollout": "rljob.role/rollout", "sandbox": "rljob.role/sandbox"}


def test_a_sandbox_only_job_keeps_both_pools_on_the_trainer_pods() -> None:
    rayjob = builders.build_rayjob(_rljob(sandbox={}), 1)
    groups = _groups(rayjob)
    assert list(groups) == ["trainer", "sandbox"]
    # split placement without a rollout role: the trainer's pods hold the rollout pool too, as "workers" would
    assert groups["trainer"]["replicas"] == 4 and _advertised(groups["trainer"]) == {"rljob.role/trainer": 4}
    assert groups["sandbox"]["replicas"] == 3
    limits = groups["sandbox"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "8", "memory": "64Gi"}  # unset: spec.resources' cpu and memory, never its GPUs
    assert json.loads(_env(groups["sandbox"]["template"])[ROLE_RESOURCES_ENV]) == {
        "trainer": "rljob.role/trainer", "sandbox": "rljob.role/sandbox"}


def test_the_smoke_run_has_the_sandbox_role_too() -> None:
    smoke = _groups(builders.build_smoke_rayjob(_rljob(sandbox=SANDBOX_ROLE, runPolicy={"smokeRun": {"steps": 1}})))
    assert list(smoke) == ["trainer", "sandbox"]
    assert smoke["sandbox"]["replicas"] == 3 and smoke["sandbox"]["rayStartParams"]["num-cpus"] == "0"


@pytest.mark.skipif(
    not (CRD_VALIDATE.exists() and RAYJOB_CRD.exists()),
    reason=f"{SHARED} (KubeRay CRDs and crd-validate) is absent: only CI and dev boxes have ../shared",
)
def test_sandbox_rayjobs_pass_kuberays_crd(tmp_path: Path) -> None:
    docs = [builders.build_rayjob(_rljob(sandbox=SANDBOX_ROLE, rollout=ROLLOUT_ROLE), 1),
            builders.build_rayjob(_rljob(sandbox={"replicas": 3}, scheduling={"scheduler": "kueue", "queue": "q"}), 2),
            builders.build_smoke_rayjob(_rljob(sandbox=SANDBOX_ROLE, runPolicy={"smokeRun": {}}))]
    manifest = tmp_path / "rayjobs.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    result = subprocess.run([sys.executable, str(CRD_VALIDATE), str(RAYJOB_CRD), "--", str(manifest)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(docs)} passed, 0 failed" in result.stdout


# ----------------------------------------------------------------------------------------- validation


def test_a_consistent_sandbox_role_is_valid() -> None:
    assert validation.validate_rljob(_obj(sandbox={**SANDBOX_ROLE, "replicas": 3}, rollout=ROLLOUT_ROLE)) == []
    # the code scorers alone justify it (the trainer checks the data sources when it starts)
    no_tools = _with("actor_rollout_ref.rollout.multi_turn", {})
    assert validation.validate_rljob(_obj(config=no_tools, sandbox={})) == []


@pytest.mark.parametrize(
    ("config", "sandbox", "expected"),
    [
        (_with("trainer.sandbox.replicas", 0), {"replicas": 2},
         "spec.roles.sandbox: spec.config starts no sandbox servers (trainer.sandbox.replicas is 0); set "
         "spec.config.trainer.sandbox.replicas: 2 (one run_code server per sandbox pod), or remove spec.roles.sandbox"),
        (CONFIG, {"replicas": 5},
         "spec.roles.sandbox.replicas: 5 contradicts spec.config.trainer.sandbox.replicas 3 (one run_code server per "
         "sandbox pod); set spec.config.trainer.sandbox.replicas: 5, or remove spec.roles.sandbox.replicas"),
        (CONFIG, {"resources": {"gpuResourceName": "nvidia.com/gpu"}},
         "spec.roles.sandbox.resources.gpuResourceName: the sandbox pods are CPU-only (they run programs for the "
         "code tool and the code scorers, no model) and request no GPUs; remove it"),
        (_with("custom_reward_function.path", "/config/reward.py", _with("actor_rollout_ref.rollout.multi_turn", {})),
         {}, "spec.roles.sandbox: nothing in spec.config runs code in the sandbox: no tool config "
         "(actor_rollout_ref.rollout.multi_turn.tool_config_path is unset); custom_reward_function.path replaces the "
         "built-in code scorers. Set actor_rollout_ref.rollout.multi_turn.tool_config_path"),
        (_with("reward_model.sandbox_fusion", {"url": "http://sf:8080/run_code"},
               _with("actor_rollout_ref.rollout.multi_turn", {})), {},
         "the code scorers use their own service (reward_model.sandbox_fusion.url is http://sf:8080/run_code)"),
        (CONFIG, {"resources": {"memory": "1Gi"}},
         "spec.roles.sandbox.resources.sharedMemory: 16Gi is not below the sandbox pods' memory 1Gi"),
        (CONFIG, {"resources": {"cpu": "-1"}}, "spec.roles.sandbox.resources.cpu: must be positive"),
        (CONFIG, {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
         "spec.roles.sandbox.tolerations[0].value: must be empty with operator Exists"),
        (CONFIG, {"nodeSelector": {"pool": "cpu please"}},
         "spec.roles.sandbox.nodeSelector.pool: 'cpu please' is not a valid label value"),
    ],
    ids=["no-servers", "replicas", "gpu", "nothing-runs-code", "external-service", "shm", "cpu", "toleration",
         "node-selector"],
)
def test_impossible_sandbox_roles_are_refused_with_the_fix(config: dict, sandbox: dict, expected: str) -> None:
    errors = validation.validate_rljob(_obj(config=config, sandbox=sandbox))
    assert any(expected in e for e in errors), errors


def test_offline_recipes_have_no_sandbox_role() -> None:
    obj = _obj(sandbox={})
    obj["spec"].update(recipe="dpo", config={"data": {"train_files": "s3://b/t.parquet"},
                                             "model": {"partial_pretrain": "Qwen/Qwen2.5-0.5B"}})
    errors = validation.validate_rljob(obj)
    assert any(e.startswith("spec.roles.sandbox: spec.recipe dpo trains on fixed data and runs no code") for e in errors)


def test_sandbox_replicas_without_the_role_is_a_warning() -> None:
    report = validation.check_rljob(_obj())
    assert report.errors == []
    assert any(w.startswith("spec.config.trainer.sandbox.replicas: 3 starts no sandbox servers without "
                            "spec.roles.sandbox") for w in report.warnings), report.warnings


def test_a_local_run_says_the_code_runs_in_the_local_sandbox() -> None:
    from rljob_operator import localrun

    example = yaml.safe_load((REPO / "examples" / "rljob_code_sandbox.yaml").read_text())
    run = localrun.build_local_run(api.RLJob.model_validate(example), Path("/w"), python="py", environ={})
    assert ROLE_RESOURCES_ENV not in run.env  # no sandbox pods: the trainer's plan_sandbox finds no role
    assert "spec.roles.sandbox: no run_code servers start; code runs in the local sandbox" in run.notes


def test_fewer_cpus_than_programs_at_once_is_a_warning() -> None:
    config = _with("trainer.sandbox.max_concurrency", 16)
    report = validation.check_rljob(_obj(config=config, sandbox=SANDBOX_ROLE))
    assert report.errors == []
    assert any(w.startswith("spec.roles.sandbox.resources.cpu: 8 CPUs per sandbox pod for spec.config.trainer.sandbox."
                            "max_concurrency 16 programs at once") for w in report.warnings), report.warnings
    warnings = validation.check_rljob(_obj(sandbox=SANDBOX_ROLE)).warnings  # 8 CPUs for the default 4
    assert not any("max_concurrency" in w for w in warnings), warnings
