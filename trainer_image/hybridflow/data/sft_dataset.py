"""SFT data: conversations from parquet, tokenised with the chat template, with a mask of the tokens to learn.

Single-turn rows hold a prompt (a string, one user message, or chat messages) and a response (a string);
multi-turn rows hold a list of chat messages, and every assistant turn is learned. A sequence is the
conversation rendered by the tokenizer's chat template, cut into pieces at the assistant turns: the text
up to and including the generation prompt (`assistant: ` / `<|im_start|>assistant\\n`) is context, the
turn the template writes for the assistant (its content and end-of-turn tokens) is learned. Each piece is
tokenised on its own, as at inference, where the model generates from the end of the prompt's tokens.

Items are left-padded to `data.max_length`: `input_ids`, `attention_mask`, `position_ids` and
`loss_mask` (1 where the token is a target the loss covers, predicted from the token before it). The
engine trims padding common to a micro-batch, so the padding costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from hybridflow.data.dataset import left_pad, read_parquet_rows

Truncation = Literal["error", "left", "right"]
TRUNCATIONS = ("error", "left", "right")
SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids", "loss_mask")


@dataclass(frozen=True)
class Origin:
    """Where a row comes from, for messages: file and row number in it."""

    path: str
    row: int

    def __str__(self) -> str:
        return f"row {self.row} of {self.path!r}"


@dataclass
class Encoded:
    """One tokenised sequence: token ids and, per token, whether it is a target of the loss."""

    ids: list[int]
    loss: list[int]


def read_rows(files: str | Sequence[str], what: str) -> tuple[list[dict[str, Any]], list[Origin]]:
    """Every row of the parquet files with its origin; ValueError when there is none."""
    rows, origins = read_parquet_rows(files)
    if not rows:
        names = [files] if isinstance(files, str) else list(files)
        raise ValueError(f"{what} {names} hold no rows; point data.train_files / data.val_files at non-empty parquet")
    return rows, [Origin(path, row) for path, row in origins]


def column(row: dict[str, Any], key: str, dict_keys: Sequence[str], origin: Origin, setting: str) -> Any:
    """`row[key][dict_keys[0]][dict_keys[1]]...`, with an error naming the setting to change when a key is absent."""
    if key not in row:
        raise KeyError(
            f"column {key!r} missing in {origin.path!r} (columns: {sorted(row)}); set {setting} to the column that "
            "holds it"
        )
    value = row[key]
    path = key
    for sub in dict_keys:
        if not isinstance(value, dict) or sub not in value:
            found = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise KeyError(
                f"{origin}: {path!r} has no key {sub!r} (it holds {found}); fix {setting.replace('_key', '_dict_keys')}"
            )
        value = value[sub]
        path = f"{path}.{sub}"
    return value


def as_messages(value: Any, role: str, what: str, origin: Origin) -> list[dict[str, Any]]:
    """A string as one message of `role`, or a list of {role, content} messages as it is."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        return value
    raise ValueError(
        f"{origin}: {what} must be a string or a non-empty list of {{role, content}} messages, got "
        f"{type(value).__name__}; fix the data or point the key at another column"
    )


def check_tokenizer(tokenizer: Any) -> int:
    """The pad id to use; ValueError when the tokenizer cannot render chats or pad."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat template, so conversations cannot be rendered; use an instruct model's "
            "tokenizer or set data.chat_template to a Jinja chat template"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token; give it a pad token")
    return int(pad)


def conversation_pieces(
    tokenizer: Any, messages: list[dict[str, Any]], first_trained: int, origin: Origin
) -> list[tuple[str, bool]]:
    """The chat-template text of `messages` as (text, learned) pieces: assistant turns from `first_trained` on
    are learned, everything before each of them (with the generation prompt) is context.

    The text ends with the last learned turn. ValueError when there is none, or when the template is not
    append-only (a turn rendered later changes the text before it), so pieces cannot be told apart.
    """
    pieces: list[tuple[str, bool]] = []
    done = ""
    for i, message in enumerate(messages):
        if i < first_trained or message.get("role") != "assistant":
            continue
        head = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False, add_generation_prompt=False)
        if not head.startswith(done) or not full.startswith(head):
            raise ValueError(
                f"{origin}: the chat template renders the conversation differently once turn {i} is added (the text "
                "before it changes), so the learned tokens cannot be located; use a template that only appends "
                "(data.chat_template)"
            )
        pieces += [(head[len(done):], False), (full[len(head):], True)]
        done = full
    if not pieces:
        raise ValueError(f"{origin}: no assistant message to learn from; each conversation needs at least one")
    return pieces


def encode_pieces(tokenizer: Any, conversations: list[list[tuple[str, bool]]]) -> list[Encoded]:
    """Tokenise every piece on its own (one batched call) and join each conversation's pieces."""
    texts = [text for pieces in conversations for text, _ in pieces]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    out: list[Encoded] = []
    at = 0
    for pieces in conversations:
        seq, loss = [], []
        for (_, learned), piece_ids in zip(pieces, ids[at : at + len(pieces)], strict=True):
            seq += piece_ids
            loss += [int(learned)] * len(piece_ids)
        at += len(pieces)
        if loss:
            loss[0] = 0  # the first token is predicted from nothing: never a target
        out.append(Encoded(seq, loss))
    return out


def fit_length(encoded: Encoded, max_length: int, truncation: Truncation, origin: Origin) -> Encoded:
    """Cut a sequence to `max_length` tokens as `truncation` says; ValueError when that leaves nothing to learn."""
    if len(encoded.ids) > max_length:
        if truncation == "error":
            raise ValueError(
                f"{origin} is {len(encoded.ids)} tokens, longer than data.max_length={max_length}; raise "
                "data.max_length, or set data.truncation to left (keep the end) or right (keep the start)"
            )
        keep = slice(-max_length, None) if truncation == "left" else slice(0, max_length)
        encoded = Encoded(encoded.ids[keep], encoded.loss[keep])
        encoded.loss[0] = 0
    if not any(encoded.loss):
        raise ValueError(
            f"{origin}: no response token is left to learn within data.max_length={max_length} "
            f"(truncation={truncation}); raise data.max_length or use truncation=left"
        )
    return encoded


def padded_item(encoded: Encoded, max_length: int, pad_id: int, prefix: str = "") -> dict[str, torch.Tensor]:
    """The four left-padded tensors of one sequence, keys optionally prefixed (`chosen_`, `rejected_`)."""
    input_ids, attention_mask, position_ids = left_pad(encoded.ids, max_length, pad_id)
    loss_mask = torch.tensor([0] * (max_length - len(encoded.loss)) + encoded.loss, dtype=torch.long)
    tensors = (input_ids, attention_mask, position_ids, loss_mask)
    return {f"{prefix}{key}": t for key, t in zip(SEQUENCE_KEYS, tensors, strict=True)}


class SFTDataset(torch.utils.data.Dataset):
    """Tokenised SFT conversations from verl-style parquet (single-turn prompt/response or multi-turn messages)."""

    def __init__(
        self,
        files: str | Sequence[str],
        tokenizer: Any,
        *,
        prompt_key: str = "question",
        response_key: str = "answer",
        prompt_dict_keys: Sequence[str] = (),
        response_dict_keys: Sequence[str] = (),
        multiturn: bool = False,
        messages_key: str = "messages",
        max_length: int = 1024,
        truncation: Truncation = "error",
    ) -> None:
        """Read and tokenise every row now, so bad rows are reported before training starts."""
        if truncation not in TRUNCATIONS:
            raise ValueError(f"data.truncation={truncation!r} is not known; use one of {', '.join(TRUNCATIONS)}")
        self.pad_id = check_tokenizer(tokenizer)
        self.max_length = max_length
        rows, origins = read_rows(files, "SFT files")
        conversations = []
        for row, origin in zip(rows, origins, strict=True):
            if multiturn:
                messages = as_messages(column(row, messages_key, (), origin, "data.multiturn.messages_key"),
                                       "user", f"column {messages_key!r}", origin)
                conversations.append(conversation_pieces(tokenizer, messages, 0, origin))
                continue
            prompt = as_messages(column(row, prompt_key, prompt_dict_keys, origin, "data.prompt_key"),
                                 "user", "the prompt", origin)
            response = column(row, response_key, response_dict_keys, origin, "data.response_key")
            if not isinstance(response, str):
                raise ValueError(
                    f"{origin}: the response must be a string, got {type(response).__name__}; point data.response_key "
                    "(and data.response_dict_keys) at the response text, or use data.multiturn for chat messages"
                )
            messages = [*prompt, {"role": "assistant", "content": response}]
            conversations.append(conversation_pieces(tokenizer, messages, len(prompt), origin))
        encoded = encode_pieces(tokenizer, conversations)
        self._sequences = [fit_length(e, max_length, truncation, o) for e, o in zip(encoded, origins, strict=True)]

    @classmethod
    def from_config(cls, data: Any, tokenizer: Any, split: Literal["train", "val"] = "train") -> SFTDataset:
        """Build from an SFT config's `data` group (`train_files` or `val_files` per `split`)."""
        return cls(
            data.train_files if split == "train" else data.val_files,
            tokenizer,
            prompt_key=data.prompt_key,
            response_key=data.response_key,
            prompt_dict_keys=data.prompt_dict_keys,
            response_dict_keys=data.response_dict_keys,
            multiturn=data.multiturn.enable,
            messages_key=data.multiturn.messages_key,
            max_length=data.max_length,
            truncation=data.truncation,
        )

    def __len__(self) -> int:
        """Number of conversations."""
        return len(self._sequences)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        """One conversation as left-padded input_ids, attention_mask, position_ids and loss_mask."""
        return padded_item(self._sequences[item], self.max_length, self.pad_id)
