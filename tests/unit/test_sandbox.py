"""The local code sandbox: hostile programs are contained and reported, the test process is unaffected."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

from hybridflow.tools.sandbox import (
    ISOLATION_MODES,
    SANDBOX_UID_BASE,
    SANDBOX_UID_SPAN,
    RunResult,
    SandboxPool,
    available_isolation_modes,
    isolation_mode,
    isolation_report,
    network_isolation_available,
    run_code,
    run_code_async,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
SECRET = "hf-sandbox-test-secret-6f1d"
MODE = isolation_mode()
REPORT = isolation_report()
SLACK_S = 4.0  # set-up, teardown and a loaded 2-core box on top of the run's own limit
LEFTOVER_MARK = "987.654"  # sleep duration used by cases that leave children behind


@dataclasses.dataclass
class Host:
    """What the hostile programs aim at, on the test's side."""

    outside_tmp: str
    outside_given: pathlib.Path
    sentinel: pathlib.Path
    listener: socket.socket

    def render(self, code: str) -> str:
        return (
            code.replace("@OUTSIDE_TMP@", self.outside_tmp)
            .replace("@OUTSIDE_GIVEN@", str(self.outside_given))
            .replace("@REPO@", str(REPO))
            .replace("@PORT@", str(self.listener.getsockname()[1]))
            .replace("@TEST_PID@", str(os.getpid()))
            .replace("@MARK@", LEFTOVER_MARK)
        )


@dataclasses.dataclass(frozen=True)
class Hostile:
    """A hostile program, the isolation it needs to be contained, and what its result must show."""

    name: str
    code: str
    check: Callable[[RunResult, Host], None]
    needs: tuple[str, ...] = ()  # keys of isolation_report() that must be true
    run_timeout: float = 10.0  # generous where the program ends by itself: a loaded box must not turn it into a TLE
    stdin: str | None = None
    memory_limit_mb: int = 256


def _finished(rc: int | None = None, limit: str | None = None, out: str | None = None, err: str | None = None):
    def check(r: RunResult, host: Host) -> None:
        assert r.status == "Finished", r
        if rc is not None:
            assert r.return_code == rc, r
        if limit is not None:
            assert limit in r.limits_hit, r
        if out is not None:
            assert out in r.stdout, r
        if err is not None:
            assert err in r.stderr, r

    return check


def _timed_out(r: RunResult, host: Host) -> None:
    assert r.status == "TimeLimitExceeded" and r.limits_hit == ["wall_time"] and r.return_code is None, r


def _no_secret(r: RunResult, host: Host) -> None:
    assert r.status == "Finished", r
    assert SECRET not in r.stdout + r.stderr, r


def _not_written(path_of: Callable[[Host], pathlib.Path]):
    def check(r: RunResult, host: Host) -> None:
        assert r.status == "Finished", r
        assert not path_of(host).exists(), f"{path_of(host)} was written from inside the sandbox: {r}"

    return check


def _no_connection(r: RunResult, host: Host) -> None:
    assert r.status == "Finished" and r.return_code == 1, r
    with pytest.raises(BlockingIOError):
        host.listener.accept()


def _parent_survives(r: RunResult, host: Host) -> None:
    assert r.status == "Finished" and r.return_code == 0, r
    assert r.stdout.count("refused") == 2, r


def _scratch_parent(r: RunResult, host: Host) -> None:
    assert r.status == "Finished", r
    assert host.sentinel.exists() and os.path.isdir(tempfile.gettempdir())


def _any_of_limits(*names: str):
    def check(r: RunResult, host: Host) -> None:
        assert r.status == "Finished" and r.return_code == 1, r
        assert set(names) & set(r.limits_hit), r

    return check


def _devices_hidden(r: RunResult, host: Host) -> None:
    assert r.status == "Finished" and r.return_code == 0, r
    assert "opened" not in r.stdout and r.stdout.count("refused") == 8, r


def _segfault(r: RunResult, host: Host) -> None:
    assert r.status == "Finished" and r.return_code == -11 and "SIGSEGV" in r.reason, r


def _crashed(r: RunResult, host: Host) -> None:
    assert r.status == "Finished" and r.return_code not in (0, None), r


def _no_privileges(r: RunResult, host: Host) -> None:
    assert r.status == "Finished" and r.return_code == 0, r
    assert "CapEff:\t0000000000000000" in r.stdout and "CapBnd:\t0000000000000000" in r.stdout, r
    assert "setuid refused" in r.stdout, r


HOSTILE = [
    Hostile("fork_bomb", "import os\nwhile True:\n    os.fork()\n", _finished(rc=1, limit="processes"),
            needs=("process_limit_enforced", "pid_namespace")),
    Hostile("fork_bomb_swallowing_errors",
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
            _timed_out, run_timeout=2, needs=("process_limit_enforced", "pid_namespace")),
    Hostile("subprocess_spawn_loop",
            "import subprocess\nkids = []\nwhile True:\n    kids.append(subprocess.Popen(['sleep', '@MARK@']))\n",
            _finished(rc=1, limit="processes"), needs=("process_limit_enforced", "pid_namespace")),
    Hostile("cpu_loop", "while True:\n    pass\n", _timed_out, run_timeout=2),
    Hostile("busy_with_sleeping_children",
            "import subprocess\nfor _ in range(5):\n    subprocess.Popen(['sleep', '@MARK@'])\nwhile True:\n    pass\n",
            _timed_out, run_timeout=2),
    Hostile("children_in_own_session_outlive_parent",
            "import subprocess\nfor _ in range(3):\n"
            "    subprocess.Popen(['sleep', '@MARK@'], start_new_session=True)\nprint('left')\n",
            _finished(rc=0, out="left"), needs=("pid_namespace",)),
    Hostile("sleep_forever", "import time\ntime.sleep(1000)\n", _timed_out, run_timeout=2),
    Hostile("allocate_10_gb", "x = bytearray(10 * 2**30)\n", _finished(rc=1, limit="memory")),
    Hostile("grow_list_forever", "x = []\nwhile True:\n    x.append(bytearray(2**20))\n",
            _finished(rc=1, limit="memory")),
    Hostile("print_forever", "while True:\n    print('spam' * 100)\n", _finished(limit="output")),
    Hostile("write_1_gb_file_in_scratch",
            "with open('big.bin', 'wb') as f:\n    for _ in range(1024):\n        f.write(b'0' * 2**20)\n",
            _finished(rc=1, limit="file_size")),
    Hostile("fill_scratch_with_files",
            "for i in range(64):\n    with open(f'part{i}', 'wb') as f:\n"
            "        for _ in range(31):\n            f.write(b'0' * 2**20)\n",
            _finished(rc=1, limit="scratch_space"), needs=("private_tmp",)),
    Hostile("write_outside_in_tmp",
            "import os\nos.makedirs(os.path.dirname('@OUTSIDE_TMP@'), exist_ok=True)\n"
            "open('@OUTSIDE_TMP@', 'w').write('pwned')\n",
            _not_written(lambda h: pathlib.Path(h.outside_tmp)), needs=("private_tmp",)),
    Hostile("write_to_a_path_the_test_gave",
            "import os\ntry:\n    os.makedirs(os.path.dirname('@OUTSIDE_GIVEN@'), exist_ok=True)\n"
            "    open('@OUTSIDE_GIVEN@', 'w').write('pwned')\nexcept OSError as e:\n    print('refused', e)\n",
            _not_written(lambda h: h.outside_given), needs=("private_tmp",)),
    Hostile("write_into_the_repository",
            "try:\n    open('@REPO@/sandbox-pwned.txt', 'w').write('pwned')\nexcept OSError as e:\n"
            "    print('refused', e)\n",
            _not_written(lambda h: REPO / "sandbox-pwned.txt"), needs=("read_only_filesystem",)),
    Hostile("connect_to_the_test_on_localhost",
            "import socket\nsocket.create_connection(('127.0.0.1', @PORT@), timeout=1)\n",
            _no_connection, needs=("network_namespace",)),
    Hostile("open_host_devices",
            "import os\nfor dev in ('vda', 'sda', 'kvm', 'mem', 'nvidia0', 'nvidiactl', 'fuse', 'net/tun'):\n"
            "    try:\n        os.close(os.open('/dev/' + dev, os.O_RDWR))\n        print('opened', dev)\n"
            "    except OSError as e:\n        print('refused', dev, e.errno)\n",
            _devices_hidden, needs=("minimal_dev",)),
    Hostile("dns_lookup", "import socket\nprint(socket.getaddrinfo('example.com', 80))\n",
            _finished(rc=1, err="gaierror"), needs=("network_namespace",)),
    Hostile("read_environment", "import os\nprint(dict(os.environ))\n", _no_secret),
    Hostile("read_other_processes_environment",
            "import os\nfor pid in {os.getppid(), 1, @TEST_PID@}:\n    try:\n"
            "        print(pid, open(f'/proc/{pid}/environ').read())\n    except OSError as e:\n"
            "        print('denied', pid, e)\n",
            _no_secret),
    Hostile("kill_the_parent_and_the_test",
            "import os\nfor pid in (os.getppid(), @TEST_PID@):\n    try:\n        os.kill(pid, 9)\n"
            "    except OSError as e:\n        print('refused', pid, e)\n",
            _parent_survives, needs=("pid_namespace", "uid_drop")),
    Hostile("kill_every_process_it_may", "import os\ntry:\n    os.kill(-1, 9)\nexcept ProcessLookupError:\n    pass\nprint('still here')\n",
            _finished(rc=0, out="still here"), needs=("pid_namespace", "uid_drop")),
    Hostile("recursion_bomb", "def f(n):\n    return f(n + 1)\nf(0)\n", _finished(rc=1, err="RecursionError")),
    Hostile("recursion_bomb_without_a_limit",
            "import sys\nsys.setrecursionlimit(10**9)\ndef f(n):\n    return f(n + 1)\nf(0)\n",
            _crashed, memory_limit_mb=64),
    Hostile("thread_bomb",
            "import threading, time\nwhile True:\n"
            "    threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()\n",
            _any_of_limits("processes", "memory"), needs=("process_limit_enforced",)),
    Hostile("open_files_forever", "files = []\nwhile True:\n    files.append(open('/dev/null'))\n",
            _finished(rc=1, limit="open_files")),
    Hostile("close_its_output_then_run_on",
            "import os, time\nprint('bye', flush=True)\nos.close(1)\nos.close(2)\ntime.sleep(0.5)\nraise SystemExit(4)\n",
            _finished(rc=4, out="bye")),
    Hostile("exit_code_3", "import sys\nsys.exit(3)\n", _finished(rc=3)),
    Hostile("syntax_error", "def broken(:\n", _finished(rc=1, err="SyntaxError")),
    Hostile("exception_traceback", "raise ValueError('boom')\n", _finished(rc=1, err="ValueError: boom")),
    Hostile("read_stdin", "import sys\nprint(sys.stdin.read().upper())\n", _finished(rc=0, out="HELLO SANDBOX"),
            stdin="hello sandbox"),
    Hostile("read_stdin_when_none_given", "import sys\nprint(repr(sys.stdin.read()))\n",
            _finished(rc=0, out="''")),
    Hostile("delete_the_scratch_parent",
            "import os, shutil\nshutil.rmtree(os.path.dirname(os.getcwd()), ignore_errors=True)\n"
            "shutil.rmtree('/tmp', ignore_errors=True)\nprint('tried')\n",
            _scratch_parent),
    Hostile("null_pointer_segfault", "import ctypes\nctypes.string_at(0)\n", _segfault),
    Hostile("escalate_privileges",
            "import os\nprint(open('/proc/self/status').read())\ntry:\n    os.setuid(0)\n"
            "    print('became root')\nexcept PermissionError:\n    print('setuid refused')\n",
            _no_privileges, needs=("uid_drop",)),
]


@pytest.fixture
def host(tmp_path: pathlib.Path) -> Iterator[Host]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    sentinel = pathlib.Path(tempfile.gettempdir()) / f"hf-sandbox-sentinel-{os.getpid()}"
    sentinel.write_text("keep")
    outside_tmp = os.path.join(tempfile.gettempdir(), f"hf-sandbox-outside-{os.getpid()}", "pwned.txt")
    try:
        yield Host(outside_tmp, tmp_path / "given" / "pwned.txt", sentinel, listener)
    finally:
        listener.close()
        sentinel.unlink(missing_ok=True)


def _leftover_processes() -> list[str]:
    """Processes of a sandbox uid, or still sleeping the cases' marked duration."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            uid = int(pathlib.Path(f"/proc/{entry}/status").read_text().split("Uid:")[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue
        if LEFTOVER_MARK in cmdline or SANDBOX_UID_BASE <= uid < SANDBOX_UID_BASE + SANDBOX_UID_SPAN:
            found.append(f"{entry} uid={uid} {cmdline}")
    return found


def _leftovers_after_a_moment() -> list[str]:
    """Leftover processes still there after up to 3 s (SIGKILLed ones take a moment to be reaped)."""
    deadline = time.monotonic() + 3
    while _leftover_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    return _leftover_processes()


def _assert_host_unaffected(host: Host) -> None:
    assert not _leftovers_after_a_moment(), _leftover_processes()
    assert subprocess.run(["true"], check=False).returncode == 0
    assert host.sentinel.read_text() == "keep"


def test_isolation_is_measured_and_reported() -> None:
    print(f"\nsandbox isolation on this machine: {REPORT}; modes that work: {available_isolation_modes()}")
    assert MODE in ISOLATION_MODES and MODE == available_isolation_modes()[0]
    assert network_isolation_available() == REPORT["network_namespace"] == (MODE != "none")
    result = run_code("print('hi')")
    assert (result.isolation, result.network_isolated) == (MODE, network_isolation_available())


@pytest.mark.parametrize("case", HOSTILE, ids=[case.name for case in HOSTILE])
def test_hostile_program_is_contained(case: Hostile, host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = [need for need in case.needs if not REPORT[need]]
    if missing:
        pytest.skip(f"isolation mode {MODE!r} here lacks {', '.join(missing)}, so {case.name} is not contained")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    started = time.monotonic()
    result = run_code(host.render(case.code), run_timeout=case.run_timeout, memory_limit_mb=case.memory_limit_mb,
                      stdin=case.stdin)
    elapsed = time.monotonic() - started
    print(f"\n{case.name}: {result.status} rc={result.return_code} {result.limits_hit} {result.reason} ({elapsed:.2f}s)")
    case.check(result, host)
    assert elapsed < case.run_timeout + SLACK_S and result.execution_time < case.run_timeout + SLACK_S
    assert len(result.stdout.encode()) <= 65536 and len(result.stderr.encode()) <= 65536
    _assert_host_unaffected(host)


def test_at_least_twenty_hostile_programs() -> None:
    assert len(HOSTILE) >= 20


def test_connection_attempt_without_network_isolation_is_reported(host: Host) -> None:
    if network_isolation_available():
        pytest.skip("network isolation is in effect here; test_hostile_program_is_contained covers it")
    print("\nno network namespace on this machine: the sandbox can reach 127.0.0.1 (not asserted)")
    result = run_code(host.render("import socket\nsocket.create_connection(('127.0.0.1', @PORT@), timeout=1)\n"))
    assert result.status == "Finished" and not result.network_isolated


def test_cpu_time_limit_stops_a_busy_program_before_the_wall_clock() -> None:
    started = time.monotonic()
    result = run_code("while True:\n    pass\n", run_timeout=8, cpu_time_s=1)
    assert result.status == "TimeLimitExceeded" and result.limits_hit == ["cpu_time"], result
    assert time.monotonic() - started < 8


def test_scratch_starts_empty_is_the_home_and_is_deleted_afterwards(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []  # this run's directory (a glob of the temp dir would see concurrent tests' runs)
    mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: made.append(mkdtemp(*a, **k)) or made[-1])
    code = "import os\nprint(os.listdir('.'))\nprint(os.environ['HOME'] == os.getcwd() == os.environ['TMPDIR'])\n" \
           "open('note.txt', 'w').write('x')\nprint(sorted(os.environ))\n"
    result = run_code(code)
    assert result.stdout.splitlines()[:2] == ["[]", "True"], result
    assert not any(key.startswith(("AWS_", "HF_", "KUBE")) for key in eval(result.stdout.splitlines()[2])), result
    assert result.status == "Finished" and len(made) == 1 and not os.path.exists(made[0]), (result, made)


def test_output_is_truncated_to_the_cap() -> None:
    result = run_code("import sys\nsys.stdout.write('x' * 5000)\nsys.stderr.write('y' * 10)\n", max_output_bytes=1000)
    assert result.stdout == "x" * 1000 and result.limits_hit == ["output"], result


def test_unsupported_language_is_an_error_naming_the_supported_ones() -> None:
    result = run_code("console.log(1)", language="nodejs")
    assert result.status == "Error" and "'nodejs' is not supported" in result.sandbox_error and "python" in result.reason


@pytest.mark.parametrize("kwargs, fragment", [
    ({"run_timeout": 0}, "run_timeout=0 must be a positive number"),
    ({"memory_limit_mb": 8}, "memory_limit_mb=8 is too small"),
    ({"cpu_time_s": -1}, "cpu_time_s=-1"),
    ({"isolation": "docker"}, "isolation='docker' is not a sandbox mode"),
])
def test_bad_limits_raise_saying_what_to_change(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        run_code("print(1)", **kwargs)


@pytest.mark.parametrize("mode", ISOLATION_MODES)
def test_every_working_mode_hides_secrets_and_kills_children_on_timeout(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if mode not in available_isolation_modes():
        pytest.skip(f"isolation mode {mode!r} does not work on this machine")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    ok = run_code("import os\nprint(dict(os.environ))\n", isolation=mode)
    assert ok.status == "Finished" and ok.return_code == 0 and SECRET not in ok.stdout and ok.isolation == mode
    code = f"import subprocess\nsubprocess.Popen(['sleep', '{LEFTOVER_MARK}'])\nwhile True:\n    pass\n"
    timed_out = run_code(code, isolation=mode, run_timeout=1)
    assert timed_out.status == "TimeLimitExceeded", timed_out
    assert not _leftovers_after_a_moment(), _leftover_processes()


@pytest.mark.parametrize("mode", ISOLATION_MODES)
def test_a_sandbox_dies_with_its_host(mode: str, tmp_path: pathlib.Path) -> None:
    if mode not in available_isolation_modes():
        pytest.skip(f"isolation mode {mode!r} does not work on this machine")
    if mode == "none":
        pytest.skip("without a PID namespace the program's own children outlive a SIGKILLed host (documented)")
    whole, fraction = LEFTOVER_MARK.split(".")  # split, so the host's own command line does not show the mark
    program = f"import subprocess, time\nsubprocess.Popen(['sleep', '{whole}.' + '{fraction}'])\ntime.sleep(1000)\n"
    host = subprocess.Popen([sys.executable, "-c", "import sys\nfrom hybridflow.tools.sandbox import run_code\n"
                             f"run_code(sys.argv[1], isolation={mode!r}, run_timeout=120)", program],
                            env={**os.environ, "TMPDIR": str(tmp_path)})  # its run directory goes there
    try:
        deadline = time.monotonic() + 20
        while not _leftover_processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _leftover_processes(), "the sandboxed program never started"
    finally:
        host.kill()
        host.wait()
        shutil.rmtree(tmp_path, ignore_errors=True)  # the killed host could not remove its run directory
    assert not _leftovers_after_a_moment(), _leftover_processes()


def test_async_wrapper_and_bounded_pool() -> None:
    async def scenario() -> tuple[list[RunResult], float, RunResult]:
        pool = SandboxPool(2)
        started = time.monotonic()
        results = await asyncio.gather(*(pool.run(f"import time\ntime.sleep(0.6)\nprint({i})") for i in range(4)))
        elapsed = time.monotonic() - started
        pool.close()
        return list(results), elapsed, await run_code_async("print('async')")

    results, elapsed, single = asyncio.run(scenario())
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n", "3\n"]
    assert elapsed >= 1.2, "4 runs of 0.6 s through 2 slots take two rounds"
    assert single.stdout == "async\n"
    with pytest.raises(ValueError, match="max_concurrency=0 must be at least 1"):
        SandboxPool(0)
