"""Shared pytest fixtures: a Kubernetes API emulator on 127.0.0.1 with the project's CRDs installed."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from tests.support.kube_emulator import KubeEmulator

CRD_DIR = pathlib.Path(__file__).resolve().parents[1] / "crds"


@pytest.fixture
def kube() -> Iterator[KubeEmulator]:
    """A fresh API emulator per test: built-in types, the CRDs in crds/ and KubeRay's (when available)."""
    emulator = KubeEmulator(crd_files=sorted(CRD_DIR.glob("*.yaml"))).start()
    try:
        yield emulator
    finally:
        emulator.stop()
