"""`rljob operator`: run the RLJob operator (kopf) with settings from flags and environment."""

from __future__ import annotations

import importlib
import sys

import kopf

from rljob_operator.settings import parse_settings


def run(argv: list[str]) -> int:
    """Parse settings, register the handlers and run kopf until SIGINT/SIGTERM; returns the exit status."""
    settings = parse_settings(argv)
    importlib.import_module("rljob_operator.handlers")
    kopf.configure(verbose=settings.verbose)
    kopf.run(
        clusterwide=settings.clusterwide,
        namespaces=settings.namespaces,
        standalone=settings.peering is None,
        peering_name=settings.peering,
        memo=kopf.Memo(settings=settings),
    )
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
