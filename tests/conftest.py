"""Shared pytest fixtures: a Kubernetes API emulator on 127.0.0.1 with the project's CRDs installed."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from tests.support.kube_emulator import KubeEmulator

CRD_DIR = pathlib.Path(__file__).resolve().parents[1] / "crds"

# vLLM names its ZMQ sockets <VLLM_RPC_BASE_PATH>/<uuid> (default: the temp dir) and leaves the files behind
# on shutdown: a full run left ~2,800 in /tmp. Every engine the tests start (in this process, in Ray
# workers, in subprocesses: all inherit the environment) puts them in one folder that the session removes.
_VLLM_SOCKETS = None if "VLLM_RPC_BASE_PATH" in os.environ else tempfile.mkdtemp(prefix="vllm-rpc-")
if _VLLM_SOCKETS is not None:
    os.environ["VLLM_RPC_BASE_PATH"] = _VLLM_SOCKETS


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _VLLM_SOCKETS is not None:
        shutil.rmtree(_VLLM_SOCKETS, ignore_errors=True)


@pytest.fixture
def kube() -> Iterator[KubeEmulator]:
    """A fresh API emulator per test: built-in types, the CRDs in crds/ and KubeRay's (when available)."""
    emulator = KubeEmulator(crd_files=sorted(CRD_DIR.glob("*.yaml"))).start()
    try:
        yield emulator
    finally:
        emulator.stop()
