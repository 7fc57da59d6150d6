"""User classes named in the data config: a dataset (`data.custom_cls`) and a sampler (`data.sampler`), as in verl.

Both are loaded at start-up by location and name, where the location is a Python file path or `pkg://module.name`
(an importable module, verl's spelling for samplers). verl's contracts are kept:

- dataset: ``cls(data_files=[...], tokenizer=tokenizer, processor=None, config=data)``; a `torch.utils.data.Dataset`
  whose items are dicts with the keys `REQUIRED_ITEM_KEYS` (what `RLHFDataset` yields and the trainer reads);
- sampler: ``cls(data_source=dataset, data_config=data)``; iterating it gives item indices, ``len`` the count per
  epoch; with an ``update(batch)`` method it is a curriculum sampler, told each step's scored batch.

``data`` is the data config group as a dict whose keys also read as attributes (verl passes an OmegaConf
DictConfig, read with ``config.key`` and ``config.get(key, default)``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
from collections.abc import Sequence
from typing import Any

REQUIRED_ITEM_KEYS = ("input_ids", "attention_mask", "position_ids", "raw_prompt_ids", "data_source", "reward_model")
PKG_PREFIX = "pkg://"


class ExternalClassError(ValueError):
    """A configured dataset or sampler class cannot be loaded or does not keep verl's contract."""


def data_view(data: Any) -> dict[str, Any]:
    """The data group as verl's DictConfig-like object: `view.key` and `view.get(key, default)`, nested."""
    return _View(data.model_dump(mode="json") if hasattr(data, "model_dump") else dict(data))


class _View(dict[str, Any]):
    """A dict whose keys also read as attributes."""

    def __init__(self, mapping: dict[str, Any]) -> None:
        super().__init__({k: _View(v) if isinstance(v, dict) else v for k, v in mapping.items()})

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"data config has no key {name!r}") from None


def load_class(location: str, name: str, where: str) -> type:
    """The class `name` of a Python file or `pkg://module`; `where` names the config keys in messages."""
    module = _import(location, where)
    cls = getattr(module, name, None)
    if cls is None:
        classes = sorted(n for n, v in vars(module).items() if inspect.isclass(v) and not n.startswith("_"))
        raise ExternalClassError(
            f"{where}: no class {name!r} in {location!r} (classes there: {', '.join(classes) or 'none'}); set the "
            "name to one of them"
        )
    if not inspect.isclass(cls):
        raise ExternalClassError(f"{where}: {name!r} in {location!r} is a {type(cls).__name__}, not a class")
    return cls


def _import(location: str, where: str) -> Any:
    if location.startswith(PKG_PREFIX):
        module_name = location[len(PKG_PREFIX):]
        try:
            return importlib.import_module(module_name)
        except Exception as exc:  # the user's module may raise anything at import time
            raise ExternalClassError(
                f"{where}={location!r}: importing module {module_name!r} failed with {type(exc).__name__}: {exc}; "
                "make it importable (PYTHONPATH) or give the Python file's path instead"
            ) from exc
    if not os.path.isfile(location):
        raise ExternalClassError(
            f"{where}={location!r}: no such file; give an existing Python file (absolute, or relative to the "
            "trainer's working directory) or pkg://module.name"
        )
    stem = os.path.splitext(os.path.basename(location))[0]
    spec = importlib.util.spec_from_file_location(f"hybridflow_user_{stem}", location)
    if spec is None or spec.loader is None:
        raise ExternalClassError(f"{where}={location!r}: cannot be imported as a Python module; give a .py file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ExternalClassError(
            f"{where}={location!r}: importing the file failed with {type(exc).__name__}: {exc}; fix the error there"
        ) from exc
    return module


class ExternalDataset:
    """A user dataset behind the interface the trainer reads (len, items, `data_sources()`), items checked once."""

    def __init__(self, inner: Any, where: str) -> None:
        self.inner = inner
        self.where = where
        if len(inner) == 0:
            raise ExternalClassError(f"{where}: the dataset has no items; check data.train_files / data.val_files")
        self._check_item(inner[0])

    def _check_item(self, item: Any) -> None:
        if not isinstance(item, dict):
            raise ExternalClassError(
                f"{self.where}: items must be dicts (as RLHFDataset's), got {type(item).__name__}; return a dict "
                f"with {', '.join(REQUIRED_ITEM_KEYS)}"
            )
        missing = [k for k in REQUIRED_ITEM_KEYS if k not in item]
        if missing:
            raise ExternalClassError(
                f"{self.where}: its items lack {', '.join(missing)}; each item needs {', '.join(REQUIRED_ITEM_KEYS)} "
                "(input_ids, attention_mask, position_ids: 1-D tensors left-padded to data.max_prompt_length)"
            )

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.inner[index]

    def data_sources(self) -> list[str]:
        """The distinct data sources: the class's own `data_sources()` when it has one, else read from every item."""
        own = getattr(self.inner, "data_sources", None)
        if callable(own):
            return sorted(str(s) for s in own())
        return sorted({str(self.inner[i]["data_source"]) for i in range(len(self.inner))})


def build_custom_dataset(cfg: Any, tokenizer: Any, files: Sequence[str]) -> ExternalDataset:
    """verl's custom dataset: `data.custom_cls.name` from `data.custom_cls.path`, called with verl's keywords."""
    import torch

    section = cfg.data.custom_cls
    where = "data.custom_cls"
    cls: Any = load_class(section.path, section.name, where)  # a user class: its signature is only known at run time
    if not issubclass(cls, torch.utils.data.Dataset):
        raise ExternalClassError(
            f"{where}: {section.name} in {section.path!r} must subclass torch.utils.data.Dataset (as verl requires)"
        )
    try:
        inner = cls(data_files=list(files), tokenizer=tokenizer, processor=None, config=data_view(cfg.data))
    except TypeError as exc:
        raise ExternalClassError(
            f"{where}: {section.name}(data_files=..., tokenizer=..., processor=None, config=...) failed: {exc}; give "
            "the class verl's constructor signature"
        ) from exc
    return ExternalDataset(inner, f"{where} {section.name}")


def build_sampler(cfg: Any, dataset: Sequence[Any]) -> Any:
    """verl's custom sampler from `data.sampler`, or None when none is configured."""
    section = cfg.data.sampler
    if not section.class_path:
        return None
    where = "data.sampler"
    cls = load_class(section.class_path, section.class_name, where)
    try:
        sampler = cls(data_source=dataset, data_config=data_view(cfg.data))
    except TypeError as exc:
        raise ExternalClassError(
            f"{where}: {section.class_name}(data_source=..., data_config=...) failed: {exc}; give the class verl's "
            "constructor signature"
        ) from exc
    if not hasattr(sampler, "__iter__") or not hasattr(sampler, "__len__"):
        raise ExternalClassError(f"{where}: {section.class_name} must define __iter__ (item indices) and __len__")
    return sampler


def is_curriculum(sampler: Any) -> bool:
    """Whether a sampler wants each step's batch (verl's AbstractCurriculumSampler: an `update(batch)` method)."""
    return callable(getattr(sampler, "update", None))
