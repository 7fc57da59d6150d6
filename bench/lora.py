"""LoRA vs full fine-tuning: trainable parameters, seconds per actor step and peak memory, on CPU.

    python -m bench.lora [--model smollm2|tiny] [--rows 16] [--prompt-length 60] [--response-length 16]
                         [--steps 6] [--rank 32] [--alpha 32] [--threads 2] [--gradient-checkpointing]

One actor step as the trainer's actor worker runs it with a KL loss: the reference policy's log-probs of
the batch, then one PPO update (forward, backward, AdamW step) over `--rows` rows of prompt + response
tokens (every position real, random ids and advantages). Full fine-tuning keeps a second, frozen copy of
the model for the reference (what the trainer builds); LoRA (`--rank`, `--alpha`, target_modules all-linear)
computes it with the adapter disabled on its own engine. Each mode runs in a fresh child process (fp32
`FSDPEngine`, one process, no Ray), so its peak resident set size is its own: `peak MiB` is the VmHWM over
the steps (model load excluded), which holds weights, gradients, optimizer state and activations. Seconds
per step: a third child runs both modes with their steps interleaved (load on the box slows both alike), the
median after the first (warm-up) step. Prints a table and, last, JSON with `lora_over_full`
ratios (< 1: LoRA needs less). Memory does not depend on the load of the box; step times do, a lot (vLLM
and other benches sharing the cores): run it on a quiet box and report the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.actor_memory import MIB, build_batch, current_rss, model_dir, peak_rss, reset_peak_rss

ROOT = Path(__file__).resolve().parents[1]
MODES = ("full", "lora")


def build_step(path: str, mode: str, args: argparse.Namespace) -> tuple[Any, dict[str, int]]:
    """The actor (+ reference for full) of `mode`, and a function running one step of it; parameter counts."""
    from hybridflow.engines.actor import PPOActor
    from hybridflow.engines.fsdp_engine import FSDPEngine
    from hybridflow.engines.lora import trainable_parameter_count
    from hybridflow.protocol import DataProto

    model_config: dict[str, Any] = {"enable_gradient_checkpointing": args.gradient_checkpointing}
    if mode == "lora":
        model_config.update(lora_rank=args.rank, lora_alpha=args.alpha, target_modules="all-linear")
    engine = FSDPEngine(path, model_config=model_config, optim_config={"lr": 1e-5}, total_steps=4 * args.steps)
    ref_engine = engine if mode == "lora" else FSDPEngine(path)  # full: the frozen copy the trainer keeps
    actor_cfg = {"loss_agg_mode": "token-mean", "use_kl_loss": True, "kl_loss_coef": 0.001}
    actor, ref = PPOActor(engine, config=actor_cfg), PPOActor(ref_engine, config=actor_cfg)
    trainable, total = trainable_parameter_count(engine.module)
    batch = build_batch(args.rows, args.prompt_length, args.response_length, int(engine.hf_config.vocab_size))
    batch.meta_info["temperature"] = 1.0

    def step() -> float:
        started = time.perf_counter()
        with ref_engine.adapter_disabled():
            ref_lp, _ = ref.compute_log_prob(batch, micro_batch_size=args.rows)
        data = batch.union(DataProto.from_dict(tensors={"ref_log_prob": ref_lp}))
        actor.update_policy(data, mini_batch_size=args.rows, micro_batch_size=args.rows)
        return time.perf_counter() - started

    return step, {"trainable_params": trainable, "total_params": total}


def measure_memory(path: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """In this process: one mode's parameter counts and its peak RSS over `--steps` steps (model load excluded)."""
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    step, counts = build_step(path, mode, args)
    loaded = current_rss()
    reset_peak_rss()  # loading peaks above steady state; the steps are what is compared
    for _ in range(args.steps):
        step()
    # loaded_mib: RSS before the first step (weights read lazily from the file may not all be resident yet)
    return {**counts, "peak_mib": peak_rss() / MIB, "loaded_mib": loaded / MIB}


def measure_time(path: str, args: argparse.Namespace) -> dict[str, float]:
    """In this process: both modes, their steps interleaved (the box's load changes both alike); median seconds
    per step of each after one warm-up step."""
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    steps = {mode: build_step(path, mode, args)[0] for mode in MODES}
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.steps + 1):
        for mode in MODES:
            seconds[mode].append(steps[mode]())
    return {mode: statistics.median(values[1:]) for mode, values in seconds.items()}


def _child(args: argparse.Namespace, path: Path, what: str) -> dict[str, Any]:
    """A measurement in a fresh interpreter (its own peak RSS); returns its JSON line."""
    cmd = [sys.executable, "-m", "bench.lora", "--child", str(path), what, "--rows", str(args.rows),
           "--prompt-length", str(args.prompt_length), "--response-length", str(args.response_length),
           "--steps", str(args.steps), "--rank", str(args.rank), "--alpha", str(args.alpha),
           "--threads", str(args.threads), *(["--gradient-checkpointing"] if args.gradient_checkpointing else [])]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    """Measure both modes in child processes; print the table and the JSON line."""
    parser = argparse.ArgumentParser(prog="python -m bench.lora", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="smollm2")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt-length", type=int, default=60)
    parser.add_argument("--response-length", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--alpha", type=float, default=32)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="actor_rollout_ref.model.enable_gradient_checkpointing=true (both modes)")
    parser.add_argument("--child", nargs=2, metavar=("PATH", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        path, what = args.child
        print(json.dumps(measure_time(path, args) if what == "time" else measure_memory(path, what, args)))
        return 0
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_lora_") as tmp:
        path = model_dir(args.model, Path(tmp))
        results = {mode: _child(args, path, mode) for mode in MODES}
        for mode, seconds in _child(args, path, "time").items():
            results[mode]["seconds_per_step"] = seconds
        load = max(load, os.getloadavg()[0])
    print(f"{args.model}: one actor step (reference log-probs + PPO update with KL loss) on {args.rows} rows x "
          f"{args.prompt_length}+{args.response_length} tokens, fp32, CPU, {args.threads} threads, "
          f"LoRA rank {args.rank} alpha {args.alpha:g} all-linear, gradient checkpointing "
          f"{'on' if args.gradient_checkpointing else 'off'}; load average up to {load:.1f}")
    print(f"{'mode':<6} {'trainable':>12} {'of total':>12} {'share':>7} {'s/step':>8} {'peak MiB':>9}")
    for mode, r in results.items():
        share = 100.0 * r["trainable_params"] / r["total_params"]
        print(f"{mode:<6} {r['trainable_params']:>12,} {r['total_params']:>12,} {share:>6.2f}% "
              f"{r['seconds_per_step']:>8.2f} {r['peak_mib']:>9.0f}")
    full, lora = results["full"], results["lora"]
    summary = {
        "model": args.model, "rows": args.rows, "prompt_length": args.prompt_length,
        "response_length": args.response_length, "rank": args.rank, "alpha": args.alpha, "threads": args.threads,
        "gradient_checkpointing": args.gradient_checkpointing,
        "load_average": round(load, 2),
        **{mode: {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for mode, r in results.items()},
        "lora_over_full": {
            "trainable_params": round(lora["trainable_params"] / full["trainable_params"], 5),
            "seconds_per_step": round(lora["seconds_per_step"] / full["seconds_per_step"], 3),
            "peak_mib": round(lora["peak_mib"] / full["peak_mib"], 3),
        },
    }
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
