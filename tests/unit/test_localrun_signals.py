"""`rljob run` signal handling (localrun.run_child) with real processes: what reaches the trainer, exit codes."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

# Stands in for the trainer: reports its process group, then records the signals it gets.
CHILD = r"""
import os, signal, sys, time
def on_term(signum, frame):
    print("child: SIGTERM", flush=True)
    if MODE == "exit_on_term":
        sys.exit(7)
def on_int(signum, frame):
    print("child: SIGINT", flush=True)
    if MODE != "stubborn":
        sys.exit(5)
MODE = sys.argv[1]
signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGINT, on_int)
print(f"child: ready own_group={os.getpgid(0) == os.getpid()}", flush=True)
for _ in range(600):
    time.sleep(0.1)
sys.exit(99)
"""

Spawn = Callable[[str], "subprocess.Popen[str]"]

PARENT = (
    "import os, sys; from rljob_operator.localrun import run_child; "
    "sys.exit(run_child([sys.executable, '-c', sys.argv[1], sys.argv[2]], dict(os.environ)))"
)


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start `run_child` in a subprocess around CHILD; kill leftovers after the test."""
    procs: list[subprocess.Popen[str]] = []

    def start(mode: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", PARENT, CHILD, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert line.startswith("child: ready"), line + proc.stderr.read()
        assert "own_group=True" in line  # a terminal's Ctrl-C reaches rljob only; rljob decides
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _next_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def test_sigterm_is_forwarded_and_the_childs_exit_code_returned(spawn: Spawn) -> None:
    proc = spawn("exit_on_term")
    proc.send_signal(signal.SIGTERM)
    assert _next_line(proc) == "child: SIGTERM"
    assert proc.wait(timeout=30) == 7


def test_first_ctrl_c_asks_for_a_graceful_stop_with_sigterm(spawn: Spawn) -> None:
    proc = spawn("exit_on_term")
    proc.send_signal(signal.SIGINT)
    assert _next_line(proc) == "child: SIGTERM"
    assert proc.wait(timeout=30) == 7
    assert proc.stderr is not None
    assert "stopping after the current step and a checkpoint" in proc.stderr.read()


def test_second_ctrl_c_forwards_sigint(spawn: Spawn) -> None:
    proc = spawn("exit_on_int")
    proc.send_signal(signal.SIGINT)
    assert _next_line(proc) == "child: SIGTERM"  # still running: it ignores SIGTERM
    proc.send_signal(signal.SIGINT)
    assert _next_line(proc) == "child: SIGINT"
    assert proc.wait(timeout=30) == 5


def test_third_ctrl_c_kills_and_exit_code_is_128_plus_signal(spawn: Spawn) -> None:
    proc = spawn("stubborn")
    for expected in ("child: SIGTERM", "child: SIGINT"):
        proc.send_signal(signal.SIGINT)
        assert _next_line(proc) == expected
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 128 + signal.SIGKILL
