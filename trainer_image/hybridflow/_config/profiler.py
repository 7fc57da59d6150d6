"""verl's profiler keys: `global_profiler` (tool, steps, save_path) and each role's `profiler` section.

HybridFlow builds three of verl's tools (hybridflow.profiling), each over the chosen training steps in the chosen
ranks of each enabled role:

- `torch`: torch.profiler traces, written beside the checkpoints (CPU and GPU);
- `torch_memory`: CUDA memory snapshots (allocator state plus the allocation history of the profiled steps);
- `nsys`: the workers run under NVIDIA Nsight Systems (Ray's nsight runtime env), which captures the profiled
  steps (cudaProfilerStart/Stop) with an NVTX range per worker call.

verl's `npu` tool (Ascend) is refused by verl_features with what to use instead. No torch, no Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from .common import Section
from .values import Location

if TYPE_CHECKING:
    from .root import HybridFlowConfig

ProfilerTool = Literal["torch", "torch_memory", "nsys"]
GPU_TOOLS = ("torch_memory", "nsys")
"""Tools that record CUDA activity only: refused with trainer.device=cpu."""
TorchContent = Literal["cpu", "cuda", "memory", "shapes", "stack"]

_NPU_DOC = "settings of verl's npu tool (Ascend), which HybridFlow does not have; not read"
_ROLE_MEMORY_DOC = "not read: the torch_memory tool's settings are global_profiler.global_tool_config.torch_memory"

#: nsys options verl's workers run with (its ppo_trainer.yaml); `capture-range-end` unset is filled per run.
DEFAULT_WORKER_NSIGHT_OPTIONS: dict[str, Any] = {
    "trace": "cuda,nvtx,cublas,ucx",
    "cuda-memory-usage": "true",
    "cuda-graph-trace": "graph",
    "capture-range": "cudaProfilerApi",
    "capture-range-end": None,
    "kill": "none",
}


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


class NsysToolConfig(Section):
    """Options of the nsys tool for one role (verl's `tool_config.nsys`)."""

    discrete: bool | None = Field(
        default=None,
        description="true: one capture range (one report) per worker call of this role; false: one per profiled "
        "step (or run of steps); null: global_profiler.global_tool_config.nsys.discrete.",
    )


class ToolConfig(Section):
    """Per-tool options of a role's profiler (verl's `tool_config`)."""

    torch: TorchToolConfig = Field(default_factory=TorchToolConfig, description="torch.profiler options.")
    nsys: NsysToolConfig = Field(default_factory=NsysToolConfig, description="nsys options.")
    npu: dict[str, Any] = Field(default_factory=dict, description=_NPU_DOC)
    torch_memory: dict[str, Any] = Field(default_factory=dict, description=_ROLE_MEMORY_DOC)


class GlobalNsysConfig(Section):
    """How the nsys tool runs (verl's `global_profiler.global_tool_config.nsys`)."""

    discrete: bool = Field(
        default=False,
        description="true: one capture range (one .nsys-rep report) per worker call; false: one per worker process "
        "and profiled step (or run of steps with profile_continuous_steps). A role's tool_config.nsys.discrete "
        "overrides it.",
    )
    worker_nsight_options: dict[str, Any] = Field(
        default_factory=lambda: dict(DEFAULT_WORKER_NSIGHT_OPTIONS),
        description="`nsys profile` options of the profiled workers (Ray's nsight runtime env: a one-letter key is "
        "-k VALUE, a longer one --key=VALUE). capture-range-end null: repeat-shutdown:<number of profiled windows>, "
        "or repeat with discrete captures. o (the report name) unset: <save_path>/nsys/<group>_rank<R>_%p when "
        "save_path is a local folder, else <group>_rank<R>_%p in Ray's session logs (logs/nsight).",
    )
    controller_nsight_options: dict[str, Any] = Field(
        default_factory=dict,
        description="verl runs its controller actor under nsys with these; not read: HybridFlow's controller is the "
        "driver process, so run `nsys profile ... python -m hybridflow.trainer.main_ppo ...` to profile it.",
    )


class TorchMemoryConfig(Section):
    """How the torch_memory tool records (verl's `global_profiler.global_tool_config.torch_memory`)."""

    trace_alloc_max_entries: int = Field(
        default=100_000, gt=0, description="Allocation and free events kept (the newest) in each snapshot's history."
    )
    stack_depth: int = Field(
        default=32, gt=0,
        description="verl's stack depth of each recorded allocation; not read: torch records whole stacks.",
    )
    context: Literal["state", "alloc", "all"] = Field(
        default="all",
        description="What the history records: state (the stack of each live block), alloc (plus each event's "
        "stack), all (plus frees).",
    )
    stacks: Literal["python", "all"] = Field(
        default="all", description="Stack traces recorded: python frames, or all (python, C++ and TorchScript)."
    )
    kw_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Further keyword arguments of torch.cuda.memory._record_memory_history (e.g. skip_actions).",
    )


class GlobalToolConfig(Section):
    """Settings of the tools that are global to the run (verl's `global_profiler.global_tool_config`)."""

    nsys: GlobalNsysConfig = Field(default_factory=GlobalNsysConfig, description="nsys settings.")
    torch_memory: TorchMemoryConfig = Field(default_factory=TorchMemoryConfig, description="torch_memory settings.")


class RoleProfilerConfig(Section):
    """Whether, where and how one role's workers are profiled (verl's `<role>.profiler`)."""

    tool: ProfilerTool | None = Field(
        default=None, description="The tool; null: global_profiler.tool (an enabled role's tool must be the run's)."
    )
    enable: bool | None = Field(
        default=None,
        description="Profile this role in the steps of global_profiler.steps; null: false (a colocated rollout: the "
        "actor's setting, as in verl; server replicas, rollout.mode=async, only when set here: vLLM's torch "
        "profiler, one trace set per replica).",
    )
    all_ranks: bool | None = Field(
        default=None, description="Profile every rank of the role; null: false (a colocated rollout: the actor's)."
    )
    ranks: list[int] | None = Field(
        default=None,
        description="Ranks to profile when all_ranks is false (server replicas: replica indices); null: [] (a "
        "colocated rollout: the actor's).",
    )
    save_path: Location | None = Field(default=None, description="Where traces go; null: global_profiler.save_path.")
    tool_config: ToolConfig | None = Field(
        default=None, description="Per-tool options; null: the defaults (a colocated rollout: the actor's)."
    )


class GlobalProfilerConfig(Section):
    """When profiling happens and where traces go (verl's `global_profiler`)."""

    tool: ProfilerTool | None = Field(
        default=None,
        description="Profiler: torch (torch.profiler traces), torch_memory (CUDA memory snapshots, GPU only), nsys "
        "(NVIDIA Nsight Systems reports, GPU only, nsys on every node); null: no profiling. verl's npu is not "
        "supported here.",
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
        description="Folder or URI of the traces: <save_path>/global_step_<N>/<role>_rank<R>.json.gz (torch: Chrome "
        "trace format, open in Perfetto or chrome://tracing) or .pickle (torch_memory: open in "
        "https://pytorch.org/memory_viz); null: <trainer.default_local_dir>/profile, beside the checkpoints "
        "(uploaded to S3 when that is an s3:// URI). nsys writes its reports itself: see "
        "global_tool_config.nsys.worker_nsight_options.",
    )
    global_tool_config: GlobalToolConfig = Field(
        default_factory=GlobalToolConfig, description="Settings of the nsys and torch_memory tools."
    )


PROFILED_ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout", "critic",
                  "reward_model")
"""Roles whose workers HybridFlow profiles (a served generative reward model's replicas are refused)."""


def role_sections(cfg: HybridFlowConfig) -> dict[str, RoleProfilerConfig]:
    """Each profiled role's section by dotted path."""
    arr = cfg.actor_rollout_ref
    return {
        "actor_rollout_ref.actor": arr.actor.profiler,
        "actor_rollout_ref.ref": arr.ref.profiler,
        "actor_rollout_ref.rollout": arr.rollout.profiler,
        "critic": cfg.critic.profiler,
        "reward_model": cfg.reward_model.profiler,
    }


def role_tool(cfg: HybridFlowConfig, path: str) -> str | None:
    """The tool of one role: its own, else (a colocated rollout) the actor's, else global_profiler.tool."""
    sections = role_sections(cfg)
    colocated = path == "actor_rollout_ref.rollout" and cfg.actor_rollout_ref.rollout.mode != "async"
    inherited = sections["actor_rollout_ref.actor"].tool if colocated else None
    return sections[path].tool or inherited or cfg.global_profiler.tool


def run_tool(cfg: HybridFlowConfig) -> str | None:
    """The run's one tool: global_profiler.tool, else that of the enabled roles (check() refuses a mix)."""
    if cfg.global_profiler.tool is not None:
        return cfg.global_profiler.tool
    return next((role_tool(cfg, p) for p, s in role_sections(cfg).items() if s.enable and role_tool(cfg, p)), None)


def check(cfg: HybridFlowConfig) -> list[str]:
    """Problems of the profiler settings: an enabled role with no tool, no steps or no rank; ranks out of range;
    several tools in one run; a GPU-only tool on CPU; an nsys option without a value."""
    glob = cfg.global_profiler
    problems: list[str] = []
    steps = glob.steps or []
    if any(s < 1 for s in steps):
        problems.append(f"global_profiler.steps={steps}: steps are 1-based global steps; use numbers >= 1")
    world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    enabled = []
    tools: dict[str, list[str]] = {}
    for path, section in role_sections(cfg).items():
        if not section.enable:
            continue
        enabled.append(path)
        tool = role_tool(cfg, path)
        if tool is None:
            problems.append(f"{path}.profiler.enable=true but no tool is set: set global_profiler.tool=torch")
        else:
            tools.setdefault(tool, []).append(path)
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
    if len(tools) > 1:
        mixed = "; ".join(f"{tool}: {', '.join(paths)}" for tool, paths in tools.items())
        problems.append(
            f"profiler: the enabled roles use different tools ({mixed}); a run uses one tool (a worker process holds "
            "several roles, and each tool records the whole process): set global_profiler.tool and drop the roles' "
            "profiler.tool"
        )
    tool = run_tool(cfg)
    # torch_memory, as in verl, records rank 0 of each trainer group when no role is enabled.
    if glob.tool is not None and steps and not enabled and tool != "torch_memory":
        problems.append(
            "global_profiler.steps is set but no role's profiler.enable is true, so nothing would be profiled; set "
            "e.g. actor_rollout_ref.actor.profiler.enable=true and all_ranks=true"
        )
    if tool in GPU_TOOLS and cfg.trainer.device == "cpu":
        instead = {"torch_memory": "global_profiler.tool=torch with <role>.profiler.tool_config.torch.contents=[memory] "
                   "(tensor allocations in the torch.profiler trace)",
                   "nsys": "global_profiler.tool=torch (torch.profiler traces)"}[tool]
        problems.append(
            f"global_profiler.tool={tool} records CUDA activity and needs trainer.device=cuda; on CPU use {instead}"
        )
    if tool == "nsys":
        options = glob.global_tool_config.nsys.worker_nsight_options
        empty = [k for k, v in options.items() if v is None and k != "capture-range-end"]
        if empty:
            problems.append(
                f"global_profiler.global_tool_config.nsys.worker_nsight_options: {', '.join(empty)} null; nsys takes "
                "no option without a value: give each a value or remove it"
            )
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.profiler.enable and rollout.mode == "async":
        if rollout.name != "vllm":
            problems.append(
                f"actor_rollout_ref.rollout.profiler.enable=true with rollout.mode=async and rollout.name={rollout.name}: "
                "profiling SGLang server replicas is not built in HybridFlow yet; use rollout.name=vllm, or profile "
                "the trainer's roles (actor, ref, critic)"
            )
        elif role_tool(cfg, "actor_rollout_ref.rollout") not in (None, "torch"):
            problems.append(
                "actor_rollout_ref.rollout.profiler.enable=true with rollout.mode=async: server replicas are profiled "
                f"with tool=torch (vLLM's torch profiler) only, not {role_tool(cfg, 'actor_rollout_ref.rollout')}; "
                "set global_profiler.tool=torch, or leave the rollout's profiler off"
            )
    return problems
