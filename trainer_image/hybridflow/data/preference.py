"""Preference data for offline DPO: (prompt, chosen, rejected) rows, tokenised in pairs; a toy preference task.

A row holds a prompt (a string, one user message, or chat messages) and two responses to it, each a
string or a list of assistant messages (TRL's standard and conversational formats). Each side becomes a
sequence as in SFT (`hybridflow.data.sft_dataset`): the prompt rendered with the chat template is
context, the response's turn is learned. Items hold `chosen_*` and `rejected_*` tensors (input_ids,
attention_mask, position_ids, loss_mask), each left-padded to `data.max_length`.

    python -m hybridflow.data.preference --task copy --n-train 512 --n-val 64 --out DIR

writes a toy preference task built from `hybridflow.data.toy` (chosen: the right answer; rejected: another
row's answer that is wrong for this prompt) to ``DIR/train.parquet`` and ``DIR/test.parquet``. Tasks: the
toy ones (`copy`, `arithmetic`, `count`) and `copy_letter`, the demo's one-letter copy task, which a tiny
random-init model learns by DPO alone in a minute on a CPU (`examples/tiny_dpo.yaml`).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from typing import Any, Literal

import torch

from hybridflow.data.sft_dataset import (
    TRUNCATIONS,
    Encoded,
    Truncation,
    as_messages,
    check_tokenizer,
    column,
    conversation_pieces,
    encode_pieces,
    fit_length,
    padded_item,
    read_rows,
)

SIDES = ("chosen", "rejected")


class PreferenceDataset(torch.utils.data.Dataset):
    """Tokenised (chosen, rejected) pairs from a preference parquet."""

    def __init__(
        self,
        files: str | Sequence[str],
        tokenizer: Any,
        *,
        prompt_key: str = "prompt",
        chosen_key: str = "chosen",
        rejected_key: str = "rejected",
        max_length: int = 1024,
        truncation: Truncation = "error",
    ) -> None:
        """Read and tokenise every pair now, so bad rows are reported before training starts."""
        if truncation not in TRUNCATIONS:
            raise ValueError(f"data.truncation={truncation!r} is not known; use one of {', '.join(TRUNCATIONS)}")
        self.pad_id = check_tokenizer(tokenizer)
        self.max_length = max_length
        rows, origins = read_rows(files, "preference files")
        keys = {"chosen": (chosen_key, "data.chosen_key"), "rejected": (rejected_key, "data.rejected_key")}
        conversations = []
        for row, origin in zip(rows, origins, strict=True):
            prompt = as_messages(column(row, prompt_key, (), origin, "data.prompt_key"), "user", "the prompt", origin)
            for side in SIDES:
                key, setting = keys[side]
                response = as_messages(column(row, key, (), origin, setting), "assistant", f"the {side} response", origin)
                conversations.append(conversation_pieces(tokenizer, [*prompt, *response], len(prompt), origin))
        encoded = encode_pieces(tokenizer, conversations)
        self._pairs: list[tuple[Encoded, Encoded]] = []
        for i, origin in enumerate(origins):
            chosen, rejected = (fit_length(e, max_length, truncation, origin) for e in encoded[2 * i : 2 * i + 2])
            self._pairs.append((chosen, rejected))

    @classmethod
    def from_config(cls, data: Any, tokenizer: Any, split: Literal["train", "val"] = "train") -> PreferenceDataset:
        """Build from a DPO config's `data` group (`train_files` or `val_files` per `split`)."""
        return cls(
            data.train_files if split == "train" else data.val_files,
            tokenizer,
            prompt_key=data.prompt_key,
            chosen_key=data.chosen_key,
            rejected_key=data.rejected_key,
            max_length=data.max_length,
            truncation=data.truncation,
        )

    def __len__(self) -> int:
        """Number of pairs."""
        return len(self._pairs)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        """One pair: chosen_* and rejected_* input_ids, attention_mask, position_ids and loss_mask."""
        chosen, rejected = self._pairs[item]
        return {
            **padded_item(chosen, self.max_length, self.pad_id, "chosen_"),
            **padded_item(rejected, self.max_length, self.pad_id, "rejected_"),
        }


# --- a toy preference task ------------------------------------------------------------------------------


def build_preference_rows(rows: Sequence[dict[str, Any]], *, seed: int = 0) -> list[dict[str, Any]]:
    """Preference rows from verl-format rows with `reward_model.ground_truth`: chosen is the right answer,
    rejected another row's answer that differs from it (a plausible mistake), picked with `seed`.

    The other columns (data_source, ability, reward_model, extra_info) are kept, so the rows can also be scored.
    """
    answers = sorted({str(row["reward_model"]["ground_truth"]) for row in rows})
    if len(answers) < 2:
        raise ValueError(f"the rows have {len(answers)} distinct answer(s); a wrong answer needs at least two")
    rng = random.Random(f"preference/{seed}")
    out = []
    for row in rows:
        truth = str(row["reward_model"]["ground_truth"])
        wrong = rng.choice([a for a in answers if a != truth])
        out.append({**row, "chosen": truth, "rejected": wrong})
    return out


TASKS = ("arithmetic", "copy", "copy_letter", "count")


def task_rows(task: str, n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """`n` verl-format rows of a toy task (`hybridflow.data.toy`) or of the demo's `copy_letter` task."""
    if task == "copy_letter":
        from hybridflow.demo import build_copy_letter_rows

        return build_copy_letter_rows(n, split, seed)
    from hybridflow.data.toy import build_rows

    return build_rows(task, n, seed=seed, split=split)


def generate(task: str, n_train: int, n_val: int, out: str, *, seed: int = 0) -> tuple[str, str]:
    """Write ``out/train.parquet`` and ``out/test.parquet`` of a toy task's preference pairs; return the paths."""
    import fsspec

    from hybridflow.data.toy import write_parquet

    if task not in TASKS:
        raise ValueError(f"unknown toy task {task!r}; choose one of {', '.join(TASKS)}")
    fs, root = fsspec.core.url_to_fs(out)
    fs.makedirs(root, exist_ok=True)
    paths = f"{out.rstrip('/')}/train.parquet", f"{out.rstrip('/')}/test.parquet"
    for path, split, n in ((paths[0], "train", n_train), (paths[1], "test", n_val)):
        write_parquet(build_preference_rows(task_rows(task, n, seed=seed, split=split), seed=seed), path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """Write a toy task's preference pairs (chosen right, rejected wrong); print the paths."""
    parser = argparse.ArgumentParser(prog="python -m hybridflow.data.preference", description=main.__doc__)
    parser.add_argument("--task", choices=TASKS, default="copy")
    parser.add_argument("--n-train", type=int, default=512, help="training pairs (default 512)")
    parser.add_argument("--n-val", type=int, default=64, help="test pairs (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="output folder (local path or fsspec URI)")
    args = parser.parse_args(argv)
    if args.n_train < 1 or args.n_val < 1:
        parser.error("--n-train and --n-val must be at least 1")
    for path in generate(args.task, args.n_train, args.n_val, args.out, seed=args.seed):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
