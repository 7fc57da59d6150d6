"""Toy tasks in verl's parquet format, and a tiny character-level tokenizer, for demos and tests.

The tasks have 1-3 token answers so a tiny randomly initialised model learns them with RL on a CPU in
minutes. Generation is deterministic: the same task, sizes and seed give byte-identical parquet files.

    python -m hybridflow.data.toy --task arithmetic --n-train 512 --n-val 64 --out DIR

writes ``DIR/train.parquet`` and ``DIR/test.parquet`` and prints their paths.
"""

from __future__ import annotations

import argparse
import random
import string
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hybridflow.rewards import toy as toy_rewards

# --- tasks ---------------------------------------------------------------------------------------------

Example = tuple[str, str]  # (user message, ground-truth answer)


def _arithmetic(rng: random.Random) -> Example:
    """Single-digit ``a+b`` or ``a-b``; answers -9..18."""
    a, b = rng.randrange(10), rng.randrange(10)
    if rng.random() < 0.5:
        return f"{a}+{b}=", str(a + b)
    return f"{a}-{b}=", str(a - b)


_COPY_ALPHABET = "abcde"


def _copy(rng: random.Random) -> Example:
    """Repeat a 1-3 letter string over a five-letter alphabet."""
    word = "".join(rng.choice(_COPY_ALPHABET) for _ in range(rng.randint(1, 3)))
    return f"copy {word}", word


def _count(rng: random.Random) -> Example:
    """How many times a letter occurs in a 3-8 letter string over ``ab``; answers 0-8."""
    letter = rng.choice("ab")
    word = "".join(rng.choice("ab") for _ in range(rng.randint(3, 8)))
    return f"count {letter} in {word}", str(word.count(letter))


TASKS: dict[str, tuple[str, Callable[[random.Random], Example]]] = {
    "arithmetic": (toy_rewards.ARITHMETIC, _arithmetic),
    "copy": (toy_rewards.COPY, _copy),
    "count": (toy_rewards.COUNT, _count),
}


def build_rows(task: str, n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """``n`` rows of ``task`` in verl's format (data_source, prompt, ability, reward_model, extra_info)."""
    if task not in TASKS:
        raise ValueError(f"unknown toy task {task!r}; choose one of {', '.join(TASKS)}")
    data_source, make = TASKS[task]
    # A string seed keeps train and test streams independent for the same integer seed.
    rng = random.Random(f"{task}/{split}/{seed}")
    rows = []
    for index in range(n):
        question, answer = make(rng)
        rows.append(
            {
                "data_source": data_source,
                "prompt": [{"role": "user", "content": question}],
                "ability": "toy",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"index": index, "split": split},
            }
        )
    return rows


def write_parquet(rows: Sequence[dict[str, Any]], path: str) -> None:
    """Write verl-format rows to ``path`` (a local path or fsspec URI) with a fixed schema."""
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(list(rows))
    with fsspec.open(path, "wb") as f:
        # No statistics/timestamps beyond the defaults: output bytes depend only on the rows.
        pq.write_table(table, f)


def write_tool_task(
    out: Path, model_dir: Path, train: Sequence[dict[str, Any]], val: Sequence[dict[str, Any]], tool_config: str,
    tool_config_name: str,
) -> dict[str, str]:
    """A tool-calling task's data (`out/data/{train,test}.parquet`) and verl tool config (`out/<name>`) beside
    its model; returns the overrides that point a run (model, data, tool config, checkpoints) at them."""
    (out / "data").mkdir(parents=True, exist_ok=True)
    write_parquet(train, str(out / "data" / "train.parquet"))
    write_parquet(val, str(out / "data" / "test.parquet"))
    (out / tool_config_name).write_text(tool_config, encoding="utf-8")
    return {
        "actor_rollout_ref.model.path": str(model_dir),
        "data.train_files": str(out / "data" / "train.parquet"),
        "data.val_files": str(out / "data" / "test.parquet"),
        "actor_rollout_ref.rollout.multi_turn.tool_config_path": str(out / tool_config_name),
        "trainer.default_local_dir": str(out / "checkpoints"),
    }


def generate(task: str, n_train: int, n_val: int, out: str, *, seed: int = 0) -> tuple[str, str]:
    """Write ``out/train.parquet`` and ``out/test.parquet`` for ``task``; return their paths."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(out)
    fs.makedirs(root, exist_ok=True)
    train_path, test_path = f"{out.rstrip('/')}/train.parquet", f"{out.rstrip('/')}/test.parquet"
    write_parquet(build_rows(task, n_train, seed=seed, split="train"), train_path)
    write_parquet(build_rows(task, n_val, seed=seed, split="test"), test_path)
    return train_path, test_path


# --- tokenizer ------------------------------------------------------------------------------------------

SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>")
_WORDS = ("user", "assistant", "system")  # whole-word tokens keep chat prompts short
_CHARS = string.digits + string.ascii_lowercase + string.ascii_uppercase + " \n+-*/=:.,?!()'\"#$%"

# Renders "<bos>user: 3+4=\nassistant: " for a single user turn; assistant turns end with <eos>.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def toy_vocab() -> dict[str, int]:
    """The toy tokenizer's vocabulary: special tokens, chat role words, then single characters."""
    tokens = [*SPECIAL_TOKENS, *_WORDS, *_CHARS]
    return {token: i for i, token in enumerate(tokens)}


def build_toy_tokenizer(path: str | None = None, extra_words: Sequence[str] = ()) -> Any:
    """A small character-level `PreTrainedTokenizerFast` (vocab < 128) with a chat template; saved to
    ``path`` when given (loadable with ``AutoTokenizer.from_pretrained(path)``).

    `extra_words` become whole tokens after the default vocabulary (the tool task's call string is one),
    as frequent strings are in a real BPE vocabulary.
    """
    import re

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = toy_vocab()
    for word in extra_words:
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Each word or single character is a piece (longest words first); the Fuse decoder joins pieces.
    words = sorted([*extra_words, *_WORDS], key=len, reverse=True)
    pattern = "|".join(re.escape(w) for w in words) + r"|[\s\S]"
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    if path is not None:
        tokenizer.save_pretrained(path)
    return tokenizer


# --- CLI ------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Write a toy task's train/test parquet files (and optionally the toy tokenizer); print the paths."""
    parser = argparse.ArgumentParser(prog="python -m hybridflow.data.toy", description=main.__doc__)
    parser.add_argument("--task", choices=sorted(TASKS), default="arithmetic")
    parser.add_argument("--n-train", type=int, default=512, help="training rows (default 512)")
    parser.add_argument("--n-val", type=int, default=64, help="test rows (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="output folder (local path or fsspec URI)")
    parser.add_argument("--tokenizer", help="also save the toy tokenizer to this folder")
    args = parser.parse_args(argv)
    if args.n_train < 1 or args.n_val < 1:
        parser.error("--n-train and --n-val must be at least 1")
    for path in generate(args.task, args.n_train, args.n_val, args.out, seed=args.seed):
        print(path)
    if args.tokenizer:
        build_toy_tokenizer(args.tokenizer)
        print(args.tokenizer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
