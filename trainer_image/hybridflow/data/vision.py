"""Image prompts (verl's `data.image_key`): decoding a row's images, placing them in its chat, and the model's
processor that turns text + images into token ids and pixel tensors.

A row of verl-layout parquet names its images in the `image_key` column (verl's default `images`): a list of
HF-datasets image dicts (`{"bytes": ..., "path": ...}`), file paths, raw bytes or PIL images. Each `<image>` in the
prompt's message text marks where one goes, in order (a message without any gets none; the counts must match).

Two token sequences come out of one prompt, as in verl:
- `raw_prompt_ids`: the rendered chat with one image placeholder per image, what vLLM / SGLang take together with
  the images (`multi_modal_data`): the engine runs the same processor and expands each placeholder itself;
- `input_ids`: the processor's expansion (one token per image feature), what the trainer's forward sees beside
  the processor's tensors (`multi_modal_inputs`: pixel values, image grids, ...).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

IMAGE_PLACEHOLDER = "<image>"
#: processor outputs that are not model inputs of their own (the trainer builds ids and masks itself)
TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def load_processor(path: str, trust_remote_code: bool = False) -> Any:
    """The model folder's multimodal processor (text + images), or None for a text-only model."""
    from transformers import AutoProcessor, PreTrainedTokenizerBase

    try:
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError, AttributeError, ImportError) as exc:
        if _is_text_only(path, trust_remote_code):
            return None
        raise ValueError(
            f"cannot load the image processor of {path!r} ({type(exc).__name__}: {exc}). Its processor may need a "
            "package this environment lacks: Qwen2-VL, Qwen2.5-VL, Qwen3-VL and GLM-4.1V processors need torchvision "
            "(install the build matching torch), a trust_remote_code one needs "
            "actor_rollout_ref.model.trust_remote_code=true"
        ) from exc
    if isinstance(processor, PreTrainedTokenizerBase) or getattr(processor, "image_processor", None) is None:
        return None
    return processor


def save_processor(source: str, folder: str) -> None:
    """Beside a checkpoint's or an export's tokenizer: the vision-language model's processor from `source` (image
    processor, processor and chat template), so the folder loads with AutoProcessor; nothing for a text model. One
    that cannot be loaded here (e.g. it needs torchvision) is logged, not raised: the weights are what matters."""
    try:
        processor = load_processor(source)
    except ValueError as exc:
        logger.warning("the image processor of %s is not saved with the weights: %s", source, exc)
        return
    if processor is not None:
        processor.save_pretrained(folder)


def _is_text_only(path: str, trust_remote_code: bool) -> bool:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return True
    return not is_vision_config(config)


def is_vision_config(config: Any) -> bool:
    """Whether an HF model config describes a vision-language model (it has a vision tower's config)."""
    return getattr(config, "vision_config", None) is not None


#: added to the logits of a vision-language model's placeholder tokens, by the rollout (vLLM's logit_bias) and by
#: the trainer alike, so that both compute the same policy and never sample them
PLACEHOLDER_LOGIT_BIAS = -100.0


#: where vision-language models keep their vision encoder, on the model or its backbone (`model.model`)
VISION_TOWERS = ("visual", "vision_tower", "vision_model")


def vision_tower(model: Any) -> Any:
    """A vision-language model's vision encoder module (Qwen-VL's `visual`, LLaVA's `vision_tower`, Idefics3's
    `vision_model`), or None."""
    for owner in (model, getattr(model, "model", None)):
        for name in VISION_TOWERS:
            tower = getattr(owner, name, None) if owner is not None else None
            if tower is not None:
                return tower
    return None


def placeholder_token_ids(config: Any) -> list[int]:
    """The token ids a vision-language model replaces with image (or video) features wherever they appear (HF finds
    them by id): a rollout must not sample them, or the trainer would take a generated one for an image. The
    policy is the model with PLACEHOLDER_LOGIT_BIAS on them, in the rollout and the trainer."""
    if not is_vision_config(config):
        return []
    names = ("image_token_id", "image_token_index", "video_token_id", "video_token_index")
    return sorted({int(v) for v in (getattr(config, n, None) for n in names) if isinstance(v, int) and v >= 0})


def model_placeholder_token_ids(path: str) -> list[int]:
    """`placeholder_token_ids` of the model at `path`: a folder, or a hub id already in the local cache (the engine
    downloaded it); never a download of its own. [] when its config cannot be read that way."""
    from transformers import AutoConfig

    try:
        return placeholder_token_ids(AutoConfig.from_pretrained(path, local_files_only=True))
    except (OSError, ValueError):
        return []


def placeholder_bias(config: Any, vocab_size: int, device: Any = None) -> Any:
    """The (vocab_size,) logit bias of `placeholder_token_ids`, or None for a text model."""
    import torch

    ids = [i for i in placeholder_token_ids(config) if i < vocab_size]
    if not ids:
        return None
    bias = torch.zeros(vocab_size, device=device)
    bias[ids] = PLACEHOLDER_LOGIT_BIAS
    return bias


def decode_image(value: Any, where: str) -> Any:
    """One image cell as an RGB PIL image: an HF-datasets dict (bytes or path), a path, bytes or a PIL image."""
    from PIL import Image

    if isinstance(value, Image.Image):
        image = value
    else:
        if isinstance(value, dict):
            data = value.get("bytes") or value.get("path") or value.get("image")
        else:
            data = value
        if isinstance(data, Image.Image):
            image = data
        elif isinstance(data, (bytes, bytearray)):
            image = _open(io.BytesIO(data), where)
        elif isinstance(data, str) and data:
            image = _open(data, where)
        else:
            raise ValueError(
                f"{where}: an image must be a {{'bytes': ...}} or {{'path': ...}} dict (HF datasets' Image), a file "
                f"path, bytes or a PIL image; got {type(value).__name__}"
            )
    return image.convert("RGB")


def _open(source: Any, where: str) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(source)
        image.load()
    except (OSError, UnidentifiedImageError) as exc:
        raise ValueError(f"{where}: the image cannot be read ({exc}); store PNG/JPEG bytes or a readable path") from exc
    return image


def row_images(row: dict[str, Any], image_key: str, where: str) -> list[Any]:
    """The row's images, decoded (an empty list when the column is absent or empty)."""
    cell = row.get(image_key)
    if cell is None:
        return []
    if not isinstance(cell, (list, tuple)):
        cell = [cell]
    return [decode_image(v, f"{where}, {image_key}[{i}]") for i, v in enumerate(cell)]


def place_images(messages: Sequence[dict[str, Any]], count: int, where: str) -> list[dict[str, Any]]:
    """The chat with each `<image>` in a message's text replaced by an image part (processor chat templates
    render `{"type": "image"}` as the model's own image token); `count` images must be marked."""
    placed: list[dict[str, Any]] = []
    marked = 0
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str) or IMAGE_PLACEHOLDER not in content:
            placed.append(dict(message))
            continue
        parts: list[dict[str, Any]] = []
        for i, text in enumerate(content.split(IMAGE_PLACEHOLDER)):
            if i > 0:
                parts.append({"type": "image"})
                marked += 1
            if text:
                parts.append({"type": "text", "text": text})
        placed.append({**message, "content": parts})
    if marked != count:
        raise ValueError(
            f"{where}: the prompt marks {marked} image(s) with {IMAGE_PLACEHOLDER!r} but the row has {count}; put one "
            f"{IMAGE_PLACEHOLDER} in the message text where each image goes"
        )
    return placed


def model_inputs(processor: Any, text: str, images: Sequence[Any]) -> tuple[list[int], dict[str, Any]]:
    """The processor's expanded token ids of one rendered prompt with its images, and its other tensors (the
    model's `multi_modal_inputs`: pixel values, image grids, ...)."""
    out = processor(text=[text], images=[list(images)], return_tensors="pt")  # one prompt's images, nested
    ids = out["input_ids"][0].tolist()
    return ids, {k: v for k, v in out.items() if k not in TEXT_KEYS}
