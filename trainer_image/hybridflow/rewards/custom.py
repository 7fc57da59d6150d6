"""Load a user's reward function from a Python file (``custom_reward_function.path`` / ``.name``).

The function has verl's signature,
``fn(data_source, solution_str, ground_truth, extra_info=None, **reward_kwargs) -> float | dict``, and may be
``async def``: the reward managers then await up to `hybridflow.rewards.budget.ASYNC_CONCURRENCY` calls at once in
the trainer process, each under its time budget (as verl's reward loop awaits them).
`load_custom_reward_fn` returns a `CustomRewardFunction`: callable with that signature (the configured
``reward_kwargs`` bound) and picklable by path, so it can be shipped to a Ray actor and re-imported there
(a function imported from a file path has no importable module name, so plain pickle cannot send it).

With a generative reward model served for it (`hybridflow.workers.reward_service`), the function also gets
verl's reward-loop arguments, those its signature names: ``reward_router_address`` (host:port of the served
model's HTTP endpoint: SGLang's ``/generate`` and OpenAI's ``/v1/chat/completions``), ``reward_model_tokenizer``
(loaded once per scoring process) and ``reward_model_path``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

#: verl's reward-loop arguments a custom function may name to use a served (generative) reward model.
SERVED_ARGUMENTS = ("reward_router_address", "reward_model_tokenizer", "reward_model_path")


class CustomRewardError(ValueError):
    """The configured custom reward function cannot be loaded."""


def _import_file(path: str) -> Any:
    """Import the Python file at ``path`` as a fresh module; errors name the file and the fix."""
    if not os.path.isfile(path):
        raise CustomRewardError(
            f"custom_reward_function.path={path!r}: no such file. Set it to an existing Python file "
            "(an absolute path, or a path relative to the working directory of the trainer)."
        )
    module_name = "hybridflow_custom_reward_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise CustomRewardError(
            f"custom_reward_function.path={path!r}: cannot be imported as a Python module; "
            "give a file ending in .py."
        )
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's code may raise anything at import time
        raise CustomRewardError(
            f"custom_reward_function.path={path!r}: importing the file failed with "
            f"{type(exc).__name__}: {exc}. Fix the error in that file."
        ) from exc
    return module


def _resolve(path: str, name: str) -> Callable[..., Any]:
    """The callable ``name`` of the file at ``path``; errors list what the file does define."""
    module = _import_file(path)
    if not hasattr(module, name):
        functions = sorted(
            n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
        )
        raise CustomRewardError(
            f"custom_reward_function.name={name!r}: no function of that name in {path!r} "
            f"(functions defined there: {', '.join(functions) or 'none'}). "
            "Set custom_reward_function.name to one of them."
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise CustomRewardError(
            f"custom_reward_function.name={name!r} in {path!r} is a {type(fn).__name__}, not a function. "
            "Point custom_reward_function.name at a function with the signature "
            "fn(data_source, solution_str, ground_truth, extra_info=None, **kwargs)."
        )
    return fn


class CustomRewardFunction:
    """A user's reward function with its ``reward_kwargs`` bound; pickles as (path, name, kwargs)."""

    def __init__(
        self, path: str, name: str = "compute_score", reward_kwargs: Mapping[str, Any] | None = None
    ):
        """Import ``name`` from ``path`` now, so configuration errors surface at start-up."""
        self.path = path
        self.name = name
        self.reward_kwargs = dict(reward_kwargs or {})
        self._fn = _resolve(path, name)
        self.serve_reward_model(None, None)

    def wants_reward_model(self) -> bool:
        """Whether the function names `reward_router_address` (it calls a served reward model, verl's GenRM)."""
        return "reward_router_address" in inspect.signature(self._fn).parameters

    def serve_reward_model(self, address: str | None, model_path: str | None) -> None:
        """Pass a served reward model's endpoint (host:port) and path to every call from now on (None: none).

        Which of verl's reward-loop arguments the function names is read from its signature here, once, not on
        every call; the reward model's tokenizer is loaded on the first call that needs it, in the process that
        makes it.
        """
        self.served: dict[str, str] = (
            {"reward_router_address": address, "reward_model_path": model_path} if address and model_path else {}
        )
        params = inspect.signature(self._fn).parameters
        open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self._wanted = [n for n in SERVED_ARGUMENTS if self.served and (open_ended or n in params)]
        self._rm_tokenizer: Any = None

    def _served_kwargs(self) -> dict[str, Any]:
        """The reward-loop arguments the function's signature names (all of them for one taking **kwargs)."""
        out: dict[str, Any] = {n: self.served[n] for n in self._wanted if n in self.served}
        if "reward_model_tokenizer" in self._wanted:
            if self._rm_tokenizer is None:
                from transformers import AutoTokenizer

                self._rm_tokenizer = AutoTokenizer.from_pretrained(self.served["reward_model_path"])
            out["reward_model_tokenizer"] = self._rm_tokenizer
        return out

    @property
    def is_async(self) -> bool:
        """Whether the user's function is `async def` (the reward managers then await many calls at once)."""
        return inspect.iscoroutinefunction(self._fn)

    def _call(self, **kwargs: Any) -> Any:
        """The user's function with the bound and served arguments; an `async def` one is run to completion."""
        if self.is_async:
            return asyncio.run(self.acall(**kwargs))
        return self._fn(**kwargs, **self.reward_kwargs, **self._served_kwargs())

    async def acall(self, **kwargs: Any) -> Any:
        """Await an `async def` function with the bound and served arguments (a response's, or the batch
        manager's lists)."""
        return await self._fn(**kwargs, **self.reward_kwargs, **self._served_kwargs())

    def __call__(
        self, data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
    ) -> float | dict[str, Any]:
        """Call the user's function with verl's keyword arguments and the bound ``reward_kwargs``."""
        result: float | dict[str, Any] = self._call(
            data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info
        )
        return result

    def batched(
        self,
        data_sources: list[str],
        solution_strs: list[str],
        ground_truths: list[Any],
        extra_infos: list[dict[str, Any] | None],
    ) -> Any:
        """Call a batched user function (``reward_manager=batch``): lists in, one score per sample out."""
        return self._call(
            data_sources=data_sources, solution_strs=solution_strs, ground_truths=ground_truths, extra_infos=extra_infos
        )

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the location only; the receiving process re-imports the file."""
        return {"path": self.path, "name": self.name, "reward_kwargs": self.reward_kwargs, "served": self.served}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Re-import the function in the receiving process."""
        self.path, self.name, self.reward_kwargs = state["path"], state["name"], state["reward_kwargs"]
        self._fn = _resolve(self.path, self.name)
        served = state.get("served") or {}
        self.serve_reward_model(served.get("reward_router_address"), served.get("reward_model_path"))

    def __repr__(self) -> str:
        """Where the function comes from."""
        return f"CustomRewardFunction(path={self.path!r}, name={self.name!r})"


def load_custom_reward_fn(
    path: str, name: str = "compute_score", reward_kwargs: Mapping[str, Any] | None = None
) -> CustomRewardFunction:
    """Load ``name`` from the Python file ``path`` with ``reward_kwargs`` bound; errors say what to fix."""
    if not name:
        raise CustomRewardError(
            "custom_reward_function.name is empty: set it to the name of the function in "
            f"{path!r} (verl's default is compute_score)."
        )
    return CustomRewardFunction(path, name, reward_kwargs)


def load_custom_reward_fn_from_config(cfg: Any) -> CustomRewardFunction | None:
    """`load_custom_reward_fn` from ``cfg.custom_reward_function`` (path, name, reward_kwargs); None if no path."""
    section = getattr(cfg, "custom_reward_function", None)
    path = getattr(section, "path", None) if section is not None else None
    if not path:
        return None
    return load_custom_reward_fn(
        path,
        getattr(section, "name", None) or "compute_score",
        getattr(section, "reward_kwargs", None) or {},
    )
