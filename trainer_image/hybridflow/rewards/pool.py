"""Persistent worker processes that run reward calls and kill any call that overruns its budget.

Workers are fresh interpreters: ``fork`` would copy the trainer's threads, CUDA and Ray half-initialised,
and multiprocessing's ``spawn`` re-runs the parent's ``__main__`` (a script without a ``__main__`` guard
would start over in every worker). The parent sends chunks of calls; a worker publishes which call of its
chunk it is running and since when in 16 shared bytes, so the parent can kill a worker whose call overran
(however it is stuck: a Python loop, a sleep, a regex or a big-integer operation in C), mark that call as
timed out, re-queue the rest of the chunk and start a replacement. The normal case costs one pickled round
trip per chunk and no restarts. `BudgetedScorer` is the entry point: the pool for a picklable scorer,
`hybridflow.rewards.budget.score_in_process` for one that is not (or when no worker can start).
"""

from __future__ import annotations

import contextlib
import logging
import math
import mmap
import multiprocessing
import os
import pickle
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from hybridflow.rewards.budget import (
    FATAL_ERRORS,
    Call,
    Outcome,
    Status,
    describe,
    guarded,
    is_async_scorer,
    score_concurrently,
    score_in_process,
)

logger = logging.getLogger(__name__)

# How long a worker may take to start (importing torch or a user's module on a busy node) before the pool
# gives up on processes.
STARTUP_TIMEOUT_S = 120.0
# How often the parent looks at a worker whose current call it has not yet seen start.
_POLL_S = 0.05
_MAX_CHUNK = 64
# A worker's first lines: take the parent's sys.path (so it imports what the parent can), then run the loop.
_BOOTSTRAP = (
    "import sys\n"
    "from multiprocessing.connection import Connection\n"
    "conn = Connection(int(sys.argv[1]))\n"
    "sys.path[:], blob = conn.recv()\n"
    "from hybridflow.rewards.pool import worker_main\n"
    "worker_main(conn, int(sys.argv[2]), blob)\n"
)


class PoolUnusable(RuntimeError):
    """No worker process can run the calls (cannot start, cannot load the scorer, arguments unpicklable)."""


class _Progress:
    """(position of the running call in its chunk, its start on the monotonic clock or 0) in shared memory."""

    _FORMAT = "dd"

    def __init__(self, fd: int) -> None:
        """Map the 16 bytes of the file ``fd`` (the parent creates it, the worker inherits it)."""
        self._map = mmap.mmap(fd, struct.calcsize(self._FORMAT))

    def set(self, position: int, started: float) -> None:
        """Publish the running call (``started=0``: between calls)."""
        struct.pack_into(self._FORMAT, self._map, 0, float(position), started)

    def get(self) -> tuple[int, float]:
        """The published pair."""
        position, started = struct.unpack_from(self._FORMAT, self._map, 0)
        return int(position), started

    def close(self) -> None:
        """Unmap (idempotent)."""
        if not self._map.closed:
            self._map.close()


# ---- in a worker process ------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when the trainer dies, so a call stuck forever leaves no orphan."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: a stuck worker outlives a killed trainer
        pass


def _send(conn: Connection, message: Any) -> None:
    # Plain pickle, not Connection.send's ForkingPickler: half the cost on thousands of calls a step.
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def worker_main(conn: Connection, progress_fd: int, scorer_blob: bytes) -> None:
    """A worker process's loop: load the scorer, then score chunks until told to stop or the parent goes away."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it kills the pool
    progress = _Progress(progress_fd)
    try:
        scorer = pickle.loads(scorer_blob)
    except BaseException as exc:
        _send(conn, ("failed", describe(exc)))
        return
    _send(conn, ("ready", None))
    while True:
        try:
            chunk = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        if chunk is None:
            return
        _send_results(conn, _score_chunk(scorer, chunk, progress))


def _score_chunk(scorer: Callable[..., Any], chunk: list[Call], progress: _Progress) -> list[Outcome]:
    """Run a chunk's calls, publishing each one's position and start; stop at a configuration error."""
    results = []
    for position, call in enumerate(chunk):
        progress.set(position, time.monotonic())
        try:
            results.append(guarded(scorer, call))
        except FATAL_ERRORS as exc:
            results.append(Outcome("fatal", value=exc, message=describe(exc)))
            break
        finally:
            progress.set(position, 0.0)
    return results


def _send_results(conn: Connection, results: list[Outcome]) -> None:
    """Send a chunk's outcomes; a value that cannot be pickled becomes an error outcome."""
    try:
        _send(conn, ("results", results))
        return
    except Exception:  # pickling a user's result can raise anything; nothing was written yet
        pass
    safe = []
    for outcome in results:
        try:
            pickle.dumps(outcome)
            safe.append(outcome)
        except Exception as exc:
            safe.append(Outcome("error", message=f"the result cannot be sent back: {describe(exc)}"))
    _send(conn, ("results", safe))


# ---- in the trainer -------------------------------------------------------------------------------------


@dataclass
class _Run:
    """One batch of calls going through the pool: what is done and what is still to send."""

    calls: list[Call]
    queue: deque[list[int]]
    outcomes: list[Outcome | None] = field(default_factory=list)

    def budget_of(self, chunk: list[int], position: int) -> float | None:
        """The budget of the call at ``position`` of ``chunk``."""
        return self.calls[chunk[position]].budget_s


class _Worker:
    """One worker process, its pipe and its progress pair."""

    def __init__(self, scorer_blob: bytes) -> None:
        """Start the process; it reports ready once the scorer is loaded."""
        self._file = tempfile.TemporaryFile()
        os.ftruncate(self._file.fileno(), 16)
        self.progress = _Progress(self._file.fileno())
        self.conn, child = multiprocessing.Pipe()
        fds = (child.fileno(), self._file.fileno())
        self.process = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, *map(str, fds)], pass_fds=fds, stdin=subprocess.DEVNULL
        )
        child.close()
        self.conn.send((list(sys.path), scorer_blob))
        self.started_at = time.monotonic()
        self.ready = False
        self.chunk: list[int] | None = None

    def assign(self, chunk: list[int], calls: list[Call]) -> None:
        """Send the calls at the indices ``chunk`` to this worker."""
        self.progress.set(-1, 0.0)
        self.chunk = chunk
        _send(self.conn, [calls[i] for i in chunk])

    def running(self) -> tuple[int, float] | None:
        """The chunk position of the running call and its start time, or None between calls."""
        position, started = self.progress.get()
        return (position, started) if started and position >= 0 and self.chunk is not None else None

    def last_started(self) -> int:
        """The chunk position of the call running or last run (0 before the first)."""
        return max(self.progress.get()[0], 0)

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.process.poll() is None

    def kill(self) -> None:
        """Stop the process now (SIGKILL: a call stuck in C code ignores anything gentler) and free its pipe."""
        self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        self._release()

    def stop(self) -> None:
        """Ask an idle worker to exit; kill it if it does not."""
        with contextlib.suppress(OSError, ValueError, subprocess.TimeoutExpired):
            if self.chunk is None and self.ready:
                _send(self.conn, None)
                self.process.wait(timeout=1)
        if self.alive():
            self.kill()
        self._release()

    def _release(self) -> None:
        """Close the pipe and the progress mapping (idempotent)."""
        self.conn.close()
        self.progress.close()
        self._file.close()


def _stop_all(workers: list[_Worker]) -> None:
    """Stop every worker (the pool's finaliser)."""
    for worker in workers:
        worker.stop()
    workers.clear()


def chunk_indices(n: int, workers: int) -> list[list[int]]:
    """Split ``n`` calls into about four chunks per worker (so a slow chunk does not idle the others)."""
    size = max(1, min(_MAX_CHUNK, math.ceil(n / (4 * workers))))
    return [list(range(start, min(start + size, n))) for start in range(0, n, size)]


class WorkerPool:
    """Persistent worker processes that run calls and enforce each call's budget by killing overruns."""

    def __init__(self, scorer_blob: bytes, size: int) -> None:
        """Remember the pickled scorer and the pool size; processes start on first use."""
        self._blob = scorer_blob
        self._size = size
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)

    def close(self) -> None:
        """Stop the worker processes."""
        self._finalizer()

    def run(self, calls: list[Call]) -> list[Outcome]:
        """The outcome of every call, in order.

        Raises the scorer's configuration error (e.g. an unknown data source), or `PoolUnusable`.
        """
        run = _Run(calls, deque(chunk_indices(len(calls), self._size)), [None] * len(calls))
        while run.queue or any(w.chunk is not None for w in self._workers):
            self._replace_dead()
            for worker in self._workers:
                if worker.ready and worker.chunk is None and run.queue:
                    self._assign(worker, run)
            waiting = [w for w in self._workers if w.chunk is not None or not w.ready]
            for conn in wait([w.conn for w in waiting], timeout=self._wait_s(run, waiting)):
                self._receive(next(w for w in waiting if w.conn is conn), run)
            for worker in [w for w in waiting if w in self._workers]:
                self._check(worker, run)
        return [o if o is not None else Outcome("error", message="not scored") for o in run.outcomes]

    def _replace_dead(self) -> None:
        """Top the pool up to its size, replacing workers that were killed or died between chunks."""
        for worker in [w for w in self._workers if w.chunk is None and not w.alive()]:
            worker.stop()
            self._workers.remove(worker)
        while len(self._workers) < self._size:
            try:
                self._workers.append(_Worker(self._blob))
            except OSError as exc:  # no interpreter to start, no file descriptors left, ...
                raise PoolUnusable(f"cannot start a reward worker process: {describe(exc)}") from exc

    def _assign(self, worker: _Worker, run: _Run) -> None:
        """Send the next chunk to an idle worker; a worker that died meanwhile is dropped (and replaced)."""
        chunk = run.queue.popleft()
        try:
            worker.assign(chunk, run.calls)
        except (BrokenPipeError, ConnectionError, EOFError):
            run.queue.appendleft(chunk)
            worker.chunk = None
            self._drop(worker)
        except Exception as exc:  # a call's arguments cannot be pickled
            run.queue.appendleft(chunk)
            worker.chunk = None
            raise PoolUnusable(f"a reward call cannot be sent to a worker process: {describe(exc)}") from exc

    def _wait_s(self, run: _Run, waiting: list[_Worker]) -> float:
        """How long to block for a message: until the nearest budget runs out, at most `_POLL_S`."""
        now = time.monotonic()
        wait_s = _POLL_S
        for worker in waiting:
            running = worker.running()
            budget = run.budget_of(worker.chunk, running[0]) if running and worker.chunk else None
            if running and budget is not None:
                wait_s = min(wait_s, running[1] + budget - now)
        return max(wait_s, 0.0)

    def _receive(self, worker: _Worker, run: _Run) -> None:
        """Handle one message from ``worker``: ready, failed to load, a chunk's results, or its death."""
        try:
            kind, payload = pickle.loads(worker.conn.recv_bytes())
        except (EOFError, OSError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.process.wait(timeout=1)
            died = f"the worker process died (exit code {worker.process.returncode})"
            if not worker.ready:  # it would die again: no respawn loop
                raise PoolUnusable(f"a reward worker process exited while starting: {died}") from None
            # Blame the call it was running (or ran last): every death takes one call off the queue.
            self._lost(worker, run, worker.last_started(), died, "error")
            return
        if kind == "ready":
            worker.ready = True
        elif kind == "failed":
            raise PoolUnusable(f"a reward worker process could not load the scorer: {payload}")
        else:
            chunk, worker.chunk = worker.chunk, None
            for index, outcome in zip(chunk or [], payload, strict=False):
                if outcome.status == "fatal":
                    raise outcome.value
                run.outcomes[index] = outcome

    def _check(self, worker: _Worker, run: _Run) -> None:
        """Kill ``worker`` if its running call overran its budget; give up if it never got ready."""
        if not worker.ready:
            if time.monotonic() - worker.started_at > STARTUP_TIMEOUT_S:
                raise PoolUnusable(f"no reward worker process started within {STARTUP_TIMEOUT_S:g} s")
            return
        running = worker.running()
        if running is None or worker.chunk is None:
            return
        budget = run.budget_of(worker.chunk, running[0])
        if budget is not None and time.monotonic() - running[1] > budget:
            self._lost(worker, run, running[0], f"ran past its budget of {budget:g} s", "timeout")

    def _lost(self, worker: _Worker, run: _Run, position: int, message: str, status: Status) -> None:
        """Kill ``worker``: the call at ``position`` of its chunk gets ``status``, the others are re-queued
        (those it had finished too: their results die with it)."""
        chunk, worker.chunk = worker.chunk, None
        self._drop(worker)
        if not chunk:
            return
        position = min(position, len(chunk) - 1)
        run.outcomes[chunk[position]] = Outcome(status, message=message)
        rest = chunk[:position] + chunk[position + 1 :]
        if rest:
            run.queue.appendleft(rest)

    def _drop(self, worker: _Worker) -> None:
        """Kill ``worker`` and forget it (`_replace_dead` starts another)."""
        worker.kill()
        self._workers.remove(worker)


def default_pool_size() -> int:
    """Worker processes for scoring: up to four, never more than the CPUs this process may use."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


class BudgetedScorer:
    """Run reward calls with a time budget each, in worker processes when the scorer can be pickled."""

    def __init__(self, scorer: Callable[..., Any], workers: int | None = None) -> None:
        """Wrap ``scorer``; ``workers`` defaults to `default_pool_size`. Processes start on the first call."""
        self.scorer = scorer
        self.workers = workers or default_pool_size()
        self._pool: WorkerPool | None = None
        self._blob = _pickled(scorer)
        # Why calls run in this process, said once: the scorer cannot be pickled, or no worker could start.
        self._local_reason = None if self._blob is not None else "it cannot be pickled into a worker process"
        self._warned = False

    def run(self, calls: list[Call]) -> list[Outcome]:
        """The outcome of each call, in order; a configuration error (unknown data source) is raised.

        An `async def` scorer's calls are awaited together in this process instead (`score_concurrently`): they
        mostly wait on a served model or a sandbox, which processes of one call at a time would serialise.
        """
        if is_async_scorer(self.scorer):
            return score_concurrently(self.scorer, calls)
        if all(call.budget_s is None for call in calls):
            return score_in_process(self.scorer, calls)
        if self._blob is not None and self._local_reason is None:
            if self._pool is None:
                self._pool = WorkerPool(self._blob, self.workers)
            try:
                return self._pool.run(calls)
            except PoolUnusable as exc:
                self._pool.close()
                self._pool, self._local_reason = None, str(exc)
        self._warn_local()
        return score_in_process(self.scorer, calls)

    def close(self) -> None:
        """Stop the worker processes (they also stop when this object is garbage-collected or at exit)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _warn_local(self) -> None:
        """Say once that the budget is enforced for Python code on the main thread only, and why."""
        if self._warned:
            return
        self._warned = True
        where = (
            "stops Python code only"
            if threading.current_thread() is threading.main_thread()
            else "is not enforced (not the main thread)"
        )
        logger.warning(
            "the reward function %r runs in the trainer process (%s), so its time budget %s. "
            "Load it by path (custom_reward_function.path) or define it at module level.",
            self.scorer,
            self._local_reason,
            where,
        )

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the scorer and the pool size only; the receiving process starts its own workers."""
        return {"scorer": self.scorer, "workers": self.workers}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Rebuild without processes."""
        self.__init__(state["scorer"], state["workers"])  # type: ignore[misc]


def _pickled(scorer: Callable[..., Any]) -> bytes | None:
    """``scorer`` pickled for the workers, or None when it cannot be (a lambda, a closure)."""
    try:
        return pickle.dumps(scorer)
    except Exception:  # pickle raises PicklingError, TypeError, AttributeError, ... by object
        return None
