"""The operator as a subprocess (`python -m rljob_operator.main`) pointed at the API emulator, for tests."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import TypeVar

from .kube_emulator import KubeEmulator
from .server_process import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
T = TypeVar("T")


def wait_for(check: Callable[[], T], what: str, timeout: float = 20.0) -> T:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Operator:
    """One operator process; `args` are its flags (default: standalone, all namespaces, 2 s resync)."""

    def __init__(self, kube: KubeEmulator, workdir: pathlib.Path,
                 args: Sequence[str] = ("--standalone", "-A"), pod_id: str | None = None,
                 token: str = "emulator-token", env: dict[str, str] | None = None) -> None:
        """Write a kubeconfig for the emulator into `workdir`; the log goes to `workdir/operator.log`.

        `token`: whose requests the operator sends (`kube.add_token(service_account(...))` makes RBAC
        apply to them); `env`: extra environment variables (e.g. POD_NAMESPACE, as the chart sets it).
        """
        workdir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = kube.write_kubeconfig(workdir / "kubeconfig", token=token)
        self.env = dict(env or {})
        self.log = workdir / "operator.log"
        self.metrics_port = free_port()
        self.args = list(args)
        self.pod_id = pod_id
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process (its output appended to the log)."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONPATH": str(ROOT), **self.env}
        if self.pod_id:
            env["POD_ID"] = self.pod_id
        cmd = [sys.executable, "-m", "rljob_operator.main", *self.args,
               "--metrics-port", str(self.metrics_port), "--resync-seconds", "2"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the process with `sig` (SIGTERM: a clean stop; SIGKILL: a crash) and wait for it."""
        if self.proc is not None:
            self.proc.send_signal(sig)
            self.proc.wait(15)
            self.proc = None

    def metric(self, name: str) -> float:
        """Sum of one metric's samples on the operator's /metrics endpoint (0 when absent/unreachable)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            return 0.0
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and not line.startswith("#") and line[len(name)] in " {")
