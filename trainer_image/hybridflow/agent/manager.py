"""`AgentLoopManager`: a batch of prompts in, one agent-loop trajectory per row out, as a padded batch.

`generate_sequences(prompts)` is the server-mode counterpart of a rollout engine's `generate`: the same
output keys and shapes (`hybridflow.rollout.base`), so `fit()` does not care which mode produced them.
Differences a multi-turn trajectory brings: `attention_mask` is 1 on every response token (tool turns
included) while `response_mask` is 1 on model tokens only; `rollout_log_probs` are 0 off the mask.
Trajectories run concurrently on one event loop owned by the manager (a background thread), bounded
by `rollout.agent.max_concurrency`; each row picks its loop by `agent_name`. With `rollout.over_sample_rate`
a training batch's slowest trajectories are cut once the others are complete (`hybridflow.agent.over_sample`).
Ray-free.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections.abc import Coroutine
from typing import Any

import numpy as np
import torch

from hybridflow import yamlio
from hybridflow.agent.base import AgentLoopOutput, AsyncServerClient, get_agent_loop, register_factory
from hybridflow.agent.over_sample import (
    CUT_KEY,
    CutOffGate,
    cut_output,
    finish_or_cut,
    mark_cut,
    trajectories_to_keep,
)
from hybridflow.agent.stream import TOKEN_VERSIONS, versions_tensor
from hybridflow.protocol import DataProto
from hybridflow.rollout.token_io import prompt_images, resolve_sampling, with_validation_sampling
from hybridflow.tools.base import BaseTool

SAMPLE_FIELDS_SKIPPED = ("input_ids", "attention_mask", "position_ids")


class EventLoopThread:
    """A private asyncio loop in a daemon thread; `run(coro)` executes a coroutine on it and waits.

    One long-lived loop (instead of `asyncio.run` per step) keeps tools' and the router's asyncio state
    valid across steps.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="agent-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """Run `coro` on the loop and return its result (exceptions propagate)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Stop the loop and its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


def default_loop_name(config: Any) -> str:
    """The loop of rows without `agent_name`: the configured one, else tool_agent with multi_turn.enable (or a
    tool or interaction config)."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.agent.default_agent_loop:
        return str(rollout.agent.default_agent_loop)
    mt = rollout.multi_turn
    return "tool_agent" if mt.enable or mt.tool_config_path or mt.interaction_config_path else "single_turn_agent"


def register_config_loops(path: str) -> list[str]:
    """Register the loops of verl's agent-loop config file: a list of {name, _target_, **kwargs}."""
    try:
        entries = yamlio.read(path, what="agent loop config")
    except yamlio.YamlError as err:
        raise ValueError(f"actor_rollout_ref.rollout.agent.agent_loop_config_path {path!r} is unreadable: {err}") from err
    if not isinstance(entries, list):
        raise ValueError(f"agent loop config {path!r} must be a YAML list of {{name, _target_}} entries")
    names = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry.get("name") or not entry.get("_target_"):
            raise ValueError(f"agent loop config {path!r}: entry {i} needs name and _target_ (module.Class)")
        module_name, _, cls_name = str(entry["_target_"]).rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
        except (ImportError, AttributeError, ValueError) as err:
            raise ValueError(f"agent loop config {path!r}: cannot import {entry['_target_']!r} ({err})") from err
        kwargs = {k: v for k, v in entry.items() if k not in ("name", "_target_")}
        register_factory(str(entry["name"]), lambda c, s, t, _cls=cls, _kw=kwargs, **more: _cls(c, s, t, **_kw, **more))
        names.append(str(entry["name"]))
    return names


class AgentLoopManager:
    """Run the agent loops of a batch against `server` (the router) and pack the trajectories."""

    def __init__(self, config: Any, tokenizer: Any, server: AsyncServerClient, tools: list[BaseTool] | None = None,
                 events: EventLoopThread | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.server = server
        rollout = config.actor_rollout_ref.rollout
        if tools is None and rollout.multi_turn.tool_config_path:
            from hybridflow.tools.config import load_tools

            tools = load_tools(rollout.multi_turn.tool_config_path)
        self.tools = tools or []
        self.interactions: dict[str, Any] = {}
        if rollout.multi_turn.interaction_config_path:
            from hybridflow.interactions.config import load_interactions

            self.interactions = load_interactions(rollout.multi_turn.interaction_config_path)
        if rollout.agent.agent_loop_config_path:
            register_config_loops(rollout.agent.agent_loop_config_path)
        self.default_loop = default_loop_name(config)
        get_agent_loop(self.default_loop)  # a wrong name fails now, not mid-run
        self.prompt_length = int(rollout.prompt_length or config.data.max_prompt_length)
        self.response_length = int(rollout.response_length or config.data.max_response_length)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = int(pad if pad is not None else 0)
        self.events = events or EventLoopThread()
        # rollout.over_sample_rate: loops (and the OpenAI endpoint) reach the router through a gate that can cut a batch
        self.over_sample_rate = float(rollout.over_sample_rate)
        self.gate = CutOffGate(server) if self.over_sample_rate > 0 else None
        self.client: AsyncServerClient = self.gate or server
        self._openai: Any = None
        self._openai_lock = asyncio.Lock()

    # -- the batch interface ------------------------------------------------------------------------
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """One trajectory per row of `prompts` (rows already repeated n times); see the module docstring."""
        return self.events.run(self.generate_sequences_async(prompts))

    async def generate_sequences_async(self, prompts: DataProto) -> DataProto:
        """`generate_sequences` on the manager's event loop (the asynchronous-training stream calls it per group)."""
        sampling = self._sampling(prompts.meta_info)
        failovers = getattr(self.server, "failovers", 0)
        outputs = await self._run_all(prompts, sampling)
        batch = self._pack(prompts, outputs, sampling["calculate_log_probs"])
        # requests moved off a failed replica during this call (a `Router` counts them)
        batch.meta_info["metrics"]["agent/replica_failovers"] = float(getattr(self.server, "failovers", 0) - failovers)
        return batch

    def run_trajectories(self, prompts: DataProto) -> list[AgentLoopOutput]:
        """The agent loops' outputs for every row, unpacked (each with its own `metrics`)."""
        return self.events.run(self._run_all(prompts, self._sampling(prompts.meta_info)))

    def _sampling(self, meta: dict[str, Any]) -> dict[str, Any]:
        rollout = self.config.actor_rollout_ref.rollout
        meta = with_validation_sampling(dict(meta), rollout.val_kwargs)
        params = resolve_sampling(rollout, self.response_length, {}, meta)
        params["do_sample"] = not params.pop("greedy")
        return params

    def cuts(self, meta: dict[str, Any]) -> bool:
        """Whether over-sampling may cut this batch: a training batch of samples (not validation, not ReMax's greedy
        baseline), with rollout.over_sample_rate > 0."""
        return self.gate is not None and not meta.get("validate", False) and meta.get("do_sample", True) is not False

    async def _run_all(self, prompts: DataProto, sampling: dict[str, Any]) -> list[AgentLoopOutput]:
        limit = asyncio.Semaphore(self.config.actor_rollout_ref.rollout.agent.max_concurrency)
        fields = [k for k in prompts.non_tensor_batch if k not in SAMPLE_FIELDS_SKIPPED]

        def prompt_ids(i: int) -> list[int]:
            if "raw_prompt_ids" in prompts.non_tensor_batch:
                return list(prompts.non_tensor_batch["raw_prompt_ids"][i])
            mask = prompts.batch["attention_mask"][i].bool()
            return prompts.batch["input_ids"][i][mask].tolist()

        async def one(i: int) -> AgentLoopOutput:
            sample = {k: prompts.non_tensor_batch[k][i] for k in fields}
            sample.setdefault("raw_prompt_ids", prompt_ids(i))
            name = str(sample.get("agent_name") or self.default_loop)
            loop = self._build(name)
            versions: list[int] = []
            TOKEN_VERSIONS.set(versions)  # this task's trajectory: a `VersionedServer` records into it
            async with limit:
                out = await loop.run(dict(sampling), **sample)
            out.extra_fields.setdefault("token_versions", versions)
            return out

        if not self.cuts(prompts.meta_info):
            return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))
        assert self.gate is not None
        tasks = [asyncio.ensure_future(one(i)) for i in range(len(prompts))]
        try:
            cut = await finish_or_cut(tasks, trajectories_to_keep(len(tasks), self.over_sample_rate), self.gate)
        finally:
            self.gate.reopen()
        return [mark_cut(cut_output(task), prompt_ids(i)) if cut[i] else task.result() for i, task in enumerate(tasks)]

    def _build(self, name: str) -> Any:
        """A loop instance; every loop is offered the manager's shared resources (the tools of
        `multi_turn.tool_config_path`, the interactions of `multi_turn.interaction_config_path`, the
        OpenAI-compatible endpoint) and takes what it uses."""
        return get_agent_loop(name)(self.config, self.client, self.tokenizer, tools=self.tools,
                                    interactions=self.interactions, openai_endpoint=self.openai_endpoint)

    async def openai_endpoint(self) -> Any:
        """The OpenAI-compatible endpoint over this manager's router, started on first use."""
        from hybridflow.agent.openai_server import OpenAIServer

        async with self._openai_lock:
            if self._openai is None:
                agent = self.config.actor_rollout_ref.rollout.agent
                server = OpenAIServer(self.client, self.tokenizer, host=agent.openai_host, port=agent.openai_port,
                                      tool_format=self.config.actor_rollout_ref.rollout.multi_turn.format,
                                      chat_template_kwargs=self.config.data.apply_chat_template_kwargs,
                                      default_max_tokens=self.response_length)
                await server.start()
                self._openai = server
        return self._openai

    def close(self) -> None:
        """Stop the OpenAI endpoint (if it started) and the event loop thread."""
        if self._openai is not None:
            self.events.run(self._openai.stop())
            self._openai = None
        self.events.close()

    # -- packing ------------------------------------------------------------------------------------
    @staticmethod
    def _trained_prompts(prompts: DataProto, outputs: list[AgentLoopOutput]) -> list[list[int]]:
        """The prompt ids the trainer sees per trajectory: the engine's, but an image prompt's as the processor
        expanded them (the dataset's `input_ids`), since the engine expanded its placeholders itself."""
        images = prompt_images(prompts) if "input_ids" in prompts.batch else [None] * len(outputs)
        trained = []
        for i, out in enumerate(outputs):
            if not images[i]:
                trained.append(list(out.prompt_ids))
                continue
            if list(out.prompt_ids) != list(prompts.non_tensor_batch["raw_prompt_ids"][i]):
                raise ValueError(
                    "an agent loop sent an image prompt other than its dataset prompt (raw_prompt_ids); image prompts "
                    "run in the single-turn loop, whose prompt the trainer can expand as the engine did"
                )
            mask = prompts.batch["attention_mask"][i].bool()
            trained.append(prompts.batch["input_ids"][i][mask].tolist())
        return trained

    def _pack(self, prompts: DataProto, outputs: list[AgentLoopOutput], with_logprobs: bool) -> DataProto:
        b, p_len, r_len = len(outputs), self.prompt_length, self.response_length
        prompt_ids = torch.full((b, p_len), self.pad_token_id, dtype=torch.long)
        prompt_mask = torch.zeros(b, p_len, dtype=torch.long)
        responses = torch.full((b, r_len), self.pad_token_id, dtype=torch.long)
        response_attn = torch.zeros(b, r_len, dtype=torch.long)
        response_mask = torch.zeros(b, r_len, dtype=torch.long)
        log_probs = torch.zeros(b, r_len)
        trained = self._trained_prompts(prompts, outputs)
        for i, out in enumerate(outputs):
            if len(trained[i]) > p_len:
                raise ValueError(
                    f"a trajectory's prompt is {len(trained[i])} tokens (with the tool schemas the chat template "
                    f"adds), longer than rollout.prompt_length / data.max_prompt_length={p_len}; raise data.max_prompt_length"
                )
            n_p, n_r = len(trained[i]), min(len(out.response_ids), r_len)
            if n_p:
                prompt_ids[i, p_len - n_p:] = torch.tensor(trained[i])
                prompt_mask[i, p_len - n_p:] = 1
            if n_r:
                responses[i, :n_r] = torch.tensor(out.response_ids[:n_r])
                response_attn[i, :n_r] = 1
                response_mask[i, :n_r] = torch.tensor(out.response_mask[:n_r])
                if out.response_logprobs is not None:
                    log_probs[i, :n_r] = torch.tensor(out.response_logprobs[:n_r]) * response_mask[i, :n_r]
        prompt_pos = torch.clamp(prompt_mask.cumsum(-1) - 1, min=0)
        delta = torch.arange(1, r_len + 1).unsqueeze(0)
        tensors = {
            "prompts": prompt_ids,
            "responses": responses,
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": torch.cat([prompt_mask, response_attn], dim=1),
            "position_ids": torch.cat([prompt_pos, prompt_pos[:, -1:] + delta], dim=1),
            "response_mask": response_mask,
        }
        if with_logprobs:
            tensors["rollout_log_probs"] = log_probs
        recorded = [list(o.extra_fields.get("token_versions") or []) for o in outputs]
        if any(recorded):  # generated through a `VersionedServer` (asynchronous training)
            tensors["rollout_versions"] = versions_tensor(recorded, response_mask)
        non_tensors = dict(prompts.non_tensor_batch)
        non_tensors["num_turns"] = np.array([o.num_turns for o in outputs], dtype=np.int64)
        if self.cuts(prompts.meta_info):  # every batch over-sampling may cut has the key (batches concatenate)
            non_tensors[CUT_KEY] = np.array([bool(o.extra_fields.get(CUT_KEY)) for o in outputs], dtype=bool)
        if any("turn_scores" in o.extra_fields for o in outputs):
            # interactions' turn scores reach the reward function as extra_info["turn_scores"]
            old = non_tensors.get("extra_info")
            infos = np.empty(b, dtype=object)
            for i, out in enumerate(outputs):
                info = old[i] if old is not None and isinstance(old[i], dict) else {}
                infos[i] = {**info, "turn_scores": list(out.extra_fields.get("turn_scores", []))}
            non_tensors["extra_info"] = infos
        meta = {k: v for k, v in prompts.meta_info.items() if k != "metrics"}
        meta["metrics"] = trajectory_metrics(outputs)
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)


def trajectory_metrics(outputs: list[AgentLoopOutput]) -> dict[str, float]:
    """Per-step agent metrics: turns (mean/max/min), tool calls, tool errors and latency, aborted trajectories,
    the share of prompt tokens (every turn's) served from the prefix cache, and `agent/<key>/mean` for any
    other figure a loop reports in its `metrics` (a custom loop's own counters)."""
    turns = [o.num_turns for o in outputs] or [0]
    total = {key: sum(o.metrics.get(key, 0.0) for o in outputs) for key in ("tool_calls", "tool_errors", "tool_latency_s", "aborted")}
    n = max(len(outputs), 1)
    metrics = {
        "agent/num_turns/mean": float(np.mean(turns)),
        "agent/num_turns/max": float(max(turns)),
        "agent/num_turns/min": float(min(turns)),
        "agent/tool_calls/mean": total["tool_calls"] / n,
        "agent/tool_errors/mean": total["tool_errors"] / n,
        "agent/tool_latency_s/mean": total["tool_latency_s"] / max(total["tool_calls"], 1.0),
        "agent/aborted": total["aborted"],
    }
    prompt_tokens = sum(o.metrics.get("prompt_tokens", 0.0) for o in outputs)
    if prompt_tokens:  # engines that report their prefix-cache hits (vLLM does)
        metrics["agent/prefix_cache_hit_rate"] = sum(o.metrics.get("cached_tokens", 0.0) for o in outputs) / prompt_tokens
    known = {*total, "prompt_tokens", "cached_tokens"}
    for key in sorted({k for o in outputs for k in o.metrics} - known):
        metrics[f"agent/{key}/mean"] = sum(float(o.metrics.get(key, 0.0)) for o in outputs) / n
    return metrics
