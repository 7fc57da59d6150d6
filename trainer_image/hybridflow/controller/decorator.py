"""The `@register` decorator: how a worker method's inputs are split over ranks and outputs gathered.

A method on a worker class marked with `@register(dispatch_mode=..., execute_mode=...)` becomes a method
of the same name on the `RayWorkerGroup` built from that class. A group call runs three steps:

1. dispatch: turn the caller's arguments into one argument list per rank;
2. execute: call the method on every rank (`Execute.ALL`) or on rank 0 only (`Execute.RANK_ZERO`);
3. collect: turn the per-rank results into the value the caller gets back.

This module is Ray-free: dispatch and collect are plain functions over lists, unit-testable alone.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

REGISTER_ATTR = "_hybridflow_register"


class Dispatch(enum.Enum):
    """How a group call's arguments reach the ranks and how the results come back."""

    ONE_TO_ALL = "one_to_all"  # every rank gets the same arguments; a list of per-rank results returns
    DP_COMPUTE_PROTO = "dp_compute_proto"  # DataProto args split by dp rank; outputs concatenated
    ALL_TO_ALL = "all_to_all"  # each argument is already a list with one entry per rank
    RANK_ZERO = "rank_zero"  # every rank gets the same arguments; only rank 0's result returns


class Execute(enum.Enum):
    """Which ranks run the method."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class MethodSpec:
    """What `@register` recorded on a worker method."""

    dispatch_mode: Dispatch
    execute_mode: Execute = Execute.ALL
    blocking: bool = True


@dataclass
class DispatchResult:
    """Per-rank positional and keyword arguments plus what collect needs to undo the split."""

    args: list[tuple[Any, ...]]
    kwargs: list[dict[str, Any]]
    context: dict[str, Any] = field(default_factory=dict)


def register(
    dispatch_mode: Dispatch = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
) -> Callable[[F], F]:
    """Mark a worker method so `RayWorkerGroup` exposes it with this dispatch and execute mode."""
    if not isinstance(dispatch_mode, Dispatch):
        raise TypeError(
            f"register(dispatch_mode={dispatch_mode!r}): use a member of Dispatch "
            f"({', '.join(m.name for m in Dispatch)})"
        )
    if not isinstance(execute_mode, Execute):
        raise TypeError(
            f"register(execute_mode={execute_mode!r}): use a member of Execute "
            f"({', '.join(m.name for m in Execute)})"
        )
    spec = MethodSpec(dispatch_mode=dispatch_mode, execute_mode=execute_mode, blocking=blocking)

    def mark(fn: F) -> F:
        setattr(fn, REGISTER_ATTR, spec)
        return fn

    return mark


def get_method_spec(fn: Any) -> MethodSpec | None:
    """The `MethodSpec` that `@register` put on `fn`, or None for an unregistered method."""
    return getattr(fn, REGISTER_ATTR, None)


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """Every `@register`-ed method of a worker class (including inherited ones), by name."""
    found: dict[str, MethodSpec] = {}
    for name in dir(cls):
        if name.startswith("__"):
            continue
        spec = get_method_spec(getattr(cls, name, None))
        if spec is not None:
            found[name] = spec
    return found


# ---------------------------------------------------------------------------------------------------
# dispatch functions: (world_size, *args, **kwargs) -> DispatchResult


def dispatch_one_to_all(world_size: int, *args: Any, **kwargs: Any) -> DispatchResult:
    """Give every rank the same arguments."""
    return DispatchResult(args=[args] * world_size, kwargs=[kwargs] * world_size)


def dispatch_all_to_all(world_size: int, *args: Any, **kwargs: Any) -> DispatchResult:
    """Hand entry i of every (list) argument to rank i."""
    for name, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, (list, tuple)) or len(value) != world_size:
            raise ValueError(
                f"ALL_TO_ALL dispatch: argument {name!r} must be a list with one entry per rank "
                f"({world_size}); got {type(value).__name__}"
                + (f" of length {len(value)}" if isinstance(value, (list, tuple)) else "")
            )
    per_args = [tuple(a[i] for a in args) for i in range(world_size)]
    per_kwargs = [{k: v[i] for k, v in kwargs.items()} for i in range(world_size)]
    return DispatchResult(args=per_args, kwargs=per_kwargs)


def _is_dataproto(value: Any) -> bool:
    from hybridflow.protocol import DataProto

    return isinstance(value, DataProto)


def dispatch_dp_compute_proto(world_size: int, *args: Any, **kwargs: Any) -> DispatchResult:
    """Split every DataProto argument into `world_size` equal chunks, padding to a divisor first.

    Non-DataProto arguments (flags, numbers) are broadcast. All DataProto arguments must have the
    same length; the padding count is remembered so `collect_dp_compute_proto` can drop the rows
    the padding produced.
    """
    from hybridflow.protocol import pad_dataproto_to_divisor

    lengths = {len(v) for v in [*args, *kwargs.values()] if _is_dataproto(v)}
    if not lengths:
        raise TypeError(
            "DP_COMPUTE_PROTO dispatch: the call has no DataProto argument to split; "
            "pass the batch as a DataProto or register the method with Dispatch.ONE_TO_ALL"
        )
    if len(lengths) > 1:
        raise ValueError(
            f"DP_COMPUTE_PROTO dispatch: DataProto arguments have different lengths {sorted(lengths)}; "
            "pass batches of equal length (they are split row-wise over the same ranks)"
        )
    pad = 0

    def split(value: Any) -> list[Any]:
        nonlocal pad
        if not _is_dataproto(value):
            return [value] * world_size
        padded, pad = pad_dataproto_to_divisor(value, world_size)
        return list(padded.chunk(world_size))

    split_args = [split(a) for a in args]
    split_kwargs = {k: split(v) for k, v in kwargs.items()}
    per_args = [tuple(a[i] for a in split_args) for i in range(world_size)]
    per_kwargs = [{k: v[i] for k, v in split_kwargs.items()} for i in range(world_size)]
    chunk_len = (lengths.pop() + pad) // world_size
    return DispatchResult(args=per_args, kwargs=per_kwargs, context={"pad_size": pad, "chunk_len": chunk_len})


# ---------------------------------------------------------------------------------------------------
# collect functions: (outputs, context) -> value


def collect_all(outputs: list[Any], context: dict[str, Any]) -> list[Any]:
    """Return the per-rank results as a list (rank order)."""
    return list(outputs)


def collect_rank_zero(outputs: list[Any], context: dict[str, Any]) -> Any:
    """Return rank 0's result."""
    return outputs[0]


def collect_dp_compute_proto(outputs: list[Any], context: dict[str, Any]) -> Any:
    """Concatenate per-rank DataProto results in rank order and drop the dispatch padding.

    Ranks that return None (a method with nothing to report) yield None; mixed results are an error.
    """
    from hybridflow.protocol import DataProto, unpad_dataproto

    if all(o is None for o in outputs):
        return None
    if not all(_is_dataproto(o) for o in outputs):
        kinds = sorted({type(o).__name__ for o in outputs})
        raise TypeError(
            f"DP_COMPUTE_PROTO collect: every rank must return a DataProto, got {kinds}; "
            "make the worker method return a DataProto (or register it with Dispatch.ONE_TO_ALL)"
        )
    pad = context.get("pad_size", 0)
    chunk_len = context.get("chunk_len")
    if pad and chunk_len:
        # A method may return k rows per input row (e.g. generate with n samples per prompt, repeated
        # interleaved): the padding rows' outputs are then the last pad * k rows.
        ratios = {len(o) / chunk_len for o in outputs}
        if len(ratios) != 1 or not float(next(iter(ratios))).is_integer():
            raise ValueError(
                f"DP_COMPUTE_PROTO collect: ranks returned {[len(o) for o in outputs]} rows for {chunk_len} "
                "input rows each; a worker method must return the same whole multiple of its input rows"
            )
        pad *= int(ratios.pop())
    merged = DataProto.concat(outputs)
    # DataProto.concat merges meta_info: equal values once, `metrics` gathered into per-rank lists.
    return unpad_dataproto(merged, pad_size=pad)


DISPATCH_FNS: dict[Dispatch, Callable[..., DispatchResult]] = {
    Dispatch.ONE_TO_ALL: dispatch_one_to_all,
    Dispatch.DP_COMPUTE_PROTO: dispatch_dp_compute_proto,
    Dispatch.ALL_TO_ALL: dispatch_all_to_all,
    Dispatch.RANK_ZERO: dispatch_one_to_all,
}

COLLECT_FNS: dict[Dispatch, Callable[[list[Any], dict[str, Any]], Any]] = {
    Dispatch.ONE_TO_ALL: collect_all,
    Dispatch.DP_COMPUTE_PROTO: collect_dp_compute_proto,
    Dispatch.ALL_TO_ALL: collect_all,
    Dispatch.RANK_ZERO: collect_rank_zero,
}


def dispatch(mode: Dispatch, world_size: int, *args: Any, **kwargs: Any) -> DispatchResult:
    """Split a call's arguments over `world_size` ranks according to `mode`."""
    if world_size < 1:
        raise ValueError(f"dispatch needs world_size >= 1, got {world_size}")
    return DISPATCH_FNS[mode](world_size, *args, **kwargs)


def collect(mode: Dispatch, outputs: list[Any], context: dict[str, Any] | None = None) -> Any:
    """Gather per-rank outputs into the caller's result according to `mode`."""
    return COLLECT_FNS[mode](outputs, context or {})
