"""The FSDP engine with a vision-language model: Qwen2.5-VL's own 3-D rotary positions under left padding, and
actor.freeze_vision_tower (one process; the 2-rank run is tests/integration/test_vision_grpo.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.engines.fsdp_engine import FSDPEngine
from hybridflow.models.tiny import build_tiny_model, build_tiny_vlm

VOCAB = 96
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = 92, 93, 94, 95


@pytest.fixture(scope="module")
def qwen_vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Qwen2.5-VL (no processor: its processor class needs torchvision, absent here)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config={"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 512,
                     "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]}, "tie_word_embeddings": False},
        vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56,
                       "fullatt_block_indexes": [0]},
        image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qwen_vl") / "model"
    Qwen2_5_VLForConditionalGeneration(config).save_pretrained(path)
    return path


def _image_inputs(seed: int) -> dict[str, Any]:
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    gen = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(56, 56, 3, generator=gen) * 255).to(torch.uint8).numpy()
    processor = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=56 * 56, patch_size=14, merge_size=2,
                                         temporal_patch_size=2)
    out = processor(images=[Image.fromarray(pixels)], return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def _prompt(text: list[int], inputs: dict[str, Any]) -> list[int]:
    tokens = int(inputs["image_grid_thw"].prod()) // 4  # 2 x 2 patches merge into one token
    return [*text[:2], VISION_START, *[IMAGE_PAD] * tokens, VISION_END, *text[2:]]


def test_qwen_vl_positions_under_left_padding_equal_each_row_alone(qwen_vl: Path) -> None:
    """The engine lets the model derive its 3-D positions from the image grids (`position_ids=None`, whatever a
    transformers version does with 1-D ones): a left-padded batch gives each row the logits it gets alone, which is
    what vLLM computes."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    engine = FSDPEngine(str(qwen_vl))
    assert engine.own_positions
    images = [_image_inputs(1), _image_inputs(2)]
    rows = [_prompt([5, 6, 7, 8, 9, 10, 11], images[0]), _prompt([12, 13, 14], images[1])]
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        batched = engine.forward(ids, mask, positions, multi_modal_inputs=images)
    reference = Qwen2_5_VLForConditionalGeneration.from_pretrained(qwen_vl).eval()
    for i, row in enumerate(rows):
        with torch.no_grad():
            alone = reference(input_ids=torch.tensor([row]), **images[i]).logits[0]
        assert torch.allclose(batched[i, -len(row):], alone, atol=1e-5), i


def test_freeze_vision_tower_keeps_the_encoder_out_of_the_optimizer(tmp_path: Path) -> None:
    path = build_tiny_vlm(tmp_path / "vlm")
    optim = {"lr": 1e-3}
    engine = FSDPEngine(str(path), optim_config=optim, freeze_vision_tower=True)
    frozen = {n for n, p in engine.module.named_parameters() if not p.requires_grad}
    assert frozen and all(".vision_model." in n for n in frozen)
    assert any("connector" in n and p.requires_grad for n, p in engine.module.named_parameters())
    optimized = {id(p) for group in engine.optimizer.param_groups for p in group["params"]}
    assert not any(id(p) in optimized for p in engine.module.model.vision_model.parameters())


def test_freeze_vision_tower_on_a_text_model_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = build_tiny_model(tmp_path / "text")
    with pytest.raises(ValueError, match="has no vision tower .* set it to false"):
        FSDPEngine(str(path), optim_config={"lr": 1e-3}, freeze_vision_tower=True)


def test_a_vlm_checkpoint_exports_to_a_folder_that_loads_with_its_processor(tmp_path: Path) -> None:
    """The checkpoint's huggingface/ holds the processor; the merger writes an image-text-to-text folder whose
    logits on an image prompt equal the engine's."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from hybridflow.data.toy_vision import COLORS, color_image
    from hybridflow.data.vision import decode_image, model_inputs
    from hybridflow.model_merger import merge
    from hybridflow.workers.ckpt_io import save_engine_checkpoint

    path = build_tiny_vlm(tmp_path / "vlm")
    engine = FSDPEngine(str(path), optim_config={"lr": 1e-2})
    processor = AutoProcessor.from_pretrained(path)
    import random

    image = decode_image({"bytes": color_image(COLORS["g"], random.Random(0))}, "test")
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}],
                                         add_generation_prompt=True, tokenize=False)
    ids, inputs = model_inputs(processor, text, [image])
    batch = torch.tensor([ids])
    mask = torch.ones_like(batch)
    engine.forward(batch, mask, mask.cumsum(-1) - 1, multi_modal_inputs=[inputs]).logsumexp(-1).mean().backward()
    engine.optimizer_step()
    with torch.no_grad():
        expected = engine.forward(batch, mask, mask.cumsum(-1) - 1, multi_modal_inputs=[inputs])
    save_engine_checkpoint(engine, str(tmp_path / "ckpt" / "actor"), ["model", "extra"])
    assert (tmp_path / "ckpt" / "actor" / "huggingface" / "processor_config.json").is_file()
    out = tmp_path / "export"
    merge(str(tmp_path / "ckpt" / "actor"), str(out))
    exported = AutoModelForImageTextToText.from_pretrained(out).eval()
    again = AutoProcessor.from_pretrained(out)
    assert again.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}],
                                     add_generation_prompt=True, tokenize=False) == text
    with torch.no_grad():
        logits = exported(input_ids=batch, attention_mask=mask, **inputs).logits
    assert torch.allclose(logits, expected, atol=1e-5)
