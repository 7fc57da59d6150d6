"""verl spellings translated before validation: no-op keys, `optim.clip_grad`, `model.torch_dtype`, micro-batches,
`multi_turn.format=qwen`.

`translate(mapping)` returns the mapping HybridFlow's models read, the notes to print once at start-up
(keys accepted without effect, deprecated keys converted) and the problems found on the way. Keys the
table in verl_features refuses are left in place: validation reports them, with the feature's message.
No torch, no Ray.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import verl_features
from .errors import ConfigError, shorten
from .groups import TrainerConfig
from .names import SERVER_ROLLOUT_NAMES

ACTOR = "actor_rollout_ref.actor"


@dataclass
class Translation:
    """What `translate` made of a verl-shaped mapping."""

    mapping: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def translate(mapping: dict[str, Any]) -> Translation:
    """Apply verl's aliases and deprecated keys to a copy of `mapping`; notes and problems say what happened."""
    out = Translation(copy.deepcopy(mapping))
    _accept_no_op_keys(out)
    _server_mode_for_tools(out)
    _single_turn_in_sync_mode(out)
    _qwen_tool_format(out)
    _profiler_without_steps(out)
    for group in (ACTOR, "critic"):
        _clip_grad(out, group)
    for spec in _TORCH_DTYPES:
        _torch_dtype(out, spec)
    _activation_offload_on_cpu(out)
    for deprecated in _DEPRECATED:
        _global_micro_batch(out, deprecated)
    return out


def notes_line(notes: list[str]) -> str:
    """One start-up line listing the notes (empty when there are none)."""
    return f"verl compatibility: {'; '.join(notes)}" if notes else ""


# ------------------------------------------------------------------------------------- no-op keys


def _accept_no_op_keys(out: Translation) -> None:
    """Remove the verl keys the table accepts at their value, and note each, with the no-effect fields set."""
    accepted: list[str] = []
    for path, parent, key in list(verl_features.walk(out.mapping)):
        if key not in parent:
            continue  # under a key removed a moment ago
        kept = next((k for k in verl_features.NO_EFFECT_FIELDS if verl_features.matches(k.pattern, path)), None)
        entry = kept or verl_features.key_entry(path)
        if entry is None or not verl_features.accepted(entry, parent[key]):
            continue
        if kept and parent[key] == _field_default(path):
            continue  # at its default it asks for nothing: no note (to_dict() output sets every field)
        value = parent[key] if kept else parent.pop(key)  # a field of the schema stays, validated as usual
        shown = "" if isinstance(value, dict) else f"={_yaml(value)}"
        accepted.append(f"{'.'.join(path)}{shown} ({entry.note})")
    if accepted:
        out.notes.append("accepted without effect here: " + ", ".join(accepted))


@functools.cache
def _defaults() -> dict[str, Any]:
    """The schema's defaults as nested data."""
    from .root import HybridFlowConfig  # root imports this module

    return HybridFlowConfig.model_construct().model_dump()


def _field_default(path: tuple[str, ...]) -> Any:
    """The schema default of a field (a no-effect field of verl_features.NO_EFFECT_FIELDS)."""
    node: Any = _defaults()
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _yaml(value: Any) -> str:
    """A value as it would be typed on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return shorten(value, 60) if not isinstance(value, str | int | float) else str(value)


# ------------------------------------------------------------------------------- Hydra's '+' keys

#: Keys HybridFlow's schema has a default for and verl's `ppo_trainer.yaml` does not, so verl's command lines add
#: them with `+key=v` (Hydra refuses `+` on a key the composed config has): `+` on these is not refused here.
#: `*` is one level. A key's children go with it (`+...mixed_precision.param_dtype=bf16` is accepted too).
PLUS_ADDS = (
    "*.*.fsdp_config.model_dtype",  # actor_rollout_ref.actor, .ref, critic.model, reward_model.model
    "*.*.fsdp_config.mixed_precision",
    "data.gen_batch_size",  # DAPO's generation batch
)


def plus_defaults(defaults: dict[str, Any]) -> dict[str, Any]:
    """The defaults `+key=v` counts as existing keys (Hydra's composed config): `defaults` less PLUS_ADDS."""
    tree = copy.deepcopy(defaults)
    for path, parent, key in list(verl_features.walk(tree)):
        if key in parent and any(verl_features.matches(p, path) for p in PLUS_ADDS):
            del parent[key]
    return tree


# ---------------------------------------------------------------------------- multi-turn rollout


def _server_mode_for_tools(out: Translation) -> None:
    """A config with no rollout.mode that sync mode cannot serve runs in server mode, as in verl (whose default is
    async): multi-turn tool calling, and SGLang with tensor_model_parallel_size > 1 (a batch-mode SGLang engine
    lives in one worker, a server replica spans the GPUs).

    HybridFlow's own default stays sync (see RolloutConfig.mode); an explicit mode=sync is still refused for
    these by the rules.
    """
    rollout = _group(out.mapping, "actor_rollout_ref.rollout")
    if rollout is None or "mode" in rollout:
        return
    multi_turn = rollout.get("multi_turn")
    name = rollout.get("name", _field_default(("actor_rollout_ref", "rollout", "name")))
    tp = rollout.get("tensor_model_parallel_size", 1)
    if isinstance(multi_turn, dict) and multi_turn.get("enable") is True:
        why = "multi_turn.enable=true runs"
    elif name == "sglang" and isinstance(tp, int) and not isinstance(tp, bool) and tp > 1:
        why = f"SGLang with tensor_model_parallel_size={tp} runs (a replica spans its GPUs)"
    else:
        return
    rollout["mode"] = "async"
    out.notes.append(f"rollout.mode=async set: {why} in server mode (verl's default mode; HybridFlow's is sync)")


def _single_turn_in_sync_mode(out: Translation) -> None:
    """`rollout.mode=async` for single-turn generation that server mode here cannot serve runs in sync mode, noted.

    verl's default mode is async, and a verl line without a mode runs in sync mode here already: for single-turn
    prompts (no tools, agent loop, interactions or asynchronous training) both give the same samples, one request
    per response (verl's single-turn agent loop). An explicit mode=async says the same as verl's default, so where
    HybridFlow's server replicas cannot serve it (they are vLLM or SGLang engines: a line with rollout.name=hf) the
    line runs in sync mode, as a line without the key does, with a note; anything that needs server mode keeps
    mode=async and its refusal.
    """
    rollout = _group(out.mapping, "actor_rollout_ref.rollout")
    if rollout is None or rollout.get("mode") != "async":
        return
    multi_turn = _group(rollout, "multi_turn") or {}
    agent = _group(rollout, "agent") or {}
    custom_server = _group(agent, "custom_async_server") or {}
    async_training = _group(out.mapping, "async_training") or {}
    needs_server = (
        multi_turn.get("enable") is True or multi_turn.get("tool_config_path") or multi_turn.get("interaction_config_path")
        or agent.get("agent_loop_config_path") or custom_server.get("path")
        or async_training.get("mode", "sync") != "sync"
    )
    if needs_server:
        return
    name = rollout.get("name", _field_default(("actor_rollout_ref", "rollout", "name")))
    if name in SERVER_ROLLOUT_NAMES:
        return
    rollout["mode"] = "sync"
    out.notes.append(
        f"rollout.mode=async runs in sync mode: single-turn prompts give the same samples either way (verl's "
        f"single-turn agent loop, one request per response) and server replicas here are vLLM or SGLang engines "
        f"(rollout.name={_yaml(name)})"
    )


def _profiler_without_steps(out: Translation) -> None:
    """`global_profiler.tool` without `global_profiler.steps` profiles nothing (in verl too): noted."""
    profiler = _group(out.mapping, "global_profiler")
    if profiler is None or profiler.get("tool") in (None, "npu") or profiler.get("steps"):
        return
    out.notes.append(
        f"global_profiler.tool={profiler['tool']} without global_profiler.steps profiles nothing (as in verl); "
        "set e.g. global_profiler.steps=[1]"
    )


def _qwen_tool_format(out: Translation) -> None:
    """`multi_turn.format=qwen` is read as `hermes`, noted.

    verl's configs and examples name it (its sglang multi-turn YAMLs), but verl's tool-parser registry has no such
    parser: Qwen2.5 and Qwen3 chat templates write tool calls as Hermes `<tool_call>{json}</tool_call>` blocks,
    which the hermes parser reads (Qwen3-Coder and Qwen3.5 write XML calls: `qwen3_coder`).
    """
    multi_turn = _group(out.mapping, "actor_rollout_ref.rollout.multi_turn")
    if multi_turn is None or multi_turn.get("format") != "qwen":
        return
    multi_turn["format"] = "hermes"
    out.notes.append(
        "multi_turn.format=qwen is read as hermes: Qwen2.5's and Qwen3's chat templates write tool calls as Hermes "
        "<tool_call>{json}</tool_call> blocks (for Qwen3-Coder's and Qwen3.5's XML calls set format=qwen3_coder)"
    )


# ------------------------------------------------------------------------------- optim.clip_grad


def _clip_grad(out: Translation, group: str) -> None:
    """verl's `<group>.optim.clip_grad` is HybridFlow's `<group>.grad_clip` (the same global-norm clip)."""
    role = _group(out.mapping, group)
    optim = role.get("optim") if role is not None else None
    if role is None or not isinstance(optim, dict) or "clip_grad" not in optim:
        return
    value = optim.pop("clip_grad")
    where = f"{group}.optim.clip_grad"
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        out.problems.append(f"{where}: expected a positive number (got {shorten(value)}); e.g. 1.0")
        return
    if "grad_clip" in role and role["grad_clip"] != value:
        out.problems.append(
            f"{where}: {value} contradicts {group}.grad_clip={shorten(role['grad_clip'])} (both set the gradient-norm "
            f"clip); keep only one of the two"
        )
        return
    role["grad_clip"] = value


# ------------------------------------------------------------------------------ model.torch_dtype


@dataclass(frozen=True)
class _TorchDtype:
    """verl's `<model>.torch_dtype` and the FSDP groups whose `fsdp_config.model_dtype` loads that model here."""

    model: str
    groups: tuple[str, ...]


_TORCH_DTYPES = (
    # actor_rollout_ref.model is the actor's and the reference's model (both load it)
    _TorchDtype("actor_rollout_ref.model", (ACTOR, "actor_rollout_ref.ref")),
    _TorchDtype("critic.model", ("critic.model",)),
)

#: verl's spellings of a dtype (torch names, with or without `torch.`, and the short ones) -> HybridFlow's.
_DTYPE_NAMES = {
    "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
}


def _dtype_name(value: Any) -> str | None:
    """HybridFlow's short dtype name for a verl/torch spelling (`torch.bfloat16`, `bfloat16`, `bf16`), else None."""
    if not isinstance(value, str):
        return None
    return _DTYPE_NAMES.get(value.strip().lower().removeprefix("torch."))


def _torch_dtype(out: Translation, spec: _TorchDtype) -> None:
    """verl's `<model>.torch_dtype` (the dtype the Hugging Face model is loaded in) is `fsdp_config.model_dtype` here.

    Set on every group that loads that model unless the group sets model_dtype itself; a group whose own
    model_dtype names another dtype is a contradiction (refused, with both keys named).
    """
    model = _group(out.mapping, spec.model)
    if model is None or "torch_dtype" not in model:
        return
    value = model.pop("torch_dtype")
    where = f"{spec.model}.torch_dtype"
    name = _dtype_name(value)
    if name is None:
        out.problems.append(
            f"{where}: {shorten(value)} is not a dtype HybridFlow loads models in; use bfloat16, float16 or float32 "
            f"(or set <role>.fsdp_config.model_dtype: bf16, fp16, fp32)"
        )
        return
    set_on: list[str] = []
    for group_path in spec.groups:
        fsdp = _ensure_group(out.mapping, f"{group_path}.fsdp_config")
        if fsdp is None:
            continue  # not a mapping: validation reports it
        explicit = fsdp.get("model_dtype")
        if explicit is None:
            fsdp["model_dtype"] = name
            set_on.append(f"{group_path}.fsdp_config.model_dtype")
        elif _dtype_name(explicit) != name:
            out.problems.append(
                f"{where}: {value} contradicts {group_path}.fsdp_config.model_dtype={shorten(explicit)} (both set the "
                f"dtype that model is loaded in); keep only one, or give both the same dtype"
            )
    if set_on:
        out.notes.append(f"{where}={value} is verl's load dtype: set " + ", ".join(f"{key}={name}" for key in set_on))


def _ensure_group(mapping: dict[str, Any], dotted_path: str) -> dict[str, Any] | None:
    """The mapping at a dotted path, created empty where missing; None when a value on the way is not a mapping."""
    node: Any = mapping
    for part in dotted_path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.setdefault(part, {})
    return node if isinstance(node, dict) else None


# ---------------------------------------------------------------------- model.enable_activation_offload


def _activation_offload_on_cpu(out: Translation) -> None:
    """`model.enable_activation_offload=true` with trainer.device=cpu changes nothing (activations are in host memory
    already): said once at start-up, as verl keys accepted without effect are."""
    device = (_group(out.mapping, "trainer") or {}).get("device", _field_default(("trainer", "device")))
    if device != "cpu":
        return
    for model in ("actor_rollout_ref.model", "critic.model"):
        if (_group(out.mapping, model) or {}).get("enable_activation_offload") is True:
            out.notes.append(
                f"{model}.enable_activation_offload=true has no effect with trainer.device=cpu: activations are in "
                "host memory already"
            )


# ------------------------------------------------------------------------ global micro-batch sizes


@dataclass(frozen=True)
class _Deprecated:
    """verl's deprecated global micro-batch key of one role, and the per-GPU key that replaced it."""

    group: str
    old: str
    new: str
    sp_group: str
    """Whose ulysses_sequence_parallel_size divides the ranks (verl: the worker's, the actor's for ref/rollout)."""


_DEPRECATED = (
    _Deprecated(ACTOR, "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", ACTOR),
    _Deprecated("actor_rollout_ref.ref", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu", ACTOR),
    _Deprecated("actor_rollout_ref.rollout", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu", ACTOR),
    _Deprecated("critic", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", "critic"),
    _Deprecated("reward_model", "micro_batch_size", "micro_batch_size_per_gpu", "reward_model"),
)


def _global_micro_batch(out: Translation, spec: _Deprecated) -> None:
    """Convert a global micro-batch size to the per-GPU key as verl does: divide by the data-parallel ranks.

    verl divides by (world size // ulysses_sequence_parallel_size), rounding down; HybridFlow refuses a
    size that does not divide, rather than train with a different one than asked for.
    """
    role = _group(out.mapping, spec.group)
    if role is None or spec.old not in role:
        return
    value = role.pop(spec.old)
    old, new = f"{spec.group}.{spec.old}", f"{spec.group}.{spec.new}"
    if value is None:
        out.notes.append(f"{old}=null is verl's deprecated default (unset); ignored")
        return
    if role.get(spec.new) is not None:
        out.problems.append(
            f"{old}: set together with {new}; verl's global micro-batch size is deprecated, keep only {new}"
        )
        return
    ranks = _data_parallel_ranks(out.mapping, spec.sp_group)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        out.problems.append(f"{old}: expected a positive whole number (got {shorten(value)}); better, set {new}")
        return
    if ranks is None:
        out.problems.append(f"{old}: cannot be converted to {new} until trainer.nnodes and n_gpus_per_node are valid")
        return
    if value % ranks:
        out.problems.append(
            f"{old}: verl's deprecated global micro-batch size {value} does not split over the {ranks} data-parallel "
            f"ranks (verl would round it down); set {new} instead (e.g. {max(1, value // ranks)})"
        )
        return
    role[spec.new] = value // ranks
    out.notes.append(f"{old}={value} is deprecated in verl: converted to {spec.new}={value // ranks} ({ranks} ranks)")


def _data_parallel_ranks(mapping: dict[str, Any], sp_group: str) -> int | None:
    """world size // ulysses size, with the schema's defaults for missing keys; None when not computable."""
    trainer = _group(mapping, "trainer") or {}
    nnodes = trainer.get("nnodes", TrainerConfig.model_fields["nnodes"].default)
    per_node = trainer.get("n_gpus_per_node", TrainerConfig.model_fields["n_gpus_per_node"].default)
    sp = (_group(mapping, sp_group) or {}).get("ulysses_sequence_parallel_size", 1)
    numbers = (nnodes, per_node, sp)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in numbers):
        return None
    world = nnodes * per_node
    return world // sp if world >= sp else None


def _group(mapping: dict[str, Any], dotted_path: str) -> dict[str, Any] | None:
    """The mapping at a dotted path, or None when absent or not a mapping."""
    node: Any = mapping
    for part in dotted_path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node if isinstance(node, dict) else None


# ---------------------------------------------------------------------------------- --config-name


@dataclass(frozen=True)
class ConfigChoice:
    """What a verl `--config-name` (with `--config-path`) selects here: a YAML file, or defaults plus overrides."""

    path: str | None
    overrides: tuple[str, ...] = ()
    note: str = ""


def resolve_config_name(name: str, config_path: str | None, is_file: Callable[[str], bool]) -> ConfigChoice:
    """Map verl's `--config-name NAME [--config-path DIR]` to what HybridFlow loads; ConfigError when it cannot.

    verl's own config names come first (their YAMLs compose verl's defaults through Hydra, which this
    loader does not do): `ppo_trainer` is HybridFlow's defaults, the multi-turn examples are the keys they
    set (verl_features.CONFIG_NAMES), Megatron and multimodal ones are refused. Any other name is a YAML
    file `DIR/NAME.yaml`, as Hydra would find it.
    """
    stem = name.removesuffix(".yaml").removesuffix(".yml")
    known = verl_features.CONFIG_NAMES.get(stem)
    where = f"--config-name {name}"
    if known is not None and known.feature is not None:
        raise ConfigError([f"{where} ({known.where}/{stem}.yaml in verl): {known.feature.message}"])
    if known is not None:
        note = "" if not known.sets else (
            f"--config-name {stem}: the keys verl's {known.where}/{stem}.yaml sets: {' '.join(known.sets)}"
        )
        return ConfigChoice(None, known.sets, note)
    candidates = [f"{config_path.rstrip('/')}/{stem}{ext}" for ext in (".yaml", ".yml")] if config_path else []
    found = next((c for c in candidates if is_file(c)), None)
    if found is not None:
        return ConfigChoice(found)
    names = ", ".join(sorted(n for n, c in verl_features.CONFIG_NAMES.items() if c.feature is None))
    looked = f"no {candidates[0]} exists" if candidates else "no --config-path was given"
    raise ConfigError(
        [f"{where}: not one of the verl config names HybridFlow knows ({names}) and {looked}; pass your YAML "
         "file as the first argument (or --config-path DIR --config-name NAME)"]
    )
