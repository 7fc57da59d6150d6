"""Tests for `rljob run` (operator/rljob_operator/localrun.py): the local command is the RayJob's, made local."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hybridflow.config import ConfigError, load_config
from rljob_operator import api, cli, localrun, names
from rljob_operator.builders import build_configmap, build_rayjob

REPO = Path(__file__).resolve().parents[2]
TINY_RLJOB = REPO / "examples" / "tiny_grpo_rljob.yaml"
TINY_CONFIG = REPO / "examples" / "tiny_grpo.yaml"
CPU_EXAMPLE = REPO / "examples" / "rljob_cpu_tiny.yaml"
GPU_EXAMPLE = REPO / "examples" / "rljob_gsm8k_qwen.yaml"


def _job(path: Path = TINY_RLJOB) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _write(tmp_path: Path, job: dict[str, Any]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _rayjob_argv(job: dict[str, Any]) -> list[str]:
    rljob = api.RLJob.model_validate(job)
    rljob.metadata.uid = "uid"
    return shlex.split(build_rayjob(rljob, 1)["spec"]["entrypoint"])


def _fail_if_started(monkeypatch: pytest.MonkeyPatch) -> None:
    def started(*_: Any, **__: Any) -> int:
        raise AssertionError("the trainer must not be started")

    monkeypatch.setattr(localrun, "run_child", started)


def _dry_run(
    capsys: pytest.CaptureFixture[str], path: Path, workdir: Path, *extra: str
) -> tuple[list[str], str]:
    """Run `rljob run --dry-run` through the CLI table; (command argv from the last line, whole stdout)."""
    assert cli.main(["run", "-f", str(path), "--dry-run", "--workdir", str(workdir), *extra]) == 0
    out = capsys.readouterr().out
    return shlex.split(out.rstrip("\n").splitlines()[-1]), out


@pytest.mark.parametrize("example", [TINY_RLJOB, CPU_EXAMPLE], ids=lambda p: p.name)
def test_dry_run_command_is_the_rayjob_entrypoint_modulo_config_path(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = tmp_path / "wd"
    argv, _ = _dry_run(capsys, example, workdir)
    expected = _rayjob_argv(_job(example))
    assert argv[0] == sys.executable and expected[0] == "python"
    assert argv[1:] == [str(workdir / "config.yaml") if a == names.CONFIG_PATH else a for a in expected[1:]]


def test_overrides_are_appended_after_the_entrypoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = ["trainer.total_training_steps=2", "trainer.resume_mode=disable"]
    argv, _ = _dry_run(capsys, TINY_RLJOB, tmp_path / "wd", *overrides)
    assert argv[-2:] == overrides
    entrypoint = _rayjob_argv(_job())
    assert argv[:-2] == [
        sys.executable,
        *entrypoint[1:3],
        str(tmp_path / "wd" / "config.yaml"),
        *entrypoint[4:],
    ]


def test_written_config_is_the_configmaps_and_the_trainer_loads_it(tmp_path: Path, capsys) -> None:
    job = _job()
    _dry_run(capsys, TINY_RLJOB, tmp_path / "wd", "trainer.total_training_steps=2")
    written = (tmp_path / "wd" / "config.yaml").read_text()
    rljob = api.RLJob.model_validate(job)
    rljob.metadata.uid = "uid"
    assert written == build_configmap(rljob)["data"][names.CONFIG_KEY]
    cfg = load_config(tmp_path / "wd" / "config.yaml", ["trainer.total_training_steps=2"])
    assert cfg.trainer.default_local_dir == job["spec"]["checkpoint"]["uri"]
    assert cfg.trainer.resume_mode == "auto"


def test_dry_run_prints_the_pods_env_as_exports(tmp_path: Path, capsys) -> None:
    job = _job()
    job["metadata"]["namespace"] = "team-a"
    job["spec"]["pod"] = {
        "env": [
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}},
        ]
    }
    job["spec"]["checkpoint"]["secretRef"] = {"name": "s3-creds"}
    _, out = _dry_run(capsys, _write(tmp_path, job), tmp_path / "wd")
    for line in ("export RLJOB_NAME=tiny-grpo", "export RLJOB_NAMESPACE=team-a", "export HYBRIDFLOW_ATTEMPT=1",
                 "export HF_HUB_OFFLINE=1"):  # fmt: skip
        assert line in out.splitlines()
    assert not any(line.startswith("export WANDB_API_KEY=") for line in out.splitlines())  # never invented
    assert "# note: WANDB_API_KEY: comes from Secret 'wandb' key 'key' on a cluster" in out
    assert "# note: envFrom Secret 's3-creds'" in out
    assert "# checkpoints: outputs/rljob/tiny-grpo/checkpoints" in out


def test_build_local_run_env_matches_the_head_pod() -> None:
    rljob = api.RLJob.model_validate(_job())
    run = localrun.build_local_run(rljob, Path("/w"), python="py", environ={})
    rljob.metadata.uid = "uid"
    pod_env = build_rayjob(rljob, 1)["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"][
        "containers"
    ][0]
    literal = {e["name"]: e["value"] for e in pod_env["env"] if "value" in e}
    assert {k: v for k, v in run.env.items() if k in literal} == literal
    assert set(run.env) == {e["name"] for e in pod_env["env"]}
    assert run.checkpoint_uri == "outputs/rljob/tiny-grpo/checkpoints"


def test_secret_env_present_locally_is_kept_from_the_environment() -> None:
    job = _job()
    job["spec"]["pod"] = {
        "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    }
    run = localrun.build_local_run(
        api.RLJob.model_validate(job), Path("/w"), python="py", environ={"TOKEN": "x"}
    )
    assert "TOKEN" not in run.env  # inherited from the environment, not overwritten
    assert any("using your environment's value" in n for n in run.notes)


def test_environment_values_replace_the_pods_literal_values_with_a_note() -> None:
    environ = {"HYBRIDFLOW_METRICS_PORT": "0", "RLJOB_NAME": "tiny-grpo"}
    run = localrun.build_local_run(api.RLJob.model_validate(_job()), Path("/w"), python="py", environ=environ)
    assert run.env["HYBRIDFLOW_METRICS_PORT"] == "0" and run.env["RLJOB_NAME"] == "tiny-grpo"
    assert run.notes == ["HYBRIDFLOW_METRICS_PORT: your environment's '0' replaces the pod's '8000'"]


def test_without_checkpoint_uri_the_configs_default_local_dir_is_used() -> None:
    job = _job()
    del job["spec"]["checkpoint"]
    job["spec"]["config"]["trainer"]["default_local_dir"] = "outputs/demo/checkpoints"  # allowed without a URI
    run = localrun.build_local_run(api.RLJob.model_validate(job), Path("/w"), python="py", environ={})
    assert run.checkpoint_uri == "outputs/demo/checkpoints"
    assert not any(a.startswith("trainer.default_local_dir=") for a in run.argv)


@pytest.mark.parametrize(
    "entrypoint",
    [
        "bash -c 'train'",
        f"python -m hybridflow.trainer.main_ppo trainer.seed=1 {names.CONFIG_PATH}",
        f"python -m hybridflow.trainer.main_ppo {names.CONFIG_PATH} --flag",
    ],
)
def test_entrypoint_of_another_shape_is_refused(entrypoint: str) -> None:
    with pytest.raises(RuntimeError, match="cannot map it to a local command"):
        localrun.localize_entrypoint(entrypoint, Path("/w/config.yaml"), "py")


def test_trainer_parses_the_local_argv_like_build_local_run() -> None:
    """main_ppo's own parser sees the config file first and every override after it."""
    from hybridflow.trainer.main_ppo import parse_argv

    run = localrun.build_local_run(
        api.RLJob.model_validate(_job()), Path("/w"), ["trainer.seed=3"], python="py", environ={}
    )
    assert parse_argv(run.argv[3:]) == ("/w/config.yaml", run.argv[4:])
    assert run.argv[-1] == "trainer.seed=3"


def test_invalid_manifest_exits_1_listing_problems_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _fail_if_started(monkeypatch)
    job = _job()
    job["spec"]["resources"]["memory"] = "8GB"
    job["spec"]["config"]["trainer"]["nnode"] = 2
    workdir = tmp_path / "wd"
    assert cli.main(["run", "-f", str(_write(tmp_path, job)), "--workdir", str(workdir)]) == 1
    err = capsys.readouterr().err
    assert "RLJob/tiny-grpo: invalid, nothing started (2 problem(s)):" in err
    assert "  - spec.resources.memory: '8GB' is not a Kubernetes quantity" in err
    assert "  - spec.config.trainer.nnode: unknown key; did you mean nnodes?" in err
    assert not workdir.exists()


def test_invalid_override_exits_1_before_anything_is_written(tmp_path: Path, capsys, monkeypatch) -> None:
    _fail_if_started(monkeypatch)
    workdir = tmp_path / "wd"
    code = cli.main(
        ["run", "-f", str(TINY_RLJOB), "--workdir", str(workdir), "trainer.total_trainig_steps=2"]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "the overrides make the trainer config invalid, nothing started" in err
    assert "total_trainig_steps" in err and "did you mean" in err
    assert not workdir.exists()


def test_build_local_run_applies_overrides_like_the_trainer() -> None:
    rljob = api.RLJob.model_validate(_job())
    run = localrun.build_local_run(
        rljob, Path("/w"), ["trainer.total_training_steps=2"], python="py", environ={}
    )
    assert run.config.trainer.total_training_steps == 2
    with pytest.raises(ConfigError):
        localrun.build_local_run(
            rljob, Path("/w"), ["actor_rollout_ref.rollout.n=zero"], python="py", environ={}
        )


@pytest.mark.parametrize(
    ("overrides", "gpus", "expected"),
    [
        ([], 0, None),  # the tiny job is on CPU
        (["trainer.device=cuda", "trainer.n_gpus_per_node=2"], 2, None),
        (["trainer.device=cuda", "trainer.n_gpus_per_node=2"], 0, "has no CUDA GPU. To run on CPU, append"),
        (
            ["trainer.device=cuda", "trainer.n_gpus_per_node=2"],
            1,
            "asks for 1 node(s) x 2 GPU(s) = 2 CUDA GPUs",
        ),
    ],
)
def test_device_problem(overrides: list[str], gpus: int, expected: str | None) -> None:
    run = localrun.build_local_run(
        api.RLJob.model_validate(_job()), Path("/w"), overrides, python="py", environ={}
    )
    problem = localrun.device_problem(run.config, gpus)
    assert (problem is None) if expected is None else (problem is not None and expected in problem)


def test_cuda_job_without_gpus_says_so_and_suggests_cpu_overrides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _fail_if_started(monkeypatch)
    monkeypatch.setattr(localrun, "local_gpu_count", lambda: 0)
    assert cli.main(["run", "-f", str(GPU_EXAMPLE), "--workdir", str(tmp_path / "wd")]) == 1
    err = capsys.readouterr().err
    assert "cannot run here: spec.config.trainer.device is cuda" in err
    assert "trainer.device=cpu" in err
    assert not (tmp_path / "wd").exists()
    # A dry run still shows the command, with the same problem as a warning.
    assert cli.main(["run", "-f", str(GPU_EXAMPLE), "--dry-run", "--workdir", str(tmp_path / "wd")]) == 0
    captured = capsys.readouterr()
    assert "warning: spec.config.trainer.device is cuda" in captured.err
    assert shlex.split(captured.out.splitlines()[-1])[1:3] == ["-m", "hybridflow.trainer.main_ppo"]


def test_rljob_help_lists_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "  run " in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "--help"])
    assert exit_info.value.code == 0
    assert "rljob run" in capsys.readouterr().out


def test_run_passes_command_and_env_to_the_child_and_returns_its_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def fake_child(argv: list[str], env: dict[str, str]) -> int:
        seen.update(argv=argv, env=env)
        return 3

    monkeypatch.setattr(localrun, "run_child", fake_child)
    monkeypatch.setenv("SOME_USER_VAR", "kept")
    assert cli.main(["run", "-f", str(TINY_RLJOB), "--workdir", str(tmp_path / "wd"), "trainer.seed=3"]) == 3
    assert seen["argv"][-1] == "trainer.seed=3" and seen["argv"][0] == sys.executable
    assert seen["env"]["RLJOB_NAME"] == "tiny-grpo" and seen["env"]["SOME_USER_VAR"] == "kept"
    assert (tmp_path / "wd" / "config.yaml").exists()
    assert "rljob run: tiny-grpo: config" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("kind: Secret\nmetadata: {name: s}\n", "no RLJob found"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_file_problems_exit_1(tmp_path: Path, capsys, monkeypatch, content: str, message: str) -> None:
    _fail_if_started(monkeypatch)
    path = tmp_path / "job.yaml"
    path.write_text(content)
    assert cli.main(["run", "-f", str(path)]) == 1
    assert message in capsys.readouterr().err


def test_two_rljobs_in_one_file_are_refused(tmp_path: Path, capsys, monkeypatch) -> None:
    _fail_if_started(monkeypatch)
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump_all([_job(), _job(CPU_EXAMPLE)]))
    assert cli.main(["run", "-f", str(path)]) == 1
    assert "2 RLJobs found (tiny-grpo, tiny-cpu-grpo)" in capsys.readouterr().err


def test_example_has_the_same_trainer_config_as_tiny_grpo_yaml() -> None:
    """examples/tiny_grpo_rljob.yaml is `make run`'s job: its config is tiny_grpo.yaml's, bar what the operator sets."""
    config = yaml.safe_load(TINY_CONFIG.read_text())
    assert config["trainer"].pop("resume_mode") == "disable"  # the operator always resumes (auto)
    config["trainer"].pop("default_local_dir")  # spec.checkpoint.uri sets it
    assert _job()["spec"]["config"] == config
    # kubectl reads YAML 1.1, where a bare key n/y/no/yes/on/off is a boolean: such keys must be quoted.
    assert not re.search(r"^\s*(n|y|no|yes|on|off):", TINY_RLJOB.read_text(), re.MULTILINE | re.IGNORECASE)


def test_example_passes_rljob_validate(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", "-f", str(TINY_RLJOB)]) == 0
    assert "(RLJob/tiny-grpo): valid" in capsys.readouterr().out
