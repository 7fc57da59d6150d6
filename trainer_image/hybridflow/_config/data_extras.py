"""verl's data extras: a user dataset class, a (curriculum) sampler, chat-template arguments, the generation batch.

`data.custom_cls` and `data.sampler` name a class by file path (or `pkg://module`) and name, loaded at start-up
like `custom_reward_function.path` (hybridflow.data.external). No torch, no Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from .common import Section

if TYPE_CHECKING:
    from .root import HybridFlowConfig


class CustomDatasetClass(Section):
    """A user dataset class (verl's `data.custom_cls`): `cls(data_files=..., tokenizer=..., processor=None, config=...)`."""

    path: str | None = Field(
        default=None,
        description="Python file (or `pkg://module.name`) defining the dataset class; null: HybridFlow's RLHFDataset. "
        "The class is called as cls(data_files=[...], tokenizer=tokenizer, processor=None, config=data) with `data` "
        "this config group (attribute and .get access); its items are dicts with at least input_ids, attention_mask, "
        "position_ids (1-D, left-padded to data.max_prompt_length), raw_prompt_ids, data_source and reward_model.",
    )
    name: str | None = Field(default=None, description="Name of the class in that file; required with path.")


class SamplerClass(Section):
    """A user sampler (verl's `data.sampler`): `cls(data_source=dataset, data_config=data)`, iterating item indices."""

    class_path: str | None = Field(
        default=None,
        description="Python file (or `pkg://module.name`, verl's spelling) defining the sampler; null: the seeded "
        "per-epoch shuffle of data.shuffle / data.seed. The sampler decides the order instead (data.shuffle and "
        "data.seed are then not read). A sampler with update(batch) is verl's curriculum sampler: the trainer calls "
        "it with each step's batch after the step (rewards and advantages included).",
    )
    class_name: str | None = Field(default=None, description="Name of the sampler class; required with class_path.")


def check(cfg: HybridFlowConfig) -> list[str]:
    """Cross-field problems of the data extras."""
    data = cfg.data
    problems: list[str] = []
    if bool(data.custom_cls.path) != bool(data.custom_cls.name):
        problems.append(
            "data.custom_cls: set both path (the Python file) and name (the dataset class in it), or neither"
        )
    if bool(data.sampler.class_path) != bool(data.sampler.class_name):
        problems.append(
            "data.sampler: set both class_path (the Python file or pkg://module) and class_name (the sampler class), "
            "or neither"
        )
    if data.sampler.class_path and cfg.async_training.enabled:
        problems.append(
            "data.sampler: a custom sampler with async_training is not built in HybridFlow yet; remove data.sampler "
            "(the stream shuffles by data.shuffle / data.seed) or set async_training.enabled=false"
        )
    problems += _gen_batch_problems(cfg)
    return problems


def _gen_batch_problems(cfg: HybridFlowConfig) -> list[str]:
    """data.gen_batch_size is DAPO's generation batch: prompts drawn per round of dynamic sampling."""
    data = cfg.data
    gen = data.gen_batch_size
    if gen is None or gen == data.train_batch_size:
        return []
    filter_groups = cfg.algorithm.filter_groups
    if not filter_groups.enable:
        return [
            f"data.gen_batch_size={gen} differs from data.train_batch_size={data.train_batch_size}: it sizes the "
            "prompt batches drawn by dynamic sampling (DAPO); set algorithm.filter_groups.enable=true, or remove "
            "data.gen_batch_size (each step then draws train_batch_size prompts)"
        ]
    if cfg.async_training.enabled:
        return ["data.gen_batch_size: not read with async_training (the stream draws train_batch_size prompts); remove it"]
    return []

