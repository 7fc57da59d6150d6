"""An OpenAI-compatible HTTP endpoint in front of the router, so agent code written against the OpenAI client
can be trained; every call's token ids are captured server-side.

    GET  /v1/models
    POST /v1/completions          {"prompt": text | [token ids], "max_tokens", "temperature", "top_p", ...}
    POST /v1/chat/completions     {"messages", "tools", "max_tokens" | "max_completion_tokens", ...}
    POST /generate                SGLang's native shape: {"input_ids" | "text", "sampling_params": {"max_new_tokens",
                                  "temperature", "top_p", "top_k"}} -> {"text", "output_ids", "meta_info"}
                                  (max_new_tokens capped at the endpoint's default_max_tokens)

Under `/sessions/<id>/v1/...` the calls belong to one training trajectory (`OpenAIAgentLoop` opens the
session and gives the agent that base URL): they go to one replica (the router's sticky sessions, so its
prefix cache holds the conversation), their sampling is the rollout's (a request asking for another
temperature or top_p is refused: the policy's samples must come from the configured distribution), their
tokens count against the trajectory's response budget (a call past it returns an empty completion with
finish_reason "length"), and each call's prompt ids, output ids and log-probs are kept for the trajectory.
Chat requests are rendered with the policy's chat template (tools and `data.apply_chat_template_kwargs`
included) and answered in OpenAI's shape; tool calls in the output (`multi_turn.format`: Hermes `<tool_call>`
blocks, or gpt-oss's Harmony calls) become `message.tool_calls`. Streaming and n > 1 are
refused with a message. Outside a session the endpoint serves plain requests (evaluation, debugging).

The server runs on the agent loops' event loop (aiohttp), bound to 127.0.0.1 unless configured otherwise
(`actor_rollout_ref.rollout.agent.openai_host`; on a cluster the pod's address, so sandboxes in other pods
can call it).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from hybridflow.agent.base import AsyncServerClient
from hybridflow.agent.chat import render_ids
from hybridflow.agent.tool_parser import FunctionCall, get_tool_parser

MODEL_NAME = "policy"
MAX_BODY_BYTES = 8 * 1024 * 1024
_SAMPLING_CHECKED = ("temperature", "top_p")


class RequestError(ValueError):
    """A request the endpoint refuses (HTTP 400, OpenAI's error shape)."""


@dataclass
class Call:
    """One generation of a session: what the engine saw and produced."""

    prompt_ids: list[int]
    output_ids: list[int]
    log_probs: list[float] | None
    cached_tokens: int | None = None


@dataclass
class Session:
    """One trajectory's calls, its sampling and its response budget."""

    sampling: dict[str, Any]
    response_budget: int
    calls: list[Call] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the chat so far, replies as returned
    context_ids: list[int] = field(default_factory=list)  # its token ids: what the engine saw and produced

    def tokens_left(self, prompt_ids: list[int]) -> int:
        """Response tokens the trajectory still has if this call's prompt continues its first one."""
        if not self.calls:
            return self.response_budget
        return self.response_budget - max(0, len(prompt_ids) - len(self.calls[0].prompt_ids))


class OpenAIServer:
    """The endpoint (see the module docstring); `start` on the event loop that runs the router."""

    def __init__(self, router: AsyncServerClient | None, tokenizer: Any, *, host: str = "127.0.0.1", port: int = 0,
                 tool_format: str = "hermes", default_max_tokens: int = 256,
                 chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.router = router
        self.tokenizer = tokenizer
        self.host, self.port = host, port
        self.parser = get_tool_parser(tool_format)
        self.template_kwargs = dict(chat_template_kwargs or {})  # verl's data.apply_chat_template_kwargs
        self.default_max_tokens = default_max_tokens
        self.sessions: dict[str, Session] = {}
        self._runner: Any = None
        self.url = ""

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> str:
        """Listen; returns the root URL (``http://host:port``)."""
        from aiohttp import web

        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/generate", self._native_generate)
        app.router.add_get("/sessions/{sid}/v1/models", self._models)
        app.router.add_post("/sessions/{sid}/v1/completions", self._completions)
        app.router.add_post("/sessions/{sid}/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{self.host}:{port}"
        return self.url

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def open_session(self, sampling: dict[str, Any], response_budget: int) -> tuple[str, str]:
        """A new trajectory's session id and the base URL its agent gives the OpenAI client."""
        sid = uuid.uuid4().hex
        self.sessions[sid] = Session(dict(sampling), int(response_budget))
        return sid, f"{self.url}/sessions/{sid}/v1"

    def close_session(self, sid: str) -> Session:
        """End a session; its calls."""
        return self.sessions.pop(sid)

    # -- handlers ---------------------------------------------------------------------------------
    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "hybridflow"}]})

    async def _completions(self, request: Any) -> Any:
        return await self._serve(request, chat=False)

    async def _chat(self, request: Any) -> Any:
        return await self._serve(request, chat=True)

    async def _serve(self, request: Any, *, chat: bool) -> Any:
        from aiohttp import web

        if self.router is None:
            return _error(503, "the model's replicas are still starting; retry shortly", "unavailable")
        try:
            session = self._session(request)
            body = await _json_body(request)
            prompt_ids, tools = self._prompt(body, chat, session)
            out, ids = await self._generate(request.match_info.get("sid"), session, body, prompt_ids)
        except RequestError as err:
            return _error(400, str(err))
        except LookupError as err:
            return _error(404, str(err), "not_found_error")
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids), "total_tokens": len(prompt_ids) + len(ids)}
        reason = "length" if out.finish_reason in ("length", "budget") else "stop"
        base = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": MODEL_NAME, "usage": usage}
        if not chat:
            choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None, "token_ids": ids}
            return web.json_response({**base, "object": "text_completion", "choices": [choice]})
        message = self._message(ids, text, tools)
        if message.get("tool_calls"):
            reason = "tool_calls"
        if session is not None:
            session.messages = [*body["messages"], message]
            session.context_ids = prompt_ids + ids
        choice = {"index": 0, "message": message, "finish_reason": reason, "logprobs": None, "token_ids": ids}
        return web.json_response({**base, "object": "chat.completion", "choices": [choice]})

    async def _native_generate(self, request: Any) -> Any:
        """SGLang's /generate (what verl's generative-reward functions post to): token ids or text in, one greedy or
        sampled continuation out, outside any session."""
        from aiohttp import web

        try:
            body = await _json_body(request)
            prompt_ids = self._native_prompt(body)
            params = _native_sampling(body.get("sampling_params") or {}, self.default_max_tokens)
        except RequestError as err:
            return _error(400, str(err))
        if self.router is None:
            return _error(503, "the model's replicas are still starting; retry shortly", "unavailable")
        out = await self.router.generate(request_id=uuid.uuid4().hex, prompt_ids=prompt_ids, sampling_params=params)
        ids = list(out.token_ids)
        meta = {"finish_reason": {"type": out.finish_reason}, "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(ids), "cached_tokens": out.cached_tokens or 0}
        if out.log_probs is not None:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(out.log_probs, ids, strict=False)]
        return web.json_response({"text": self.tokenizer.decode(ids, skip_special_tokens=True), "output_ids": ids,
                                  "meta_info": meta})

    def _native_prompt(self, body: dict[str, Any]) -> list[int]:
        ids, text = body.get("input_ids"), body.get("text")
        if ids is not None:
            if isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                return list(ids)
            raise RequestError("'input_ids' must be a non-empty list of token ids (one prompt per request)")
        if isinstance(text, str) and text:
            return list(self.tokenizer(text)["input_ids"])
        raise RequestError("send 'input_ids' (a list of token ids) or 'text' (a string), one prompt per request")

    # -- pieces -----------------------------------------------------------------------------------
    def _session(self, request: Any) -> Session | None:
        sid = request.match_info.get("sid")
        if sid is None:
            return None
        if sid not in self.sessions:
            raise LookupError(f"no open session {sid!r}: it ended (its trajectory is complete) or never existed")
        return self.sessions[sid]

    def _prompt(self, body: dict[str, Any], chat: bool, session: Session | None) -> tuple[list[int], list[dict] | None]:
        if body.get("stream"):
            raise RequestError("stream=true is not supported by this endpoint; leave stream unset")
        if int(body.get("n", 1) or 1) != 1:
            raise RequestError("n > 1 is not supported; make n separate requests (each is its own sample)")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                raise RequestError("'messages' must be a non-empty list of {role, content} objects")
            tools = body.get("tools")
            if tools is not None and not isinstance(tools, list):
                raise RequestError("'tools' must be a list of OpenAI function tools")
            try:
                return self._chat_ids(messages, tools, session), tools
            except Exception as err:  # noqa: BLE001 - a template error is the request's fault
                raise RequestError(f"the chat template could not render these messages: {type(err).__name__}: {err}") from err
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt)["input_ids"]), None
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt), None
        raise RequestError("'prompt' must be a string or a list of token ids (one prompt per request)")

    def _chat_ids(self, messages: list[dict[str, Any]], tools: list[dict] | None, session: Session | None) -> list[int]:
        """A session's conversation continues with its exact ids plus the new messages rendered as a turn
        (as `tool_agent` appends tool turns), so no earlier token is re-rendered; else the whole chat."""
        if session is not None and session.messages and len(messages) > len(session.messages) and all(
            _same_message(a, b) for a, b in zip(messages[: len(session.messages)], session.messages, strict=True)
        ):
            new = [_plain_message(m) for m in _with_call_names(messages)[len(session.messages):]]
            return session.context_ids + self.parser.render_turn(self.tokenizer, new, template_kwargs=self.template_kwargs)
        return render_ids(self.tokenizer, [_plain_message(m) for m in _with_call_names(messages)], tools=tools,
                          template_kwargs=self.template_kwargs)

    async def _generate(self, sid: str | None, session: Session | None, body: dict[str, Any],
                        prompt_ids: list[int]) -> tuple[Any, list[int]]:
        from hybridflow.agent.base import TokenOutput

        asked = body.get("max_completion_tokens", body.get("max_tokens"))
        if asked is not None and (not isinstance(asked, int) or isinstance(asked, bool) or asked < 1):
            raise RequestError(f"max_tokens must be a positive integer (got {asked!r})")
        asked_sampling = {key: _number(body, key) for key in _SAMPLING_CHECKED if body.get(key) is not None}
        if session is None:
            temperature = asked_sampling.get("temperature", 1.0)
            params = {"temperature": temperature, "top_p": asked_sampling.get("top_p", 1.0), "do_sample": temperature > 0,
                      "max_tokens": asked or self.default_max_tokens}
            out = await self.router.generate(request_id=uuid.uuid4().hex, prompt_ids=prompt_ids, sampling_params=params)
            return out, list(out.token_ids)
        for key, value in asked_sampling.items():
            if value != float(session.sampling.get(key, 1.0)):
                raise RequestError(
                    f"{key}={body[key]} in a training session: the rollout samples with "
                    f"actor_rollout_ref.rollout.{key}={session.sampling.get(key, 1.0)}; omit {key} from the request"
                )
        left = session.tokens_left(prompt_ids)
        if left <= 0:
            return TokenOutput([], None, "budget"), []
        params = {**session.sampling, "max_tokens": min(left, asked or left)}
        out = await self.router.generate(request_id=str(sid), prompt_ids=prompt_ids, sampling_params=params)
        ids = list(out.token_ids)[:left]
        logprobs = list(out.log_probs[: len(ids)]) if out.log_probs else None
        session.calls.append(Call(list(prompt_ids), ids, logprobs, out.cached_tokens))
        return out, ids

    def _message(self, ids: list[int], text: str, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        content, calls = self.parser.read(self.tokenizer, ids, tools)
        # Without a call the text is the answer (a malformed call stays in sight), except in Harmony, whose text
        # without its special tokens runs channel names into the words: there the answer is the parsed content.
        answer = content if self.parser.keep_special_tokens else text
        if not tools:
            return {"role": "assistant", "content": answer}
        tool_calls = [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in calls if isinstance(c, FunctionCall)
        ]
        if not tool_calls:  # no call, or only malformed ones
            return {"role": "assistant", "content": answer}
        return {"role": "assistant", "content": content.strip() or None, "tool_calls": tool_calls}


def _with_call_names(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool messages given the name of the call they answer (by tool_call_id) where they lack one: Harmony
    writes a tool's reply as from that function."""
    names: dict[Any, Any] = {}
    out = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict) and call.get("id"):
                names[call["id"]] = (call.get("function") or {}).get("name")
        if message.get("role") == "tool" and not message.get("name") and names.get(message.get("tool_call_id")):
            message = {**message, "name": names[message["tool_call_id"]]}
        out.append(message)
    return out


def _same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether a message the client sent back is the one the conversation had (the client may drop None
    fields, or turn tool-call arguments into objects and back)."""
    if a.get("role") != b.get("role") or (a.get("content") or "") != (b.get("content") or ""):
        return False
    return _calls_of(a) == _calls_of(b)


def _calls_of(message: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(str(c.get("function", {}).get("name")), c.get("function", {}).get("arguments"))
            for c in _plain_message(message).get("tool_calls") or [] if isinstance(c, dict)]


def _native_sampling(sampling: Any, default_max_tokens: int) -> dict[str, Any]:
    """The router's sampling dict from SGLang's `sampling_params` (temperature 0: greedy; defaults: SGLang's);
    max_new_tokens is capped at `default_max_tokens`, the served model's response length."""
    if not isinstance(sampling, dict):
        raise RequestError("'sampling_params' must be an object (max_new_tokens, temperature, top_p, top_k)")
    unknown = sorted(set(sampling) - {"max_new_tokens", "temperature", "top_p", "top_k", "skip_special_tokens"})
    if unknown:
        raise RequestError(f"sampling_params {', '.join(unknown)} not supported here; use max_new_tokens, "
                           "temperature, top_p, top_k")
    limit = sampling.get("max_new_tokens", default_max_tokens)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise RequestError(f"max_new_tokens must be a positive integer (got {limit!r})")
    limit = min(limit, default_max_tokens)  # the served model's response length (its context holds no more)
    temperature = _number(sampling, "temperature") if "temperature" in sampling else 1.0
    top_k = sampling.get("top_k", -1)
    if not isinstance(top_k, int) or isinstance(top_k, bool):
        raise RequestError(f"top_k must be an integer (got {top_k!r})")
    return {"max_tokens": limit, "temperature": temperature, "do_sample": temperature > 0,
            "top_p": _number(sampling, "top_p") if "top_p" in sampling else 1.0, "top_k": top_k}


def _number(body: dict[str, Any], key: str) -> float:
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise RequestError(f"{key} must be a number (got {str(value)[:50]!r})")
    return float(value)


def _plain_message(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's message shape for a chat template: tool-call arguments as objects, list content as text."""
    out = dict(message)
    content = out.get("content")
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        out["content"] = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        fixed = []
        for call in calls:
            fn = dict((call or {}).get("function") or {})
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except json.JSONDecodeError:
                    pass  # the template writes the string as it is
            fixed.append({**call, "function": fn})
        out["tool_calls"] = fixed
    return out


async def _json_body(request: Any) -> dict[str, Any]:
    try:
        body = await request.json()
    except Exception as err:  # noqa: BLE001 - aiohttp raises several types for bad bodies
        raise RequestError(f"the request body is not JSON ({type(err).__name__}); send a JSON object") from err
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def _error(status: int, message: str, kind: str = "invalid_request_error") -> Any:
    from aiohttp import web

    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": None}}, status=status)
