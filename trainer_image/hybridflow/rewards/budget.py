"""Reward calls with a time budget: the call and outcome types, and running calls in this process.

Every failure of a call becomes an `Outcome` (``timeout`` or ``error`` with a short message) instead of an
exception, so one bad response cannot crash or stall the reward step; only configuration errors (an
unknown data source) are raised. `hybridflow.rewards.pool` runs calls in worker processes, where any
overrun can be stopped. Here, in the calling process, ``signal.setitimer`` stops Python code that overruns
(not C code such as a backtracking regex) and only on the main thread: the fallback for scorers that
cannot be pickled.
"""

from __future__ import annotations

import contextlib
import inspect
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal, NamedTuple

from hybridflow.rewards.registry import UnknownDataSourceError

# "fatal": a configuration error raised by the scorer in a worker process; the pool raises it again, so
# callers never see the status.
Status = Literal["ok", "error", "timeout", "fatal"]

# Configuration errors are not a response's fault: they fail the step with their own message.
FATAL_ERRORS: tuple[type[BaseException], ...] = (UnknownDataSourceError,)
_MESSAGE_CHARS = 300


# Named tuples, not dataclasses: thousands cross the worker pipes each step, and tuples pickle faster.
class Call(NamedTuple):
    """One reward call: keyword arguments for the scorer (or its ``batched`` method) and its budget."""

    kwargs: dict[str, Any]
    budget_s: float | None
    batched: bool = False


class Outcome(NamedTuple):
    """What one call gave: ``value`` when ``status`` is ok, else a short ``message`` saying what went wrong."""

    status: Status
    value: Any = None
    message: str = ""


def shorten(text: str, limit: int = _MESSAGE_CHARS) -> str:
    """``text`` cut to about ``limit`` characters (its start and end) with the number of characters left out."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}...[{len(text) - 2 * half} chars]...{text[-half:]}"


def describe(exc: BaseException) -> str:
    """An exception as ``Type: message``, shortened."""
    return shorten(f"{type(exc).__name__}: {exc}")


def invoke(scorer: Callable[..., Any], call: Call) -> Any:
    """Run one call: ``scorer(**kwargs)``, or ``scorer.batched(**kwargs)`` (if it has one) for a batched call."""
    fn = getattr(scorer, "batched", scorer) if call.batched else scorer
    return fn(**call.kwargs)


class _Overrun(BaseException):
    """Raised by SIGALRM in a call that overran; a BaseException so that `except Exception` cannot eat it."""


_PASS_THROUGH: tuple[type[BaseException], ...] = (*FATAL_ERRORS, _Overrun, KeyboardInterrupt)


def guarded(scorer: Callable[..., Any], call: Call) -> Outcome:
    """`invoke` with every failure but a configuration error, an overrun or Ctrl-C as an error outcome."""
    try:
        return Outcome("ok", invoke(scorer, call))
    except _PASS_THROUGH:
        raise
    except BaseException as exc:  # the user's code may raise anything, SystemExit included
        return Outcome("error", message=describe(exc))


# ---- in the calling process -------------------------------------------------------------------------


def _on_alarm(signum: int, frame: Any) -> None:
    """SIGALRM handler: stop the running call."""
    raise _Overrun


@contextlib.contextmanager
def _alarm_handler() -> Iterator[bool]:
    """Install the SIGALRM handler for a batch of calls; yields whether alarms can be used here."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield False
        return
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _with_alarm(scorer: Callable[..., Any], call: Call, budget_s: float) -> Outcome:
    """`guarded` with SIGALRM armed for ``budget_s``; an alarm that fires while disarming still counts."""
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, budget_s)
            return guarded(scorer, call)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Overrun:
        return Outcome("timeout", message=f"ran past its budget of {budget_s:g} s")


#: Calls of an `async def` scorer awaited at once (each a request to a served model or a sandbox, mostly waiting).
ASYNC_CONCURRENCY = 64


def is_async_scorer(scorer: Any) -> bool:
    """Whether the scorer is an `async def` function (verl's reward loop awaits those), directly or wrapped."""
    return bool(getattr(scorer, "is_async", False)) or inspect.iscoroutinefunction(scorer)


async def _awaited(scorer: Any, call: Call) -> Any:
    return await getattr(scorer, "acall", scorer)(**call.kwargs)


def score_concurrently(scorer: Any, calls: list[Call], concurrency: int = ASYNC_CONCURRENCY) -> list[Outcome]:
    """Run an `async def` scorer's calls here, up to `concurrency` at once, each under its budget
    (`asyncio.wait_for`: a call that blocks the event loop with CPU work is not stopped, one that awaits is)."""
    import asyncio

    async def one(gate: asyncio.Semaphore, call: Call) -> Outcome:
        async with gate:
            try:
                return Outcome("ok", await asyncio.wait_for(_awaited(scorer, call), call.budget_s))
            except asyncio.TimeoutError:
                return Outcome("timeout", message=f"ran past its budget of {call.budget_s:g} s")
            except FATAL_ERRORS:
                raise
            except Exception as exc:  # the user's code may raise anything
                return Outcome("error", message=describe(exc))

    async def every() -> list[Outcome]:
        gate = asyncio.Semaphore(max(1, concurrency))
        return list(await asyncio.gather(*(one(gate, call) for call in calls)))

    return asyncio.run(every())


def score_in_process(scorer: Callable[..., Any], calls: list[Call]) -> list[Outcome]:
    """Run the calls here, each under its budget where SIGALRM is available (main thread, Python code)."""
    with _alarm_handler() as alarms:
        return [
            _with_alarm(scorer, call, call.budget_s) if alarms and call.budget_s else guarded(scorer, call)
            for call in calls
        ]
