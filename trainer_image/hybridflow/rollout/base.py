"""The rollout engine interface shared by the HF, vLLM and SGLang engines, and batch helpers.

Contract of `generate(prompts)`:
- input: `input_ids`, `attention_mask`, `position_ids` of shape (b, P), prompts LEFT-padded; one row
  per sample. The engine does NOT repeat prompts: for n samples per prompt the caller repeats the
  batch first (`prompts.repeat(n, interleave=True)`, as verl's trainer does), so rows i*n .. i*n+n-1
  are the samples of prompt i and every other per-row field stays aligned.
- sampling from keyword arguments (or `prompts.meta_info`, which wins): `do_sample` (False: greedy),
  `temperature` (0: greedy), `top_p`, `top_k` (-1 or 0: off), `response_length` (max new tokens),
  `calculate_log_probs`.
- output (b rows): `prompts` (b, P), `responses` (b, R) RIGHT-padded with the pad id to exactly
  R = response_length (so outputs of different ranks concatenate), `input_ids` = prompts ++ responses,
  `attention_mask`, `position_ids` (continuing the prompt's), `response_mask` (1 up to and including
  the first EOS), optionally `rollout_log_probs` (b, R); non-tensor fields of the input carried over.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import Any

import torch

from hybridflow.protocol import DataProto

SAMPLING_KEYS = ("do_sample", "temperature", "top_p", "top_k", "response_length", "calculate_log_probs")


class RolloutEngine(abc.ABC):
    """Generates responses for a batch of prompts and takes new weights from the trainer."""

    @abc.abstractmethod
    def generate(self, prompts: DataProto, **sampling: Any) -> DataProto:
        """Sample one response per row of `prompts` (see the module docstring for keys and shapes)."""

    @abc.abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights with the trainer's (HF parameter names, full tensors)."""


def response_mask_from(responses: torch.Tensor, eos_token_id: int | list[int] | None, gen_len: int) -> torch.Tensor:
    """1 for generated tokens up to and including the first EOS, 0 after it and past `gen_len`."""
    b, r = responses.shape
    in_range = torch.arange(r, device=responses.device).expand(b, r) < gen_len
    if eos_token_id is None:
        return in_range.long()
    eos_ids = torch.as_tensor(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id])
    is_eos = torch.isin(responses, eos_ids.to(responses.device)) & in_range
    # tokens strictly after the first EOS: an EOS occurred at an earlier position
    after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    return (in_range & ~after_eos).long()


def assemble_output(
    prompts: DataProto,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_log_probs: torch.Tensor | None = None,
) -> DataProto:
    """Build the generate() output batch from the prompt batch and the padded responses."""
    b = prompts.batch
    prompt_ids, prompt_mask, prompt_pos = b["input_ids"], b["attention_mask"], b["position_ids"]
    resp_len = responses.shape[1]
    delta = torch.arange(1, resp_len + 1, device=prompt_pos.device).unsqueeze(0)
    tensors = {
        "prompts": prompt_ids,
        "responses": responses,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),
        "attention_mask": torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1),
        "position_ids": torch.cat([prompt_pos, prompt_pos[:, -1:] + delta], dim=1),
        "response_mask": response_mask,
    }
    if rollout_log_probs is not None:
        tensors["rollout_log_probs"] = rollout_log_probs
    return DataProto.from_dict(
        tensors=tensors,
        non_tensors=dict(prompts.non_tensor_batch),
        meta_info={k: v for k, v in prompts.meta_info.items() if k != "metrics"},
    )
