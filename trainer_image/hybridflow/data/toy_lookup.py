"""The toy tool task: the prompt asks for the value behind a key, and only the `lookup` tool knows it.

    user: value of c?
    assistant: <lookup call><eos>                 (model, mask 1)
    tool: e\\nassistant:                           (tool turn, mask 0)
    e                                              (model, mask 1; reward 1 when it equals the value)

Values are random letters independent of the key, so a model that answers without calling guesses
(right 1 time in 26); calling and copying the tool's answer earns 1. The toy tokenizer has the whole
Hermes call string as one token (as a BPE vocabulary has frequent strings). `prepare` warm-starts the
random model with a few supervised steps, standing in for a pretrained model that knows the tool format
but has poor habits (`PRIORS`): it calls 15% of the time, otherwise guesses (the key itself, 60%), and
copies a tool's answer 70% of the time. Its sampled reward starts near 0.14 and its greedy reward near
1/26 (greedy, it guesses); RL must teach it to call every time and to answer with the tool's result.

    python -m hybridflow.data.toy_lookup --out outputs/tool_demo    # writes model, data, tool config
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybridflow.rewards.toy import LOOKUP

LOOKUP_CALL = '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>'
KEYS = "abcde"
VALUES = "abcdefghijklmnopqrstuvwxyz"  # a guess is right 1 time in 26: only calling the tool pays
# What the warm start teaches (the position predicting each token): P(call | prompt), P(EOS | call),
# P(the tool's value | its turn), P(the key as a guess | prompt), P(EOS | guess).
HABITS = ("call", "eos_after_call", "copy", "guess", "eos_after_guess")
PRIORS = {"call": 0.15, "copy": 0.7, "guess": 0.6}
TOOL_CONFIG = """tools:
  - class_name: hybridflow.tools.lookup.LookupTool
    config: {type: native, timeout: 10}
"""


def build_rows(n: int, split: str, seed: int = 0) -> list[dict[str, Any]]:
    """Verl-format rows with `agent_name: tool_agent` and the lookup table in `extra_info.tools_kwargs`."""
    rng = random.Random(f"lookup/{split}/{seed}")
    rows = []
    for index in range(n):
        key, value = rng.choice(KEYS), rng.choice(VALUES)
        rows.append({
            "data_source": LOOKUP,
            "prompt": [{"role": "user", "content": f"value of {key}?"}],
            "ability": "toy",
            "agent_name": "tool_agent",
            "reward_model": {"style": "rule", "ground_truth": value},
            "extra_info": {"index": index, "split": split,
                           "tools_kwargs": {"lookup": {"create_kwargs": {"table": {key: value}, "key": key}}}},
        })
    return rows


def warm_start(model_dir: Path, rows: list[dict[str, Any]], priors: dict[str, float], seed: int = 0) -> dict[str, float]:
    """Supervised steps that give the random model each habit of `HABITS` with the probability `priors`
    names (the rest at 0.95); returns the probabilities reached (means over 128 rows).

    The sequences are those the tool agent loop builds: the prompt rendered with the tool schema, then
    either the call, EOS, the tool turn rendered by `turn_ids` and the value, or a guess (the key) and EOS.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.agent.chat import render_ids, turn_ids
    from hybridflow.tools.lookup import LookupTool

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    call_id, eos = tok.convert_tokens_to_ids(LOOKUP_CALL), tok.eos_token_id
    schema = LookupTool({}, None).tool_schema.model_dump(exclude_none=True)

    def letter(text: str) -> int:
        (token,) = tok(text, add_special_tokens=False)["input_ids"]
        return token

    seqs: list[list[int]] = []
    spots: dict[str, list[tuple[int, int]]] = {h: [] for h in HABITS}  # habit -> (sequence, position)
    for row in rows[:128]:
        value, key = row["reward_model"]["ground_truth"], row["extra_info"]["tools_kwargs"]["lookup"]["create_kwargs"]["key"]
        prompt = render_ids(tok, row["prompt"], tools=[schema])
        n = len(prompt)
        call = prompt + [call_id, eos] + turn_ids(tok, [{"role": "tool", "content": value}]) + [letter(value)]
        spots["call"].append((len(seqs), n - 1))
        spots["eos_after_call"].append((len(seqs), n))
        spots["copy"].append((len(seqs), len(call) - 2))
        seqs.append(call)
        spots["guess"].append((len(seqs), n - 1))
        spots["eos_after_guess"].append((len(seqs), n))
        seqs.append(prompt + [letter(key), eos])
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, seq in enumerate(seqs):  # right-padded: positions count from each sequence's start
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
    index = {h: torch.tensor(v) for h, v in spots.items()}
    targets = {h: priors.get(h, 0.95) for h in HABITS}
    torch.manual_seed(seed)
    optim = torch.optim.Adam(model.parameters(), lr=3e-3)
    reached = dict.fromkeys(HABITS, 0.0)
    for _ in range(600):
        log_probs = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
        lps = {h: log_probs[i[:, 0], i[:, 1], ids[i[:, 0], i[:, 1] + 1]] for h, i in index.items()}
        reached = {h: float(v.detach().exp().mean()) for h, v in lps.items()}
        if all(abs(reached[h] - targets[h]) < 0.03 for h in HABITS):
            break
        # binary cross-entropy against each habit's prior: its minimum is P = prior, so the warm start
        # learns each habit that far and no further, and RL has to do the rest
        loss = sum(-(t * lps[h] + (1 - t) * torch.log1p(-lps[h].exp().clamp(max=1 - 1e-6))).mean()
                   for h, t in targets.items())
        optim.zero_grad()
        loss.backward()
        optim.step()
    model.save_pretrained(str(model_dir))
    return reached


def prepare(out: Path, priors: dict[str, float] | None = None, n_train: int = 1024, n_val: int = 64) -> dict[str, str]:
    """Model (toy tokenizer + the call token, warm-started), data and tool config under `out`; the overrides."""
    from hybridflow.data.toy import build_toy_tokenizer, write_tool_task
    from hybridflow.models.tiny import build_tiny_model

    out.mkdir(parents=True, exist_ok=True)
    train, val = build_rows(n_train, "train"), build_rows(n_val, "test")
    model_dir = out / "model"
    if not (model_dir / "config.json").exists():
        build_tiny_model(model_dir, build_toy_tokenizer(extra_words=[LOOKUP_CALL]))
        warm_start(model_dir, train, {**PRIORS, **(priors or {})})
    return write_tool_task(out, model_dir, train, val, TOOL_CONFIG, "lookup_tool.yaml")


def main(argv: Sequence[str] | None = None) -> int:
    """Write the tool task's model, data and tool config; print the overrides that point a run at them."""
    parser = argparse.ArgumentParser(prog="python -m hybridflow.data.toy_lookup", description=main.__doc__)
    parser.add_argument("--out", required=True, help="folder to write")
    for habit in ("call", "copy", "guess"):
        parser.add_argument(f"--{habit}-prior", type=float, default=PRIORS[habit],
                            help=f"P({habit}) the warm-started model starts with (default {PRIORS[habit]})")
    args = parser.parse_args(argv)
    priors = {h: getattr(args, f"{h}_prior") for h in ("call", "copy", "guess")}
    if not all(0 < p < 1 for p in priors.values()):
        parser.error("--call-prior, --copy-prior and --guess-prior must be between 0 and 1")
    for key, value in prepare(Path(args.out), priors).items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
