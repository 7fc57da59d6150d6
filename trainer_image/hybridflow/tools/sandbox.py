"""A hardened local sandbox for untrusted Python, with SandboxFusion's `run_code` semantics.

Each run is a fresh process tree: this module, run as a script under `python -I -S -B` (the
"bootstrap", stdlib only), sets the sandbox up and execs `python -I -S -B -u main.py`. What is
contained depends on the isolation mode, chosen once per process by probing (`isolation_mode()`):

- ``root-namespaces`` (running as root): new network, PID, mount, IPC and UTS namespaces. Only a
  loopback interface exists, so nothing outside is reachable (no DNS either). The sandbox's PID 1 is
  a root-owned supervisor; when the program exits, or the host kills the tree, every process in the
  namespace dies. Every mount is re-mounted read-only; `/tmp` (the scratch directory is
  `/tmp/scratch`) and `/dev/shm` are fresh size-capped tmpfs that vanish with the namespace; `/dev`
  holds only null, zero, full, random and urandom (no GPUs, kvm, fuse, tun or disks);
  `/proc` is the namespace's own (hidepid=2). The program runs as a fresh, unnamed uid/gid per run
  (so RLIMIT_NPROC counts only its own processes and threads; `nobody`, shared, where this user
  namespace does not map the range SANDBOX_UID_BASE..+SPAN), with no supplementary groups, an
  empty capability bounding set, securebits locked and no_new_privs (setuid binaries do not elevate).
  Interpreter directories under a non-world-readable parent (e.g. pyenv in /root) are bind-mounted
  read-only onto a tmpfs covering that parent, which also hides the rest of it.
- ``user-namespaces`` (unprivileged, where the kernel allows them): the same namespaces and mounts,
  as uid 0 of a user namespace mapped to the caller, with every capability dropped before exec.
  RLIMIT_NPROC is enforced unless the caller is real root (the kernel exempts it).
- ``none``: resource limits, a new session and an empty environment only; the program can reach
  the network and write wherever the caller can. As root it drops to a fresh uid when the
  interpreter is world-accessible (so it can write only world-writable places), otherwise it runs
  as root. Processes that start their own session escape the final process-group kill unless a uid
  drop is in effect (then every process of that uid is killed); if the host itself is SIGKILLed, the
  program dies (parent-death signal) but its children survive.

In every mode: the sandbox is SIGKILLed if the host process dies; RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE=0;
a wall-clock limit that SIGKILLs the whole tree; output read incrementally and capped (the program is
killed once it exceeds the cap); an environment with nothing of the parent's (minimal PATH,
HOME=TMPDIR=scratch, LANG); cwd an empty scratch directory, deleted afterwards. Not contained: reading
world-readable files of the host (read-only in the namespace modes), and connecting to path-based Unix
sockets outside /tmp whose permissions admit others (network namespaces do not cover those); the
node's CPU and memory beyond the per-process rlimits (no cgroups: N processes may use N x the memory
limit); tmpfs pages (scratch, /dev/shm), which count against the node's memory, not RLIMIT_AS.
Which limit was hit is inferred from signals and from the error text on stderr.
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import functools
import json
import logging
import math
import os
import re
import resource
import secrets
import selectors
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any, Literal

logger = logging.getLogger(__name__)

RunStatus = Literal["Finished", "TimeLimitExceeded", "Error"]
IsolationMode = Literal["root-namespaces", "user-namespaces", "none"]
ISOLATION_MODES: tuple[str, ...] = ("root-namespaces", "user-namespaces", "none")
SUPPORTED_LANGUAGES: tuple[str, ...] = ("python",)
SANDBOX_UID_BASE = 2_000_000_000  # fresh per-run uids/gids are drawn from [base, base + span)
SANDBOX_UID_SPAN = 1 << 24

_NOBODY = 65534
_SCRATCH_IN_NS = "/tmp/scratch"
_MAIN_IN_NS = "/tmp/main.py"
_SHM_MB = 16
_DEVICES = ("null", "zero", "full", "random", "urandom")
_DRAIN_GRACE_S = 0.3  # after the program exits, how long leftover holders of its pipes may keep them
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_BOOT_ENV = {"PATH": _SAFE_PATH, "LANG": "C.UTF-8"}
_PROGRAM_FLAGS = ("-I", "-B", "-u")  # isolated (no PYTHON* env, no user site), no .pyc, unbuffered

# Linux ABI constants (linux/sched.h, linux/mount.h, linux/prctl.h, linux/securebits.h).
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_NOATIME, _MS_NODIRATIME, _MS_BIND, _MS_REC = 1024, 2048, 4096, 16384
_MS_PRIVATE, _MS_RELATIME = 1 << 18, 1 << 21
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_SET_NO_NEW_PRIVS = 1, 24, 28, 38
_SECUREBITS_LOCKED = 0b11101011  # NOROOT and NO_CAP_AMBIENT_RAISE on, NO_SETUID_FIXUP and KEEP_CAPS off; all locked
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


@dataclasses.dataclass
class RunResult:
    """The outcome of one run, shaped like SandboxFusion's run_result plus what was contained."""

    status: RunStatus  # Finished: the program ended (any return code); Error: the sandbox failed
    return_code: int | None  # negative: killed by that signal; None when it did not finish
    stdout: str
    stderr: str
    execution_time: float  # wall-clock seconds, sandbox set-up included
    limits_hit: list[str] = dataclasses.field(default_factory=list)  # wall_time, cpu_time, memory, ...
    reason: str = ""  # one sentence on how the run ended
    sandbox_error: str | None = None  # set when status is Error: what failed on the sandbox side
    isolation: str = "none"
    network_isolated: bool = False


@dataclasses.dataclass(frozen=True)
class _Limits:
    """The per-run limits, validated once."""

    run_timeout: float
    memory_limit_mb: int
    cpu_time_s: int
    max_processes: int
    max_output_bytes: int
    max_file_mb: int
    max_open_files: int
    scratch_mb: int


def run_code(
    code: str,
    *,
    language: str = "python",
    run_timeout: float = 10.0,
    memory_limit_mb: int = 512,
    cpu_time_s: float | None = None,
    max_processes: int = 32,
    max_output_bytes: int = 65536,
    stdin: str | None = None,
    max_file_mb: int = 32,
    max_open_files: int = 64,
    scratch_mb: int = 128,
    site_packages: bool = False,
    isolation: str | None = None,
) -> RunResult:
    """Run `code` in a fresh sandbox and wait for it (at most about `run_timeout` seconds).

    `max_processes` counts threads too (RLIMIT_NPROC); `max_output_bytes` caps stdout and stderr each;
    `max_file_mb` is the largest file the program may write; `scratch_mb` the size of its /tmp in the
    namespace modes; `site_packages` lets it import this interpreter's installed packages.
    """
    mode = isolation or isolation_mode()
    if mode not in ISOLATION_MODES:
        raise ValueError(f"isolation={mode!r} is not a sandbox mode: use one of {', '.join(ISOLATION_MODES)}")
    limits = _build_limits(
        run_timeout=run_timeout, memory_limit_mb=memory_limit_mb, cpu_time_s=cpu_time_s,
        max_processes=max_processes, max_output_bytes=max_output_bytes, max_file_mb=max_file_mb,
        max_open_files=max_open_files, scratch_mb=scratch_mb,
    )
    if language not in SUPPORTED_LANGUAGES:
        message = f"language {language!r} is not supported; this sandbox runs: {', '.join(SUPPORTED_LANGUAGES)}"
        return RunResult("Error", None, "", "", 0.0, reason=message, sandbox_error=message, isolation=mode)
    try:
        run_dir = tempfile.mkdtemp(prefix="hybridflow-sandbox-")
    except OSError as exc:
        message = f"could not create the run directory in {tempfile.gettempdir()} ({exc}); free space or set TMPDIR"
        return RunResult("Error", None, "", "", 0.0, reason=message, sandbox_error=message, isolation=mode)
    try:
        return _run_in(run_dir, code, stdin, limits, mode, site_packages)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


async def run_code_async(code: str, **options: Any) -> RunResult:
    """`run_code` in a worker thread, for event loops (a cancelled caller leaves the run to finish)."""
    import asyncio  # imported here: the in-sandbox bootstrap runs this module and should start fast

    return await asyncio.to_thread(functools.partial(run_code, code, **options))


class SandboxPool:
    """At most `max_concurrency` sandboxes at once, each in the pool's own threads (use it from one event loop)."""

    def __init__(self, max_concurrency: int = 4, *, gate: threading.Semaphore | None = None) -> None:
        import asyncio
        from concurrent.futures import ThreadPoolExecutor

        if max_concurrency < 1:
            raise ValueError(f"max_concurrency={max_concurrency} must be at least 1 (the sandboxes run at once)")
        self.max_concurrency = max_concurrency
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._executor = ThreadPoolExecutor(max_concurrency, thread_name_prefix="sandbox")
        self._gate = gate  # e.g. a process-wide limit shared by several pools, held while a run lasts

    async def run(self, code: str, **options: Any) -> RunResult:
        """Run `code` (options as for `run_code`) once a slot is free."""
        import asyncio

        async with self._semaphore:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, functools.partial(self._run_gated, code, options)
            )

    def _run_gated(self, code: str, options: dict[str, Any]) -> RunResult:
        with self._gate or nullcontext():
            return run_code(code, **options)

    def close(self) -> None:
        """Stop the pool's threads once their runs end."""
        self._executor.shutdown(wait=False)


@functools.cache
def isolation_mode() -> str:
    """The strongest isolation mode that works on this machine, probed once per process."""
    mode = (available_isolation_modes() or ("none",))[0]
    if mode == "none":
        logger.warning("code sandbox: no namespaces available, so sandboxed programs can reach the network and write "
                       "where this process can; run as root or allow user namespaces to contain them")
    return mode


@functools.cache
def available_isolation_modes() -> tuple[str, ...]:
    """Every isolation mode that runs a trivial program correctly here, strongest first."""
    candidates = (["root-namespaces"] if os.geteuid() == 0 else []) + ["user-namespaces", "none"]
    working = []
    for mode in candidates:
        probe = run_code("print('ok')", isolation=mode, run_timeout=20)
        if probe.status == "Finished" and probe.return_code == 0 and probe.stdout == "ok\n":
            working.append(mode)
        else:
            logger.info("code sandbox: mode %s unavailable: %s %s", mode, probe.reason, probe.stderr[-500:])
    return tuple(working)


def network_isolation_available() -> bool:
    """Whether sandboxed programs run without network access (a new network namespace) here."""
    return isolation_mode() != "none"


def isolation_report(mode: str | None = None) -> dict[str, Any]:
    """What the given (default: the probed) mode contains on this machine, as plain booleans."""
    mode = mode or isolation_mode()
    namespaces = mode != "none"
    uid = _sandbox_uid(mode, False)
    return {
        "mode": mode,
        "network_namespace": namespaces,
        "pid_namespace": namespaces,
        "read_only_filesystem": namespaces,
        "private_tmp": namespaces,
        "minimal_dev": namespaces,
        "uid_drop": uid is not None,
        "process_limit_enforced": uid is not None or os.getuid() != 0,
    }


# ---------------------------------------------------------------- host side


def _build_limits(**values: Any) -> _Limits:
    """Validate the limits, with messages that say which value to change."""
    for name in ("run_timeout", "memory_limit_mb", "max_processes", "max_output_bytes", "max_file_mb",
                 "max_open_files", "scratch_mb"):
        if not isinstance(values[name], (int, float)) or isinstance(values[name], bool) or values[name] <= 0:
            raise ValueError(f"{name}={values[name]!r} must be a positive number")
    if values["memory_limit_mb"] < 32:
        raise ValueError(f"memory_limit_mb={values['memory_limit_mb']} is too small for Python to start: use >= 32")
    if values["max_open_files"] < 16:
        raise ValueError(f"max_open_files={values['max_open_files']} is too small for Python to start: use >= 16")
    cpu = values.pop("cpu_time_s")
    if cpu is not None and (not isinstance(cpu, (int, float)) or cpu <= 0):
        raise ValueError(f"cpu_time_s={cpu!r} must be a positive number of seconds, or None for run_timeout + 1")
    cpu_s = math.ceil(cpu) if cpu is not None else math.ceil(values["run_timeout"]) + 1
    ints = {k: int(v) for k, v in values.items() if k != "run_timeout"}
    return _Limits(run_timeout=float(values["run_timeout"]), cpu_time_s=cpu_s, **ints)


def _run_in(run_dir: str, code: str, stdin: str | None, limits: _Limits, mode: str, site_packages: bool) -> RunResult:
    """Launch the bootstrap for one run in `run_dir`, collect its output and classify the outcome."""
    uid = _sandbox_uid(mode, site_packages)
    main = os.path.join(run_dir, "main.py")
    with open(main, "w", encoding="utf-8", errors="replace") as f:
        f.write(code)
    os.chmod(main, 0o444)
    scratch = _SCRATCH_IN_NS
    if mode == "none":
        scratch = os.path.join(run_dir, "scratch")
        os.mkdir(scratch, 0o700)
        if uid is not None:
            os.chmod(run_dir, 0o755)
            os.chown(scratch, uid, uid)
    spec = _build_spec(mode, main, scratch, limits, uid, site_packages)
    read_end, write_end = os.pipe()
    start = time.monotonic()
    try:
        spec["status_fd"] = write_end
        proc = subprocess.Popen(
            [os.path.realpath(sys.executable), "-I", "-S", "-B", os.path.abspath(__file__), json.dumps(spec)],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=_BOOT_ENV, cwd=run_dir, start_new_session=True, pass_fds=(write_end,),
        )
    except OSError as exc:
        os.close(read_end)
        message = f"could not start the sandbox: {exc}"
        return RunResult("Error", None, "", "", 0.0, reason=message, sandbox_error=message, isolation=mode)
    finally:
        os.close(write_end)
    try:
        out, err, timed_out, flooded = _collect(proc, (stdin or "").encode(errors="replace"), start + limits.run_timeout,
                                                limits.max_output_bytes)
    finally:
        _kill_group(proc.pid)  # before reaping, so the group id cannot have been reused
        _await_pipes_closed(proc, time.monotonic() + 1.0)
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        if mode == "none" and uid is not None:
            _kill_uid(uid)
    elapsed = time.monotonic() - start
    reports = _read_reports(read_end)
    result = RunResult(
        "Finished", None, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), round(elapsed, 4),
        isolation=mode, network_isolated=mode != "none",
    )
    _classify(result, reports, proc.returncode, mode, timed_out, flooded, limits)
    return result


def _build_spec(mode: str, main: str, scratch: str, limits: _Limits, uid: int | None, site_packages: bool) -> dict:
    """The bootstrap's instructions (plain JSON): what to mount, which limits, which program."""
    python = sys.executable if site_packages else os.path.realpath(sys.executable)
    flags = list(_PROGRAM_FLAGS) + ([] if site_packages else ["-S"])
    needed = {os.path.realpath(sys.base_prefix)} | ({os.path.realpath(sys.prefix)} if site_packages else set())
    expose = sorted(
        [cover, path] for path in needed if uid is not None and (cover := _hidden_ancestor(path)) is not None
    )
    nproc = limits.max_processes
    if uid is None and os.getuid() != 0 and mode == "none":
        nproc += _task_count(os.getuid())  # the caller's own processes count against the same limit
    return {
        "mode": mode, "host_pid": os.getpid(), "code_path": main, "scratch": scratch, "uid": uid, "python": python,
        "flags": flags,
        "expose": expose, "scratch_mb": limits.scratch_mb,
        "env": {"PATH": _SAFE_PATH, "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8",
                # one BLAS/OpenMP thread: a pool sized to a big node's cores would exceed max_processes
                "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
        "limits": {
            "RLIMIT_AS": [limits.memory_limit_mb << 20] * 2,
            "RLIMIT_CPU": [limits.cpu_time_s, limits.cpu_time_s + 1],
            "RLIMIT_NPROC": [nproc] * 2,
            "RLIMIT_FSIZE": [limits.max_file_mb << 20] * 2,
            "RLIMIT_NOFILE": [limits.max_open_files] * 2,
            "RLIMIT_CORE": [0, 0],
        },
    }


def _sandbox_uid(mode: str, site_packages: bool) -> int | None:
    """The uid the program runs as: a fresh one when root can drop to it, else None (keep the caller's)."""
    if os.geteuid() != 0 or mode == "user-namespaces":
        return None
    if mode == "none":  # nothing is bind-mounted in this mode: the interpreter itself must be reachable
        paths = [os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)]
        if site_packages:
            paths.append(os.path.realpath(sys.prefix))
        if any(_hidden_ancestor(p) is not None for p in paths):
            return None
    if not all(_id_range_mapped(f"/proc/self/{kind}_map") for kind in ("uid", "gid")):
        return _NOBODY
    return SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_SPAN)


def _hidden_ancestor(path: str) -> str | None:
    """The outermost directory above `path` that others may not enter, or None."""
    parts = path.strip("/").split("/")
    for depth in range(1, len(parts)):
        ancestor = "/" + "/".join(parts[:depth])
        if not os.stat(ancestor).st_mode & stat.S_IXOTH:
            return ancestor
    return None


def _id_range_mapped(map_file: str) -> bool:
    """Whether this user namespace maps every id of the sandbox range."""
    try:
        with open(map_file) as f:
            rows = [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    except OSError:
        return False
    return any(s <= SANDBOX_UID_BASE and SANDBOX_UID_BASE + SANDBOX_UID_SPAN <= s + n for s, _, n in rows)


def _task_count(uid: int) -> int:
    """How many tasks (threads included) run as real uid `uid`, from /proc."""
    count = 0
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields.get("Threads", "1"))
        except (OSError, ValueError, KeyError):
            continue
    return count


def _collect(proc: subprocess.Popen, stdin: bytes, deadline: float, cap: int) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin and read stdout/stderr until they close, the deadline passes or one exceeds `cap`.

    Returns (stdout, stderr, timed_out, flooded); leaves the killing to the caller.
    """
    assert proc.stdout is not None and proc.stderr is not None
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    seen = dict.fromkeys(buffers, 0)
    selector = selectors.DefaultSelector()
    for fd in buffers:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    pending = memoryview(stdin)
    stdin_fd = proc.stdin.fileno() if proc.stdin is not None else None
    if stdin_fd is not None:
        os.set_blocking(stdin_fd, False)
        selector.register(stdin_fd, selectors.EVENT_WRITE)
    exited_at: float | None = None
    timed_out = flooded = False
    with selector:
        while True:  # until the program has exited and its pipes are drained (or held past a grace period)
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if exited_at is None and os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                exited_at = now
            if exited_at is not None and (not selector.get_map() or now - exited_at > _DRAIN_GRACE_S):
                break
            if not selector.get_map():  # it closed its output but runs on
                time.sleep(min(deadline - now, 0.05))
                continue
            for key, _ in selector.select(min(deadline - now, 0.05 if exited_at else 0.25)):
                if key.fd == stdin_fd:
                    pending = _feed(selector, proc, pending)
                    continue
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                seen[key.fd] += len(chunk)
                buffers[key.fd] += chunk[: max(cap - len(buffers[key.fd]), 0)]
                flooded = flooded or seen[key.fd] > cap
            if flooded:
                break
    return bytes(buffers[proc.stdout.fileno()]), bytes(buffers[proc.stderr.fileno()]), timed_out, flooded


def _feed(selector: selectors.BaseSelector, proc: subprocess.Popen, pending: memoryview) -> memoryview:
    """Write what the pipe takes of `pending` to the program's stdin; close it when done or refused."""
    assert proc.stdin is not None
    try:
        pending = pending[os.write(proc.stdin.fileno(), pending[:65536]):]
    except BlockingIOError:
        return pending
    except (BrokenPipeError, OSError):
        pending = pending[len(pending):]
    if not pending:
        selector.unregister(proc.stdin.fileno())
        proc.stdin.close()
    return pending


def _await_pipes_closed(proc: subprocess.Popen, deadline: float) -> None:
    """Discard output until every process holding the pipes has exited (the killed tree is gone)."""
    fds = [f.fileno() for f in (proc.stdout, proc.stderr) if f is not None and not f.closed]
    with selectors.DefaultSelector() as selector:
        for fd in fds:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map() and (remaining := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(remaining):
                try:
                    if not os.read(key.fd, 65536):
                        selector.unregister(key.fd)
                except BlockingIOError:
                    continue


def _kill_group(pgid: int) -> None:
    """SIGKILL the bootstrap's process group (the sandbox's PID 1 is in it: its namespace dies too)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of the run's own uid (those that left the process group)."""
    subprocess.run([os.path.realpath(sys.executable), "-I", "-S", "-B", os.path.abspath(__file__), "--reap",
                    str(uid)], env=_BOOT_ENV, check=False, timeout=30)


def _read_reports(fd: int) -> dict[str, Any]:
    """The bootstrap's JSON lines from the status pipe (exit status, set-up errors), merged."""
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    merged: dict[str, Any] = {}
    for line in data.splitlines():
        try:
            report = json.loads(line)
        except ValueError:
            continue
        for key, value in report.items():
            merged.setdefault(key, value)
    return merged


def _classify(result: RunResult, reports: Mapping[str, Any], boot_rc: int | None, mode: str,
              timed_out: bool, flooded: bool, limits: _Limits) -> None:
    """Fill status, return code, limits hit and reason from how the run ended."""
    if reports.get("setup_error"):
        result.status, result.sandbox_error = "Error", f"sandbox set-up failed: {reports['setup_error']}"
        result.reason = result.sandbox_error
        return
    if timed_out:
        result.status, result.limits_hit = "TimeLimitExceeded", ["wall_time"]
        result.reason = f"wall-clock limit of {limits.run_timeout:g}s exceeded: the program and its children were killed"
        return
    code = boot_rc if mode == "none" else (
        os.waitstatus_to_exitcode(reports["status"]) if "status" in reports else None)
    if code is None and not flooded:
        result.status = "Error"
        result.sandbox_error = f"the sandbox supervisor exited ({boot_rc}) without the program's status"
        result.reason = result.sandbox_error
        return
    if code is None:  # flooded, and killed (by us, SIGKILL) before the supervisor could report
        code = -signal.SIGKILL
    result.return_code = code
    hits = _inferred_limits(code, result.stderr)
    if flooded:
        hits.insert(0, "output")
        result.reason = f"output exceeded {limits.max_output_bytes} bytes: the program was killed, its output cut"
    elif code is not None and code < 0:
        result.reason = f"killed by signal {_signal_name(-code)}"
    else:
        result.reason = f"exited with code {code}"
    if "cpu_time" in hits:
        result.status, result.return_code = "TimeLimitExceeded", None
        result.reason = f"CPU-time limit of {limits.cpu_time_s}s exceeded"
    result.limits_hit = hits


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


_LIMIT_PATTERNS = (  # stderr text (Python's own messages) -> the limit it reveals
    ("memory", re.compile(r"MemoryError|Cannot allocate memory|std::bad_alloc")),
    ("file_size", re.compile(r"File too large")),
    ("scratch_space", re.compile(r"No space left on device")),
    ("processes", re.compile(r"Resource temporarily unavailable|can't start new thread")),
    ("open_files", re.compile(r"Too many open files")),
)


def _inferred_limits(code: int | None, stderr: str) -> list[str]:
    """The limits a run evidently hit: from its terminating signal and the error text on stderr."""
    hits = []
    if code == -signal.SIGXCPU:
        hits.append("cpu_time")
    if code == -signal.SIGXFSZ:
        hits.append("file_size")
    for name, pattern in _LIMIT_PATTERNS:
        if name not in hits and pattern.search(stderr):
            hits.append(name)
    return hits


# ---------------------------------------------------------------- bootstrap (runs inside the sandbox)


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    libc.unshare.argtypes = [ctypes.c_int]
    return libc


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(text: str | None) -> bytes | None:
        return text.encode() if text is not None else None

    _check(_libc().mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _prctl(option: int, arg: int = 0) -> int:
    return _libc().prctl(option, arg, 0, 0, 0)


def _report(fd: int, **fields: Any) -> None:
    try:
        os.write(fd, (json.dumps(fields) + "\n").encode())
    except OSError:
        pass


def _boot_main(argv: list[str]) -> None:
    """Entry point of the bootstrap: set up the sandbox described by argv[0] and exec the program."""
    if argv[:1] == ["--reap"]:
        os.setgroups([])
        os.setgid(int(argv[1]))
        os.setuid(int(argv[1]))
        try:
            os.kill(-1, signal.SIGKILL)  # every process of this uid but the caller
        except ProcessLookupError:
            pass
        os._exit(0)
    spec = json.loads(argv[0])
    fd = spec["status_fd"]
    os.set_inheritable(fd, False)  # the program must not inherit it
    try:
        _die_with_host(spec["host_pid"])
        if spec["mode"] == "none":
            _exec_program(spec, spec["scratch"], spec["code_path"])
        _enter_namespaces(spec["mode"] == "user-namespaces")
        if os.fork() == 0:
            _pid1(spec, fd)
        os.wait()
        os._exit(0)
    except BaseException as exc:  # noqa: BLE001 - whatever failed, the host must hear of it
        _report(fd, setup_error=f"{type(exc).__name__}: {exc}")
        os._exit(125)


def _die_with_host(host_pid: int) -> None:
    """SIGKILL this process when the host (the thread that started it, which waits for it) dies."""
    _check(_prctl(_PR_SET_PDEATHSIG, signal.SIGKILL), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != host_pid:  # the host died before the line above
        os._exit(125)


def _enter_namespaces(as_user: bool) -> None:
    """Unshare mount, network, PID, IPC and UTS namespaces (and the user namespace when unprivileged)."""
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS
    _check(_libc().unshare(flags | (_CLONE_NEWUSER if as_user else 0)), "unshare")
    if as_user:
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)


def _pid1(spec: dict, fd: int) -> None:
    """The namespace's init: build its filesystem, start the program, report its exit status."""
    try:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        with open(spec["code_path"], "rb") as f:
            code = f.read()
        _setup_mounts(spec, code)
        _loopback_up()
        child = os.fork()
        if child == 0:
            try:
                _exec_program(spec, _SCRATCH_IN_NS, _MAIN_IN_NS)
            except BaseException as exc:  # noqa: BLE001
                _report(fd, setup_error=f"{type(exc).__name__}: {exc}")
                os._exit(125)
        while True:  # reap orphans until the program itself exits; then the kernel kills the rest
            pid, status = os.waitpid(-1, 0)
            if pid == child:
                break
        _report(fd, status=status)
        os._exit(0)
    except BaseException as exc:  # noqa: BLE001
        _report(fd, setup_error=f"{type(exc).__name__}: {exc}")
        os._exit(125)


def _setup_mounts(spec: dict, code: bytes) -> None:
    """Private propagation, own /proc, exposed interpreter, fresh /tmp and /dev, all else read-only."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    proc_flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    try:
        _mount("proc", "/proc", "proc", proc_flags, "hidepid=2")
    except OSError:
        _mount("proc", "/proc", "proc", proc_flags)
    held = [(cover, path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for cover, path in spec["expose"]]
    for cover in sorted({cover for cover, _, _ in held}):
        _mount("tmpfs", cover, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755")
    for _, path, path_fd in held:
        os.makedirs(path, 0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{path_fd}", path, None, _MS_BIND | _MS_REC)
        os.close(path_fd)
    _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={spec['scratch_mb']}m,mode=1777")
    _minimal_dev()
    with open(_MAIN_IN_NS, "wb") as f:
        f.write(code)
    os.chmod(_MAIN_IN_NS, 0o444)
    os.mkdir(_SCRATCH_IN_NS, 0o700)
    if spec["uid"] is not None:
        os.chown(_SCRATCH_IN_NS, spec["uid"], spec["uid"])
    _remount_read_only(keep={"/tmp", "/dev/shm"})


def _minimal_dev() -> None:
    """Replace /dev by a tmpfs with only null, zero, full, random, urandom, the std* links and a small shm.

    Keeps the host's other devices (GPUs, whose /dev/nvidia* nodes are usually world-writable, kvm, fuse,
    tun, disks) out of reach; the nodes are bind-mounted because user namespaces may not mknod.
    """
    held = {name: os.open(f"/dev/{name}", os.O_PATH) for name in _DEVICES if os.path.exists(f"/dev/{name}")}
    _mount("tmpfs", "/dev", "tmpfs", _MS_NOSUID | _MS_NOEXEC, "size=64k,mode=0755")
    for name, node_fd in held.items():
        open(f"/dev/{name}", "w").close()
        _mount(f"/proc/self/fd/{node_fd}", f"/dev/{name}", None, _MS_BIND)
        os.close(node_fd)
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/dev/{link}")
    os.mkdir("/dev/shm")
    _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={_SHM_MB}m,mode=1777")


def _remount_read_only(keep: set[str]) -> None:
    """Make every mount but `keep` read-only in this namespace, keeping flags the kernel may lock."""
    with open("/proc/self/mountinfo") as f:
        points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4]) for line in f]
    for point in dict.fromkeys(points):
        if point in keep:
            continue
        try:
            st_flags = os.statvfs(point).f_flag
        except OSError:  # shadowed by a later mount or gone: not reachable from the sandbox
            continue
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
        for st_bit, ms_bit in ((os.ST_NOSUID, _MS_NOSUID), (os.ST_NODEV, _MS_NODEV), (os.ST_NOEXEC, _MS_NOEXEC),
                               (os.ST_NOATIME, _MS_NOATIME), (os.ST_NODIRATIME, _MS_NODIRATIME),
                               (os.ST_RELATIME, _MS_RELATIME)):
            flags |= ms_bit if st_flags & st_bit else 0
        _mount(None, point, None, flags)


def _loopback_up() -> None:
    """Bring up `lo` in the new network namespace, so programs can talk to themselves (and nothing else)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def _exec_program(spec: dict, scratch: str, main: str) -> None:
    """In the program's process: own session, limits, fewest privileges, then exec the interpreter."""
    if os.getsid(0) != os.getpid():
        os.setsid()
    os.chdir(scratch)
    for name, (soft, hard) in spec["limits"].items():
        _lower_limit(getattr(resource, name), soft, hard)
    _drop_privileges(spec["uid"])
    if spec["mode"] == "none":  # the uid change cleared the parent-death signal; inside namespaces PID 1 has it
        _die_with_host(spec["host_pid"])
    argv = [spec["python"], *spec["flags"], main]
    os.execve(argv[0], argv, spec["env"])


def _lower_limit(which: int, soft: int, hard: int) -> None:
    """Set a resource limit, never above the current hard limit (only root may raise that)."""
    _, current_hard = resource.getrlimit(which)
    if current_hard != resource.RLIM_INFINITY:
        hard = min(hard, current_hard)
    resource.setrlimit(which, (min(soft, hard), hard))


def _drop_privileges(uid: int | None) -> None:
    """Empty the capability bounding set, lock securebits, switch to `uid` and set no_new_privs."""
    for cap in range(64):
        if _prctl(_PR_CAPBSET_DROP, cap) != 0:
            break  # EINVAL past the last capability; EPERM when unprivileged (nothing to drop)
    _prctl(_PR_SET_SECUREBITS, _SECUREBITS_LOCKED)  # uid 0 gains no capabilities at exec; EPERM: unprivileged
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    _check(_prctl(_PR_SET_NO_NEW_PRIVS, 1), "prctl(PR_SET_NO_NEW_PRIVS)")


if __name__ == "__main__":
    _boot_main(sys.argv[1:])
