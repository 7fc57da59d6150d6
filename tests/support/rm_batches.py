"""Rollout-shaped batches for reward-model tests: chat prompts rendered with a tokenizer, answers as responses."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hybridflow.engines.reward_model import positions_from_mask
from hybridflow.protocol import DataProto


def rollout_batch(
    tokenizer: Any, pairs: list[tuple[str, str]], prompt_len: int = 24, resp_len: int = 6
) -> DataProto:
    """Left-padded rendered prompts + right-padded responses (answer + EOS, cut at resp_len), as a rollout
    returns, with each prompt's chat messages as `raw_prompt` (data.return_raw_chat)."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    prompts = torch.full((len(pairs), prompt_len), pad)
    responses = torch.full((len(pairs), resp_len), pad)
    chats = np.empty(len(pairs), dtype=object)
    for i, (question, answer) in enumerate(pairs):
        chats[i] = [{"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(chats[i], add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        prompts[i, prompt_len - len(ids) :] = torch.tensor(ids)
        resp = (tokenizer(answer, add_special_tokens=False)["input_ids"] + [eos])[:resp_len]
        responses[i, : len(resp)] = torch.tensor(resp)
    input_ids = torch.cat([prompts, responses], dim=1)
    mask = (input_ids != pad).long()
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": input_ids,
            "attention_mask": mask,
            "position_ids": positions_from_mask(mask),
            "response_mask": mask[:, prompt_len:].clone(),
        },
        non_tensors={"raw_prompt": chats},
    )
