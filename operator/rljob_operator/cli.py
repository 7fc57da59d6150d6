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
from typing import Any, TextIO

import yaml

from hybridflow import yamlio
from hybridflow.crash import INTERNAL_ERROR, report_bug
from rljob_operator import api, changes
from rljob_operator.builders import build_children, build_smoke_children
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

#: Exit statuses of `validate` and `render` (documented in their --help, README and docs/troubleshooting.md).
EXIT_VALID, EXIT_INVALID, EXIT_USAGE, EXIT_UNREADABLE, EXIT_BUG = 0, 1, 2, 3, INTERNAL_ERROR
EXIT_CODES = (
    "exit status: 0 every document is valid; 1 a document is invalid (or there is no RLJob); 2 wrong "
    "options; 3 a file could not be read (missing, not UTF-8, not YAML, duplicate keys, over a size, "
    "depth or alias limit); 4 internal error (a bug: please report it with the input)"
)


def _documents(path: str) -> Iterator[tuple[int, Any]]:
    """(1-based index, object) for each non-empty YAML document of a file; raises YamlError."""
    for index, doc in enumerate(yamlio.read_all(path), start=1):
        if doc is not None:
            yield index, doc


def _label(index: int, doc: Any) -> str:
    if isinstance(doc, dict):
        meta = doc.get("metadata")
        name = meta.get("name", "?") if isinstance(meta, dict) else "?"
        return f"document {index} ({yamlio.shorten(str(doc.get('kind', '?')), 60)}/{yamlio.shorten(str(name), 80)})"
    return f"document {index}"


def _is_rljob(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("kind") == api.KIND


def not_an_object(doc: Any) -> str | None:
    """Why a document cannot be a Kubernetes object at all, or None; `rljob validate` must not skip it.

    Other kinds (a Secret, a ConfigMap next to the RLJob) are skipped; a list, a scalar, a mapping
    without kind, or a near miss of RLJob (`kind: RLjob`, any kind in our API group) is an error.
    """
    if not isinstance(doc, dict):
        return (f"<document>: expected a Kubernetes object (a mapping with apiVersion and kind), got "
                f"{type(doc).__name__} {yamlio.shorten_repr(doc, 60)}; fix the document or remove it")
    kind, version = doc.get("kind"), doc.get("apiVersion")
    if not isinstance(kind, str) or not kind:
        return f"kind: missing or not a string; set kind: {api.KIND} (and apiVersion: {api.API_VERSION})"
    if not isinstance(version, str) or not version:
        return f"apiVersion: missing or not a string; set apiVersion: {api.API_VERSION} for an RLJob"
    if kind != api.KIND and (kind.lower() == api.KIND.lower() or version.split("/")[0] == api.GROUP):
        return f"kind: {yamlio.shorten_repr(kind, 60)} is not a kind of {api.GROUP}; did you mean {api.KIND}?"
    return None


def _load_all(files: list[str], err: TextIO) -> list[tuple[str, int, Any]] | None:
    """Every document of every file, or None (after printing why) when a file cannot be read."""
    docs: list[tuple[str, int, Any]] = []
    for path in files:
        try:
            docs.extend((path, i, d) for i, d in _documents(path))
        except yamlio.YamlError as e:
            print(e, file=err)
            return None
    return docs


@dataclass(frozen=True)
class Manifest:
    """One document of a manifest file: where it is, the object, its checks (None if skipped)."""

    where: str
    doc: Any
    report: ValidationReport | None


class _Crash(Exception):
    """An unexpected exception while checking one document (reported as a bug, with its location)."""

    def __init__(self, where: str, error: Exception) -> None:
        super().__init__(where)
        self.where, self.error = where, error


def _manifest_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The parser `validate` and `render` share: a repeatable, required -f/--filename."""
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=EXIT_CODES)
    parser.add_argument("-f", "--filename", action="append", required=True, metavar="FILE",
                        help="manifest file (repeatable; - reads stdin)")  # fmt: skip
    return parser


def _check(where: str, doc: Any) -> Manifest:
    """One document checked: an RLJob's report, an error for a non-object, None for other kinds."""
    try:
        problem = not_an_object(doc)
        if problem is not None:
            return Manifest(where, doc, ValidationReport(errors=[problem]))
        return Manifest(where, doc, check_rljob(doc) if _is_rljob(doc) else None)
    except Exception as exc:  # noqa: BLE001 - reported as a bug with the document's location
        raise _Crash(where, exc) from exc


def _check_manifests(files: list[str]) -> list[Manifest] | None:
    """Every document of `files`, each RLJob checked; None (after saying why on stderr) if a file is unusable."""
    docs = _load_all(files, sys.stderr)
    if docs is None:
        return None
    return [_check(f"{path}: {_label(index, doc)}", doc) for path, index, doc in docs]


def _no_rljob_found(files: list[str]) -> int:
    """Say on stderr that `files` hold no RLJob; return exit status 1."""
    print(f"no RLJob found in {', '.join(files)}; expected kind: {api.KIND}", file=sys.stderr)
    return EXIT_INVALID


def _guarded(prog: str, run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a subcommand; an unexpected exception is reported as a bug naming the input, never a traceback."""
    try:
        return run(args)
    except _Crash as crash:
        return report_bug(prog, crash.where, crash.error, sys.stderr)
    except Exception as exc:  # noqa: BLE001
        return report_bug(prog, ", ".join(args.filename), exc, sys.stderr)


# ------------------------------------------------------------------------------------------- validate


def validate_main(argv: list[str]) -> int:
    """`rljob validate -f FILE...`: exit 0 only if every document is valid (see EXIT_CODES)."""
    parser = _manifest_parser(
        "rljob validate",
        "Check RLJob manifests offline with the operator's own rules: the API schema, the "
        "trainer config (hybridflow.config) and whether the cluster shape fits. Multi-document YAML; "
        "documents of other kinds are skipped, documents that are no Kubernetes object are invalid.",
    )
    return _guarded("rljob validate", _validate, parser.parse_args(argv))


def _validate(args: argparse.Namespace) -> int:
    manifests = _check_manifests(args.filename)
    if manifests is None:
        return EXIT_UNREADABLE
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
    return EXIT_INVALID if invalid else EXIT_VALID


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
        "Print the objects the operator would create for each RLJob (its ConfigMap, the smoke run's "
        "RayJob when spec.runPolicy.smokeRun is set, and the RayJob of one attempt) as multi-document YAML. Nothing is sent to a cluster. Invalid RLJobs are "
        "reported as by `rljob validate` and not rendered.",
    )
    parser.add_argument("--attempt", type=_attempt, default=1, help="attempt number to render (default 1)")
    parser.add_argument("--trainer-image", metavar="IMAGE", default=api.DEFAULT_IMAGE,
                        help="the operator's default trainer image (its --trainer-image, the chart's trainerImage), "
                             f"used by RLJobs without spec.image (default {api.DEFAULT_IMAGE})")
    parser.add_argument("--pod-defaults", metavar="YAML",
                        help="the operator's pod defaults (its --pod-defaults, the chart's podDefaults), under "
                             "each RLJob's own spec.pod")
    return _guarded("rljob render", _render, parser.parse_args(argv))


def _render(args: argparse.Namespace) -> int:
    try:
        pod_defaults = parse_pod_defaults("--pod-defaults", args.pod_defaults)
    except ValueError as err:
        print(f"rljob render: {err}", file=sys.stderr)
        return EXIT_USAGE
    manifests = _check_manifests(args.filename)
    if manifests is None:
        return EXIT_UNREADABLE
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
        try:
            rendered.extend(_children(item.doc, args, pod_defaults))
        except Exception as exc:  # noqa: BLE001 - reported as a bug with the document's location
            raise _Crash(item.where, exc) from exc
    if failed:
        return EXIT_INVALID
    if not rendered:
        return _no_rljob_found(args.filename)
    text = yaml.safe_dump_all(rendered, sort_keys=False, default_flow_style=False)
    print(f"# Rendered offline by `rljob render` (attempt {args.attempt}); nothing was applied.")
    print(f"# ownerReferences carry the placeholder uid {PLACEHOLDER_UID} unless the manifest had a uid:")
    print("# on a cluster the operator creates these objects with the RLJob's real uid.")
    print(text, end="")
    return EXIT_VALID


def _children(doc: dict[str, Any], args: argparse.Namespace, pod_defaults: api.PodSpec) -> list[dict[str, Any]]:
    """The ConfigMap, the smoke run's RayJob (when spec.runPolicy.smokeRun is set; the operator runs it before
    attempt 1) and the attempt's RayJob of one valid RLJob document, as the operator would create them."""
    rljob = api.RLJob.model_validate(doc)
    if not rljob.metadata.uid:
        rljob.metadata.uid = PLACEHOLDER_UID
    location = changes.checkpoint_location(doc)
    configmap, rayjob = build_children(rljob, args.attempt, changes.attempt_annotations(doc, location),
                                       default_image=args.trainer_image, pod_defaults=pod_defaults)
    if rljob.spec.run_policy.smoke_run is None:
        return [configmap, rayjob]
    _, smoke_rayjob = build_smoke_children(rljob, changes.smoke_annotations(doc, location),
                                           default_image=args.trainer_image, pod_defaults=pod_defaults)
    return [configmap, smoke_rayjob, rayjob]


if __name__ == "__main__":
    sys.exit(main())
