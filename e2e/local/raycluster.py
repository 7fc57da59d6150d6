"""A local Ray head node (`ray start --head --block`) that can be stopped without touching anyone else's Ray.

`ray stop` kills every Ray process of the user on the machine, which on a shared CI box would also end
other people's test clusters. So the head runs as our own child in its own process group
(`--block` keeps `ray start` in the foreground as the parent of gcs_server, raylet and the workers),
on free ports and a private short temp dir, and `stop()` signals only that process group.

Token auth is disabled (RAY_AUTH_MODE=disabled): with it on, Ray writes ~/.ray/auth_token, which
another test starting Ray at the same time may overwrite under our feet.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Environment every process that talks to this cluster needs (the head itself and every driver).
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
#: The head's GCS declares a node dead after 3 missed 1 s health checks (~3 s) instead of Ray's default
#: 5 x 3 s: a lost worker pod is noticed, and replaced, quickly enough for a short test.
HEALTH_CHECK_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def ray_cli() -> str:
    """The `ray` command of this interpreter's environment (else the one on PATH)."""
    exe = Path(sys.executable).with_name("ray")
    if exe.exists():
        return str(exe)
    found = shutil.which("ray")
    if found is None:
        raise RuntimeError("the `ray` command is not installed; install the trainer extra: "
                           "`.venv/bin/pip install -c constraints.txt -e '.[trainer]'`")
    return found


def _kill_group(leader: subprocess.Popen[bytes], pgid: int, timeout_s: float = 15.0) -> None:
    """SIGKILL a process group and wait until none of its processes is left (reaping our own child)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        leader.poll()  # a dead but unreaped leader would keep the group alive as a zombie
        time.sleep(0.2)


class LocalRayCluster:
    """One Ray head node on 127.0.0.1 with `num_cpus` CPUs; `address` is what RAY_ADDRESS should hold."""

    def __init__(self, num_cpus: int = 2, log_dir: Path | None = None) -> None:
        self.num_cpus = num_cpus
        self.port = free_port()
        self.address = f"{HOST}:{self.port}"
        # Ray puts Unix sockets under the temp dir: keep the path short (AF_UNIX allows ~107 bytes).
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rayE2E", dir="/tmp"))
        self.log = (log_dir or self.temp_dir) / "ray-head.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The `ray start` command line: every port that has a fixed default gets a free one instead."""
        ports = {
            "--port": self.port,
            # The dashboard process starts even with --include-dashboard=false (headless), on 8265.
            "--dashboard-port": free_port(),
            "--ray-client-server-port": free_port(),
            "--dashboard-agent-listen-port": free_port(),
            "--dashboard-agent-grpc-port": free_port(),
            "--runtime-env-agent-port": free_port(),
            "--metrics-export-port": free_port(),
            "--node-manager-port": free_port(),
            "--object-manager-port": free_port(),
        }
        return [
            ray_cli(), "start", "--head", "--block", "--node-ip-address", HOST,
            "--num-cpus", str(self.num_cpus), "--num-gpus", "0", "--include-dashboard=false",
            "--disable-usage-stats", "--temp-dir", str(self.temp_dir),
            # 256 MiB: the trainer moves small batches; Ray's default (30% of RAM) is far more than needed.
            "--object-store-memory", str(256 << 20),
            *(f"{flag}={port}" for flag, port in ports.items()),
        ]

    def start(self, timeout_s: float = 90.0) -> LocalRayCluster:
        """Start the head and wait until a driver can connect to it."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **RAY_ENV, **HEALTH_CHECK_ENV}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.command(), env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"`ray start --head` exited with {self.proc.returncode}:\n{tail}")
            if self._gcs_answers() and self._node_ready():
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the local Ray head did not come up within {timeout_s} s; see {self.log}")

    def _gcs_answers(self) -> bool:
        try:
            with socket.create_connection((HOST, self.port), timeout=1):
                return True
        except OSError:
            return False

    def _node_ready(self) -> bool:
        """The raylet has registered: `ray start` prints its banner only after that."""
        return "Ray runtime started" in self.log.read_text(errors="replace")

    def stop(self) -> None:
        """Stop the head's process group (SIGTERM, then SIGKILL) and remove the temp dir."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            pgid = os.getpgid(proc.pid)
            os.killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass  # `ray start --block` does not always exit on SIGTERM; its children have by now
            # Ray's daemons share the group; whatever did not exit with `ray start` goes now.
            _kill_group(proc, pgid)
            proc.wait(timeout=10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
