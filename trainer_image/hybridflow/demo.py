"""`make run`: GRPO on a tiny random-init model and a toy task, locally on CPU, through the real stack.

    python -m hybridflow.demo [--out outputs/demo] [key=value ...]

Builds (no downloads) the toy tokenizer + a tiny Qwen2-style model (hidden 64, 2 layers) and a
"copy one letter" task under `--out`, then runs `hybridflow.trainer.main_ppo` with
`examples/tiny_grpo.yaml`: Ray, two FSDP2 worker processes, the HF rollout. Extra `key=value`
arguments override the YAML. The mean reward climbs from ~0.02 (a random model guesses one of ~100
characters) to > 0.8 within a few minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_grpo.yaml"
LETTERS = "abcde"


def build_copy_letter_rows(n: int, split: str, seed: int = 0) -> list[dict]:
    """Verl-format rows of the demo task: "copy x" -> "x" for one letter of `LETTERS`.

    A variant of `hybridflow.data.toy`'s copy task (which copies 1-3 letters): one-letter answers
    make a one-token response, which a random-init model learns with RL in a few dozen steps.
    Scored by the built-in `toy/copy` scorer.
    """
    import random

    from hybridflow.rewards.toy import COPY

    rng = random.Random(f"demo/{split}/{seed}")
    rows = []
    for index in range(n):
        letter = rng.choice(LETTERS)
        rows.append(
            {
                "data_source": COPY,
                "prompt": [{"role": "user", "content": f"copy {letter}"}],
                "ability": "toy",
                "reward_model": {"style": "rule", "ground_truth": letter},
                "extra_info": {"index": index, "split": split},
            }
        )
    return rows


def prepare(out: Path) -> dict[str, str]:
    """Write model, tokenizer and data under `out` (model reused when present); return the overrides."""
    from hybridflow.data.toy import write_parquet
    from hybridflow.models.tiny import build_tiny_model

    model_dir = out / "model"
    if not (model_dir / "config.json").exists():
        build_tiny_model(model_dir)
    data_dir = out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    write_parquet(build_copy_letter_rows(1024, "train"), str(data_dir / "train.parquet"))
    write_parquet(build_copy_letter_rows(64, "test"), str(data_dir / "test.parquet"))
    ckpt_dir = out / "checkpoints"
    shutil.rmtree(ckpt_dir, ignore_errors=True)  # the demo always starts fresh
    return {
        "actor_rollout_ref.model.path": str(model_dir),
        "data.train_files": str(data_dir / "train.parquet"),
        "data.val_files": str(data_dir / "test.parquet"),
        "trainer.default_local_dir": str(ckpt_dir),
    }


def summarize(metrics_path: str) -> str:
    """First and last training reward from the JSONL metrics, for the closing message.

    `metrics_path` is where the file logger wrote (`tracking.resolve_file_logger_path`: the checkpoint
    folder, or $HYBRIDFLOW_FILE_LOGGER_PATH, possibly remote); a missing or unreadable file is said, not raised.
    """
    try:
        from hybridflow.storage import read_bytes

        text = read_bytes(metrics_path).decode("utf-8", "replace")
    except Exception as err:  # noqa: BLE001 - the run succeeded; the summary is a courtesy
        return f"no metrics to summarize at {metrics_path} ({type(err).__name__}: {err})"
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn last line of an interrupted run
        if isinstance(row, dict):
            rows.append(row)
    rewards = [(r.get("step"), r["critic/score/mean"]) for r in rows if isinstance(r.get("critic/score/mean"), (int, float))]
    if not rewards:
        return "no training steps were logged"
    (first_step, first), (last_step, last) = rewards[0], rewards[-1]
    return f"mean reward {first:.2f} at step {first_step} -> {last:.2f} at step {last_step}"


def main(argv: Sequence[str] | None = None) -> int:
    """Prepare the inputs, train, and say where the checkpoints and metrics are."""
    parser = argparse.ArgumentParser(prog="python -m hybridflow.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/demo", help="folder for model, data, checkpoints")
    parser.add_argument("overrides", nargs="*", help="extra key=value config overrides")
    args = parser.parse_args(argv)
    if not EXAMPLE.exists():
        print(
            f"error: {EXAMPLE} not found; run the demo from a source checkout of the repository",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out).resolve()
    print(
        f"demo: building the toy tokenizer, a tiny model and the copy-a-letter task under {out}", flush=True
    )
    overrides = prepare(out)
    from hybridflow.trainer import main_ppo

    code = main_ppo.main([str(EXAMPLE), *(f"{k}={v}" for k, v in overrides.items()), *args.overrides])
    if code != 0:
        return code
    ckpt_dir = Path(overrides["trainer.default_local_dir"])
    from hybridflow.tracking import resolve_file_logger_path

    metrics = resolve_file_logger_path(str(ckpt_dir))  # honours $HYBRIDFLOW_FILE_LOGGER_PATH, as the trainer does
    print(f"demo: {summarize(metrics)}")
    print(
        f"demo: checkpoints in {ckpt_dir} (latest step in {ckpt_dir / 'latest_checkpointed_iteration.txt'})"
    )
    print(f"demo: per-step metrics (JSONL, verl metric names) in {metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
