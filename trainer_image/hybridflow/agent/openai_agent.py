"""`OpenAIAgentLoop`: train agent code written against the OpenAI client.

    from openai import AsyncOpenAI
    from hybridflow.agent import OpenAIAgentLoop, register

    @register("my_agent")
    class MyAgent(OpenAIAgentLoop):
        async def agent(self, base_url: str, sample: dict) -> None:
            client = AsyncOpenAI(base_url=base_url, api_key="unused")
            reply = await client.chat.completions.create(model="policy", messages=list(sample["raw_prompt"]))
            ...   # call tools, send their results back, as the agent would in production

Each trajectory gets its own session on the OpenAI-compatible endpoint (`hybridflow.agent.openai_server`);
what the agent's calls sent and received, in token ids, becomes the trajectory: the first call's prompt is
the prompt, each call's output is model tokens (mask 1), and what a later call's prompt adds after the
previous output (tool results, user turns, the next generation prompt) is context (mask 0). A call whose
prompt does not continue the trajectory so far (the agent rewrote or dropped history) ends it there,
counted in `agent/non_prefix_calls/mean`; an agent that raises keeps the calls it made, counted in
`agent/agent_errors/mean`. A synchronous `agent` runs in a thread, so the blocking OpenAI client works too.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from hybridflow.agent.base import AgentLoopBase, AgentLoopOutput
from hybridflow.agent.openai_server import Call, OpenAIServer

logger = logging.getLogger(__name__)


class OpenAIAgentLoop(AgentLoopBase):
    """Base of loops whose agent talks to the policy over OpenAI's API; subclasses implement `agent`."""

    def __init__(self, trainer_config: Any, server_manager: Any, tokenizer: Any, *,
                 openai_endpoint: Callable[[], Awaitable[OpenAIServer]] | None = None, **kwargs: Any) -> None:
        super().__init__(trainer_config, server_manager, tokenizer, **kwargs)
        if openai_endpoint is None:
            raise ValueError("an OpenAIAgentLoop needs the manager's OpenAI endpoint; build it through AgentLoopManager")
        self.openai_endpoint = openai_endpoint

    def agent(self, base_url: str, sample: dict[str, Any]) -> Any:
        """Run the agent against `base_url` (an OpenAI-compatible /v1 root) on `sample` (the dataset row:
        `raw_prompt` chat messages, `extra_info`, ...); async or sync. Its calls are the trajectory."""
        raise NotImplementedError("subclass OpenAIAgentLoop and implement agent(base_url, sample)")

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One session: the agent runs, then its captured calls become the trajectory."""
        endpoint = await self.openai_endpoint()
        sid, base_url = endpoint.open_session(sampling_params, self.response_length)
        errors = 0.0
        try:
            if inspect.iscoroutinefunction(self.agent):
                await self.agent(base_url, kwargs)
            else:
                await asyncio.to_thread(self.agent, base_url, kwargs)
        except Exception as err:  # noqa: BLE001 - the user's agent failing must not end the rollout
            errors = 1.0
            logger.warning("agent %s raised %s: %s (the calls it made are kept)", type(self).__name__,
                           type(err).__name__, str(err)[:200])
        finally:
            calls = endpoint.close_session(sid).calls
        fallback = list(kwargs.get("raw_prompt_ids") or [])
        return assemble_trajectory(calls, fallback, self.response_length, {"agent_errors": errors})


def assemble_trajectory(calls: list[Call], fallback_prompt: list[int], response_length: int,
                        metrics: dict[str, float]) -> AgentLoopOutput:
    """The trajectory of a session's calls (see the module docstring); no call: the prompt, no response."""
    stats = {**metrics, "non_prefix_calls": 0.0, "aborted": 0.0}
    if not calls:
        return AgentLoopOutput(prompt_ids=fallback_prompt, response_ids=[], response_mask=[], response_logprobs=[],
                               num_turns=1, metrics=stats)
    prompt = list(calls[0].prompt_ids)
    response: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    turns = 1
    for index, call in enumerate(calls):
        context = prompt + response
        if index and call.prompt_ids[: len(context)] != context:
            stats["non_prefix_calls"] = float(len(calls) - index)
            break
        added = list(call.prompt_ids[len(context):])
        if added:
            response += added
            mask += [0] * len(added)
            logprobs += [0.0] * len(added)
            turns += 1
        response += call.output_ids
        mask += [1] * len(call.output_ids)
        logprobs += call.log_probs if call.log_probs is not None else [0.0] * len(call.output_ids)
        turns += 1
        if call.cached_tokens is not None:
            stats["prompt_tokens"] = stats.get("prompt_tokens", 0.0) + len(call.prompt_ids)
            stats["cached_tokens"] = stats.get("cached_tokens", 0.0) + call.cached_tokens
    # the session's budget keeps the total within response_length; a last context turn without output is dropped
    while mask and mask[-1] == 0:
        response.pop(), mask.pop(), logprobs.pop()
    return AgentLoopOutput(prompt_ids=prompt, response_ids=response[:response_length], response_mask=mask[:response_length],
                           response_logprobs=logprobs[:response_length], num_turns=turns, metrics=stats)
