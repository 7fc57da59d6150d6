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
# workers, in subprocesses, in xdist workers: all inherit the environment) puts them in one folder that the
# process which made it removes at the end.
_VLLM_SOCKETS = None if "VLLM_RPC_BASE_PATH" in os.environ else tempfile.mkdtemp(prefix="vllm-rpc-")
if _VLLM_SOCKETS is not None:
    os.environ["VLLM_RPC_BASE_PATH"] = _VLLM_SOCKETS

# Under pytest-xdist (`make test` runs two workers) the integration and e2e tests, which start Ray clusters,
# vLLM engines, operators and trainers, all run on one worker, one after another as without xdist; the other
# worker runs the unit tests beside them. Two such runs at once on a 2-core box would only fight for the cores.
SERIAL_GROUP = "integration"
SERIAL_DIRS = ("integration", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_dir = pathlib.Path(__file__).resolve().parent
    for item in items:
        parts = pathlib.Path(item.path).resolve().relative_to(tests_dir).parts
        if parts[0] in SERIAL_DIRS:
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))


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
