"""Profiles of chosen training steps in chosen worker ranks (verl's profiler keys): one mechanism, three tools.

The driver (`StepProfiler`) starts and stops profiling around the steps of `global_profiler.steps`; each
worker process (`WorkerProfiler`) decides from its roles' `profiler` sections whether its rank records
and how:

- continuous (`discrete=false`, verl's default): one recording per worker process covering the whole step (or
  run of consecutive steps with `profile_continuous_steps`), each worker call in it a labelled region
  (`actor.update_actor`, `ref.compute_ref_log_prob`, ...);
- discrete: one recording per worker call of an enabled role.

What records is the run's tool (a `Recorder`):

- `torch`: a torch.profiler trace, Chrome-trace JSON (gzipped; open in Perfetto or chrome://tracing);
- `torch_memory`: a CUDA memory snapshot (`torch.cuda.memory._dump_snapshot`: the allocator's segments plus the
  allocation history recorded during the window; open in https://pytorch.org/memory_viz). Always continuous.
  As in verl, with no role enabled the rank 0 of each trainer group records;
- `nsys`: a capture range of NVIDIA Nsight Systems (cudaProfilerStart / Stop), with an NVTX range per call. The
  chosen workers are started under `nsys profile` by Ray's nsight runtime env (`nsight_runtime_env`), and nsys
  writes the .nsys-rep reports itself.

Files go to ``<root>/global_step_<N>/<role>[_<call>]_rank<R>.<suffix>``, where the root is the role's
`save_path`, else `global_profiler.save_path`, else ``<trainer.default_local_dir>/profile`` beside the
checkpoints. They are written locally first and copied with `hybridflow.storage.upload_file`, so an ``s3://``
root gets them too.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

PROFILE_DIR = "profile"
SECTIONS = {
    "actor": "actor_rollout_ref.actor",
    "ref": "actor_rollout_ref.ref",
    "rollout": "actor_rollout_ref.rollout",
    "critic": "critic",
    "reward_model": "reward_model",
}
"""A worker's sub-role -> the config group whose `profiler` section it reads."""


@dataclass(frozen=True)
class RoleProfile:
    """What one role's profiler section asks for, with verl's inheritance filled in."""

    enabled: bool
    all_ranks: bool = False
    ranks: tuple[int, ...] = ()
    contents: tuple[str, ...] = ()
    discrete: bool = False
    root: str | None = None

    def chooses(self, rank: int) -> bool:
        """Whether this rank of the role is traced."""
        return self.enabled and (self.all_ranks or rank in self.ranks)


def _section(cfg: Any, subrole: str) -> Any:
    node = cfg
    for part in SECTIONS[subrole].split("."):
        node = getattr(node, part)
    return node.profiler


def trace_root(cfg: Any, save_path: str | None = None) -> str:
    """Where traces go: a role's save_path, else global_profiler.save_path, else <default_local_dir>/profile."""
    chosen = save_path or cfg.global_profiler.save_path
    if chosen:
        return str(chosen).rstrip("/")
    return f"{str(cfg.trainer.default_local_dir).rstrip('/')}/{PROFILE_DIR}"


def role_profile(cfg: Any, subrole: str) -> RoleProfile:
    """The profile of `subrole` (actor, ref, rollout, critic, reward_model) under the run's tool; a colocated
    rollout's unset fields are the actor's (verl)."""
    from hybridflow._config.profiler import run_tool

    section = _section(cfg, subrole)
    # The colocated rollout is the actor's process; server replicas (rollout.mode=async) are profiled on their own.
    inherited = _section(cfg, "actor") if subrole == "rollout" and not server_replicas(cfg) else None

    def pick(name: str, default: Any) -> Any:
        value = getattr(section, name)
        if value is None and inherited is not None:
            value = getattr(inherited, name)
        return default if value is None else value

    glob = cfg.global_profiler
    tool = run_tool(cfg)
    tool_config = pick("tool_config", None)
    torch_options = tool_config.torch if tool_config is not None else None
    if tool == "torch":
        discrete = bool(torch_options.discrete) if torch_options is not None else False
    elif tool == "nsys":
        own = tool_config.nsys.discrete if tool_config is not None else None
        discrete = glob.global_tool_config.nsys.discrete if own is None else own
    else:  # torch_memory: one snapshot per window
        discrete = False
    return RoleProfile(
        enabled=bool(pick("enable", False)) and tool is not None and bool(glob.steps),
        all_ranks=bool(pick("all_ranks", False)),
        ranks=tuple(pick("ranks", [])),
        contents=tuple(torch_options.contents) if torch_options is not None else (),
        discrete=discrete,
        root=trace_root(cfg, pick("save_path", None)),
    )


def server_replicas(cfg: Any) -> bool:
    """Whether the rollout runs as server replicas (rollout.mode=async): its profiler section then stands alone."""
    return cfg.actor_rollout_ref.rollout.mode == "async"


def any_role_enabled(cfg: Any) -> bool:
    """Whether any profiled role's profiler.enable is true (the rollout's unset enable is the actor's)."""
    return any(role_profile(cfg, r).enabled for r in SECTIONS)


def step_windows(steps: Sequence[int] | None, continuous: bool) -> list[tuple[int, int]]:
    """The (first, last) step of each trace: one per step, or runs of consecutive steps merged when `continuous`."""
    windows: list[tuple[int, int]] = []
    for step in sorted(set(steps or ())):
        if continuous and windows and windows[-1][1] == step - 1:
            windows[-1] = (windows[-1][0], step)
        else:
            windows.append((step, step))
    return windows


def window_label(window: tuple[int, int]) -> str:
    """The trace folder of a window: global_step_3, or global_step_3-4 for a continuous run."""
    first, last = window
    return f"global_step_{first}" if first == last else f"global_step_{first}-{last}"


class StepProfiler:
    """Driver side: tell every worker group to start before a profiled step and to stop after it."""

    def __init__(self, cfg: Any, groups: Sequence[Any], log: Callable[[str], None] = print) -> None:
        from hybridflow._config.profiler import run_tool

        glob = cfg.global_profiler
        tool = run_tool(cfg)
        self.enabled = bool(glob.steps) and (any_role_enabled(cfg) or tool == "torch_memory")
        self.windows = step_windows(glob.steps, glob.profile_continuous_steps) if self.enabled else []
        self.groups = [g for g in groups if g is not None]
        self.log = log
        self._active: tuple[int, int] | None = None

    def _window_of(self, step: int) -> tuple[int, int] | None:
        return next((w for w in self.windows if w[0] <= step <= w[1]), None)

    def before_step(self, step: int) -> None:
        """Start tracing when `step` is profiled and no trace runs (also mid-window, after a resume)."""
        window = self._window_of(step)
        if window is None or self._active is not None:
            return
        self._active = window
        for group in self.groups:
            group.start_profile(window_label(window))

    def after_step(self, step: int) -> list[str]:
        """Stop tracing after the last step of the running window; returns the traces the workers wrote."""
        if self._active is None or step < self._active[1]:
            return []
        return self.stop()

    def close(self) -> None:
        """At the end of fit(): write a trace still running; a failure here is logged, never raised over the
        error that may be ending the run."""
        try:
            self.stop()
        except Exception as exc:  # the workers may be gone (the reason the run stops)
            self.log(f"profiler: the running trace could not be written: {type(exc).__name__}: {exc}")

    def stop(self) -> list[str]:
        """Stop a running trace now (the last step of the window, or the run ended early)."""
        if self._active is None:
            return []
        self._active = None
        written: list[str] = []
        for group in self.groups:
            for paths in group.stop_profile() or []:
                written += paths or []
        if written:
            self.log(f"profiler: wrote {len(written)} file(s), e.g. {written[0]}")
        return written


class WorkerProfiler:
    """Worker side: one process's recordings, for the sub-roles it holds (`actor`, `ref`, `rollout`, `critic`,
    `reward_model`)."""

    def __init__(self, cfg: Any, subroles: Sequence[str], rank: int, name: str) -> None:
        from hybridflow._config.profiler import run_tool

        self.rank = rank
        self.name = name
        self.tool = run_tool(cfg)
        self.settings = cfg.global_profiler.global_tool_config
        profiles = {r: role_profile(cfg, r) for r in subroles if r in SECTIONS}
        self.chosen = {r: p for r, p in profiles.items() if p.chooses(rank)}
        if self.tool == "torch_memory" and cfg.global_profiler.steps and not any_role_enabled(cfg) and rank == 0:
            # verl's torch_memory records rank 0 of each group when no role's profiler is enabled
            self.chosen = {r: RoleProfile(enabled=True, root=trace_root(cfg)) for r in profiles}
        # One continuous role makes the whole process record continuously: one recorder runs at a time.
        self.continuous = any(not p.discrete for p in self.chosen.values())
        self.contents = tuple(sorted({c for p in self.chosen.values() for c in p.contents}))
        first = next(iter(self.chosen.values()), None)
        self.root = first.root if first is not None else None
        self.label: str | None = None
        self._recorder: Recorder | None = None
        self._written: list[str] = []
        self._names: dict[str, int] = {}

    @property
    def active(self) -> bool:
        """Whether this process records anything at all."""
        return bool(self.chosen)

    def _new_recorder(self, contents: Sequence[str]) -> Recorder:
        if self.tool == "torch_memory":
            return MemorySnapshot(self.settings.torch_memory)
        if self.tool == "nsys":
            return NsightCapture()
        return TorchTrace(contents)

    def start(self, label: str) -> None:
        """Begin a profiled window (`global_step_N`): continuous mode starts the process's recording now."""
        if not self.active:
            return
        self.label, self._written, self._names = label, [], {}
        if self.tool == "nsys" and "://" not in (self.root or ""):
            os.makedirs(nsys_dir(self.root), exist_ok=True)  # nsys writes the report there after the capture
            logger.info("profiler: nsys captures %s rank %d (pid %d) in %s", self.name, self.rank, os.getpid(), label)
        if self.continuous:
            self._recorder = self._new_recorder(self.contents)
            self._recorder.start()

    def stop(self) -> list[str]:
        """End the window: finish the continuous recording; return every file written in the window."""
        if self.label is None:
            return []
        if self._recorder is not None:
            recorder, self._recorder = self._recorder, None
            self._finish(recorder, f"{self.name}_rank{self.rank}")
        written, self.label = self._written, None
        return written

    @contextlib.contextmanager
    def region(self, subrole: str, call: str) -> Iterator[None]:
        """Around one worker call: a labelled region of the continuous recording, or its own one when discrete."""
        if self.label is None:
            yield
            return
        if self._recorder is not None:
            with self._recorder.region(f"{subrole}.{call}"):
                yield
            return
        if subrole not in self.chosen:
            yield
            return
        recorder = self._new_recorder(self.chosen[subrole].contents)
        recorder.start()
        try:
            with recorder.region(f"{subrole}.{call}"):
                yield
        finally:
            self._finish(recorder, f"{subrole}_{call}_rank{self.rank}")

    def _finish(self, recorder: Recorder, stem: str) -> None:
        """Stop `recorder` and store its file beside the checkpoints (a second call of the same name in a window
        gets _2, _3...); nsys writes its report itself."""
        if recorder.suffix is None:
            recorder.finish(None)
            return
        count = self._names[stem] = self._names.get(stem, 0) + 1
        name = f"{stem}{recorder.suffix}" if count == 1 else f"{stem}_{count}{recorder.suffix}"
        with tempfile.TemporaryDirectory(prefix="hybridflow-profile-") as tmp:
            local = os.path.join(tmp, name)
            recorder.finish(local)
            self._written.append(store_file(local, self.root, self.label, name))


def store_file(local: str, root: str | None, label: str | None, name: str) -> str:
    """Copy a profiler's file to <root>/<label>/<name>, beside the checkpoints (local or S3); returns its URI."""
    from hybridflow.storage import upload_file

    uri = f"{root}/{label}/{name}"
    upload_file(local, uri)
    logger.info("profiler: %s written", uri)
    return uri


class Recorder:
    """One tool's recording in one worker process: started, regions labelled, then finished into a file at
    `finish(path)` (`suffix` names its kind; None: the tool writes its own files, and `path` is None)."""

    suffix: str | None = None

    def start(self) -> None:
        raise NotImplementedError

    def finish(self, path: str | None) -> None:
        raise NotImplementedError

    def region(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A labelled region of the recording (a worker call)."""
        return contextlib.nullcontext()


class TorchTrace(Recorder):
    """tool=torch: a torch.profiler trace, exported as gzipped Chrome-trace JSON."""

    suffix = ".json.gz"

    def __init__(self, contents: Sequence[str]) -> None:
        self._prof = build_torch_profiler(contents)

    def start(self) -> None:
        self._prof.start()

    def finish(self, path: str | None) -> None:
        self._prof.stop()
        self._prof.export_chrome_trace(path)

    def region(self, name: str) -> contextlib.AbstractContextManager[Any]:
        import torch

        return torch.profiler.record_function(name)


class MemorySnapshot(Recorder):
    """tool=torch_memory: CUDA allocation history recorded over the window, then the allocator's snapshot."""

    suffix = ".pickle"

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def start(self) -> None:
        import torch

        torch.cuda.memory._record_memory_history(
            context=self.settings.context,
            stacks=self.settings.stacks,
            max_entries=self.settings.trace_alloc_max_entries,
            **self.settings.kw_args,
        )

    def finish(self, path: str | None) -> None:
        import torch

        try:
            torch.cuda.memory._dump_snapshot(path)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)  # stop recording (and its overhead)

    def region(self, name: str) -> contextlib.AbstractContextManager[Any]:
        import torch

        return torch.profiler.record_function(name)  # shown in the snapshot's history with global annotations


class NsightCapture(Recorder):
    """tool=nsys: one capture range of the Nsight Systems process this worker runs under; NVTX ranges per call."""

    suffix = None

    def start(self) -> None:
        import torch

        torch.cuda.profiler.start()

    def finish(self, path: str | None) -> None:
        import torch

        torch.cuda.profiler.stop()

    def region(self, name: str) -> contextlib.AbstractContextManager[Any]:
        import torch

        return torch.cuda.nvtx.range(name)


def nsight_runtime_env(cfg: Any, subroles: Sequence[str], name: str) -> Callable[[int], dict[str, Any] | None]:
    """For tool=nsys: rank -> the Ray runtime env that starts that worker under `nsys profile` (None: a rank
    that records nothing, or another tool).

    The options are global_tool_config.nsys.worker_nsight_options with two blanks filled: capture-range-end
    (repeat-shutdown:<windows> for continuous capture, repeat for discrete) and o, the report's name
    (<root>/nsys/<name>_<pid> for a local root; in Ray's session logs, logs/nsight, for an s3:// one). Each
    worker logs its rank and pid when its first capture starts.
    """
    from hybridflow._config.profiler import run_tool

    def env(rank: int) -> dict[str, Any] | None:
        if run_tool(cfg) != "nsys":
            return None
        profiler = WorkerProfiler(cfg, subroles, rank, name)
        if not profiler.active:
            return None
        glob = cfg.global_profiler
        options = {k: v for k, v in glob.global_tool_config.nsys.worker_nsight_options.items() if v is not None}
        if "capture-range-end" not in options and "capture-range" in options:
            windows = len(step_windows(glob.steps, glob.profile_continuous_steps))
            options["capture-range-end"] = f"repeat-shutdown:{windows}" if profiler.continuous else "repeat"
        if "o" not in options and "output" not in options:
            stem = f"{name}_%p"  # the same options for every rank: Ray's nsight plugin keeps one command at a time
            options["o"] = stem if "://" in (profiler.root or "") else f"{nsys_dir(profiler.root)}/{stem}"
        return {"nsight": {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items()}}

    return env


def nsys_dir(root: str | None) -> str:
    """The local folder of nsys reports under a profile root (created by each worker before it is captured)."""
    return f"{os.path.abspath(root or PROFILE_DIR)}/nsys"


def build_torch_profiler(contents: Sequence[str]) -> Any:
    """A torch.profiler.profile for verl's `contents` (cpu, cuda, memory, shapes, stack); cuda only where it exists."""
    import torch

    wanted = set(contents)
    activities = []
    if not wanted or "cpu" in wanted:
        activities.append(torch.profiler.ProfilerActivity.CPU)
    if (not wanted or "cuda" in wanted) and torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    if not activities:  # cuda asked for on a machine without one: CPU activity is what there is
        activities.append(torch.profiler.ProfilerActivity.CPU)
    return torch.profiler.profile(
        activities=activities,
        record_shapes="shapes" in wanted,
        profile_memory="memory" in wanted,
        with_stack="stack" in wanted,
    )


F = TypeVar("F", bound=Callable[..., Any])


def profiled(subrole: str) -> Callable[[F], F]:
    """Mark a worker method as a call of `subrole`: traced by the worker's `profiler` when one is running."""

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            profiler = getattr(self, "profiler", None)
            if profiler is None or profiler.label is None:
                return method(self, *args, **kwargs)
            with profiler.region(subrole, method.__name__):
                return method(self, *args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
