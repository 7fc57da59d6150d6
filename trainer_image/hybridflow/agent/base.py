"""Agent loops in verl's shape: `AgentLoopBase.run(sampling_params, **kwargs) -> AgentLoopOutput`.

An agent loop turns one sample (its chat messages and dataset fields) into one trajectory by talking to
a rollout server through an async client (`AsyncServerClient`: token ids in, token ids and log-probs
out). Loops never import Ray or an engine: the client is whatever the caller hands in (the router over
Ray replicas in a run, a fake server in tests). Loops are registered by name (`register`) and chosen
per sample by the dataset's `agent_name` field.

Contract of the output (what the trainer trains on):
- `prompt_ids`: the prompt exactly as the engine saw it; `response_ids`: everything after it, model
  turns and tool/user turns alike, exactly the ids the engine produced or was fed (never re-tokenised);
- `response_mask`: 1 on model tokens, 0 on tool and user tokens, so the loss never trains on tool output;
- `response_logprobs`: the engine's log-prob of each response token (0 where the mask is 0), aligned.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class TokenOutput:
    """One generation from a server: the new token ids, their log-probs and why it stopped."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    finish_reason: str = "stop"  # stop (EOS / stop token), length (max_tokens), abort (cancelled)
    cached_tokens: int | None = None  # prompt tokens served from the engine's prefix cache, when it reports them


class AsyncServerClient(Protocol):
    """What an agent loop needs from the rollout service (verl's `server_manager.generate`)."""

    async def generate(
        self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
        multi_modal_data: dict[str, Any] | None = None,
    ) -> TokenOutput:
        """Continue `prompt_ids`; `request_id` names the trajectory (its turns stick to one replica).
        `multi_modal_data`: an image prompt's images (`{"image": [PIL images]}`; `prompt_ids` then hold one
        placeholder per image, which the engine expands)."""
        ...


def with_images(multi_modal_data: dict[str, Any] | None) -> dict[str, Any]:
    """The `multi_modal_data` keyword for a server's generate, only for an image prompt: a text prompt's call stays
    the three keywords every `AsyncServerClient` takes."""
    return {"multi_modal_data": multi_modal_data} if multi_modal_data else {}


@dataclass
class AgentLoopOutput:
    """A finished trajectory (see the module docstring for the token contract)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    num_turns: int = 2
    metrics: dict[str, float] = field(default_factory=dict)
    extra_fields: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.response_mask) != len(self.response_ids):
            raise ValueError(
                f"agent loop output: {len(self.response_ids)} response ids but {len(self.response_mask)} mask "
                "entries; every response token needs a mask value (1 model, 0 tool/user)"
            )
        if self.response_logprobs is not None and len(self.response_logprobs) != len(self.response_ids):
            raise ValueError(
                f"agent loop output: {len(self.response_ids)} response ids but {len(self.response_logprobs)} "
                "log-probs; give one per response token (0.0 on tool/user tokens) or None"
            )


class AgentLoopBase(abc.ABC):
    """Base of agent loops; subclasses implement `run`. One instance serves one trajectory.

    `trainer_config` is the whole HybridFlow config, `server_manager` an `AsyncServerClient`,
    `tokenizer` the policy's tokenizer (chat template included).
    """

    def __init__(self, trainer_config: Any, server_manager: AsyncServerClient, tokenizer: Any, **kwargs: Any) -> None:
        self.config = trainer_config
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        rollout = trainer_config.actor_rollout_ref.rollout
        self.prompt_length = int(rollout.prompt_length or trainer_config.data.max_prompt_length)
        self.response_length = int(rollout.response_length or trainer_config.data.max_response_length)
        self.loop_kwargs = kwargs

    @abc.abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One trajectory. kwargs: the sample's fields (`raw_prompt` messages, `raw_prompt_ids`,
        `tools_kwargs`, `extra_info`, `index`, ...)."""


_REGISTRY: dict[str, Callable[..., AgentLoopBase]] = {}


def register(name: str) -> Callable[[type[AgentLoopBase]], type[AgentLoopBase]]:
    """Class decorator: make an agent loop selectable by `agent_name` (verl's `@register`)."""

    def wrap(cls: type[AgentLoopBase]) -> type[AgentLoopBase]:
        _REGISTRY[name] = cls
        return cls

    return wrap


def register_factory(name: str, factory: Callable[..., AgentLoopBase]) -> None:
    """Register a loop built by `factory(trainer_config, server_manager, tokenizer)` (config-file loops)."""
    _REGISTRY[name] = factory


def get_agent_loop(name: str) -> Callable[..., AgentLoopBase]:
    """The loop class (or factory) registered as `name`; a wrong name lists the known ones."""
    if name not in _REGISTRY:
        raise KeyError(
            f"unknown agent loop {name!r} (the sample's agent_name or rollout.agent.default_agent_loop); "
            f"registered: {sorted(_REGISTRY)}. Register one with @hybridflow.agent.register(name) or "
            "actor_rollout_ref.rollout.agent.agent_loop_config_path"
        )
    return _REGISTRY[name]


def registered_agent_loops() -> list[str]:
    """Names of every registered agent loop."""
    return sorted(_REGISTRY)


def sampling_for_turn(sampling_params: dict[str, Any], budget: int, per_turn: int | None) -> dict[str, Any]:
    """The sampling of one model turn: max_tokens is what the response budget (and the per-turn cap) leave."""
    params = dict(sampling_params)
    limit = budget if per_turn is None else min(budget, per_turn)
    params["max_tokens"] = max(1, min(int(params.get("max_tokens", limit)), limit))
    return params
