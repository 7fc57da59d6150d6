"""Tests for the `make run` summary (hybridflow/demo.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridflow import demo
from hybridflow.tracking import resolve_file_logger_path


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "critic/sc')  # torn last line


def test_summary_reads_where_the_file_logger_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 12: with HYBRIDFLOW_FILE_LOGGER_PATH set, the summary read <checkpoints>/metrics.jsonl and crashed."""
    elsewhere = tmp_path / "logs" / "run.jsonl"
    monkeypatch.setenv("HYBRIDFLOW_FILE_LOGGER_PATH", str(elsewhere))
    _write(elsewhere, [{"step": 1, "critic/score/mean": 0.1}, {"step": 2, "critic/score/mean": 0.9}])
    path = resolve_file_logger_path(str(tmp_path / "checkpoints"))
    assert path == str(elsewhere)
    assert demo.summarize(path) == "mean reward 0.10 at step 1 -> 0.90 at step 2"


def test_summary_of_a_missing_file_is_a_note_not_a_crash(tmp_path: Path) -> None:
    assert demo.summarize(str(tmp_path / "none.jsonl")).startswith("no metrics to summarize at ")
    _write(tmp_path / "empty.jsonl", [{"step": 1}])
    assert demo.summarize(str(tmp_path / "empty.jsonl")) == "no training steps were logged"
