"""A toy image task for vision-language runs on a CPU: name the colour of a plain image by its letter.

Each row's image (PNG bytes in verl's `images` column, as HF datasets stores them) is one plain colour with a
little noise; the prompt is `<image>colour?` and the answer the colour's letter (r, g, b, y, w), scored by the
`toy/color` scorer. A tiny vision-language model (`python -m hybridflow.models.tiny --arch idefics3`) learns it
from its pixels alone: the text is the same in every row.

    python -m hybridflow.data.toy_vision --n-train 256 --n-val 32 --out DIR
"""

from __future__ import annotations

import argparse
import io
import random
import sys
from collections.abc import Sequence
from typing import Any

from hybridflow.data.toy import write_parquet
from hybridflow.rewards import toy as toy_rewards

COLORS = {"r": (220, 30, 30), "g": (30, 200, 40), "b": (30, 40, 220), "y": (230, 220, 30), "w": (245, 245, 245)}
PROMPT = "<image>colour?"


def color_image(rgb: tuple[int, int, int], rng: random.Random, size: int = 56) -> bytes:
    """PNG bytes of a `size` x `size` image of colour `rgb`, each pixel moved by up to +-20 per channel."""
    from PIL import Image

    pixels = bytes(max(0, min(255, c + rng.randint(-20, 20))) for _ in range(size * size) for c in rgb)
    buffer = io.BytesIO()
    Image.frombytes("RGB", (size, size), pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def build_rows(n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """`n` rows in verl's layout with an `images` column (one image each)."""
    rng = random.Random(f"color/{split}/{seed}")
    rows = []
    for index in range(n):
        letter = rng.choice(sorted(COLORS))
        rows.append({
            "data_source": toy_rewards.COLOR,
            "prompt": [{"role": "user", "content": PROMPT}],
            "images": [{"bytes": color_image(COLORS[letter], rng), "path": None}],
            "ability": "toy",
            "reward_model": {"style": "rule", "ground_truth": letter},
            "extra_info": {"index": index, "split": split},
        })
    return rows


def generate(n_train: int, n_val: int, out: str, *, seed: int = 0) -> tuple[str, str]:
    """Write `out/train.parquet` and `out/test.parquet`; return their paths."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(out)
    fs.makedirs(root, exist_ok=True)
    train_path, test_path = f"{out.rstrip('/')}/train.parquet", f"{out.rstrip('/')}/test.parquet"
    write_parquet(build_rows(n_train, seed=seed, split="train"), train_path)
    write_parquet(build_rows(n_val, seed=seed, split="test"), test_path)
    return train_path, test_path


def main(argv: Sequence[str] | None = None) -> int:
    """Write the colour task's train/test parquet files; print their paths."""
    parser = argparse.ArgumentParser(prog="python -m hybridflow.data.toy_vision", description=main.__doc__)
    parser.add_argument("--n-train", type=int, default=256)
    parser.add_argument("--n-val", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="output folder (local path or fsspec URI)")
    args = parser.parse_args(argv)
    if args.n_train < 1 or args.n_val < 1:
        parser.error("--n-train and --n-val must be at least 1")
    for path in generate(args.n_train, args.n_val, args.out, seed=args.seed):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
