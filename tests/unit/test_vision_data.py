"""Image prompts (hybridflow.data.vision, RLHFDataset with a processor): placing, decoding, lengths, refusals."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from hybridflow.config import ConfigError
from hybridflow.data import vision
from hybridflow.data.dataset import RLHFDataset, collate_fn
from hybridflow.data.toy import build_toy_tokenizer, write_parquet
from hybridflow.data.toy_vision import build_rows
from hybridflow.models.tiny import build_tiny_vlm
from hybridflow.rollout.token_io import prompt_images, prompt_token_lists
from hybridflow.trainer.main_ppo import load_run_config, multimodal_problem


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model")


def _png(color: tuple[int, int, int] = (255, 0, 0)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (30, 20), color).save(buffer, format="PNG")
    return buffer.getvalue()


def test_each_image_marker_becomes_an_image_part_in_order() -> None:
    messages = [{"role": "system", "content": "look"}, {"role": "user", "content": "a<image>b<image>"}]
    placed = vision.place_images(messages, 2, "row 0")
    assert placed[0] == messages[0]
    assert placed[1]["content"] == [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"},
                                    {"type": "image"}]


def test_a_marker_count_unlike_the_image_count_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match=r"marks 1 image\(s\).*the row has 2"):
        vision.place_images([{"role": "user", "content": "<image>?"}], 2, "row 3")


def test_images_decode_from_hf_dicts_paths_and_bytes(tmp_path: Path) -> None:
    path = tmp_path / "a.png"
    path.write_bytes(_png((0, 0, 255)))
    for cell in ({"bytes": _png((0, 0, 255)), "path": None}, {"bytes": None, "path": str(path)}, str(path)):
        image = vision.decode_image(cell, "row 0")
        assert image.mode == "RGB" and image.getpixel((0, 0)) == (0, 0, 255)


def test_an_unreadable_image_says_which_row_and_what_to_store() -> None:
    with pytest.raises(ValueError, match=r"row 7, images\[0\]: the image cannot be read"):
        vision.row_images({"images": [{"bytes": b"not a png"}]}, "images", "row 7")
    with pytest.raises(ValueError, match="must be a"):
        vision.decode_image(3, "row 0")


def test_the_engine_gets_one_placeholder_per_image_and_the_trainer_the_expansion(vlm: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    write_parquet(build_rows(4), str(tmp_path / "train.parquet"))
    tok = AutoTokenizer.from_pretrained(vlm)
    processor = vision.load_processor(str(vlm))
    ds = RLHFDataset(str(tmp_path / "train.parquet"), tok, processor=processor, max_prompt_length=32)
    item = ds[0]
    image_id = tok.convert_tokens_to_ids("<image>")
    assert item["raw_prompt_ids"].count(image_id) == 1  # vLLM expands it itself
    assert item["input_ids"].tolist().count(image_id) == 4  # 56x56 / 14-pixel patches / scale 2
    assert item["multi_modal_inputs"]["pixel_values"].shape == (1, 1, 3, 56, 56)
    assert "images" not in item
    batch = collate_fn([ds[0], ds[1]])
    assert prompt_token_lists(batch)[0] == item["raw_prompt_ids"]
    assert [len(images) for images in prompt_images(batch)] == [1, 1]


def test_a_prompt_whose_image_tokens_overflow_is_refused_not_cut(vlm: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    write_parquet(build_rows(2), str(tmp_path / "train.parquet"))
    tok = AutoTokenizer.from_pretrained(vlm)
    with pytest.raises(ValueError, match="longer than data.max_prompt_length=16"):
        RLHFDataset(str(tmp_path / "train.parquet"), tok, processor=vision.load_processor(str(vlm)),
                    max_prompt_length=16, truncation="left")


def test_images_for_a_text_model_are_refused_with_the_fix(tmp_path: Path) -> None:
    write_parquet(build_rows(2), str(tmp_path / "train.parquet"))
    with pytest.raises(ValueError, match="text-only model"):
        RLHFDataset(str(tmp_path / "train.parquet"), build_toy_tokenizer(), max_prompt_length=32)


def test_a_text_model_has_no_processor_and_no_placeholder_tokens(tmp_path: Path) -> None:
    from transformers import AutoConfig

    from hybridflow.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "text")
    assert vision.load_processor(str(path)) is None
    assert vision.placeholder_token_ids(AutoConfig.from_pretrained(path)) == []


def test_the_vlm_bans_its_image_token_only(vlm: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    ids = vision.placeholder_token_ids(AutoConfig.from_pretrained(vlm))
    assert ids == [AutoTokenizer.from_pretrained(vlm).convert_tokens_to_ids("<image>")]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("actor_rollout_ref.rollout.name=hf", "rollout.name=vllm"),
        ("algorithm.adv_estimator=gae", "critic (GAE)"),
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "Ulysses"),
    ],
)
def test_what_image_prompts_lack_here_is_refused_before_ray_starts(override: str, named: str) -> None:
    repo = Path(__file__).resolve().parents[2]
    cfg = load_run_config([str(repo / "examples" / "tiny_grpo_vision.yaml"), override])[0]
    assert named in (multimodal_problem(cfg) or "")
    assert multimodal_problem(load_run_config([str(repo / "examples" / "tiny_grpo_vision.yaml")])[0]) is None


def test_image_prompts_in_multi_turn_loops_are_refused_by_the_config_when_the_image_column_is_named() -> None:
    repo = Path(__file__).resolve().parents[2]
    example = str(repo / "examples" / "tiny_grpo_vision.yaml")
    with pytest.raises(ConfigError, match=r"image prompts in multi-turn agent loops .*multi_turn.enable=false"):
        load_run_config([example, "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.multi_turn.enable=true"])
    # server mode's single-turn loop carries images
    assert multimodal_problem(load_run_config([example, "actor_rollout_ref.rollout.mode=async"])[0]) is None
