"""`python -m hybridflow.trainer.main_ppo`: argument parsing and start-up errors (no Ray needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.demo import EXAMPLE, prepare
from hybridflow.trainer import main_ppo


def test_parse_argv_splits_file_and_overrides() -> None:
    assert main_ppo.parse_argv(["job.yaml", "a.b=1", "+c=2"]) == ("job.yaml", ["a.b=1", "+c=2"])
    assert main_ppo.parse_argv(["a.b=1"]) == (None, ["a.b=1"])
    assert main_ppo.parse_argv([]) == (None, [])


def test_invalid_config_lists_every_problem_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main_ppo.main(
        [str(EXAMPLE), "actor_rollout_ref.actor.ppo_mini_bach_size=4", "trainer.total_epochs=0"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "ppo_mini_bach_size" in err and "did you mean" in err
    assert "total_epochs" in err


def test_missing_config_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main_ppo.main([str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_unknown_data_source_fails_before_ray_starts(tmp_path: Path) -> None:
    """A data_source without a scorer stops the run at start-up, before any worker exists."""
    overrides = prepare(tmp_path)
    from hybridflow.data.toy import write_parquet

    rows = [
        {
            "data_source": "my/unscored_set",
            "prompt": [{"role": "user", "content": "copy a"}],
            "ability": "toy",
            "reward_model": {"style": "rule", "ground_truth": "a"},
            "extra_info": {"index": i},
        }
        for i in range(128)
    ]
    write_parquet(rows, str(tmp_path / "bad.parquet"))
    args = [f"{k}={v}" for k, v in overrides.items()] + [f"data.train_files={tmp_path / 'bad.parquet'}"]
    proc = subprocess.run(
        [sys.executable, "-m", "hybridflow.trainer.main_ppo", str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "RAY_ADDRESS": "127.0.0.1:1"},  # any Ray use would fail loudly
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "my/unscored_set" in proc.stderr
    assert "custom_reward_function" in proc.stderr
