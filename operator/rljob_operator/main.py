"""`rljob operator`: run the RLJob operator (kopf) with settings from flags and environment."""

from __future__ import annotations

import dataclasses
import importlib
import sys

import kopf

from rljob_operator import peering
from rljob_operator.settings import parse_settings


def run(argv: list[str]) -> int:
    """Parse settings, register the handlers and run kopf until SIGINT/SIGTERM; returns the exit status."""
    settings = parse_settings(argv)
    if settings.priority is None:
        settings = dataclasses.replace(settings, priority=peering.random_priority())
    identity = peering.own_identity()
    importlib.import_module("rljob_operator.handlers")
    if settings.webhook is not None:
        importlib.import_module("rljob_operator.webhook").register()
    kopf.configure(verbose=settings.verbose)
    kopf.run(
        clusterwide=settings.clusterwide,
        namespaces=settings.namespaces,
        standalone=settings.peering is None,
        peering_name=settings.peering,
        priority=settings.priority,
        identity=identity,  # type: ignore[arg-type]  # kopf's Identity is a NewType of str
        memo=kopf.Memo(settings=settings, identity=identity),
    )
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
