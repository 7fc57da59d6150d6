"""`rljob run -f job.yaml`: run an RLJob's trainer on this machine through its RayJob's own entrypoint.

The command line and environment are not re-derived here: they are read from what the operator would
create (`build_configmap` for the trainer config, `build_rayjob` for the entrypoint and the pods' env),
and only the pod-specific parts are made local: the mounted config path becomes `<workdir>/config.yaml`
and `python` becomes the current interpreter. So `rljob run` and `kubectl apply` cannot drift apart.
Extra `key=value` arguments are appended after the entrypoint's own overrides (verl's CLI: last wins).
Environment variables already set in the caller's environment win over the pod's literal values, so a
local run can still be adjusted (e.g. `HYBRIDFLOW_METRICS_PORT=0` when port 8000 is taken); every
such replacement is reported.

Signals: the trainer runs in its own process group, so a terminal's Ctrl-C reaches only `rljob`, which
decides what to forward. SIGTERM is forwarded as is (the trainer finishes its step, saves a checkpoint
and exits, as when Kubernetes stops a pod). The first Ctrl-C is forwarded as SIGTERM too, for the same
graceful stop; a second one is forwarded as SIGINT (stop now, no checkpoint); a third kills the trainer.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from hybridflow import yamlio
from hybridflow.config import ConfigError, apply_overrides
from hybridflow.recipes import RECIPES, TrainerConfigTree, get_recipe
from rljob_operator import api, names
from rljob_operator.builders import build_configmap, build_rayjob
from rljob_operator.validation import check_rljob

#: Stands in for metadata.uid: the builders need one for ownerReferences, which a local run never uses.
LOCAL_UID = "00000000-0000-0000-0000-000000000000"
#: The attempt a local run corresponds to (a fresh run; it still resumes from existing checkpoints).
LOCAL_ATTEMPT = 1
#: Where `<workdir>` defaults to, relative to the current directory (`/outputs/` is git-ignored).
DEFAULT_WORKDIR_ROOT = Path("outputs") / "rljob"
#: Namespace reported to the trainer (RLJOB_NAMESPACE) when the manifest names none: kubectl's default.
DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True)
class LocalRun:
    """What a local run executes: the RayJob's command and pod environment, made local."""

    name: str
    argv: list[str]
    env: dict[str, str]
    config_text: str
    config_path: Path
    config: TrainerConfigTree
    notes: list[str] = field(default_factory=list)

    @property
    def checkpoint_uri(self) -> str:
        """Where checkpoints go: spec.checkpoint.uri, else the config's trainer.default_local_dir."""
        return self.config.trainer.default_local_dir


# ----------------------------------------------------------------------------------------- pure part


def localize_entrypoint(entrypoint: str, config_path: Path, python: str) -> list[str]:
    """The RayJob entrypoint as argv, with the current interpreter and the local config file.

    Raises RuntimeError when the entrypoint no longer has the shape this module relies on (the builder
    changed): better to stop than to run something other than what the cluster would.
    """
    argv = shlex.split(entrypoint)
    modules = sorted(recipe.module for recipe in RECIPES.values())
    shaped = len(argv) >= 4 and argv[:2] == ["python", "-m"] and argv[2] in modules and argv[3] == names.CONFIG_PATH
    if not shaped or any("=" not in a for a in argv[4:]):
        raise RuntimeError(
            f"the RayJob entrypoint {entrypoint!r} is not `python -m <{' | '.join(modules)}> {names.CONFIG_PATH} "
            "key=value...`; rljob run cannot map it to a local command: update rljob_operator.localrun with the builder"
        )
    return [python, *argv[1:3], str(config_path), *argv[4:]]


def _head_container(rayjob: dict[str, Any]) -> dict[str, Any]:
    """The container that runs the trainer driver: the head pod's first (KubeRay runs the entrypoint there)."""
    container: dict[str, Any] = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"][
        "containers"
    ][0]
    return container


def _local_env(
    container: dict[str, Any], rljob: api.RLJob, environ: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The container's env with values resolvable here, plus notes on what only a cluster provides."""
    env: dict[str, str] = {}
    notes: list[str] = []
    for var in container.get("env", []):
        name = var["name"]
        if "value" in var:
            env[name] = str(var["value"])
            if environ.get(name, env[name]) != env[name]:
                # Local tweaks (e.g. HYBRIDFLOW_METRICS_PORT=0 when port 8000 is taken) stay possible.
                notes.append(f"{name}: your environment's {environ[name]!r} replaces the pod's {env[name]!r}")
                env[name] = environ[name]
            continue
        source = var.get("valueFrom", {})
        if source.get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[name] = rljob.metadata.namespace or DEFAULT_NAMESPACE
        elif name in environ:
            notes.append(
                f"{name}: comes from {_describe_source(source)} on a cluster; using your environment's value"
            )
        else:
            notes.append(
                f"{name}: comes from {_describe_source(source)} on a cluster and is not set here; "
                f"export {name}=... before `rljob run` if the trainer needs it"
            )
    for source in container.get("envFrom", []):
        ref = source.get("secretRef") or source.get("configMapRef") or {}
        kind = "Secret" if "secretRef" in source else "ConfigMap"
        notes.append(
            f"envFrom {kind} {ref.get('name')!r}: its keys become environment variables on a cluster; export "
            "the ones the trainer needs (e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL) here"
        )
    return env, notes


def _describe_source(source: dict[str, Any]) -> str:
    """`Secret 'x' key 'y'` and the like, for notes about env values only a cluster can resolve."""
    for key, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
        if key in source:
            return f"{kind} {source[key]['name']!r} key {source[key]['key']!r}"
    if "fieldRef" in source:
        return f"the pod field {source['fieldRef'].get('fieldPath')!r}"
    return "the pod's resources"


def build_local_run(
    rljob: api.RLJob,
    workdir: Path,
    overrides: Sequence[str] = (),
    *,
    python: str,
    environ: Mapping[str, str],
) -> LocalRun:
    """Derive the local command, env and config file text from the RLJob's ConfigMap and RayJob.

    `rljob` must be valid (check_rljob). Raises ConfigError when the overrides make the config invalid:
    the same check the trainer makes at start-up (parse + run requirements), done before anything starts.
    """
    rljob = rljob.model_copy(deep=True)
    rljob.metadata.uid = rljob.metadata.uid or LOCAL_UID
    # One machine holds every role: no pods per role, so no Ray resource to place the pools by (roles.py).
    role_notes = ["spec.roles: every role runs on this machine"] if rljob.spec.roles is not None else []
    if rljob.spec.roles is not None and rljob.spec.roles.sandbox is not None:
        role_notes.append("spec.roles.sandbox: no run_code servers start; code runs in the local sandbox")
    rljob.spec.roles = None
    config_text = build_configmap(rljob)["data"][names.CONFIG_KEY]
    rayjob = build_rayjob(rljob, LOCAL_ATTEMPT)
    config_path = workdir / names.CONFIG_KEY
    argv = [*localize_entrypoint(rayjob["spec"]["entrypoint"], config_path, python), *overrides]
    # What the recipe's trainer does with this argv: load its config (config file, every key=value after it),
    # then the run checks. (Its parser is not imported: the operator package depends on the config models only.)
    parse = get_recipe(rljob.spec.recipe).parse
    config = parse(apply_overrides(yamlio.load_mapping(config_text, names.CONFIG_KEY), argv[4:]))
    config.validate_for_run()
    env, notes = _local_env(_head_container(rayjob), rljob, environ)
    return LocalRun(rljob.metadata.name, argv, env, config_text, config_path, config, role_notes + notes)


def device_problem(config: TrainerConfigTree, gpus: int) -> str | None:
    """Why this config cannot run on a machine with `gpus` CUDA GPUs, with the overrides that fix it."""
    trainer = config.trainer
    if trainer.device != "cuda":
        return None
    needed = trainer.nnodes * trainer.n_gpus_per_node
    if gpus >= needed:
        return None
    shape = f"{trainer.nnodes} node(s) x {trainer.n_gpus_per_node} GPU(s) = {needed}"
    if gpus == 0:
        return (
            f"spec.config.trainer.device is cuda ({shape}) but this machine has no CUDA GPU. To run on CPU, "
            "append `trainer.device=cpu trainer.nnodes=1 trainer.n_gpus_per_node=2` (on CPU: worker processes) "
            "and choose a model and batch sizes a CPU can train"
        )
    return (
        f"spec.config.trainer asks for {shape} CUDA GPUs but this machine has {gpus}. Append "
        f"`trainer.nnodes=1 trainer.n_gpus_per_node={gpus}` (and check that batch sizes still divide), or "
        "`trainer.device=cpu`"
    )


def render_dry_run(run: LocalRun) -> str:
    """A shell snippet: comments saying where things are, the env as exports, then the command."""
    lines = [
        f"# rljob run --dry-run: RLJob {run.name}; nothing was started",
        f"# trainer config (the ConfigMap's {names.CONFIG_KEY}): {run.config_path}",
        f"# checkpoints: {run.checkpoint_uri} (resumes from the latest committed step there)",
        *(f"# note: {note}" for note in run.notes),
        *(f"export {key}={shlex.quote(value)}" for key, value in run.env.items()),
        shlex.join(run.argv),
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- I/O part


def local_gpu_count() -> int:
    """Number of CUDA GPUs torch sees here (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _load_rljob(path: str) -> tuple[Any, list[str]]:
    """The one RLJob document of a file, or (None, problems) saying what is wrong with the file."""
    try:
        docs = [d for d in yamlio.read_all(path) if d is not None]
    except yamlio.YamlError as err:
        return None, [str(err)]
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == api.KIND]
    if len(jobs) == 1:
        return jobs[0], []
    if not jobs:
        return None, [f"{path}: no RLJob found; expected a document with kind: {api.KIND}"]
    found = ", ".join(str((j.get("metadata") or {}).get("name", "?")) for j in jobs)
    return None, [f"{path}: {len(jobs)} RLJobs found ({found}); rljob run runs one: put it in its own file"]


def run_child(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run `argv` in its own process group, forwarding SIGINT/SIGTERM (see the module doc); its exit status.

    A child killed by a signal gives 128 + the signal number, as a shell reports it.
    """
    proc = subprocess.Popen(list(argv), env=dict(env), process_group=0)
    interrupts = 0

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal interrupts
        if signum != signal.SIGINT:
            proc.send_signal(signum)
            return
        interrupts += 1
        if interrupts == 1:
            print("\nrljob run: stopping after the current step and a checkpoint (SIGTERM to the trainer); "
                  "Ctrl-C again stops now without one", file=sys.stderr, flush=True)  # fmt: skip
            proc.send_signal(signal.SIGTERM)
        elif interrupts == 2:
            print(
                "\nrljob run: stopping now (SIGINT); Ctrl-C again kills the trainer",
                file=sys.stderr,
                flush=True,
            )
            proc.send_signal(signal.SIGINT)
        else:
            proc.kill()

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if proc.poll() is None:  # rljob itself failed: never leave the trainer running unattended
            proc.kill()
            proc.wait()
    return 128 - code if code < 0 else code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rljob run",
        description="Run an RLJob's trainer on this machine (local Ray; CPU or local GPUs) with the same "
        "config, entrypoint and environment as the RayJob the operator would create. Validates first, like "
        "`rljob validate`; checkpoints go to spec.checkpoint.uri (or trainer.default_local_dir), and a rerun "
        "resumes from the latest committed one.",
        epilog="example: rljob run -f examples/tiny_grpo_rljob.yaml trainer.total_training_steps=2",
    )
    parser.add_argument(
        "-f", "--filename", required=True, metavar="FILE", help="RLJob manifest (- reads stdin)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="write the config, print env and command, run nothing"
    )
    parser.add_argument("--workdir", type=Path, metavar="DIR",
                        help=f"where config.yaml is written (default {DEFAULT_WORKDIR_ROOT}/<name>)")  # fmt: skip
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="trainer config overrides appended after the entrypoint's (verl syntax)")  # fmt: skip
    return parser


def run_main(argv: list[str]) -> int:
    """`rljob run -f FILE [--dry-run] [--workdir DIR] [key=value ...]`; exit 1 before starting on bad input."""
    args = _parser().parse_args(argv)
    bad_options = [o for o in args.overrides if o.startswith("-")]
    if bad_options:
        print(
            f"rljob run: unknown option {bad_options[0]}; overrides are key=value (see --help)",
            file=sys.stderr,
        )
        return 2
    doc, problems = _load_rljob(args.filename)
    if doc is None:
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1
    report = check_rljob(doc)
    where = f"{args.filename}: RLJob/{(doc.get('metadata') or {}).get('name', '?')}"
    for warning in report.warnings:
        print(f"{where}: warning: {warning}", file=sys.stderr)
    if report.errors:
        print(f"{where}: invalid, nothing started ({len(report.errors)} problem(s)):", file=sys.stderr)
        for problem in report.errors:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    rljob = api.RLJob.model_validate({k: v for k, v in doc.items() if k != "status"})
    workdir = args.workdir or DEFAULT_WORKDIR_ROOT / rljob.metadata.name
    try:
        run = build_local_run(
            rljob, workdir.resolve(), args.overrides, python=sys.executable, environ=os.environ
        )
    except ConfigError as err:
        print(f"{where}: the overrides make the trainer config invalid, nothing started:", file=sys.stderr)
        for problem in err.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    gpu_problem = (
        device_problem(run.config, local_gpu_count()) if run.config.trainer.device == "cuda" else None
    )
    if gpu_problem and not args.dry_run:
        print(f"{where}: cannot run here: {gpu_problem}", file=sys.stderr)
        return 1
    run.config_path.parent.mkdir(parents=True, exist_ok=True)
    run.config_path.write_text(run.config_text)
    if args.dry_run:
        if gpu_problem:
            print(f"{where}: warning: {gpu_problem}", file=sys.stderr)
        print(render_dry_run(run), end="")
        return 0
    for note in run.notes:
        print(f"rljob run: note: {note}", file=sys.stderr)
    print(
        f"rljob run: {run.name}: config {run.config_path}, checkpoints {run.checkpoint_uri}", file=sys.stderr
    )
    print(f"rljob run: {shlex.join(run.argv)}", file=sys.stderr, flush=True)
    return run_child(run.argv, {**os.environ, **run.env})
