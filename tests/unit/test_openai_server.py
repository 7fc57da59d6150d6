"""The OpenAI-compatible endpoint and `OpenAIAgentLoop`, driven by the real `openai` client over HTTP on
127.0.0.1, in front of a scripted server (the engine is not what is tested here; the agent-rollout
integration test runs a real vLLM behind it)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest
import torch

from hybridflow.agent import OpenAIAgentLoop, register
from hybridflow.agent.chat import render_ids, turn_ids
from hybridflow.agent.manager import AgentLoopManager
from hybridflow.data.dataset import collate_fn
from hybridflow.tools.lookup import LookupTool
from tests.unit.test_agent_loops import CALL, EOS, TOK, ScriptedServer, config, ids, lookup_sample

TOOLS = [LookupTool({}, None).tool_schema.model_dump(exclude_none=True)]


def _batch(sample: dict[str, Any], agent_name: str) -> Any:
    prompt_ids = sample["raw_prompt_ids"]
    return collate_fn([{**sample, "input_ids": torch.tensor(prompt_ids), "agent_name": agent_name,
                        "attention_mask": torch.ones(len(prompt_ids), dtype=torch.long)}])


def _run(agent_name: str, server: ScriptedServer, *overrides: str, response_length: int = 40) -> tuple[Any, AgentLoopManager]:
    manager = AgentLoopManager(config(*overrides, response_length=response_length), TOK, server)
    try:
        return manager.run_trajectories(_batch(lookup_sample("q"), agent_name))[0], manager
    finally:
        manager.close()


@register("test_openai_lookup")
class LookupAgent(OpenAIAgentLoop):
    """A production-style tool agent: call, run the tools the model asked for, send their results back."""

    async def agent(self, base_url: str, sample: dict[str, Any]) -> None:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        messages = list(sample["raw_prompt"])
        for _ in range(3):
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "q"})


def test_a_tool_agent_over_the_openai_client_becomes_an_exact_trajectory() -> None:
    server = ScriptedServer([[CALL, EOS], ids("q") + [EOS]])
    out, _ = _run("test_openai_lookup", server)
    sample = lookup_sample("q")
    tool_turn = turn_ids(TOK, [{"role": "tool", "content": "q"}])
    assert out.prompt_ids == render_ids(TOK, sample["raw_prompt"], tools=TOOLS)
    assert out.response_ids == [CALL, EOS] + tool_turn + ids("q") + [EOS]
    assert out.response_mask == [1, 1] + [0] * len(tool_turn) + [1, 1]
    assert out.response_logprobs == [-0.5, -0.51] + [0.0] * len(tool_turn) + [-0.5, -0.51]
    # both calls were one session: the same request id (one replica), the second continuing the first's ids
    assert server.calls[0]["request_id"] == server.calls[1]["request_id"]
    assert server.calls[1]["prompt_ids"] == out.prompt_ids + [CALL, EOS] + tool_turn
    assert out.num_turns == 4 and out.metrics["non_prefix_calls"] == 0 and out.metrics["agent_errors"] == 0


def test_the_endpoint_answers_in_openai_shape_with_tool_calls() -> None:
    seen: dict[str, Any] = {}

    @register("test_openai_shape")
    class Shape(OpenAIAgentLoop):
        async def agent(self, base_url: str, sample: dict[str, Any]) -> None:
            client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
            seen["models"] = [m.id for m in (await client.models.list()).data]
            seen["reply"] = await client.chat.completions.create(model="policy", messages=sample["raw_prompt"], tools=TOOLS)

    _run("test_openai_shape", ScriptedServer([[CALL, EOS]]))
    reply = seen["reply"]
    assert seen["models"] == ["policy"]
    assert reply.object == "chat.completion" and reply.choices[0].finish_reason == "tool_calls"
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "lookup" and json.loads(call.function.arguments) == {}
    assert reply.usage.completion_tokens == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0.3}, "actor_rollout_ref.rollout.temperature"),
        ({"top_p": 0.5}, "omit top_p"),
        ({"stream": True}, "stream=true is not supported"),
        ({"n": 2}, "n > 1 is not supported"),
        ({"max_tokens": 0}, "max_tokens must be a positive integer"),
    ],
)
def test_requests_the_endpoint_cannot_honour_are_refused_with_the_fix(kwargs: dict[str, Any], message: str) -> None:
    seen: dict[str, Any] = {}

    @register("test_openai_refused")
    class Refused(OpenAIAgentLoop):
        async def agent(self, base_url: str, sample: dict[str, Any]) -> None:
            client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
            try:
                await client.chat.completions.create(model="policy", messages=sample["raw_prompt"], **kwargs)
            except openai.BadRequestError as err:
                seen["error"] = err

    out, _ = _run("test_openai_refused", ScriptedServer([[EOS]]))
    assert message in seen["error"].message
    assert out.response_ids == [] and out.num_turns == 1  # nothing generated, nothing to train on


def test_a_call_past_the_response_budget_gets_an_empty_length_completion() -> None:
    seen: list[Any] = []

    @register("test_openai_budget")
    class Greedy(OpenAIAgentLoop):
        async def agent(self, base_url: str, sample: dict[str, Any]) -> None:
            client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
            prompt = list(sample["raw_prompt_ids"])
            for _ in range(3):
                reply = await client.completions.create(model="policy", prompt=prompt)
                seen.append(reply.choices[0])
                prompt = prompt + ids("ab")  # as if the reply were appended

    out, _ = _run("test_openai_budget", ScriptedServer([ids("ab")]), response_length=3)
    # the second call gets the one token left (max_tokens 1; the scripted engine says "stop"), the third none
    assert [c.finish_reason for c in seen] == ["stop", "stop", "length"]
    assert seen[0].text == "ab" and seen[1].text == "a" and seen[2].text == ""
    assert len(out.response_ids) <= 3 and sum(out.response_mask) == 3  # "ab", then the 1 token left


def test_rewritten_history_ends_the_trajectory_and_a_raising_agent_keeps_its_calls() -> None:
    @register("test_openai_rewrites")
    class Rewrites(OpenAIAgentLoop):
        def agent(self, base_url: str, sample: dict[str, Any]) -> None:  # synchronous: runs in a thread
            client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
            client.chat.completions.create(model="policy", messages=sample["raw_prompt"])
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "value of d?"}])
            raise RuntimeError("the agent crashed after its calls")

    out, _ = _run("test_openai_rewrites", ScriptedServer([ids("x") + [EOS]]))
    assert out.response_ids == ids("x") + [EOS]  # the first call only
    assert out.metrics["non_prefix_calls"] == 1 and out.metrics["agent_errors"] == 1


def test_outside_a_session_the_endpoint_serves_plain_requests_and_bad_bodies_get_openai_errors() -> None:
    from hybridflow.agent.manager import EventLoopThread
    from hybridflow.agent.openai_server import OpenAIServer

    events = EventLoopThread()
    server = OpenAIServer(ScriptedServer([ids("hi")]), TOK)
    try:
        url = events.run(server.start())
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        reply = client.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=2)
        assert reply.choices[0].text == "hi"
        with pytest.raises(openai.NotFoundError, match="no open session"):
            openai.OpenAI(base_url=f"{url}/sessions/nope/v1", api_key="x", max_retries=0).completions.create(
                model="policy", prompt="x")
        request = urllib.request.Request(f"{url}/v1/chat/completions", data=b"{not json", method="POST",
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=10)
        assert err.value.code == 400 and "not JSON" in json.loads(err.value.read())["error"]["message"]
    finally:
        events.run(server.stop())
        events.close()
