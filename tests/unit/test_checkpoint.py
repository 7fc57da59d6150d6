"""Checkpoint folders: commit protocol, corruption fallback, retention, trainer state, resume decisions."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from hybridflow import checkpoint as ck


def _write_step(root: str, step: int, payload: bytes = b"weights", commit: bool = True) -> str:
    path = Path(ck.step_dir(root, step).removeprefix("file://"))
    (path / "actor").mkdir(parents=True, exist_ok=True)
    (path / "actor" / "model.pt").write_bytes(payload * 10)
    ck.save_trainer_state(
        ck.step_dir(root, step), ck.TrainerState(global_step=step, dataloader={"pos": step})
    )
    if commit:
        ck.commit_step(root, step)
    return str(path)


@pytest.fixture(params=["plain", "file-uri"])
def root(tmp_path: Path, request: pytest.FixtureRequest) -> str:
    base = str(tmp_path / "ckpt")
    return base if request.param == "plain" else f"file://{base}"


def test_commit_writes_manifest_marker_and_latest(root: str) -> None:
    path = Path(_write_step(root, 3))
    manifest = json.loads((path / ck.MANIFEST_FILE).read_text())
    assert set(manifest["files"]) == {"actor/model.pt", ck.TRAINER_STATE_FILE}
    assert manifest["files"]["actor/model.pt"]["size"] == 70
    assert (path / ck.COMMIT_FILE).exists()
    assert (path.parent / ck.LATEST_FILE).read_text() == "3"
    assert ck.verify_step(ck.step_dir(root, 3)) is None


def test_uncommitted_step_is_ignored(root: str) -> None:
    _write_step(root, 1)
    _write_step(root, 2, commit=False)
    assert ck.list_steps(root) == [1, 2]
    assert ck.find_latest_committed(root) == 1
    assert "no commit marker" in ck.verify_step(ck.step_dir(root, 2))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: (p / "actor" / "model.pt").write_bytes(b"short"), "size mismatch"),
        (lambda p: (p / "actor" / "model.pt").write_bytes(b"WEIGHTS" * 10), "checksum mismatch"),
        (lambda p: (p / "actor" / "model.pt").unlink(), "missing file"),
        (lambda p: (p / ck.MANIFEST_FILE).write_text("{}"), "does not match its commit marker"),
        (lambda p: (p / ck.MANIFEST_FILE).unlink(), "without a manifest"),
    ],
)
def test_corrupt_latest_falls_back_to_previous(root: str, damage, reason: str) -> None:
    _write_step(root, 1)
    latest = Path(_write_step(root, 2))
    damage(latest)
    messages: list[str] = []
    assert ck.find_latest_committed(root, log=messages.append) == 1
    assert reason in messages[0]


def test_no_steps_means_none(tmp_path: Path) -> None:
    assert ck.find_latest_committed(str(tmp_path / "missing")) is None


def test_retention_keeps_newest_committed_and_spares_newer_uncommitted(root: str) -> None:
    for step in (1, 2, 3):
        _write_step(root, step)
    _write_step(root, 4, commit=False)  # a save in progress
    assert ck.apply_retention(root, keep=2) == [1]
    assert ck.list_steps(root) == [2, 3, 4]
    assert ck.apply_retention(root, keep=None) == []


def test_retention_removes_crashed_older_saves(root: str) -> None:
    _write_step(root, 1)
    _write_step(root, 2, commit=False)  # crashed save
    _write_step(root, 3)
    assert ck.apply_retention(root, keep=5) == [2]
    assert ck.list_steps(root) == [1, 3]


def test_retention_without_commits_deletes_nothing(root: str) -> None:
    _write_step(root, 1, commit=False)
    assert ck.apply_retention(root, keep=1) == []
    assert ck.list_steps(root) == [1]


def test_trainer_state_round_trip_with_rng(root: str) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = ck.TrainerState(
        global_step=7, dataloader={"epoch": 1, "pos": 4}, rng=ck.capture_rng_state(), wandb_run_id="abc"
    )
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    ck.save_trainer_state(ck.step_dir(root, 7), state)
    loaded = ck.load_trainer_state(ck.step_dir(root, 7))
    assert (loaded.global_step, loaded.dataloader, loaded.wandb_run_id) == (7, {"epoch": 1, "pos": 4}, "abc")
    random.random(), np.random.rand(), torch.rand(1)  # advance the generators
    ck.restore_rng_state(loaded.rng)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_load_trainer_state_missing_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ck.CheckpointError, match="resume_from_path"):
        ck.load_trainer_state(str(tmp_path / "global_step_1"))


@pytest.mark.parametrize(
    ("mode", "path", "latest", "expected"),
    [
        ("disable", None, 5, None),
        ("auto", None, None, None),
        ("auto", None, 5, "/r/global_step_5"),
        ("resume_path", "/other/global_step_2/", 5, "/other/global_step_2"),
    ],
)
def test_resolve_resume_path(mode: str, path: str | None, latest: int | None, expected: str | None) -> None:
    assert ck.resolve_resume_path(mode, path, "/r", latest) == expected


@pytest.mark.parametrize(
    ("mode", "path", "match"),
    [
        ("resume_path", None, "needs trainer.resume_from_path"),
        ("resume_path", "/x/step3", "global_step_N"),
        ("sometimes", None, "unknown"),
    ],
)
def test_resolve_resume_path_errors(mode: str, path: str | None, match: str) -> None:
    with pytest.raises(ck.CheckpointError, match=match):
        ck.resolve_resume_path(mode, path, "/r", 1)


def test_check_resumable_names_the_problem(root: str) -> None:
    _write_step(root, 1, commit=False)
    with pytest.raises(ck.CheckpointError, match="no commit marker"):
        ck.check_resumable(ck.step_dir(root, 1))


def test_s3_like_memory_filesystem() -> None:
    root = "memory://bucket/run"
    fs = __import__("fsspec").filesystem("memory")
    fs.pipe("/bucket/run/global_step_1/actor/model.pt", b"x" * 100)
    ck.save_trainer_state(ck.step_dir(root, 1), ck.TrainerState(global_step=1))
    ck.commit_step(root, 1)
    fs.pipe("/bucket/run/global_step_2/actor/model.pt", b"y" * 100)  # never committed
    assert ck.find_latest_committed(root) == 1
    assert ck.load_trainer_state(ck.step_dir(root, 1)).global_step == 1
    fs.rm("/bucket", recursive=True)
