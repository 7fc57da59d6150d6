"""The trainers a job can run (`ppo`, `sft`, `dpo`): entry module, config parser and checkpoint keys of each.

Torch- and Ray-free: the operator reads it to build a RayJob's entrypoint (`python -m <module> config.yaml`),
to validate `spec.config` with the recipe's own config models, and to know which `trainer.*` key
`spec.checkpoint.keep` sets. `rljob run` follows the same table, so a local run and a cluster run agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from hybridflow._config.offline import OfflineConfig, parse_offline_config
from hybridflow.config import HybridFlowConfig, parse_config

RecipeName = Literal["ppo", "sft", "dpo"]
RECIPE_NAMES: tuple[str, ...] = get_args(RecipeName)

#: Any recipe's parsed config (the RL tree, or SftConfig / DpoConfig); they share `trainer.{nnodes,
#: n_gpus_per_node, device, default_local_dir, placement}` and `validate_for_run()`, which the operator reads.
TrainerConfigTree = HybridFlowConfig | OfflineConfig


@dataclass(frozen=True)
class Recipe:
    """One trainer: how to start it and how to read its config."""

    name: RecipeName
    module: str
    summary: str
    parse: Callable[[Mapping[str, Any]], TrainerConfigTree]
    #: The `trainer.*` keys that hold how many checkpoints to keep (set from an RLJob's spec.checkpoint.keep).
    keep_keys: tuple[str, ...]


RECIPES: dict[str, Recipe] = {
    "ppo": Recipe(
        "ppo", "hybridflow.trainer.main_ppo", "RL (PPO, GRPO, DAPO, online DPO, ...) with rollouts and rewards",
        parse_config, ("max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep"),
    ),
    "sft": Recipe(
        "sft", "hybridflow.trainer.fsdp_sft_trainer", "supervised fine-tuning on response tokens",
        lambda mapping: parse_offline_config(mapping, "sft"), ("max_ckpt_to_keep",),
    ),
    "dpo": Recipe(
        "dpo", "hybridflow.trainer.fsdp_dpo_trainer", "offline DPO / IPO from preference pairs",
        lambda mapping: parse_offline_config(mapping, "dpo"), ("max_ckpt_to_keep",),
    ),
}


def get_recipe(name: str) -> Recipe:
    """The recipe called `name`; ValueError listing the valid names otherwise."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; use one of {', '.join(RECIPE_NAMES)}")
    return RECIPES[name]
