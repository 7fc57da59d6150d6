"""The toy tool task: the prompt asks for the value behind a key, and only the `lookup` tool knows it.

    user: value of c?
    assistant: <lookup call><eos>                 (model, mask 1)
    tool: e\\nassistant:                           (tool turn, mask 0)
    e                                              (model, mask 1; reward 1 when it equals the value)

Values are random letters independent of the key, so a model that answers without calling guesses
(right 1 time in 26); calling and copying the tool's answer earns 1. The toy tokenizer has the whole
Hermes call string as one token (as a BPE vocabulary has frequent strings), and `prepare` gives the
random model a prior of calling about `call_prior` of the time with a few supervised steps, standing in
for a pretrained model that knows the tool format: RL must teach it to call every time and to answer
with the tool's result.

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


def warm_start(model_dir: Path, rows: list[dict[str, Any]], call_prior: float, seed: int = 0) -> float:
    """Supervised steps until P(call | prompt) reaches `call_prior` and P(EOS | call) 0.95; returns P(call)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    call_id = tok.convert_tokens_to_ids(LOOKUP_CALL)
    texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows[:64]]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(p) for p in prompts) + 2
    ids = torch.full((len(prompts), width), tok.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left-padded prompt, then <call> <eos>
        seq = p + [call_id, tok.eos_token_id]
        ids[i, width - len(seq):] = torch.tensor(seq)
        mask[i, width - len(seq):] = 1
    torch.manual_seed(seed)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    prob = 0.0
    for _ in range(200):
        logits = model(input_ids=ids, attention_mask=mask).logits
        log_probs = torch.log_softmax(logits[:, -3:-1].float(), dim=-1)
        call_lp, eos_lp = log_probs[:, 0, call_id], log_probs[:, 1, tok.eos_token_id]
        prob, eos_prob = float(call_lp.detach().exp().mean()), float(eos_lp.detach().exp().mean())
        if prob >= call_prior and eos_prob >= 0.95:
            break
        # the call's end-of-turn is learnt fully; the call itself only up to the prior
        loss = -eos_lp.mean() - (call_lp.mean() if prob < call_prior else 0.0)
        optim.zero_grad()
        loss.backward()
        optim.step()
    model.save_pretrained(str(model_dir))
    return prob


def prepare(out: Path, call_prior: float = 0.4, n_train: int = 1024, n_val: int = 64) -> dict[str, str]:
    """Model (toy tokenizer + the call token, warm-started), data and tool config under `out`; the overrides."""
    from hybridflow.data.toy import build_toy_tokenizer, write_parquet
    from hybridflow.models.tiny import build_tiny_model

    out.mkdir(parents=True, exist_ok=True)
    train, val = build_rows(n_train, "train"), build_rows(n_val, "test")
    model_dir = out / "model"
    if not (model_dir / "config.json").exists():
        build_tiny_model(model_dir, build_toy_tokenizer(extra_words=[LOOKUP_CALL]))
        warm_start(model_dir, train, call_prior)
    (out / "data").mkdir(exist_ok=True)
    write_parquet(train, str(out / "data" / "train.parquet"))
    write_parquet(val, str(out / "data" / "test.parquet"))
    (out / "lookup_tool.yaml").write_text(TOOL_CONFIG, encoding="utf-8")
    return {
        "actor_rollout_ref.model.path": str(model_dir),
        "data.train_files": str(out / "data" / "train.parquet"),
        "data.val_files": str(out / "data" / "test.parquet"),
        "actor_rollout_ref.rollout.multi_turn.tool_config_path": str(out / "lookup_tool.yaml"),
        "trainer.default_local_dir": str(out / "checkpoints"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Write the tool task's model, data and tool config; print the overrides that point a run at them."""
    parser = argparse.ArgumentParser(prog="python -m hybridflow.data.toy_lookup", description=main.__doc__)
    parser.add_argument("--out", required=True, help="folder to write")
    parser.add_argument("--call-prior", type=float, default=0.4, help="P(call) the model starts with")
    args = parser.parse_args(argv)
    if not 0 < args.call_prior < 1:
        parser.error("--call-prior must be between 0 and 1")
    for key, value in prepare(Path(args.out), args.call_prior).items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
