"""Reward-model scoring (verl's reward model worker, Ray-free): one scalar per response from a 1-label head.

The reward model is an `FSDPEngine` of kind "value" (`AutoModelForTokenClassification`, one label): it
outputs a number at every position, and the score of a response is the number at the last valid token
of its sequence (where a sequence-classification model pools too). The batch then gets `rm_scores`
(b, R): that score at the response's last valid position, 0 elsewhere, the same place a rule-based
reward manager writes its score, so KL-in-reward and every advantage estimator read it unchanged.

Two input paths, as in verl:
- same tokenizer (`reward_model.model.input_tokenizer` null): the model reads the policy's
  `input_ids` (left-padded prompt + right-padded response) as they are;
- different tokenizer: each response is decoded with the policy's tokenizer, appended to the prompt's
  chat messages (`raw_prompt`, from `data.return_raw_chat=true`) as the assistant turn, and the chat is
  rendered and tokenised with the reward model's own chat template (verl's `_switch_chat_template`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from hybridflow.engines.batching import plan_micro_batches
from hybridflow.engines.fsdp_engine import FSDPEngine
from hybridflow.protocol import DataProto, response_mask_of
from hybridflow.rewards.manager import place_scores

logger = logging.getLogger(__name__)

DIRECT_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses")


def valid_response_lengths(data: DataProto) -> torch.Tensor:
    """Valid (right-padded) tokens per response."""
    return response_mask_of(data).sum(-1).long()


def last_valid_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Column of each row's last attended token (left or right padding alike); 0 for an all-padding row."""
    width = attention_mask.shape[-1]
    flipped = attention_mask.flip(-1).bool().long()
    return torch.where(flipped.any(-1), width - 1 - flipped.argmax(-1), torch.zeros_like(flipped[:, 0]))


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids counting attended tokens from 0 (padding gets 0), as the dataset and rollout build them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def render_chats(
    data: DataProto, input_tokenizer: Any, tokenizer: Any, max_length: int | None = None
) -> DataProto:
    """Re-tokenise every (prompt chat, response) with the reward model's chat template; left-padded inputs.

    The response is decoded with the policy's tokenizer (`input_tokenizer`, special tokens kept, its EOS
    removed: the template ends the assistant turn itself), appended to `raw_prompt` as the assistant
    message and rendered with `tokenizer`'s template. Inputs longer than `max_length` (default: the
    policy's prompt + response width) lose their end, as verl truncates them on the right.
    """
    if "raw_prompt" not in data.non_tensor_batch:
        raise ValueError(
            "reward_model.model.input_tokenizer is set, so the reward model re-renders each prompt's chat, but the "
            "batch has no raw_prompt; set data.return_raw_chat=true"
        )
    limit = max_length or data.batch["attention_mask"].shape[-1]
    responses = data.batch["responses"]
    lengths = valid_response_lengths(data)
    eos = input_tokenizer.eos_token
    rows: list[list[int]] = []
    truncated = 0
    for i in range(len(data)):
        text = input_tokenizer.decode(responses[i, : int(lengths[i])].tolist(), skip_special_tokens=False)
        if eos:
            text = text.replace(eos, "")
        chat = [dict(m) for m in data.non_tensor_batch["raw_prompt"][i]]
        chat.append({"role": "assistant", "content": text})
        rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
        # The template writes any BOS itself; adding special tokens again would double it.
        ids = list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
        if len(ids) > limit:
            truncated += 1
            ids = ids[:limit]
        rows.append(ids)
    if truncated:
        logger.warning(
            "%d of %d reward-model inputs were longer than %d tokens and lost their end; raise "
            "reward_model.max_length",
            truncated,
            len(rows),
            limit,
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(ids) for ids in rows)
    input_ids = torch.full((len(rows), width), int(pad or 0), dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, ids in enumerate(rows):
        if ids:
            input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, width - len(ids) :] = 1
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": positions_from_mask(attention_mask),
            # No response block: the whole left-padded row is what a micro-batch plan costs.
            "responses": torch.zeros((len(rows), 0), dtype=torch.long),
        }
    )


class RewardModelScorer:
    """Score one rank's share of a batch with a reward model; see the module doc."""

    def __init__(
        self,
        engine: FSDPEngine,
        *,
        micro_batch_size: int | None = None,
        max_token_len: int | None = None,
        input_tokenizer: Any = None,
        tokenizer: Any = None,
        max_length: int | None = None,
    ) -> None:
        if (input_tokenizer is None) != (tokenizer is None):
            raise ValueError(
                "re-templating needs both the policy's tokenizer and the reward model's tokenizer"
            )
        self.engine = engine
        self.micro_batch_size = micro_batch_size
        self.max_token_len = max_token_len
        self.input_tokenizer = input_tokenizer
        self.tokenizer = tokenizer
        self.max_length = max_length

    def compute_rm_score(self, data: DataProto) -> torch.Tensor:
        """`rm_scores` (b, R) for the batch's responses."""
        if self.input_tokenizer is not None:
            inputs = render_chats(data, self.input_tokenizer, self.tokenizer, self.max_length)
        else:
            inputs = data.select(list(DIRECT_INPUTS))
        scores = self.sequence_scores(inputs)
        return place_scores(scores, valid_response_lengths(data), data.batch["responses"].shape[-1])

    def sequence_scores(self, inputs: DataProto) -> torch.Tensor:
        """(b,) the model's output at each row's last valid token (micro-batched, no gradients)."""
        out = torch.zeros(len(inputs), dtype=torch.float32)
        plan = plan_micro_batches(
            inputs, self.micro_batch_size, self.max_token_len, self.engine.max_over_ranks
        )
        with torch.no_grad():
            for idx in plan:
                b = inputs.select_idxs(idx).batch
                mask = b["attention_mask"]
                # Columns that are padding in every row at the end carry nothing: drop them (the
                # engine drops leading ones), so right-padded batches cost their longest row only.
                used = mask.bool().any(0).nonzero()
                end = int(used[-1]) + 1 if len(used) else mask.shape[-1]
                ids, mask, pos = (t[:, :end] for t in (b["input_ids"], mask, b["position_ids"]))
                logits = self.engine.forward(ids, mask, pos).squeeze(-1)
                # The engine may have dropped leading all-padding columns: index from the end.
                last = last_valid_index(mask) - (end - logits.shape[-1])
                out[idx] = logits[torch.arange(len(idx)), last.to(logits.device)].float().cpu()
        return out


def reward_head_problem(path: str) -> str | None:
    """Why the checkpoint at `path` is no 1-label reward model, or None (also when it cannot tell).

    Reads only the safetensors headers: a folder without a `score` head (a plain causal LM, say) would
    be given a random head and score noise; a head with several labels is another kind of classifier.
    """
    folder = Path(path)
    shapes = _safetensors_shapes(folder)
    if shapes is None:
        return None
    head = shapes.get("score.weight")
    if head is None:
        arch = _architectures(folder)
        return (
            f"reward_model.model.path={path}: the checkpoint has no 'score' head (architectures: {arch}), so it "
            "would score with random weights; point it at a reward model, a *ForSequenceClassification or "
            "*ForTokenClassification checkpoint with num_labels=1"
        )
    if head and head[0] != 1:
        return (
            f"reward_model.model.path={path}: the 'score' head has {head[0]} labels; a reward model has one "
            "(num_labels=1), the scalar reward"
        )
    return None


def head_has_bias(path: str) -> bool | None:
    """Whether the checkpoint's `score` head has a bias (token classifiers do, sequence classifiers not)."""
    shapes = _safetensors_shapes(Path(path))
    return None if shapes is None else "score.bias" in shapes


def _safetensors_shapes(folder: Path) -> dict[str, list[int]] | None:
    """Tensor name -> shape of a local safetensors checkpoint (sharded or not); None when there is none."""
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    shapes: dict[str, list[int]] = {}
    for file in files:
        with file.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        shapes.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
    return shapes


def _architectures(folder: Path) -> str:
    try:
        return (
            ", ".join(json.loads((folder / "config.json").read_text()).get("architectures") or [])
            or "unknown"
        )
    except (OSError, ValueError):
        return "unknown"
