"""An SGLang engine behind the server interface the agent loops use (token ids in and out), for `rollout.mode=async`.

`sglang.Engine` runs its scheduler (one process per tensor-parallel rank) and detokenizer in child processes;
its tokenizer manager lives in this process and takes requests as coroutines. Every call here is a coroutine on
the caller's event loop (the replica actor's): `Engine.async_generate` for generation, and the tokenizer
manager's own coroutines for weight updates, memory release and resume. The Engine's synchronous methods are
not used, because they run a private event loop of their own that cannot run inside the actor's.

Weights arrive as full HF-named tensors (as for the vLLM replicas) and are pushed in buckets of at most
`WEIGHT_BUCKET_BYTES`, each serialized once per tensor-parallel rank (every rank takes the full tensors and keeps
its shard); the radix (prefix) cache is flushed with the last bucket, so no KV block computed under the old weights
is reused. With `free_cache_engine` the replica releases weights and KV cache while the trainer uses the GPU, and
gets the weights back from a CPU copy when it resumes (`with_weights_backup`).

SGLang has no CPU build (its wheel pins a CUDA torch): this module imports it only when an engine is built, and
the adapter's logic is written against the calls below so that tests run it against a stand-in
(`tests/unit/test_sglang_adapter.py`); `bench/gpu_smoke.py` runs it against a real engine on a GPU.

Calls used: `Engine.async_generate(input_ids=, sampling_params=, return_logprob=, rid=)`,
`Engine.tokenizer_manager.{update_weights_from_tensor, release_memory_occupation, resume_memory_occupation}(req,
None)` and `.abort_request(rid=)`, `Engine.shutdown()`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from hybridflow.agent.base import TokenOutput
from hybridflow.data.vision import model_placeholder_token_ids
from hybridflow.rollout.sglang_rollout import INSTALL_HINT, engine_kwargs, parse_output, sampling_params

logger = logging.getLogger(__name__)

#: Largest weight-update message; a 7B model in bf16 goes in ~30 of them instead of one 14 GB payload.
WEIGHT_BUCKET_BYTES = 512 << 20


def weight_buckets(weights: Iterable[tuple[str, torch.Tensor]], limit: int | None = None
                   ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive lists of (name, tensor) of at most `limit` (default `WEIGHT_BUCKET_BYTES`) bytes each; a larger
    tensor goes alone."""
    limit = WEIGHT_BUCKET_BYTES if limit is None else limit
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > limit:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def finish_reason(out: Mapping[str, Any]) -> str:
    """stop, length or abort from SGLang's `meta_info.finish_reason` ({"type": ...}; None while running)."""
    finish = (out.get("meta_info") or {}).get("finish_reason")
    kind = finish.get("type") if isinstance(finish, Mapping) else finish
    return str(kind) if kind in ("stop", "length", "abort") else "abort"


def server_args_fields() -> set[str]:
    """The field names of the installed SGLang's `ServerArgs`."""
    import dataclasses

    from sglang.srt.server_args import ServerArgs

    return {f.name for f in dataclasses.fields(ServerArgs)}


def with_weights_backup(kwargs: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    """Engine arguments under which a released replica gets its weights back on resume.

    A server replica may serve again after a release without a weight push in between (validation before the
    first step, a second generate call): SGLang >= 0.5.3 keeps a CPU copy of the weights for that
    (`enable_weights_cpu_backup`, as vLLM's sleep level 1 does). An older SGLang would resume with garbage
    weights, so there the replica keeps its memory (free_cache_engine has no effect) and says so.
    """
    if not kwargs.get("enable_memory_saver"):
        return kwargs
    if "enable_weights_cpu_backup" in fields:
        return {**kwargs, "enable_weights_cpu_backup": True}
    logger.warning("free_cache_engine has no effect on this SGLang server replica: the installed SGLang has no "
                   "enable_weights_cpu_backup (0.5.3 and later have it), so a released replica could not get its "
                   "weights back; it keeps its GPU memory")
    return {**kwargs, "enable_memory_saver": False}


class TokenizerManagerControl:
    """Weight updates, memory release and aborts as coroutines on the caller's loop, through the tokenizer manager."""

    def __init__(self, engine: Any, tp_size: int) -> None:
        self.manager = engine.tokenizer_manager
        self.tp_size = tp_size

    async def update_weights(self, named: list[tuple[str, torch.Tensor]], flush_cache: bool) -> None:
        """One bucket into every rank; SGLang answers (success, message)."""
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
        from sglang.srt.utils import MultiprocessingSerializer

        payload = [MultiprocessingSerializer.serialize(named) for _ in range(self.tp_size)]
        request = UpdateWeightsFromTensorReqInput(serialized_named_tensors=payload, load_format=None,
                                                  flush_cache=flush_cache)
        answer = await self.manager.update_weights_from_tensor(request, None)
        success, message = (answer[0], answer[1]) if isinstance(answer, tuple) else (True, "")
        if not success:
            raise RuntimeError(f"SGLang refused the weight update: {message}")

    async def release(self) -> None:
        """Free weights and KV cache (torch_memory_saver; the engine needs enable_memory_saver)."""
        from sglang.srt.managers.io_struct import ReleaseMemoryOccupationReqInput

        await self.manager.release_memory_occupation(ReleaseMemoryOccupationReqInput(), None)

    async def resume(self) -> None:
        """Take the memory back (the weights from their CPU copy, see `with_weights_backup`)."""
        from sglang.srt.managers.io_struct import ResumeMemoryOccupationReqInput

        await self.manager.resume_memory_occupation(ResumeMemoryOccupationReqInput(), None)

    def abort(self, request_id: str) -> None:
        """Cancel one request; its `async_generate` returns with finish_reason abort."""
        self.manager.abort_request(rid=request_id)


class AsyncSGLangEngine:
    """One SGLang replica: `generate`, `abort`, `load_weights`, `sleep` / `wake_up` (as `AsyncVLLMEngine`)."""

    def __init__(self, model_path: str, config: Any, device: str, response_length: int, prompt_length: int,
                 cpu_cores: int | None = None, engine: Any = None, control: Any = None,
                 eos_token_ids: list[int] | None = None) -> None:
        """`engine` / `control` / `eos_token_ids`: a stand-in engine and its control (tests); else a real one."""
        del cpu_cores  # a vLLM-CPU setting; SGLang runs on GPUs only
        if torch.device(device).type != "cuda" and engine is None:
            raise RuntimeError(
                "server-mode rollout on SGLang needs a CUDA GPU (SGLang has no CPU build); on CPU set "
                "actor_rollout_ref.rollout.name=vllm (after `make vllm`)"
            )
        kwargs = engine_kwargs(model_path, config, int(prompt_length) + int(response_length))
        if engine is None:
            try:
                import sglang
            except ImportError as err:
                raise ImportError(f"{INSTALL_HINT} ({err})") from err
            kwargs = with_weights_backup(kwargs, server_args_fields())
            engine = sglang.Engine(**kwargs)
        self.engine = engine
        self.control = control or TokenizerManagerControl(engine, int(kwargs["tp_size"]))
        if eos_token_ids is None:
            from hybridflow.rollout.sglang_rollout import _special_ids

            eos, _ = _special_ids(model_path, None, None)
            eos_token_ids = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_token_ids = list(eos_token_ids)
        self.banned_ids = model_placeholder_token_ids(model_path)  # a vision-language model's image tokens
        self.ignore_eos = bool(getattr(config, "ignore_eos", False))
        self.free_cache = bool(kwargs["enable_memory_saver"])
        self.released = False
        self.aborted: set[str] = set()

    def sampling(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """SGLang's sampling dict from the agent loop's (temperature 0 or do_sample false: greedy)."""
        greedy = not params.get("do_sample", True) or float(params.get("temperature", 1.0)) <= 0
        return sampling_params({
            "greedy": greedy, "temperature": params.get("temperature", 1.0), "top_p": params.get("top_p", 1.0),
            "top_k": params.get("top_k", -1), "response_length": params["max_tokens"],
        }, self.eos_token_ids, self.ignore_eos, self.banned_ids)

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       multi_modal_data: dict[str, Any] | None = None) -> TokenOutput:
        """Continue `prompt_ids` (an image prompt's images go as SGLang's image_data); an aborted request returns
        what it had with finish_reason abort."""
        want_lp = bool(sampling_params.get("logprobs", True))
        images = (multi_modal_data or {}).get("image")
        try:
            out = await self.engine.async_generate(input_ids=list(prompt_ids), sampling_params=self.sampling(
                sampling_params), return_logprob=want_lp, rid=request_id, **({"image_data": images} if images else {}))
        except Exception:
            if request_id in self.aborted:  # some SGLang versions raise on a request aborted by its caller
                self.aborted.discard(request_id)
                return TokenOutput([], None, "abort")
            raise
        self.aborted.discard(request_id)
        reason = finish_reason(out)
        tokens, logprobs = parse_output(out, want_lp and reason != "abort")
        if want_lp and reason == "abort":
            entries = list((out.get("meta_info") or {}).get("output_token_logprobs") or [])
            logprobs = [float(e[0]) for e in entries[: len(tokens)]] if len(entries) >= len(tokens) else None
        cached = (out.get("meta_info") or {}).get("cached_tokens")
        return TokenOutput(tokens, logprobs, reason, int(cached) if cached is not None else None)

    async def abort(self, request_id: str) -> None:
        """Cancel a request in flight."""
        self.aborted.add(request_id)
        self.control.abort(request_id)

    async def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the weights in place (no restart), bucket by bucket; the last bucket flushes the radix cache.

        A released engine is resumed first (the push writes into its weight memory).
        """
        await self.wake_up()
        buckets = weight_buckets((n, t.detach()) for n, t in weights)
        bucket = next(buckets, None)
        while bucket is not None:
            following = next(buckets, None)
            await self.control.update_weights(bucket, flush_cache=following is None)
            bucket = following

    async def sleep(self) -> None:
        """GPU: release weights and KV cache while the trainer uses the device (free_cache_engine)."""
        if self.free_cache and not self.released:
            await self.control.release()
            self.released = True

    async def wake_up(self) -> None:
        """Take the memory back before serving or taking weights."""
        if self.released:
            await self.control.resume()
            self.released = False

    def shutdown(self) -> None:
        """Stop the scheduler and detokenizer processes."""
        self.engine.shutdown()
