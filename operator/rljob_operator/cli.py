"""The `rljob` command: validate and render RLJob manifests offline, run the operator.

Subcommands are dispatched from COMMANDS (name -> "module:function"); each target takes the remaining
argv and returns an exit status, and is imported only when used, so `rljob validate` needs neither kopf
nor a cluster. To add a subcommand, add one entry.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from rljob_operator import api, changes
from rljob_operator.builders import build_children
from rljob_operator.settings import parse_pod_defaults
from rljob_operator.validation import ValidationReport, check_rljob

#: Stands in for metadata.uid when rendering without a cluster (the API server assigns the real one).
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class Command:
    """A subcommand: one line of help and the function (`module:function`, argv -> exit status)."""

    help: str
    target: str


COMMANDS: dict[str, Command] = {
    "validate": Command("check RLJob manifests (schema, trainer config, cluster fit)", f"{__name__}:validate_main"),
    "render": Command("print the ConfigMap and RayJob an RLJob becomes (nothing is applied)", f"{__name__}:render_main"),
    "operator": Command("run the RLJob operator (kopf); see `rljob operator --help`", "rljob_operator.main:run"),
    "run": Command("run an RLJob's trainer on this machine, as its RayJob would", "rljob_operator.localrun:run_main"),
}


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = [f"  {name:<{width}}  {cmd.help}" for name, cmd in COMMANDS.items()]
    return (
        "usage: rljob COMMAND [ARGS...]\n\nRLJob tools: RL post-training jobs on Kubernetes (HybridFlow + KubeRay).\n\n"
        "commands:\n" + "\n".join(lines) + "\n\nRun `rljob COMMAND --help` for a command's options.\n"
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rljob` console script."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage(), end="")
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"rljob: unknown command {name!r}; choose one of {', '.join(COMMANDS)}\n", file=sys.stderr)
        print(_usage(), end="", file=sys.stderr)
        return 2
    module_name, func_name = COMMANDS[name].target.split(":")
    try:
        func: Callable[[list[str]], int] = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as err:
        print(f"rljob {name}: not available in this installation ({err}); install the operator extra", file=sys.stderr)
        return 2
    return int(func(rest) or 0)


# ------------------------------------------------------------------------------------------ documents


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    return Path(path).read_text()


def _documents(path: str) -> Iterator[tuple[int, Any]]:
    """(1-based index, object) for each non-empty YAML document of a file; raises OSError/YAMLError."""
    for index, doc in enumerate(yaml.safe_load_all(_read(path)), start=1):
        if doc is not None:
            yield index, doc


def _label(index: int, doc: Any) -> str:
    if isinstance(doc, dict):
        name = (doc.get("metadata") or {}).get("name", "?") if isinstance(doc.get("metadata"), dict) else "?"
        return f"document {index} ({doc.get('kind', '?')}/{name})"
    return f"document {index}"


def _is_rljob(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("kind") == api.KIND


def _load_all(files: list[str], err: TextIO) -> list[tuple[str, int, Any]] | None:
    """Every document of every file, or None (after printing why) when a file cannot be read."""
    docs: list[tuple[str, int, Any]] = []
    for path in files:
        try:
            docs.extend((path, i, d) for i, d in _documents(path))
        except OSError as e:
            print(f"{path}: cannot read: {e.strerror or e}; check the path", file=err)
            return None
        except yaml.YAMLError as e:
            print(f"{path}: not valid YAML: {e}", file=err)
            return None
    return docs


@dataclass(frozen=True)
class Manifest:
    """One document of a manifest file: where it is, the object, its checks (None if not an RLJob)."""

    where: str
    doc: Any
    report: ValidationReport | None


def _manifest_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The parser `validate` and `render` share: a repeatable, required -f/--filename."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("-f", "--filename", action="append", required=True, metavar="FILE",
                        help="manifest file (repeatable; - reads stdin)")  # fmt: skip
    return parser


def _check_manifests(files: list[str]) -> list[Manifest] | None:
    """Every document of `files`, each RLJob checked; None (after saying why on stderr) if a file is unusable."""
    docs = _load_all(files, sys.stderr)
    if docs is None:
        return None
    return [
        Manifest(f"{path}: {_label(index, doc)}", doc, check_rljob(doc) if _is_rljob(doc) else None)
        for path, index, doc in docs
    ]


def _no_rljob_found(files: list[str]) -> int:
    """Say on stderr that `files` hold no RLJob; return exit status 1."""
    print(f"no RLJob found in {', '.join(files)}; expected kind: {api.KIND}", file=sys.stderr)
    return 1


# ------------------------------------------------------------------------------------------- validate


def validate_main(argv: list[str]) -> int:
    """`rljob validate -f FILE...`: exit 0 if every RLJob is valid, 1 listing every problem otherwise."""
    parser = _manifest_parser(
        "rljob validate",
        "Check RLJob manifests offline with the operator's own rules: the API schema, the "
        "trainer config (hybridflow.config) and whether the cluster shape fits. Multi-document YAML; "
        "documents that are not RLJobs are skipped.",
    )
    args = parser.parse_args(argv)
    manifests = _check_manifests(args.filename)
    if manifests is None:
        return 1
    invalid = checked = 0
    for item in manifests:
        if item.report is None:
            print(f"{item.where}: skipped (not an RLJob)")
            continue
        checked += 1
        for warning in item.report.warnings:
            print(f"{item.where}: warning: {warning}")
        errors = item.report.errors
        if errors:
            invalid += 1
            print(f"{item.where}: invalid ({len(errors)} problem{'s' if len(errors) != 1 else ''}):")
            for problem in errors:
                print(f"  - {problem}")
        else:
            print(f"{item.where}: valid")
    if checked == 0:
        return _no_rljob_found(args.filename)
    return 1 if invalid else 0


# --------------------------------------------------------------------------------------------- render


def _attempt(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"attempts start at 1, got {value}")
    return value


def render_main(argv: list[str]) -> int:
    """`rljob render -f FILE [--attempt N] [--trainer-image IMAGE] [--pod-defaults YAML]`: print every child
    manifest as YAML."""
    parser = _manifest_parser(
        "rljob render",
        "Print the objects the operator would create for each RLJob (its ConfigMap and the "
        "RayJob of one attempt) as multi-document YAML. Nothing is sent to a cluster. Invalid RLJobs are "
        "reported as by `rljob validate` and not rendered.",
    )
    parser.add_argument("--attempt", type=_attempt, default=1, help="attempt number to render (default 1)")
    parser.add_argument("--trainer-image", metavar="IMAGE", default=api.DEFAULT_IMAGE,
                        help="the operator's default trainer image (its --trainer-image, the chart's trainerImage), "
                             f"used by RLJobs without spec.image (default {api.DEFAULT_IMAGE})")
    parser.add_argument("--pod-defaults", metavar="YAML",
                        help="the operator's pod defaults (its --pod-defaults, the chart's podDefaults), under "
                             "each RLJob's own spec.pod")
    args = parser.parse_args(argv)
    try:
        pod_defaults = parse_pod_defaults("--pod-defaults", args.pod_defaults)
    except ValueError as err:
        print(f"rljob render: {err}", file=sys.stderr)
        return 2
    manifests = _check_manifests(args.filename)
    if manifests is None:
        return 1
    rendered: list[dict[str, Any]] = []
    failed = False
    for item in manifests:
        if item.report is None:
            continue
        if item.report.errors:
            failed = True
            print(f"{item.where}: invalid, not rendered:", file=sys.stderr)
            for problem in item.report.errors:
                print(f"  - {problem}", file=sys.stderr)
            continue
        rljob = api.RLJob.model_validate(item.doc)
        if not rljob.metadata.uid:
            rljob.metadata.uid = PLACEHOLDER_UID
        notes = changes.attempt_annotations(item.doc, changes.checkpoint_location(item.doc))
        rendered.extend(build_children(rljob, args.attempt, notes, default_image=args.trainer_image,
                                       pod_defaults=pod_defaults))
    if failed:
        return 1
    if not rendered:
        return _no_rljob_found(args.filename)
    print(f"# Rendered offline by `rljob render` (attempt {args.attempt}); nothing was applied.")
    print(f"# ownerReferences carry the placeholder uid {PLACEHOLDER_UID} unless the manifest had a uid:")
    print("# on a cluster the operator creates these objects with the RLJob's real uid.")
    print(yaml.safe_dump_all(rendered, sort_keys=False, default_flow_style=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
