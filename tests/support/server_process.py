"""Servers under test as subprocesses: start one, wait until its HTTP readiness URL answers, stop it.

Shared by the moto S3 server (tests/support/s3.py) and Prometheus (tests/support/prometheus.py).
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

#: How much of a dead or silent server's log an error message quotes.
LOG_TAIL_CHARS = 2000


def free_port() -> int:
    """Return a TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_http_server(command: Sequence[str], ready_url: str, *, name: str, timeout_s: float,
                      log_path: Path | None = None, poll_s: float = 0.1,
                      died_hint: str = "") -> subprocess.Popen[bytes]:
    """Start `command` and return its process once GET `ready_url` succeeds.

    Its stdout and stderr go to `log_path` (discarded when None). Raises RuntimeError, quoting the
    end of the log, if the process exits first (with `died_hint` appended: what to check) or if
    `timeout_s` passes (the process is stopped then).
    """
    if log_path is None:
        process = subprocess.Popen(list(command), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        with log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
            process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            hint = f"; {died_hint}" if died_hint else ""
            raise RuntimeError(f"{name} exited with {process.returncode} before {ready_url} answered"
                               f"{hint}{_log_tail(log_path)}")
        with suppress(OSError):  # refused, reset, or an HTTP error status: not ready yet
            urllib.request.urlopen(ready_url, timeout=1).close()
            return process
        time.sleep(poll_s)
    stop_process(process)
    raise RuntimeError(f"{name} did not answer on {ready_url} within {timeout_s}s; pass a longer timeout_s "
                       f"if the machine is busy{_log_tail(log_path)}")


def stop_process(process: subprocess.Popen[bytes] | None, grace_s: float = 10.0) -> None:
    """Terminate `process`, killing it if it outlives `grace_s`; nothing to do if it is None or gone."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _log_tail(log_path: Path | None) -> str:
    if log_path is None:
        return ""
    return f"; its log ends:\n{log_path.read_text(errors='replace')[-LOG_TAIL_CHARS:]}"
