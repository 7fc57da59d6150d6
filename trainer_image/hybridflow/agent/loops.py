"""The built-in agent loops: `single_turn_agent` (one generation) and `tool_agent` (multi-turn tool calling).

`tool_agent` alternates model turns and tool turns: the model's tokens are read for tool calls in the
configured format (`multi_turn.format`: Hermes or gpt-oss's Harmony, `hybridflow.agent.tool_parser`, which
also says how the tokens are decoded), each call runs (bounded by `multi_turn.max_parallel_calls`, with a
per-tool timeout), and the results are appended as one tool turn, rendered by the chat template (Harmony's
by the format itself) with `data.apply_chat_template_kwargs`, as the prompt is. A call
that is malformed, names no known tool, raises or hangs gets an error text as its result; the
trajectory goes on. It ends when the model calls no tool, the response budget or a turn limit is
reached, or the server aborts the request. The last turn is always the model's.

With interactions (`multi_turn.interaction_config_path`, `hybridflow.interactions`), a model turn without
tool calls goes to the sample's interaction (`extra_info.interaction_kwargs.name`; it sees each model turn's
content: calls and reasoning taken out), whose reply becomes a user turn (mask 0) and whose turn score is kept
in `extra_fields["turn_scores"]`; the trajectory ends when the interaction says so (its last reply is not
appended: nothing would train on it), or at a limit. An interaction that raises or hangs ends the trajectory
on the model's turn and counts in `interaction_errors`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from hybridflow._config.verl_features import MULTIMODAL_AGENTS
from hybridflow.agent.base import (
    AgentLoopBase,
    AgentLoopOutput,
    TokenOutput,
    register,
    sampling_for_turn,
    with_images,
)
from hybridflow.agent.chat import render_ids
from hybridflow.agent.tool_parser import Call, ToolCallError, get_tool_parser
from hybridflow.interactions.base import BaseInteraction
from hybridflow.interactions.config import KEY as INTERACTION_KEY
from hybridflow.tools.base import BaseTool

DEFAULT_TOOL_TIMEOUT_S = 30.0


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """One model turn on the dataset's prompt ids: the same tokens batch mode generates from."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Generate one response to `raw_prompt_ids`."""
        prompt_ids = list(kwargs["raw_prompt_ids"])
        params = sampling_for_turn(sampling_params, self.response_length, None)
        out = await self.server_manager.generate(
            request_id=uuid.uuid4().hex, prompt_ids=prompt_ids, sampling_params=params,
            **with_images(kwargs.get("multi_modal_data")),  # an image prompt's images
        )
        ids = out.token_ids[: self.response_length]
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=ids,
            response_mask=[1] * len(ids),
            response_logprobs=_logprobs(out, len(ids)),
            num_turns=2,
            metrics={"aborted": float(out.finish_reason == "abort"), **_cache_stats(len(prompt_ids), out)},
        )


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    """Multi-turn tool calling in verl's `tool_agent` shape (see the module docstring)."""

    def __init__(self, trainer_config: Any, server_manager: Any, tokenizer: Any, *, tools: list[BaseTool] | None = None,
                 interactions: dict[str, BaseInteraction] | None = None, **kwargs: Any) -> None:
        super().__init__(trainer_config, server_manager, tokenizer, **kwargs)
        self.multi_turn = trainer_config.actor_rollout_ref.rollout.multi_turn
        self.tools = {tool.name: tool for tool in (tools or [])}
        self.interactions = dict(interactions or {})
        self.tool_schemas = [t.tool_schema.model_dump(exclude_none=True) for t in self.tools.values()]
        self.parser = get_tool_parser(self.multi_turn.format)
        self.template_kwargs = dict(trainer_config.data.apply_chat_template_kwargs or {})

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One trajectory of model and tool turns."""
        if kwargs.get("multi_modal_data"):
            raise ValueError(f"the tool agent loop got an image prompt: {MULTIMODAL_AGENTS.message}")
        request_id = uuid.uuid4().hex
        if self.tool_schemas and kwargs.get("raw_prompt"):
            prompt_ids = render_ids(self.tokenizer, list(kwargs["raw_prompt"]), tools=self.tool_schemas,
                                    template_kwargs=self.template_kwargs)
        else:
            prompt_ids = list(kwargs["raw_prompt_ids"])
        tools_kwargs = _tools_kwargs(kwargs)
        response: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        stats = {"tool_calls": 0.0, "tool_errors": 0.0, "tool_latency_s": 0.0, "aborted": 0.0}
        instances: dict[str, str] = {}
        assistant_turns = user_turns = 0
        interaction, interaction_kwargs = self._interaction_of(kwargs)
        messages: list[dict[str, Any]] = [dict(m) for m in kwargs.get("raw_prompt") or []]
        turn_scores: list[float] = []
        with_interaction = interaction is not None
        if interaction is not None:
            stats.update(interaction_turns=0.0, interaction_errors=0.0)
            try:
                await asyncio.wait_for(interaction.start_interaction(request_id, **interaction_kwargs),
                                       DEFAULT_TOOL_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - counted; the trajectory goes on without its user turns
                stats["interaction_errors"] += 1
                interaction = None
        try:
            while True:
                budget = self.response_length - len(response)
                params = sampling_for_turn(sampling_params, budget, self.multi_turn.max_tokens_per_turn)
                out = await self.server_manager.generate(
                    request_id=request_id, prompt_ids=prompt_ids + response, sampling_params=params
                )
                ids = out.token_ids[:budget]
                for key, value in _cache_stats(len(prompt_ids) + len(response), out).items():
                    stats[key] = stats.get(key, 0.0) + value
                response += ids
                mask += [1] * len(ids)
                logprobs += _logprobs(out, len(ids)) or [0.0] * len(ids)
                assistant_turns += 1
                if out.finish_reason == "abort":
                    stats["aborted"] = 1.0
                    break
                if len(response) >= self.response_length or _reached(self.multi_turn.max_assistant_turns, assistant_turns):
                    break
                if _reached(self.multi_turn.max_user_turns, user_turns):
                    break
                answer, calls = self.parser.read(self.tokenizer, ids, self.tool_schemas)
                messages.append({"role": "assistant", "content": answer})
                if not calls:
                    if interaction is None:
                        break
                    reply = await self._interact(interaction, request_id, messages, interaction_kwargs, stats)
                    if reply is None:
                        break
                    done, content, score = reply
                    turn_scores.append(score)
                    if done:
                        break  # its last reply is not appended: nothing would train on it
                    user_ids = self._turn_ids([{"role": "user", "content": content}])
                    if len(response) + len(user_ids) >= self.response_length:
                        break
                    messages.append({"role": "user", "content": content})
                    response += user_ids
                    mask += [0] * len(user_ids)
                    logprobs += [0.0] * len(user_ids)
                    user_turns += 1
                    stats["interaction_turns"] += 1
                    continue
                calls = calls[: self.multi_turn.max_parallel_calls]
                started = time.perf_counter()
                texts = await asyncio.gather(*(self._call(c, tools_kwargs, instances, stats) for c in calls))
                stats["tool_latency_s"] += time.perf_counter() - started
                replies = [_tool_message(call, text) for call, text in zip(calls, texts, strict=True)]
                tool_ids = self._turn_ids(replies)
                if len(response) + len(tool_ids) >= self.response_length:
                    break  # no room left for the model to answer: the trajectory ends on its own turn
                messages += replies
                response += tool_ids
                mask += [0] * len(tool_ids)
                logprobs += [0.0] * len(tool_ids)
                user_turns += 1
        finally:
            await self._release(instances)
            if interaction is not None:
                await _best_effort(interaction.finalize_interaction(request_id, **interaction_kwargs))
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response,
            response_mask=mask,
            response_logprobs=logprobs,
            num_turns=1 + assistant_turns + user_turns,
            metrics=stats,
            extra_fields={"turn_scores": turn_scores} if with_interaction else {},
        )

    def _turn_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Ids of tool or user messages continuing the trajectory, in the configured format."""
        return self.parser.render_turn(self.tokenizer, messages, template_kwargs=self.template_kwargs)

    def _interaction_of(self, sample: dict[str, Any]) -> tuple[BaseInteraction | None, dict[str, Any]]:
        """The sample's interaction and its kwargs (verl: `extra_info.interaction_kwargs`, `name` choosing it)."""
        if not self.interactions:
            return None, {}
        extra = sample.get("extra_info")
        found = sample.get("interaction_kwargs")
        if not isinstance(found, dict) and isinstance(extra, dict):
            found = extra.get("interaction_kwargs")
        if not isinstance(found, dict):
            raise ValueError(
                f"{INTERACTION_KEY} is set, but sample {sample.get('index', '?')} has no extra_info.interaction_kwargs; "
                f"give every row one naming its interaction (e.g. {{name: {next(iter(self.interactions))}}}), or unset "
                f"{INTERACTION_KEY}"
            )
        name = found.get("name")
        if name not in self.interactions:
            raise ValueError(
                f"sample {sample.get('index', '?')}: extra_info.interaction_kwargs.name={name!r} is not an interaction of "
                f"{INTERACTION_KEY}; configured: {sorted(self.interactions)}"
            )
        return self.interactions[name], dict(found)

    async def _interact(self, interaction: BaseInteraction, request_id: str, messages: list[dict[str, Any]],
                        interaction_kwargs: dict[str, Any], stats: dict[str, float]) -> tuple[bool, str, float] | None:
        """(done, user reply, turn score); None when the interaction failed (counted, the trajectory ends)."""
        try:
            done, content, score, _ = await asyncio.wait_for(
                interaction.generate_response(request_id, list(messages), **interaction_kwargs), DEFAULT_TOOL_TIMEOUT_S
            )
            return bool(done), str(content), float(score)
        except Exception:  # noqa: BLE001 - a user interaction's bug or hang must not end the rollout
            stats["interaction_errors"] += 1
            return None

    async def _call(self, call: Call, tools_kwargs: dict[str, Any],
                    instances: dict[str, str], stats: dict[str, float]) -> str:
        """Run one call; every failure becomes a message to the model (never an exception)."""
        stats["tool_calls"] += 1
        if isinstance(call, ToolCallError):
            stats["tool_errors"] += 1
            return call.message
        tool = self.tools.get(call.name)
        if tool is None:
            stats["tool_errors"] += 1
            return f"error: there is no tool {call.name!r}; available tools: {sorted(self.tools)}"
        timeout = float(tool.config.get("timeout", DEFAULT_TOOL_TIMEOUT_S))
        try:
            if call.name not in instances:
                create_kwargs = (tools_kwargs.get(call.name) or {}).get("create_kwargs") or {}
                instances[call.name], _ = await asyncio.wait_for(tool.create(**create_kwargs), timeout)
            result, _, _ = await asyncio.wait_for(tool.execute(instances[call.name], call.arguments), timeout)
        except asyncio.TimeoutError:
            stats["tool_errors"] += 1
            return f"error: tool {call.name} did not answer within {timeout:g} s"
        except Exception as err:  # a user tool's bug must not end the rollout
            stats["tool_errors"] += 1
            return f"error: tool {call.name} failed: {type(err).__name__}: {err}"
        return self._truncate(result.text or "")

    def _truncate(self, text: str) -> str:
        limit, side = self.multi_turn.max_tool_response_length, self.multi_turn.tool_response_truncate_side
        if len(text) <= limit:
            return text
        if side == "left":
            return text[:limit] + "...(truncated)"
        if side == "right":
            return "(truncated)..." + text[-limit:]
        half = limit // 2
        return text[:half] + "...(truncated)..." + text[len(text) - (limit - half):]

    async def _release(self, instances: dict[str, str]) -> None:
        for name, instance_id in instances.items():
            await _best_effort(self.tools[name].release(instance_id))


async def _best_effort(call: Any) -> None:
    try:
        await asyncio.wait_for(call, DEFAULT_TOOL_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - releasing is best effort; the trajectory is already complete
        pass


def _tool_message(call: Call, text: str) -> dict[str, Any]:
    """A call's result as a chat message; `name` is the function called, where the call says (Harmony's
    replies are written as from it; chat templates that do not read it ignore it)."""
    message: dict[str, Any] = {"role": "tool", "content": text}
    if call.name:
        message["name"] = call.name
    return message


def _reached(limit: int | None, count: int) -> bool:
    return limit is not None and count >= limit


def _cache_stats(prompt_len: int, out: TokenOutput) -> dict[str, float]:
    """Prompt tokens of one turn and how many of them the engine's prefix cache served (when it says)."""
    if out.cached_tokens is None:
        return {}
    return {"prompt_tokens": float(prompt_len), "cached_tokens": float(out.cached_tokens)}


def _logprobs(out: TokenOutput, n: int) -> list[float] | None:
    return None if out.log_probs is None else [float(x) for x in out.log_probs[:n]]


def _tools_kwargs(sample: dict[str, Any]) -> dict[str, Any]:
    """verl keeps per-sample tool arguments in `tools_kwargs` (top level or under extra_info)."""
    direct = sample.get("tools_kwargs")
    if isinstance(direct, dict):
        return direct
    extra = sample.get("extra_info")
    nested = extra.get("tools_kwargs") if isinstance(extra, dict) else None
    return nested if isinstance(nested, dict) else {}
