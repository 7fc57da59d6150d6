"""verl's profiler keys: `global_profiler` (tool, steps, save_path) and each role's `profiler` section.

HybridFlow builds verl's `torch` tool: torch.profiler traces of the chosen training steps in the chosen ranks of
each enabled role, written beside the checkpoints (hybridflow.profiling). verl's other tools (nsys, npu,
torch_memory) are refused by verl_features with what to use instead. No torch, no Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from .common import Section
from .values import Location

if TYPE_CHECKING:
    from .root import HybridFlowConfig

ProfilerTool = Literal["torch"]
TorchContent = Literal["cpu", "cuda", "memory", "shapes", "stack"]

_OTHER_TOOLS_DOC = "settings of verl's {tool} tool, which HybridFlow does not have (only tool=torch); not read"


class TorchToolConfig(Section):
    """Options of the torch.profiler tool (verl's `tool_config.torch`)."""

    contents: list[TorchContent] = Field(
        default_factory=list,
        description="What to record: cpu, cuda (device kernels), memory (tensor allocations), shapes (operator "
        "input shapes), stack (source lines); empty: cpu, plus cuda on GPU.",
    )
    discrete: bool = Field(
        default=False,
        description="true: one trace per worker call (update_actor, compute_log_prob, ...); false: one trace per "
        "worker process covering the whole profiled step(s). A worker holding several roles (actor + rollout + ref) "
        "traces continuously when any enabled role there is continuous.",
    )


class ToolConfig(Section):
    """Per-tool options of a role's profiler (verl's `tool_config`)."""

    torch: TorchToolConfig = Field(default_factory=TorchToolConfig, description="torch.profiler options.")
    nsys: dict[str, Any] = Field(default_factory=dict, description=_OTHER_TOOLS_DOC.format(tool="nsys"))
    npu: dict[str, Any] = Field(default_factory=dict, description=_OTHER_TOOLS_DOC.format(tool="npu"))
    torch_memory: dict[str, Any] = Field(default_factory=dict, description=_OTHER_TOOLS_DOC.format(tool="torch_memory"))


class RoleProfilerConfig(Section):
    """Whether, where and how one role's workers are profiled (verl's `<role>.profiler`)."""

    tool: ProfilerTool | None = Field(default=None, description="The tool; null: global_profiler.tool.")
    enable: bool | None = Field(
        default=None,
        description="Profile this role in the steps of global_profiler.steps; null: false (the rollout: the actor's "
        "setting, as in verl).",
    )
    all_ranks: bool | None = Field(
        default=None, description="Profile every rank of the role; null: false (the rollout: the actor's)."
    )
    ranks: list[int] | None = Field(
        default=None, description="Ranks to profile when all_ranks is false; null: [] (the rollout: the actor's)."
    )
    save_path: Location | None = Field(default=None, description="Where traces go; null: global_profiler.save_path.")
    tool_config: ToolConfig | None = Field(
        default=None, description="Per-tool options; null: the defaults (the rollout: the actor's)."
    )


class GlobalProfilerConfig(Section):
    """When profiling happens and where traces go (verl's `global_profiler`)."""

    tool: ProfilerTool | None = Field(
        default=None,
        description="Profiler: torch (torch.profiler traces); null: no profiling. verl's nsys, npu and torch_memory "
        "are not supported here.",
    )
    steps: list[int] | None = Field(
        default=None, description="Global steps to profile (1-based, e.g. [1, 5]); null: none."
    )
    profile_continuous_steps: bool = Field(
        default=False,
        description="Consecutive steps of `steps` go into one trace (started before the first, stopped after the last) "
        "instead of one trace per step.",
    )
    save_path: Location | None = Field(
        default=None,
        description="Folder or URI of the traces: <save_path>/global_step_<N>/<role>_rank<R>.json.gz (Chrome trace "
        "format, open in Perfetto or chrome://tracing); null: <trainer.default_local_dir>/profile, beside the "
        "checkpoints (uploaded to S3 when that is an s3:// URI).",
    )
    global_tool_config: dict[str, Any] = Field(
        default_factory=dict, description="Settings of verl's nsys and torch_memory tools; not read (tool=torch only)."
    )


PROFILED_ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout", "critic")
"""Roles whose workers HybridFlow profiles (`reward_model.profiler` is refused when enabled)."""


def role_sections(cfg: HybridFlowConfig) -> dict[str, RoleProfilerConfig]:
    """Each profiled role's section by dotted path, the reward model's too."""
    arr = cfg.actor_rollout_ref
    return {
        "actor_rollout_ref.actor": arr.actor.profiler,
        "actor_rollout_ref.ref": arr.ref.profiler,
        "actor_rollout_ref.rollout": arr.rollout.profiler,
        "critic": cfg.critic.profiler,
        "reward_model": cfg.reward_model.profiler,
    }


def check(cfg: HybridFlowConfig) -> list[str]:
    """Problems of the profiler settings: an enabled role with no tool, no steps or no rank; ranks out of range."""
    glob = cfg.global_profiler
    problems: list[str] = []
    steps = glob.steps or []
    if any(s < 1 for s in steps):
        problems.append(f"global_profiler.steps={steps}: steps are 1-based global steps; use numbers >= 1")
    world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    enabled = []
    for path, section in role_sections(cfg).items():
        if not section.enable:
            continue
        enabled.append(path)
        if path == "reward_model":
            problems.append(
                "reward_model.profiler.enable=true: profiling the reward-model workers is not built in HybridFlow yet; "
                "profile actor_rollout_ref.actor / ref / critic instead"
            )
            continue
        if (section.tool or glob.tool) is None:
            problems.append(f"{path}.profiler.enable=true but no tool is set: set global_profiler.tool=torch")
        if not steps:
            problems.append(f"{path}.profiler.enable=true but global_profiler.steps is empty: e.g. global_profiler.steps=[1]")
        if not section.all_ranks and not section.ranks:
            problems.append(f"{path}.profiler: no rank chosen; set {path}.profiler.all_ranks=true or ranks=[0]")
        bad = [r for r in section.ranks or [] if not 0 <= r < world]
        if bad:
            problems.append(
                f"{path}.profiler.ranks={section.ranks}: {bad} not among the {world} ranks (0..{world - 1}) of "
                "trainer.nnodes x trainer.n_gpus_per_node"
            )
    if glob.tool is not None and steps and not enabled:
        problems.append(
            "global_profiler.steps is set but no role's profiler.enable is true, so nothing would be profiled; set "
            "e.g. actor_rollout_ref.actor.profiler.enable=true and all_ranks=true"
        )
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.profiler.enable and rollout.mode == "async":
        problems.append(
            "actor_rollout_ref.rollout.profiler.enable=true with rollout.mode=async: profiling the server replicas is "
            "not built in HybridFlow yet; remove it (the trainer's actor, ref and critic workers can be profiled)"
        )
    return problems
