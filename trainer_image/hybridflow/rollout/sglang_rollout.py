"""Rollout on SGLang's offline engine (`sglang.Engine`), with weight updates and memory release.

SGLang has no CPU build (PyPI's `sglang` pins a CUDA torch), so it is imported only when this engine
is built, and its absence gives install advice. The adapter's own logic (sampling translation,
output parsing, weight pushing, sleep/wake bookkeeping) is written against the few engine methods
below so it can be tested with a stand-in engine; `bench/gpu_smoke.py` runs it for real on a GPU.

Engine methods used: `generate(input_ids=, sampling_params=, return_logprob=)`,
`update_weights_from_tensor(named_tensors, flush_cache=)`, `release_memory_occupation()`,
`resume_memory_occupation()`, `shutdown()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from hybridflow.data.vision import PLACEHOLDER_LOGIT_BIAS, model_placeholder_token_ids
from hybridflow.protocol import DataProto
from hybridflow.rollout.base import RolloutEngine, assemble_output
from hybridflow.rollout.token_io import (
    config_value,
    pack_responses,
    prompt_images,
    prompt_token_lists,
    resolve_sampling,
)

INSTALL_HINT = (
    "SGLang is not installed. It needs a CUDA machine: `pip install -c constraints.txt '.[sglang]'` "
    "in a GPU image (there is no CPU build); or set actor_rollout_ref.rollout.name=vllm (CPU: `make "
    "vllm`) or hf"
)


def engine_kwargs(model_path: str, config: Any, max_model_len: int | None = None) -> dict[str, Any]:
    """`sglang.Engine` arguments from `actor_rollout_ref.rollout` (pure)."""
    kwargs: dict[str, Any] = {
        "model_path": model_path,
        "dtype": str(config_value(config, "dtype", "bfloat16")),
        "tp_size": int(config_value(config, "tensor_model_parallel_size", 1)),
        "mem_fraction_static": float(config_value(config, "gpu_memory_utilization", 0.5)),
        "disable_cuda_graph": bool(config_value(config, "enforce_eager", False)),
        "disable_radix_cache": not bool(config_value(config, "enable_prefix_caching", True)),
        "max_running_requests": int(config_value(config, "max_num_seqs", 1024)),
        "chunked_prefill_size": int(config_value(config, "max_num_batched_tokens", 8192)),
        # the weights are released between rollout and training (free_cache_engine), see `_sleep`
        "enable_memory_saver": bool(config_value(config, "free_cache_engine", False)),
        "random_seed": int(config_value(config, "seed", 0)),
        "log_level": "error",
    }
    length = config_value(config, "max_model_len", None) or max_model_len
    if length:
        kwargs["context_length"] = int(length)
    extra = config_value(config, "engine_kwargs", {}) or {}
    kwargs.update(dict(extra.get("sglang", {}) or {}))
    return kwargs


def sampling_params(params: Mapping[str, Any], stop_token_ids: Sequence[int], ignore_eos: bool,
                    banned_ids: Sequence[int] = ()) -> dict[str, Any]:
    """SGLang's sampling dict from `resolve_sampling` output (greedy = temperature 0); `banned_ids` (a vision-language
    model's image tokens) get PLACEHOLDER_LOGIT_BIAS, as in the trainer."""
    greedy = bool(params["greedy"])
    bias = {"logit_bias": {str(int(t)): PLACEHOLDER_LOGIT_BIAS for t in banned_ids}} if banned_ids else {}
    return {
        **bias,
        "n": 1,
        "temperature": 0.0 if greedy else float(params["temperature"]),
        "top_p": 1.0 if greedy else float(params["top_p"]),
        "top_k": -1 if greedy else int(params["top_k"]),
        "max_new_tokens": int(params["response_length"]),
        "stop_token_ids": [] if ignore_eos else list(stop_token_ids),
        "ignore_eos": ignore_eos,
        "skip_special_tokens": False,
    }


def parse_output(out: Mapping[str, Any], want_log_probs: bool) -> tuple[list[int], list[float] | None]:
    """Generated ids (ending with the stop token when one was hit) and their log-probs from one result.

    `meta_info.output_token_logprobs` holds (logprob, token_id, text) per generated token; when
    `output_ids` is absent the ids are read from there. A stop token SGLang matched but left out of
    the ids is appended (the response mask must cover EOS, see `hybridflow.rollout.base`).
    """
    meta = out.get("meta_info", {}) or {}
    entries = list(meta.get("output_token_logprobs") or [])
    ids = list(out["output_ids"]) if out.get("output_ids") is not None else [int(e[1]) for e in entries]
    finish = meta.get("finish_reason") or {}
    matched = finish.get("matched") if isinstance(finish, Mapping) else None
    if isinstance(finish, Mapping) and finish.get("type") == "stop" and isinstance(matched, int):
        if not ids or ids[-1] != matched:
            ids.append(matched)
    if not want_log_probs:
        return ids, None
    if len(entries) < len(ids):
        raise ValueError(
            f"SGLang returned {len(entries)} token log-probs for {len(ids)} generated tokens; "
            "generate with return_logprob=True"
        )
    return ids, [float(e[0]) for e in entries[: len(ids)]]


class SGLangRollout(RolloutEngine):
    """`sglang.Engine` in this worker (see the module docstring and `RolloutEngine`)."""

    def __init__(
        self,
        model_path: str,
        config: Any = None,
        device: str | torch.device = "cuda",
        response_length: int | None = None,
        prompt_length: int | None = None,
        engine: Any = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
    ) -> None:
        self.config = config
        self.response_length = int(response_length or config_value(config, "response_length", 32))
        if torch.device(device).type != "cuda" and engine is None:
            raise RuntimeError(
                "the SGLang rollout needs a CUDA GPU (SGLang has no CPU build); on CPU set "
                "actor_rollout_ref.rollout.name=vllm (after `make vllm`) or hf"
            )
        if eos_token_id is None or pad_token_id is None:
            eos_token_id, pad_token_id = _special_ids(model_path, eos_token_id, pad_token_id)
        self.eos_token_id = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
        self.pad_token_id = int(pad_token_id if pad_token_id is not None else (self.eos_token_id or [0])[0])
        self.free_cache = bool(config_value(config, "free_cache_engine", False))
        self.released = False
        if engine is None:
            try:
                import sglang
            except ImportError as err:
                raise ImportError(f"{INSTALL_HINT} ({err})") from err
            length = prompt_length and int(prompt_length) + self.response_length
            engine = sglang.Engine(**engine_kwargs(model_path, config, length))
        self.engine = engine
        self.banned_ids = model_placeholder_token_ids(model_path)  # after the engine fetched the model

    @torch.no_grad()
    def generate(self, prompts: DataProto, **sampling: Any) -> DataProto:
        """Sample one response per row (left-padded prompt ids in, right-padded responses out)."""
        params = resolve_sampling(self.config, self.response_length, sampling, prompts.meta_info)
        want_lp = bool(params["calculate_log_probs"])
        ignore_eos = bool(config_value(self.config, "ignore_eos", False))
        self._wake_up()
        images = prompt_images(prompts)
        outputs = self.engine.generate(
            input_ids=prompt_token_lists(prompts),
            sampling_params=sampling_params(params, self.eos_token_id, ignore_eos, self.banned_ids),
            return_logprob=want_lp,
            **({"image_data": images} if any(images) else {}),  # per request: its images, or None
        )
        self._sleep()
        if isinstance(outputs, Mapping):  # a single request comes back unwrapped
            outputs = [outputs]
        parsed = [parse_output(out, want_lp) for out in outputs]
        if len(parsed) != len(prompts):
            raise RuntimeError(f"SGLang returned {len(parsed)} results for {len(prompts)} prompts")
        tokens = [ids for ids, _ in parsed]
        lps = [lp or [] for _, lp in parsed] if want_lp else None
        responses, mask, log_probs = pack_responses(
            tokens, params["response_length"], self.pad_token_id, lps, prompts.batch["input_ids"].dtype
        )
        prompts_cpu = prompts.select(list(prompts.batch), list(prompts.non_tensor_batch), list(prompts.meta_info))
        return assemble_output(prompts_cpu, responses, mask, log_probs)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push full HF-named tensors into the running engine; its radix (prefix) cache is flushed.

        A released engine is resumed first and stays resumed: its weight memory came back empty
        (no CPU backup), so sleeping again before the next generate would drop the new weights.
        """
        self._wake_up()
        named = [(name, t.detach()) for name, t in weights]
        self.engine.update_weights_from_tensor(named_tensors=named, flush_cache=True)

    def _sleep(self) -> None:
        """Release weights and KV cache to free the GPU for training (free_cache_engine)."""
        if self.free_cache and not self.released:
            self.engine.release_memory_occupation()
            self.released = True

    def _wake_up(self) -> None:
        if self.released:
            self.engine.resume_memory_occupation()
            self.released = False


def _special_ids(model_path: str, eos: int | list[int] | None, pad: int | None) -> tuple[Any, int | None]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    return (eos if eos is not None else tok.eos_token_id), (pad if pad is not None else tok.pad_token_id)
