"""torch.profiler traces of chosen training steps in chosen worker ranks (verl's profiler keys, `tool=torch`).

The driver (`StepProfiler`) starts and stops profiling around the steps of `global_profiler.steps`; each
worker process (`WorkerProfiler`) decides from its roles' `profiler` sections whether its rank is traced
and how:

- continuous (`tool_config.torch.discrete=false`, verl's default): one trace per worker process covering the
  whole step (or run of consecutive steps with `profile_continuous_steps`), each worker call in it a labelled
  region (`actor.update_actor`, `ref.compute_ref_log_prob`, ...);
- discrete: one trace per worker call of an enabled role.

Traces are Chrome-trace JSON (gzipped; open in Perfetto or chrome://tracing) under
``<root>/global_step_<N>/<role>[_<call>]_rank<R>.json.gz``, where the root is the role's `save_path`, else
`global_profiler.save_path`, else ``<trainer.default_local_dir>/profile`` beside the checkpoints. They are
written locally first and copied with `hybridflow.storage.upload_file`, so an ``s3://`` root gets them too.
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
    """The profile of `subrole` (actor, ref, rollout, critic); the rollout's unset fields are the actor's (verl)."""
    section = _section(cfg, subrole)
    inherited = _section(cfg, "actor") if subrole == "rollout" else None

    def pick(name: str, default: Any) -> Any:
        value = getattr(section, name)
        if value is None and inherited is not None:
            value = getattr(inherited, name)
        return default if value is None else value

    glob = cfg.global_profiler
    tool = section.tool or (inherited.tool if inherited is not None else None) or glob.tool
    tool_config = pick("tool_config", None)
    torch_options = tool_config.torch if tool_config is not None else None
    return RoleProfile(
        enabled=bool(pick("enable", False)) and tool == "torch" and bool(glob.steps),
        all_ranks=bool(pick("all_ranks", False)),
        ranks=tuple(pick("ranks", [])),
        contents=tuple(torch_options.contents) if torch_options is not None else (),
        discrete=bool(torch_options.discrete) if torch_options is not None else False,
        root=trace_root(cfg, pick("save_path", None)),
    )


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
        glob = cfg.global_profiler
        self.enabled = glob.tool == "torch" and any(role_profile(cfg, r).enabled for r in SECTIONS)
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
            self.log(f"profiler: wrote {len(written)} trace(s), e.g. {written[0]}")
        return written


class WorkerProfiler:
    """Worker side: one process's traces, for the sub-roles it holds (`actor`, `ref`, `rollout`, `critic`)."""

    def __init__(self, cfg: Any, subroles: Sequence[str], rank: int, name: str) -> None:
        self.rank = rank
        self.name = name
        profiles = {r: role_profile(cfg, r) for r in subroles if r in SECTIONS}
        self.chosen = {r: p for r, p in profiles.items() if p.chooses(rank)}
        # One continuous role makes the whole process traced continuously: torch runs one profiler at a time.
        self.continuous = any(not p.discrete for p in self.chosen.values())
        self.contents = tuple(sorted({c for p in self.chosen.values() for c in p.contents}))
        first = next(iter(self.chosen.values()), None)
        self.root = first.root if first is not None else None
        self.label: str | None = None
        self._prof: Any = None
        self._written: list[str] = []
        self._names: dict[str, int] = {}

    @property
    def active(self) -> bool:
        """Whether this process traces anything at all."""
        return bool(self.chosen)

    def start(self, label: str) -> None:
        """Begin a profiled window (`global_step_N`): continuous mode starts the process's trace now."""
        if not self.active:
            return
        self.label, self._written, self._names = label, [], {}
        if self.continuous:
            self._prof = build_torch_profiler(self.contents)
            self._prof.start()

    def stop(self) -> list[str]:
        """End the window: write the continuous trace; return every trace written in the window."""
        if self.label is None:
            return []
        if self._prof is not None:
            prof, self._prof = self._prof, None
            prof.stop()
            self._write(prof, f"{self.name}_rank{self.rank}")
        written, self.label = self._written, None
        return written

    @contextlib.contextmanager
    def region(self, subrole: str, call: str) -> Iterator[None]:
        """Around one worker call: a labelled region of the continuous trace, or its own trace when discrete."""
        if self.label is None:
            yield
            return
        import torch

        if self._prof is not None:
            with torch.profiler.record_function(f"{subrole}.{call}"):
                yield
            return
        if subrole not in self.chosen:
            yield
            return
        prof = build_torch_profiler(self.chosen[subrole].contents)
        prof.start()
        try:
            with torch.profiler.record_function(f"{subrole}.{call}"):
                yield
        finally:
            prof.stop()
            self._write(prof, f"{subrole}_{call}_rank{self.rank}")

    def _write(self, prof: Any, stem: str) -> None:
        """Export the trace beside the checkpoints (a second call of the same name in a window gets _2, _3...)."""
        from hybridflow.storage import upload_file

        count = self._names[stem] = self._names.get(stem, 0) + 1
        name = f"{stem}.json.gz" if count == 1 else f"{stem}_{count}.json.gz"
        uri = f"{self.root}/{self.label}/{name}"
        with tempfile.TemporaryDirectory(prefix="hybridflow-trace-") as tmp:
            local = os.path.join(tmp, name)
            prof.export_chrome_trace(local)
            upload_file(local, uri)
        self._written.append(uri)
        logger.info("profiler: trace written to %s", uri)


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
