"""Prompt dataset over verl-format parquet files, and the collate function that builds a `DataProto`.

A row holds ``data_source`` (which scorer grades it), ``prompt`` (chat messages), ``ability``,
``reward_model`` (``{"style": "rule", "ground_truth": ...}``) and ``extra_info`` (``index``, ``split``,
...). Prompts are rendered with the tokenizer's chat template (generation prompt added), tokenised once
at construction (so overlong prompts are reported or filtered before training starts) and left-padded
to ``max_prompt_length`` per item, as rollout engines expect the prompt to end where generation starts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

from hybridflow.data import vision
from hybridflow.protocol import DataProto

logger = logging.getLogger(__name__)

Truncation = Literal["error", "left", "right", "middle"]
TRUNCATIONS: tuple[str, ...] = ("error", "left", "right", "middle")


def _as_file_list(files: str | Sequence[str]) -> list[str]:
    """Normalise one path/URI or a sequence of them (including OmegaConf lists) into a list."""
    if isinstance(files, str):
        return [files]
    paths = [str(f) for f in files]
    if not paths:
        raise ValueError("no parquet files given: set data.train_files / data.val_files to a path or a list.")
    return paths


def _where(origin: tuple[str, int]) -> str:
    return f"row {origin[1]} of {origin[0]!r}"


def read_parquet_rows(files: str | Sequence[str]) -> tuple[list[dict[str, Any]], list[tuple[str, int]]]:
    """Read every row of the parquet files (paths or fsspec URIs such as ``s3://``) as Python dicts.

    Returns the rows and, for each, its (file, row-in-file) origin, used in error messages.
    """
    import fsspec
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    origins: list[tuple[str, int]] = []
    for path in _as_file_list(files):
        try:
            with fsspec.open(path, "rb") as f:
                table = pq.read_table(f)
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                f"parquet file {path!r} not found; check data.train_files / data.val_files "
                "(e.g. generate a toy set with `python -m hybridflow.data.toy --out DIR`)."
            ) from exc
        file_rows = table.to_pylist()
        rows.extend(file_rows)
        origins.extend((path, i) for i in range(len(file_rows)))
    return rows, origins


def truncate_ids(ids: list[int], max_length: int, side: str) -> list[int]:
    """Cut ``ids`` to ``max_length`` tokens, keeping the end (``left``), start (``right``) or both ends
    (``middle``: the first half and the last half)."""
    if len(ids) <= max_length:
        return ids
    if side == "left":
        return ids[-max_length:]
    if side == "right":
        return ids[:max_length]
    if side == "middle":
        head = max_length // 2
        tail = max_length - head
        return ids[:head] + (ids[-tail:] if tail else [])
    raise ValueError(f"data.truncation={side!r} cannot cut a prompt; use one of left, right, middle.")


def left_pad(
    ids: list[int], length: int, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad ``ids`` to ``length``: (input_ids, attention_mask, position_ids), each a LongTensor."""
    pad = length - len(ids)
    input_ids = torch.tensor([pad_token_id] * pad + ids, dtype=torch.long)
    attention_mask = torch.tensor([0] * pad + [1] * len(ids), dtype=torch.long)
    # Positions count real tokens only, so a left-padded prompt gets the positions it would unpadded.
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=0) - 1, min=0)
    return input_ids, attention_mask, position_ids


class RLHFDataset(torch.utils.data.Dataset):
    """Chat prompts from verl-format parquet, tokenised and left-padded to ``max_prompt_length``."""

    def __init__(
        self,
        files: str | Sequence[str],
        tokenizer: Any,
        *,
        prompt_key: str = "prompt",
        max_prompt_length: int = 512,
        truncation: Truncation = "error",
        filter_overlong_prompts: bool = False,
        return_raw_chat: bool = False,
        return_full_prompt: bool = False,
        apply_chat_template_kwargs: dict[str, Any] | None = None,
        processor: Any = None,
        image_key: str = "images",
    ) -> None:
        """Read, render and tokenise every prompt; filter or check overlong ones now, not mid-training.

        ``apply_chat_template_kwargs`` go to every ``tokenizer.apply_chat_template`` call (verl's
        data.apply_chat_template_kwargs); ``return_full_prompt`` adds the rendered text as ``full_prompts``.
        With a vision-language model's ``processor``, rows with images in ``image_key`` become image prompts
        (see hybridflow.data.vision); their length is the processor's, image tokens included.
        """
        if truncation not in TRUNCATIONS:
            raise ValueError(
                f"data.truncation={truncation!r} is not known; use one of {', '.join(TRUNCATIONS)}."
            )
        if max_prompt_length < 1:
            raise ValueError(f"data.max_prompt_length={max_prompt_length} must be at least 1.")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the tokenizer has no chat template, so chat prompts cannot be rendered; use an instruct "
                "model's tokenizer or set tokenizer.chat_template before building the dataset."
            )
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad_id is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token.")
        self.tokenizer = tokenizer
        self.pad_token_id = int(pad_id)
        self.prompt_key = prompt_key
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.return_raw_chat = return_raw_chat
        self.return_full_prompt = return_full_prompt
        self.apply_chat_template_kwargs = dict(apply_chat_template_kwargs or {})
        self.processor = processor
        self.image_key = image_key

        rows, origins = read_parquet_rows(files)
        messages = [self._messages(row, origin) for row, origin in zip(rows, origins, strict=True)]
        images = self._images(rows, origins)
        messages = [vision.place_images(m, len(imgs), _where(o)) if imgs else m
                    for m, imgs, o in zip(messages, images, origins, strict=True)]
        texts = self._render(messages, images)
        placeholder_ids = self._tokenize(texts)  # an image prompt's: one placeholder per image, what the engine takes
        token_ids = [vision.model_inputs(self.processor, t, imgs)[0] if imgs else ids  # the processor's expansion
                     for t, imgs, ids in zip(texts, images, placeholder_ids, strict=True)]
        keep = [i for i, ids in enumerate(token_ids) if len(ids) <= max_prompt_length]
        self.num_filtered = 0
        if filter_overlong_prompts:
            self.num_filtered = len(rows) - len(keep)
            logger.info(
                "dropped %d of %d prompts longer than data.max_prompt_length=%d",
                self.num_filtered,
                len(rows),
                max_prompt_length,
            )
        else:
            keep = list(range(len(rows)))
            if truncation == "error" or any(images):  # cutting an image's tokens would break the prompt
                self._raise_if_overlong(token_ids, origins)
        self._rows = [rows[i] for i in keep]
        self._images_list = [images[i] for i in keep]
        self._placeholder_ids = [placeholder_ids[i] if images[i] else None for i in keep]
        self._messages_list = [messages[i] for i in keep]
        self._texts = [texts[i] for i in keep]
        self._ids = [truncate_ids(token_ids[i], max_prompt_length, truncation) for i in keep]
        self._positions = keep
        if not self._rows:
            raise ValueError(
                f"no prompts left out of {len(rows)}: all are longer than data.max_prompt_length="
                f"{max_prompt_length} tokens; raise it or turn off data.filter_overlong_prompts."
            )

    @classmethod
    def from_config(
        cls, cfg: Any, tokenizer: Any, split: Literal["train", "val"] = "train", processor: Any = None
    ) -> Any:
        """The configured dataset over ``train_files`` or ``val_files`` per ``split`` (``cfg.data`` read by
        attribute): this class, or the user's ``data.custom_cls`` when it names one. ``processor``: the
        vision-language model's (`hybridflow.data.vision.load_processor`), None for a text model."""
        data = cfg.data
        files = data.train_files if split == "train" else data.val_files
        custom = getattr(data, "custom_cls", None)
        if custom is not None and custom.path:
            from hybridflow.data.external import build_custom_dataset

            return build_custom_dataset(cfg, tokenizer, _as_file_list(files))
        return cls(
            files,
            tokenizer,
            prompt_key=data.prompt_key,
            max_prompt_length=data.max_prompt_length,
            truncation=data.truncation,
            filter_overlong_prompts=data.filter_overlong_prompts,
            # agent loops render tool schemas into the chat: they need the messages
            return_raw_chat=data.return_raw_chat or cfg.actor_rollout_ref.rollout.mode == "async",
            return_full_prompt=bool(getattr(data, "return_full_prompt", False)),
            apply_chat_template_kwargs=getattr(data, "apply_chat_template_kwargs", None),
            processor=processor,
            image_key=getattr(data, "image_key", None) or "images",
        )

    def _messages(self, row: dict[str, Any], origin: tuple[str, int]) -> list[dict[str, Any]]:
        """The chat messages of a row (a bare string prompt becomes one user message)."""
        if self.prompt_key not in row:
            raise KeyError(
                f"column {self.prompt_key!r} missing in {origin[0]!r} (columns: {sorted(row)}); "
                "set data.prompt_key to the column holding the chat messages."
            )
        prompt = row[self.prompt_key]
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        if not isinstance(prompt, list) or not all(isinstance(m, dict) and "content" in m for m in prompt):
            raise ValueError(
                f"row {origin[1]} of {origin[0]!r}: column {self.prompt_key!r} must be a list of "
                f'{{"role", "content"}} messages (verl format), got {type(prompt).__name__}.'
            )
        return prompt

    def _images(self, rows: list[dict[str, Any]], origins: list[tuple[str, int]]) -> list[list[Any]]:
        """Each row's decoded images (none without a processor: a text model reads text only)."""
        found = [bool(row.get(self.image_key)) for row in rows]
        if self.processor is None:
            if any(found):
                path, row = origins[found.index(True)]
                raise ValueError(
                    f"row {row} of {path!r} has images in column {self.image_key!r}, but the model is a text-only "
                    "model (its folder has no image processor); train a vision-language model (e.g. Qwen2.5-VL) on "
                    "image prompts, or drop the column"
                )
            return [[] for _ in rows]
        return [vision.row_images(row, self.image_key, _where(o)) for row, o in zip(rows, origins, strict=True)]

    def _render(self, messages: list[list[dict[str, Any]]], images: list[list[Any]]) -> list[str]:
        """Each conversation rendered with the chat template (generation prompt added, the configured kwargs):
        the processor's for an image prompt (it writes the model's image tokens), else the tokenizer's."""
        return [
            (self.processor if imgs else self.tokenizer).apply_chat_template(
                m, add_generation_prompt=True, tokenize=False, **self.apply_chat_template_kwargs
            )
            for m, imgs in zip(messages, images, strict=True)
        ]

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of the rendered prompts."""
        if not texts:
            return []
        # The template already wrote any BOS the model needs; adding special tokens would double it.
        return list(self.tokenizer(texts, add_special_tokens=False)["input_ids"])

    def _raise_if_overlong(self, token_ids: list[list[int]], origins: list[tuple[str, int]]) -> None:
        """With truncation="error", reject the first prompt longer than max_prompt_length."""
        for i, ids in enumerate(token_ids):
            if len(ids) > self.max_prompt_length:
                path, row = origins[i]
                raise ValueError(
                    f"prompt of row {row} in {path!r} is {len(ids)} tokens, longer than "
                    f"data.max_prompt_length={self.max_prompt_length}. Raise data.max_prompt_length, set "
                    "data.filter_overlong_prompts=true to drop such rows, or set data.truncation to "
                    "left, right or middle to cut them."
                )

    def __len__(self) -> int:
        """Number of prompts (after filtering)."""
        return len(self._rows)

    def __getitem__(self, item: int) -> dict[str, Any]:
        """One prompt: padded tensors, raw token ids and the row's other columns."""
        row = self._rows[item]
        ids = self._ids[item]
        input_ids, attention_mask, position_ids = left_pad(ids, self.max_prompt_length, self.pad_token_id)
        out: dict[str, Any] = {k: v for k, v in row.items() if k != self.prompt_key}
        out.update(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            raw_prompt_ids=list(ids),
        )
        out.pop(self.image_key, None)
        images = self._images_list[item]
        if images:  # the engine gets the images and the unexpanded prompt; the trainer the processor's tensors
            out["raw_prompt_ids"] = list(self._placeholder_ids[item])
            out["multi_modal_data"] = {"image": images}
            out["multi_modal_inputs"] = vision.model_inputs(self.processor, self._texts[item], images)[1]
        elif self.processor is not None:
            out["multi_modal_data"] = None
            out["multi_modal_inputs"] = {}
        extra_info = row.get("extra_info")
        index = extra_info.get("index") if isinstance(extra_info, dict) else None
        out["index"] = index if index is not None else self._positions[item]
        if self.return_raw_chat:
            out["raw_prompt"] = self._messages_list[item]
        if self.return_full_prompt:
            out["full_prompts"] = self._texts[item]
        return out

    def data_sources(self) -> list[str]:
        """The distinct ``data_source`` values (for `hybridflow.rewards.check_reward_sources`)."""
        return sorted({str(row.get("data_source")) for row in self._rows})


def collate_fn(items: Sequence[dict[str, Any]]) -> DataProto:
    """Stack the items' tensors into a batch and put every other field into 1-D object arrays."""
    if not items:
        raise ValueError("cannot collate an empty list of items")
    keys = list(items[0])
    tensors: dict[str, torch.Tensor] = {}
    non_tensors: dict[str, np.ndarray] = {}
    for key in keys:
        values = [item.get(key) for item in items]
        if isinstance(values[0], torch.Tensor):
            stacked = [v for v in values if isinstance(v, torch.Tensor)]
            if len(stacked) != len(values):
                raise ValueError(
                    f"cannot collate {key!r}: a tensor in some items, missing or not a tensor in others"
                )
            tensors[key] = torch.stack(stacked)
        else:
            array = np.empty(len(values), dtype=object)
            for i, value in enumerate(values):
                array[i] = value
            non_tensors[key] = array
    return DataProto.from_dict(tensors, non_tensors=non_tensors)
