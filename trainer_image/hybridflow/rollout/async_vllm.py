"""A vLLM `AsyncLLM` engine behind the server interface the agent loops use (token ids in and out).

The engine core runs in a child process (vLLM V1's multiprocess client); with tensor_model_parallel_size > 1
it drives one worker process per rank (vLLM's multiprocess executor, gloo/shared memory on CPU). Requests stream
in concurrently, and `generate` returns when one finishes. Weights arrive as full HF-named tensors and go
to the engine's workers as one safetensors blob (`WeightSyncExtension.hf_load_weights_bytes`, the same
mechanism the in-worker `VLLMRollout` uses when its engine is out of process) through `collective_rpc`, so
every rank takes the full tensors and keeps its own shard; then the prefix cache is reset so no KV block
computed under old weights is reused.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hybridflow.agent.base import TokenOutput
from hybridflow.data.vision import placeholder_token_ids
from hybridflow.rollout.vllm_rollout import (
    VLLMRollout,
    _state_dict_to_bytes,
    bind_cpu_threads,
    build_sampling_params,
    eos_token_ids,
    tokens_prompt,
)


class AsyncVLLMEngine:
    """One `AsyncLLM` replica: `generate`, `abort`, `load_weights`, `sleep` / `wake_up`."""

    def __init__(self, model_path: str, config: Any, device: str, response_length: int, prompt_length: int,
                 cpu_cores: int | None = None, profile_dir: str | None = None, profile_contents: tuple[str, ...] = (),
                 **engine_overrides: Any) -> None:
        """`profile_dir`: an absolute folder for vLLM's torch profiler (start_profile / stop_profile write there);
        `profile_contents`: what it records, as the torch tool's `contents` (cpu, cuda, memory, shapes, stack)."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        dev = torch.device(device)
        kwargs = VLLMRollout.engine_kwargs(model_path, config, dev, response_length, prompt_length)
        kwargs.update(engine_overrides)
        if profile_dir is not None:
            from vllm.config import ProfilerConfig

            wanted = set(profile_contents)
            activities = [a for a, c in (("CPU", "cpu"), ("CUDA", "cuda")) if not wanted or c in wanted]
            if dev.type != "cuda":
                activities = ["CPU"]
            kwargs["profiler_config"] = ProfilerConfig(
                profiler="torch", torch_profiler_dir=profile_dir, torch_profiler_activities=activities,
                # the torch tool's contents, not vLLM's defaults (stacks on): stacks make CPU traces slow to write
                torch_profiler_with_stack="stack" in wanted, torch_profiler_record_shapes="shapes" in wanted,
                torch_profiler_with_memory="memory" in wanted, torch_profiler_dump_cuda_time_total=False,
            )
        tp = int(kwargs.get("tensor_parallel_size", 1))
        if dev.type == "cpu":
            bind_cpu_threads(cpu_cores, tp)
        if kwargs.get("distributed_executor_backend") == "external_launcher":
            kwargs.pop("distributed_executor_backend")  # a replica is not inside the trainer's world
        if tp > 1 and kwargs.get("distributed_executor_backend") in (None, "uni"):
            # one worker process per rank beside the engine core, on this replica's devices (GPU: the ones
            # CUDA_VISIBLE_DEVICES names; CPU: one core list per rank of VLLM_CPU_OMP_THREADS_BIND)
            kwargs["distributed_executor_backend"] = "mp"
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        self.dtype = self.engine.model_config.dtype
        self.eos_token_ids = eos_token_ids(self.engine.tokenizer, self.engine.model_config.hf_config)
        self.banned_ids = placeholder_token_ids(self.engine.model_config.hf_config)  # a VLM's image tokens
        self.free_cache = dev.type == "cuda" and bool(kwargs.get("enable_sleep_mode"))
        self.ignore_eos = bool(getattr(config, "ignore_eos", False))

    def sampling(self, params: dict[str, Any]) -> Any:
        """vLLM SamplingParams from the agent loop's dict (temperature 0 or do_sample false: greedy)."""
        return build_sampling_params(
            greedy=not params.get("do_sample", True) or float(params.get("temperature", 1.0)) <= 0,
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=int(params.get("top_k", -1)),
            max_tokens=int(params["max_tokens"]),
            logprobs=bool(params.get("logprobs", True)),
            eos_ids=self.eos_token_ids,
            ignore_eos=self.ignore_eos,
            seed=params.get("seed"),
            banned_ids=self.banned_ids,
        )

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       multi_modal_data: dict[str, Any] | None = None) -> TokenOutput:
        """Continue `prompt_ids` (with an image prompt's images, which vLLM expands into their placeholders); an
        aborted request returns what it had with finish_reason abort."""
        final = None
        prompt = tokens_prompt(prompt_ids, multi_modal_data)
        async for out in self.engine.generate(prompt, self.sampling(sampling_params), request_id=request_id):
            final = out
        if final is None:
            return TokenOutput([], [], "abort")
        choice = final.outputs[0]
        tokens = list(choice.token_ids)
        logprobs = None
        if choice.logprobs is not None:
            logprobs = [float(step[t].logprob) for step, t in zip(choice.logprobs, tokens, strict=False)]
        reason = choice.finish_reason or ("abort" if not final.finished else "stop")
        return TokenOutput(tokens, logprobs, "abort" if reason == "abort" else str(reason), final.num_cached_tokens)

    async def abort(self, request_id: str) -> None:
        """Cancel a request in flight (its `generate` returns with finish_reason abort)."""
        await self.engine.abort(request_id)

    async def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the weights in place (no restart), then drop cached KV blocks."""
        cast = ((n, t.detach().to(self.dtype) if t.is_floating_point() else t.detach()) for n, t in weights)
        await self.engine.collective_rpc("hf_load_weights_bytes", args=(_state_dict_to_bytes(cast),))
        await self.engine.reset_prefix_cache()
        if self.banned_ids:  # a vision-language model: image features of the old weights are cached by image
            await self.engine.reset_encoder_cache()

    async def sleep(self) -> None:
        """GPU: release weights and KV cache while the trainer uses the device (no-op on CPU)."""
        if self.free_cache:
            await self.engine.sleep(level=1)

    async def wake_up(self) -> None:
        """GPU: take the memory back before serving."""
        if self.free_cache:
            await self.engine.wake_up()

    async def start_profile(self) -> None:
        """Start vLLM's torch profiler in the engine's processes (the engine was built with a `profile_dir`)."""
        await self.engine.start_profile()

    async def stop_profile(self) -> None:
        """Stop it: each process writes its trace into `profile_dir`."""
        await self.engine.stop_profile()

    def shutdown(self) -> None:
        """Stop the engine core process."""
        self.engine.shutdown()
