"""Pure token plumbing shared by the vLLM and SGLang engines: prompt id lists in, padded tensors out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hybridflow.protocol import DataProto
from hybridflow.rollout.base import SAMPLING_KEYS


def config_value(cfg: Any, key: str, default: Any) -> Any:
    """`cfg.key` (or `cfg[key]` for a dict); `default` when missing or None."""
    if cfg is None:
        return default
    value = cfg.get(key, default) if isinstance(cfg, Mapping) else getattr(cfg, key, default)
    return default if value is None else value


def resolve_sampling(
    config: Any, response_length: int, overrides: Mapping[str, Any], meta_info: Mapping[str, Any]
) -> dict[str, Any]:
    """Sampling for one generate call: rollout config < keyword overrides < the batch's meta_info.

    Adds `greedy` (do_sample false or temperature 0); top_k <= 0 means off (-1), as in verl's config.
    """
    params: dict[str, Any] = {
        "do_sample": bool(config_value(config, "do_sample", True)),
        "temperature": float(config_value(config, "temperature", 1.0)),
        "top_p": float(config_value(config, "top_p", 1.0)),
        "top_k": int(config_value(config, "top_k", -1)),
        "response_length": int(response_length),
        "calculate_log_probs": bool(config_value(config, "calculate_log_probs", False)),
    }
    params.update({k: v for k, v in overrides.items() if k in SAMPLING_KEYS})
    params.update({k: v for k, v in meta_info.items() if k in SAMPLING_KEYS})
    params["greedy"] = not params["do_sample"] or float(params["temperature"]) <= 0
    params["top_k"] = int(params["top_k"]) if int(params["top_k"]) > 0 else -1
    params["response_length"] = int(params["response_length"])
    return params


VALIDATION_KEYS = ("do_sample", "temperature", "top_p", "top_k")


def with_validation_sampling(meta: dict[str, Any], val_kwargs: Any) -> dict[str, Any]:
    """`meta` with `rollout.val_kwargs` filled in for a validation batch (keys the batch sets win)."""
    if meta.get("validate"):
        for key in VALIDATION_KEYS:
            meta.setdefault(key, getattr(val_kwargs, key))
    return meta


def prompt_token_lists(prompts: DataProto) -> list[list[int]]:
    """The prompt ids an engine takes for every row: the real (unpadded) ids, read through `attention_mask` (any
    padding side); for an image prompt, `raw_prompt_ids` (one placeholder per image, which the engine expands
    itself; see hybridflow.data.vision)."""
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    images = prompt_images(prompts)
    raw = prompts.non_tensor_batch.get("raw_prompt_ids")
    return [list(raw[i]) if images[i] else row[m].tolist()
            for i, (row, m) in enumerate(zip(ids, mask, strict=True))]


def prompt_images(prompts: DataProto) -> list[list[Any] | None]:
    """Each row's images (PIL) for the engine, None for a text prompt."""
    data = prompts.non_tensor_batch.get("multi_modal_data")
    if data is None:
        return [None] * len(prompts)
    return [list(d["image"]) if d and d.get("image") else None for d in data]


def pack_responses(
    token_lists: Sequence[Sequence[int]],
    response_length: int,
    pad_token_id: int,
    logprob_lists: Sequence[Sequence[float]] | None = None,
    dtype: torch.dtype = torch.long,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Right-pad generated ids to (b, response_length); mask 1 on generated tokens; aligned log-probs.

    Engines stop after the first EOS and keep it, so the mask (1 up to and including EOS, as in
    `hybridflow.rollout.base`) is simply the generated length. Longer outputs are cut to the length.
    """
    b = len(token_lists)
    responses = torch.full((b, response_length), pad_token_id, dtype=dtype)
    mask = torch.zeros(b, response_length, dtype=torch.long)
    log_probs = torch.zeros(b, response_length) if logprob_lists is not None else None
    for i, tokens in enumerate(token_lists):
        n = min(len(tokens), response_length)
        if n:
            responses[i, :n] = torch.tensor(list(tokens[:n]), dtype=dtype)
        mask[i, :n] = 1
        if log_probs is not None and logprob_lists is not None:
            lps = list(logprob_lists[i])[:n]
            if len(lps) != n:
                raise ValueError(f"row {i}: {n} generated tokens but {len(lps)} log-probs from the engine")
            if n:
                log_probs[i, :n] = torch.tensor(lps, dtype=torch.float32)
    return responses, mask, log_probs
