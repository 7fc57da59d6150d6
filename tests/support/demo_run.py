"""Train on the demo's toy task in-process and read back its metrics: the learning tests' set-up.

Runs `hybridflow.trainer.main_ppo.main` with an example config and the model, data and checkpoint
folder `hybridflow.demo.prepare` writes, inside a Ray session the caller starts (`local_ray`), and
returns the JSONL rows the file logger wrote (what the operator and users read too).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hybridflow.demo import EXAMPLE, prepare
from hybridflow.trainer import main_ppo


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The JSONL rows, one per logged step (step 0 = validation before training)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_demo(tmp_path: Path, *overrides: str, example: Path = EXAMPLE) -> list[dict[str, Any]]:
    """Train `example` on the demo's data under `tmp_path` (no checkpoints) plus `overrides`; return the rows."""
    base = prepare(tmp_path)
    args = [str(example), *(f"{k}={v}" for k, v in base.items()), "trainer.save_freq=-1", *overrides]
    assert main_ppo.main(args) == 0
    return read_metrics(Path(base["trainer.default_local_dir"]) / "metrics.jsonl")


def mean(values: list[float]) -> float:
    """The arithmetic mean of a non-empty list."""
    return sum(values) / len(values)


#: A custom reward function (verl's signature) that appends "<driver pid> <prompt index>" to $SAMPLE_LOG for every
#: training sample it scores, so resume tests can check which prompts a run trained, in which order.
RECORDING_REWARD = """
import os
from hybridflow.rewards import default_compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if extra_info.get("split", "train") == "train":  # validation prompts are scored too
        with open(os.environ["SAMPLE_LOG"], "a") as log:
            log.write(f"{os.getpid()} {extra_info['index']}\\n")
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
"""
