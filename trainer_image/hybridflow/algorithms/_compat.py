"""Small helpers shared by the algorithm modules: config access and registry plumbing."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_MISSING = object()


def cfg_get(config: Any, name: str, default: Any = None) -> Any:
    """Read ``name`` from a pydantic model, namespace, dataclass or mapping; ``default`` if absent or None.

    verl passes OmegaConf ``DictConfig`` objects (attribute and ``.get`` access), our trainer passes
    pydantic models and tests pass plain namespaces or dicts: this accepts all of them.
    """
    if config is None:
        return default
    if isinstance(config, Mapping):
        value = config.get(name, _MISSING)
    else:
        value = getattr(config, name, _MISSING)
        if value is _MISSING and hasattr(config, "get") and callable(config.get):
            try:
                value = config.get(name, _MISSING)
            except TypeError:
                value = _MISSING
    if value is _MISSING or value is None:
        return default
    return value


def adapt_to_signature(fn: F) -> F:
    """Return ``fn`` unchanged if it takes ``**kwargs``, else a wrapper that drops unknown keywords.

    The trainer calls every registered function with the same full keyword set. Functions ported
    from verl often accept only the keywords they use; this lets them keep working unchanged.
    """
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return fn
    accepted = {p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **{k: v for k, v in kwargs.items() if k in accepted})

    wrapper.__wrapped_original__ = fn  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def register_in(registry: dict[str, Callable[..., Any]], kind: str, name: str, fn: Callable[..., Any]) -> None:
    """Put ``fn`` under ``name`` in ``registry``; a different function already there is an error."""
    existing = registry.get(name)
    if existing is not None:
        original = getattr(existing, "__wrapped_original__", existing)
        if original is not fn:
            raise ValueError(
                f"{kind} {name!r} is already registered by {original.__module__}.{original.__qualname__}; "
                f"pick another name for {fn.__module__}.{fn.__qualname__}."
            )
    registry[name] = adapt_to_signature(fn)


def lookup(registry: Mapping[str, Callable[..., Any]], kind: str, name: Any, config_key: str) -> Callable[..., Any]:
    """Return ``registry[name]`` or raise a ValueError that lists the valid names and says what to set."""
    key = getattr(name, "value", name)
    if key not in registry:
        valid = ", ".join(sorted(registry))
        raise ValueError(
            f"Unknown {kind} {key!r}. Valid names: {valid}. Set {config_key} to one of them, "
            f"or register your own function under {key!r} before the trainer starts."
        )
    return registry[key]
