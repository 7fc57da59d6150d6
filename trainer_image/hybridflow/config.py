"""The HybridFlow trainer config: verl's keys and defaults as one validated pydantic tree.

Imports neither torch nor Ray, so the operator validates RLJob specs with the very models the
trainer runs with. Typical use::

    cfg = load_config("job.yaml", ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=8"])
    cfg.validate_for_run()

`python -m hybridflow.config [FILE] [OVERRIDES...] [--for-run]` prints the resolved config as YAML
(like verl's `--cfg job`) and exits with status 2, listing every problem, when it is invalid.

Where this differs from verl's `ppo_trainer.yaml`, on purpose:

- defaults: `actor.strategy=fsdp2`, `rollout.tensor_model_parallel_size=1`, `trainer.logger=[console]`
  (no wandb account needed), `model.path` and `data.train_files` empty (required by `validate_for_run`);
- verl's `${...}` defaults are nulls here, filled in after validation (e.g. `critic.ppo_mini_batch_size`
  is the actor's, `rollout.prompt_length` is `data.max_prompt_length`); `critic.enable=null` means
  "when the estimator is gae" (see `critic_enabled`);
- `ray_init` lives in `trainer.ray_init`; verl's top-level `ray_init.*` is accepted and moved there;
- `trainer.placement` (colocate | split) is a HybridFlow addition;
- `${...}` references are resolved without OmegaConf (absolute, relative and `oc.select` forms).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path as FsPath
from typing import Any

import yaml
from pydantic import ValidationError

from . import yamlio
from ._config.common import CheckpointConfig, FsdpConfig, MixedPrecision, OptimConfig, WrapPolicy
from ._config.errors import ConfigError, problems_from_validation_error
from ._config.groups import (
    AlgorithmConfig,
    CustomRewardFunction,
    DataConfig,
    FilterGroups,
    KlCtrl,
    RayInitConfig,
    TrainerConfig,
)
from ._config.interpolation import resolve_tree
from ._config.names import (
    ADV_ESTIMATORS,
    FILTER_GROUP_METRICS,
    GROUP_ESTIMATORS,
    KL_PENALTIES,
    LOGGERS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    REWARD_MANAGERS,
    ROLLOUT_NAMES,
)
from ._config.overrides import apply_overrides, too_deep_problem
from ._config.root import HybridFlowConfig
from ._config.rules import check_runnable as _runnable_problems
from ._config.verl_compat import plus_defaults
from ._config.workers import (
    ActorConfig,
    ActorRolloutRefConfig,
    CriticConfig,
    CriticModelConfig,
    ModelConfig,
    OverlongBuffer,
    PolicyLossConfig,
    RefConfig,
    RewardModelConfig,
    RewardModelModelConfig,
    RolloutConfig,
    SamplingConfig,
)
from .crash import report_bug

__all__ = [
    "ADV_ESTIMATORS",
    "FILTER_GROUP_METRICS",
    "GROUP_ESTIMATORS",
    "KL_PENALTIES",
    "LOGGERS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "REWARD_MANAGERS",
    "ROLLOUT_NAMES",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "CheckpointConfig",
    "ConfigError",
    "CriticConfig",
    "CriticModelConfig",
    "CustomRewardFunction",
    "DataConfig",
    "FilterGroups",
    "FsdpConfig",
    "HybridFlowConfig",
    "KlCtrl",
    "MixedPrecision",
    "ModelConfig",
    "OptimConfig",
    "OverlongBuffer",
    "PolicyLossConfig",
    "RayInitConfig",
    "RefConfig",
    "RewardModelConfig",
    "RewardModelModelConfig",
    "RolloutConfig",
    "SamplingConfig",
    "TrainerConfig",
    "WrapPolicy",
    "apply_overrides",
    "check_runnable",
    "load_config",
    "main",
    "parse_config",
]


def parse_config(mapping: Mapping[str, Any]) -> HybridFlowConfig:
    """Validate a mapping in verl's nested shape; ConfigError lists every problem found."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(
            [
                f"<root>: expected a mapping of groups (algorithm, data, trainer, ...), got {type(mapping).__name__}"
            ]
        )
    deep = yamlio.find_too_deep(mapping)
    if deep is not None:  # the resolver, pydantic and the YAML dump of the config recurse per level
        raise ConfigError([too_deep_problem(deep)])
    resolved, problems = resolve_tree(mapping, _schema_default)
    try:
        cfg = HybridFlowConfig.model_validate(resolved)
    except ValidationError as exc:
        # A reference that failed to resolve also fails type checks: report it once.
        broken = {p.split(": ", 1)[0] for p in problems}
        problems += [
            p
            for p in problems_from_validation_error(exc, HybridFlowConfig)
            if p.split(": ", 1)[0] not in broken
        ]
    if problems:
        raise ConfigError(problems)
    return cfg


def load_config(path: str | FsPath | None = None, overrides: Iterable[str] = ()) -> HybridFlowConfig:
    """Read a YAML file (None: start from defaults), apply Hydra-style overrides and validate.

    `+key=v` on a key the file, an earlier override or the schema's defaults already has is refused, as Hydra
    refuses it; `++key=v` adds or replaces."""
    mapping: Any = {}
    if path is not None:
        mapping = _read_yaml(FsPath(path))
    return parse_config(apply_overrides(mapping, list(overrides), _plus_defaults()))


def check_runnable(cfg: HybridFlowConfig) -> None:
    """Raise ConfigError if the config lacks what a real run needs (same as cfg.validate_for_run())."""
    problems = _runnable_problems(cfg)
    if problems:
        raise ConfigError(problems)


def _read_yaml(path: FsPath) -> dict[str, Any]:
    """Load a YAML mapping from a file, with problems phrased for the user."""
    try:
        data = yamlio.read_mapping(path, "groups", file="config file")
    except yamlio.YamlError as exc:
        raise ConfigError([str(exc)]) from None
    if "apiVersion" in data and "kind" in data:
        raise ConfigError(
            [
                f"{path}: this is a Kubernetes manifest (kind {yamlio.shorten_repr(data['kind'], 60)}), not a "
                "trainer config; check it with `rljob validate`, or pass the mapping under its spec.config"
            ]
        )
    return data


@functools.cache
def _raw_defaults() -> dict[str, Any]:
    """Schema defaults before derived values are filled in (the targets `${...}` may reference)."""
    return HybridFlowConfig.model_construct().model_dump()


@functools.cache
def _plus_defaults() -> dict[str, Any]:
    """The default keys `+key=v` may not add (verl_compat.plus_defaults: less those verl's own defaults lack)."""
    return plus_defaults(_raw_defaults())


def _schema_default(path: tuple[str, ...]) -> Any:
    """The default at a dotted path; KeyError when the schema has no such key."""
    node: Any = _raw_defaults()
    for part in path:
        if not isinstance(node, dict) or part not in node:
            raise KeyError(path)
        node = node[part]
    return node


USAGE = """usage: python -m hybridflow.config [FILE] [KEY=VALUE | +KEY=VALUE | ~KEY ...] [--for-run]

Print the resolved HybridFlow config as YAML. FILE is a YAML config in verl's shape (omit it to start
from the defaults); overrides follow Hydra's syntax. --for-run also requires what a real run needs
(model path, training data). Exit status: 0 valid, 2 invalid or unreadable, 4 internal error (a bug:
please report it with the input)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(USAGE)
        return 0
    for_run = "--for-run" in args
    args = [a for a in args if a != "--for-run"]
    unknown = [a for a in args if a.startswith("-")]
    if unknown:
        print(f"unknown option {unknown[0]}\n{USAGE}", file=sys.stderr)
        return 2
    path = args.pop(0) if args and "=" not in args[0] and not args[0].startswith(("~", "+")) else None
    try:
        cfg = load_config(path, args)
        if for_run:
            cfg.validate_for_run()
        text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    except Exception as exc:  # any input ends in a message, never a traceback (issue 12)
        return report_bug("python -m hybridflow.config", path or "the overrides", exc, sys.stderr)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
