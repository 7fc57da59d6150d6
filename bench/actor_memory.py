"""Peak host memory of one actor micro-batch (update and log-prob pass), per row, on CPU.

    python -m bench.actor_memory [--model tiny|smollm2] [--rows 8 32 128] [--prompt-length 60]
                                 [--response-length 16] [--phase update|log_prob|both]

Each (phase, rows) point runs in a fresh child process, and the peak resident set size (VmHWM,
reset just before the micro-batch) belongs to that point alone. The child builds the actor (fp32 `FSDPEngine` + AdamW, one process, no
Ray), runs one warm-up micro-batch of 1 row (which allocates the optimizer state), reads its RSS as
the baseline, then runs one micro-batch of `rows` rows (prompt + response tokens, every position
real) and reports the peak minus the baseline. The slope between points is the memory one more row
costs; the rest (gradients, allocator slack) does not grow with rows. Prints a table and, last, JSON.
Memory figures do not depend on the load of the box; run it with nothing else big beside it.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def current_rss() -> int:
    """Resident set size of this process in bytes (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize()


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith(field + ":"))
    return int(line.split()[1])


def reset_peak_rss() -> None:
    """Start the peak-RSS record afresh (Linux >= 4.0: "5" to clear_refs resets VmHWM)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss() -> int:
    """Peak resident set size since the last `reset_peak_rss`, in bytes."""
    return _status_kib("VmHWM") * 1024


def build_batch(rows: int, prompt_length: int, response_length: int, vocab: int, seed: int = 0) -> Any:
    """A full micro-batch: random prompt and response ids, no padding, random advantages."""
    import torch

    from hybridflow.protocol import DataProto

    gen = torch.Generator().manual_seed(seed)
    seq = prompt_length + response_length
    ids = torch.randint(0, vocab, (rows, seq), generator=gen)
    return DataProto.from_dict(tensors={
        "input_ids": ids,
        "attention_mask": torch.ones(rows, seq, dtype=torch.long),
        "position_ids": torch.arange(seq).expand(rows, seq).clone(),
        "responses": ids[:, prompt_length:].clone(),
        "response_mask": torch.ones(rows, response_length, dtype=torch.long),
        "advantages": torch.randn(rows, response_length, generator=gen),
    })


def model_dir(name: str, work: Path) -> Path:
    """The model folder: a tiny random Qwen2 (built under `work`) or SmolLM2-135M (outputs/bench/)."""
    if name == "tiny":
        from hybridflow.models.tiny import build_tiny_model

        return build_tiny_model(work / "tiny", seed=0)
    from bench.rollout import smollm2_dir

    return smollm2_dir(ROOT / "outputs" / "bench" / "smollm2-135m")


def measure_point(
    path: str, phase: str, rows: int, prompt_length: int, response_length: int, checkpointing: bool = False,
) -> dict[str, float]:
    """In this process: baseline RSS after a 1-row warm-up, then the peak over one `rows`-row micro-batch."""
    import torch

    from hybridflow.engines.actor import PPOActor
    from hybridflow.engines.fsdp_engine import FSDPEngine

    torch.set_num_threads(1)  # memory does not depend on threads; the box is shared
    model_config = {"enable_gradient_checkpointing": checkpointing}
    engine = FSDPEngine(path, model_config=model_config, optim_config={"lr": 1e-6}, total_steps=10)
    actor = PPOActor(engine, config={"loss_agg_mode": "token-mean"})
    vocab = int(engine.hf_config.vocab_size)
    run = actor.update_policy if phase == "update" else actor.compute_log_prob

    def once(data: Any) -> None:
        if phase == "update":
            run(data, mini_batch_size=len(data), micro_batch_size=len(data))
        else:
            run(data, micro_batch_size=len(data))

    once(build_batch(1, prompt_length, response_length, vocab, seed=1))
    batch = build_batch(rows, prompt_length, response_length, vocab)
    base = current_rss()
    reset_peak_rss()  # model loading peaked higher than a small micro-batch does
    once(batch)
    return {"baseline_mib": base / MIB, "peak_over_baseline_mib": (peak_rss() - base) / MIB}


def run_point(args: argparse.Namespace, path: Path, phase: str, rows: int) -> dict[str, float]:
    """`measure_point` in a fresh interpreter (its own peak RSS); returns its JSON line."""
    cmd = [sys.executable, "-m", "bench.actor_memory", "--child", str(path), phase, str(rows),
           "--prompt-length", str(args.prompt_length), "--response-length", str(args.response_length),
           *(["--gradient-checkpointing"] if args.gradient_checkpointing else [])]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def per_row_slopes(points: list[tuple[int, float]]) -> list[float]:
    """MiB per extra row between consecutive (rows, peak MiB) points."""
    return [(b - a) / (rb - ra) for (ra, a), (rb, b) in zip(points, points[1:], strict=False) if rb != ra]


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every (phase, rows) point in a child process; print the table and the JSON line."""
    parser = argparse.ArgumentParser(prog="python -m bench.actor_memory", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--prompt-length", type=int, default=60)
    parser.add_argument("--response-length", type=int, default=16)
    parser.add_argument("--phase", choices=["update", "log_prob", "both"], default="both")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="actor_rollout_ref.model.enable_gradient_checkpointing=true")
    parser.add_argument("--child", nargs=3, metavar=("PATH", "PHASE", "ROWS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        path, phase, rows = args.child
        point = measure_point(path, phase, int(rows), args.prompt_length, args.response_length,
                              checkpointing=args.gradient_checkpointing)
        print(json.dumps(point))
        return 0
    phases = ["update", "log_prob"] if args.phase == "both" else [args.phase]
    summary: dict[str, Any] = {"model": args.model, "prompt_length": args.prompt_length,
                               "response_length": args.response_length,
                               "gradient_checkpointing": args.gradient_checkpointing}
    with tempfile.TemporaryDirectory(prefix="bench_mem_") as tmp:
        path = model_dir(args.model, Path(tmp))
        print(f"{args.model}: one micro-batch, {args.prompt_length}+{args.response_length} tokens per row, fp32, CPU, "
              f"gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}")
        print(f"{'phase':<10} {'rows':>6} {'peak-base MiB':>14} {'MiB/row (slope)':>16}")
        for phase in phases:
            points = [(rows, run_point(args, path, phase, rows)["peak_over_baseline_mib"]) for rows in args.rows]
            slopes = per_row_slopes(points)
            for i, (rows, mib) in enumerate(points):
                slope = f"{slopes[i - 1]:.2f}" if i else ""
                print(f"{phase:<10} {rows:>6} {mib:>14.1f} {slope:>16}")
            summary[phase] = {"peak_over_baseline_mib": {r: round(m, 1) for r, m in points},
                              "mib_per_row": [round(s, 2) for s in slopes]}
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
