"""hybridflow.config input handling: YAML files, overrides, ${...} references, CLI, import isolation."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from hybridflow.config import ConfigError, apply_overrides, load_config, main, parse_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("override", "key", "value"),
    [
        ("a.b=3", ("a", "b"), 3),
        ("a.b=1e-6", ("a", "b"), 1e-6),
        ("a.b=2.5E3", ("a", "b"), 2500.0),
        ("a.b=true", ("a", "b"), True),
        ("a.b=False", ("a", "b"), False),
        ("a.b=null", ("a", "b"), None),
        ("a.b=~", ("a", "b"), None),
        ("a.b=", ("a", "b"), ""),
        ("a.b=hello world", ("a", "b"), "hello world"),
        ("a.b='007'", ("a", "b"), "007"),
        ("a.b=['console','file']", ("a", "b"), ["console", "file"]),
        ("a.b=[console, wandb]", ("a", "b"), ["console", "wandb"]),
        ("a.b={x: 1, y: [2]}", ("a", "b"), {"x": 1, "y": [2]}),
        ("a.b=s3://bucket/x.parquet", ("a", "b"), "s3://bucket/x.parquet"),
        ("a.b=2025-01-31", ("a", "b"), "2025-01-31"),
        ("a.b=[unclosed", ("a", "b"), "[unclosed"),
        ("+a.new.deep=1", ("a", "new", "deep"), 1),
        ("++a.c=4", ("a", "c"), 4),
    ],
)
def test_override_values_are_read_as_yaml(override: str, key: tuple[str, ...], value: Any) -> None:
    """Values are YAML scalars/lists/maps; numbers with exponents are floats, as in Hydra."""
    out = apply_overrides({"a": {"c": 0}}, [override])
    node: Any = out
    for part in key:
        node = node[part]
    assert node == value
    assert type(node) is type(value)


def test_apply_overrides_returns_a_new_dict() -> None:
    """The input mapping is not modified."""
    original = {"trainer": {"nnodes": 1}}
    out = apply_overrides(original, ["trainer.nnodes=2", "~trainer.nnodes", "data.seed=3"])
    assert original == {"trainer": {"nnodes": 1}}
    assert out == {"trainer": {}, "data": {"seed": 3}}


def test_remove_and_conditional_remove() -> None:
    """~key removes (a missing key is fine); ~key=value only when the value matches."""
    assert apply_overrides({"a": {"b": 1}}, ["~a.b=1"]) == {"a": {}}
    assert apply_overrides({"a": {"b": 1}}, ["~a.zz", "~q.r"]) == {"a": {"b": 1}}
    with pytest.raises(ConfigError, match="differs from 2"):
        apply_overrides({"a": {"b": 1}}, ["~a.b=2"])


def test_bad_overrides_are_all_reported() -> None:
    """Malformed keys, missing '=', '+' on an existing key, paths through scalars: one error, all listed."""
    with pytest.raises(ConfigError) as info:
        apply_overrides({"a": {"b": 1}, "s": "text"}, ["a.b", "+a.b=2", "s.x=1", "a..b=1", "ok.key=1"])
    problems = info.value.problems
    assert len(problems) == 4
    assert problems[0].startswith("'a.b': missing '='")
    assert problems[1].startswith("'+a.b=2': a.b already exists")
    assert problems[2].startswith("'s.x=1': s holds 'text', not a group")
    assert problems[3].startswith("'a..b=1': 'a..b' is not a dotted key")


def test_numbers_and_dates_are_accepted_as_names(tmp_path: Path) -> None:
    """String keys take numbers and dates as text (OmegaConf behaviour), from files and overrides."""
    job = tmp_path / "job.yaml"
    job.write_text("trainer:\n  project_name: 2025\n  experiment_name: 2025-01-31\n")
    cfg = load_config(job, ["data.prompt_key=7"])
    assert (cfg.trainer.project_name, cfg.trainer.experiment_name) == ("2025", "2025-01-31")
    assert cfg.data.prompt_key == "7"
    assert cfg.trainer.default_local_dir == "checkpoints/2025/2025-01-31"


def test_load_yaml_file_with_overrides(tmp_path: Path) -> None:
    """A verl-style YAML file plus overrides (lists, bools, null, new free-form keys) gives a config."""
    job = tmp_path / "job.yaml"
    job.write_text(
        textwrap.dedent(
            """
            data:
              train_files: [file:///data/a.parquet, file:///data/b.parquet]
              train_batch_size: 16
              val_batch_size: 8
            actor_rollout_ref:
              model: {path: /models/tiny}
              actor: {ppo_mini_batch_size: 8}
            trainer:
              n_gpus_per_node: 2
              device: cpu
            """
        )
    )
    cfg = load_config(
        job,
        [
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.n=4",
            "trainer.logger=['console','file']",
            "trainer.val_before_train=false",
            "data.val_batch_size=null",
            "+actor_rollout_ref.model.override_config.rope_theta=10000",
            "+reward_model.reward_kwargs.max_resp_len=64",
        ],
    )
    assert cfg.data.train_files == ["file:///data/a.parquet", "file:///data/b.parquet"]
    assert cfg.trainer.logger == ["console", "file"]
    assert cfg.trainer.val_before_train is False
    assert cfg.data.val_batch_size is None
    assert cfg.actor_rollout_ref.model.override_config == {"rope_theta": 10000}
    assert cfg.reward_model.reward_kwargs == {"max_resp_len": 64}
    cfg.validate_for_run()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("data: [1, 2", "not valid YAML"),
        ("- a\n- b\n", "the top level must be a mapping of groups, not a list"),
        ("apiVersion: rl.hybridflow.dev/v1alpha1\nkind: RLJob\nspec: {config: {}}\n", "Kubernetes manifest"),
    ],
)
def test_bad_files_are_config_errors(tmp_path: Path, content: str, expected: str) -> None:
    """Unreadable, malformed or non-mapping files raise ConfigError naming the file."""
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=expected):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "missing.yaml")


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    """An empty YAML file is the default config."""
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(path) == load_config(None)


def test_default_local_dir_interpolation() -> None:
    """The default checkpoint folder is built from project and experiment names, as in verl."""
    assert load_config().trainer.default_local_dir == "checkpoints/hybridflow/default"
    cfg = load_config(None, ["trainer.project_name=math", "trainer.experiment_name=run1"])
    assert cfg.trainer.default_local_dir == "checkpoints/math/run1"
    assert parse_config(cfg.to_dict()).trainer.default_local_dir == "checkpoints/math/run1"


@pytest.mark.parametrize(
    ("trainer", "expected"),
    [
        (
            {"default_local_dir": "s3://b/${trainer.project_name}/${trainer.experiment_name}"},
            "s3://b/hybridflow/default",
        ),
        (
            {"project_name": "p", "default_local_dir": "/ck/${project_name}/${experiment_name}"},
            "/ck/p/default",
        ),
        ({"project_name": "p", "default_local_dir": "/ck/${.project_name}"}, "/ck/p"),
        ({"default_local_dir": "/ck/${..data.seed}"}, "/ck/1"),
        ({"default_local_dir": "/ck/${oc.select:trainer.nothing,fallback}"}, "/ck/fallback"),
    ],
)
def test_reference_forms(trainer: dict[str, Any], expected: str) -> None:
    """Absolute, bare sibling, relative and oc.select references resolve."""
    assert parse_config({"trainer": trainer}).trainer.default_local_dir == expected


def test_typed_references_take_the_referenced_value() -> None:
    """A value that is exactly one reference keeps the referenced type (ints stay ints)."""
    cfg = parse_config(
        {
            "data": {"train_batch_size": 64},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": "${data.train_batch_size}"}},
            "critic": {"ppo_mini_batch_size": "${actor_rollout_ref.actor.ppo_mini_batch_size}"},
        }
    )
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 64
    assert cfg.critic.ppo_mini_batch_size == 64


@pytest.mark.parametrize(
    ("mapping", "expected"),
    [
        (
            {"trainer": {"default_local_dir": "/c/${trainer.nope}"}},
            "trainer.default_local_dir: ${trainer.nope} refers",
        ),
        (
            {
                "trainer": {
                    "project_name": "${trainer.experiment_name}",
                    "experiment_name": "${trainer.project_name}",
                }
            },
            "references form a cycle",
        ),
        ({"trainer": {"project_name": "${oc.env:HOME}"}}, "resolver 'oc.env' is not supported"),
        ({"data": {"train_batch_size": "${data.nope}"}}, "data.train_batch_size: ${data.nope} refers"),
    ],
)
def test_reference_problems(mapping: dict[str, Any], expected: str) -> None:
    """Missing targets, cycles and unsupported resolvers are reported once, with the key path."""
    with pytest.raises(ConfigError) as info:
        parse_config(mapping)
    assert any(expected in p for p in info.value.problems), info.value.problems
    if "train_batch_size" in expected:
        assert len(info.value.problems) == 1  # not also a type error for the unresolved string


def test_cli_main_prints_yaml_and_exit_codes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """main() prints the resolved config (0), lists problems on stderr (2), checks runnability on request."""
    assert main(["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["algorithm"]["adv_estimator"] == "grpo"
    assert parse_config(printed).actor_rollout_ref.rollout.n == 2

    job = tmp_path / "job.yaml"
    job.write_text("trainer: {nnodes: 2}\n")
    assert main([str(job), "trainer.n_gpus_per_node=1"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["trainer"]["nnodes"] == 2

    assert main(["trainer.nnodes=0", "algorithm.gama=1"]) == 2
    err = capsys.readouterr().err
    assert "trainer.nnodes:" in err and "algorithm.gama: unknown key; did you mean gamma?" in err

    assert main(["--for-run"]) == 2
    assert "actor_rollout_ref.model.path: required to run" in capsys.readouterr().err
    assert main(["--bogus"]) == 2
    assert main(["--help"]) == 0
    assert "usage:" in capsys.readouterr().out


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run Python in a fresh interpreter with the repo's packages importable."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "trainer_image")}
    return subprocess.run(
        [sys.executable, *(("-c", code) if code else ()), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_python_m_entry_point() -> None:
    """`python -m hybridflow.config` works as a command with verl-like exit codes."""
    ok = _run("", "-m", "hybridflow.config", "trainer.n_gpus_per_node=2")
    assert ok.returncode == 0, ok.stderr
    assert yaml.safe_load(ok.stdout)["trainer"]["n_gpus_per_node"] == 2
    bad = _run("", "-m", "hybridflow.config", "trainer.devise=cpu")
    assert bad.returncode == 2
    assert "trainer.devise: unknown key; did you mean device?" in bad.stderr


def test_imports_without_torch_or_ray() -> None:
    """The config module imports and validates with torch and Ray made unimportable."""
    code = textwrap.dedent(
        """
        import sys
        for name in ("torch", "ray", "transformers", "vllm", "numpy"):
            sys.modules[name] = None
        from hybridflow.config import load_config
        cfg = load_config(None, ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2"])
        assert cfg.critic_enabled is False
        print("ok")
        """
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# Overrides as they appear in verl's GRPO and PPO example scripts (shell quoting already removed).
VERL_GRPO_SCRIPT = """
algorithm.adv_estimator=grpo data.train_files=/data/gsm8k/train.parquet data.val_files=/data/gsm8k/test.parquet
data.train_batch_size=1024 data.max_prompt_length=512 data.max_response_length=1024
data.filter_overlong_prompts=True data.truncation=error actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct
actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.model.use_remove_padding=True
actor_rollout_ref.actor.ppo_mini_batch_size=256 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40
actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0
actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40
actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40 actor_rollout_ref.ref.fsdp_config.param_offload=True
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger=["console","wandb"]
trainer.project_name=verl_grpo_example_gsm8k trainer.experiment_name=qwen2_7b_function_rm
trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15
"""
VERL_PPO_SCRIPT = """
data.train_files=/data/gsm8k/train.parquet data.val_files=/data/gsm8k/test.parquet data.train_batch_size=256
data.max_prompt_length=512 data.max_response_length=256 actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct
actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size=64
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.4
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 critic.optim.lr=1e-5
critic.model.path=Qwen/Qwen2.5-0.5B-Instruct critic.ppo_micro_batch_size_per_gpu=4 algorithm.kl_ctrl.kl_coef=0.001
trainer.logger=console trainer.val_before_train=False trainer.default_hdfs_dir=null trainer.n_gpus_per_node=1
trainer.nnodes=1 trainer.save_freq=10 trainer.test_freq=10 trainer.total_epochs=15 ray_init.num_cpus=8
"""


@pytest.mark.parametrize("script", [VERL_GRPO_SCRIPT, VERL_PPO_SCRIPT], ids=["grpo", "ppo"])
def test_verl_example_overrides_work_unchanged(script: str) -> None:
    """A verl user's command-line overrides parse as they are and give a runnable config."""
    cfg = load_config(None, script.split())
    cfg.validate_for_run()
    assert cfg.actor_rollout_ref.model.path is not None
    assert cfg.critic_enabled is (cfg.algorithm.adv_estimator == "gae")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"trainer: {nnodes: 1}\ntrainer: {nnodes: 2}\n", "line 2, column 1: duplicate key 'trainer' (first at line 1)"),
        (b"trainer: {project_name: caf\xe9}\n", "not UTF-8 text (byte 0xe9"),
        (b"trainer: {nnodes: !!float abc}\n", "'abc' cannot be read as float"),
        (b"a: " + b"[" * 500 + b"]" * 500, "nested deeper than 100 levels"),
    ],
)
def test_config_files_go_through_the_safe_loader(tmp_path: Path, content: bytes, expected: str) -> None:
    """Issue 12: these were tracebacks or silently accepted; now one ConfigError problem each."""
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert len(info.value.problems) == 1 and expected in info.value.problems[0]


def test_override_values_that_are_not_yaml_stay_text() -> None:
    assert apply_overrides({}, ["trainer.project_name=[" + "[" * 500])["trainer"]["project_name"].startswith("[[")
    assert apply_overrides({}, ["trainer.project_name=!!float abc"])["trainer"]["project_name"] == "!!float abc"
    assert apply_overrides({}, ["trainer.project_name=2024-01-01"])["trainer"]["project_name"] == "2024-01-01"


def test_main_reports_an_unexpected_error_as_a_bug(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import hybridflow.config as config_module

    def broken(*_: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(config_module, "load_config", broken)
    assert main(["trainer.nnodes=1"]) == 4
    err = capsys.readouterr().err
    assert "internal error while checking the overrides: RecursionError" in err and "This is a bug" in err
    assert "Traceback" not in err
