"""The SGLang server replica (`rollout.mode=async`, `hybridflow.rollout.async_sglang`) without SGLang.

SGLang has no CPU build, so its engine is a stand-in here that answers `async_generate` in SGLang's shape (output
ids, `meta_info` with (logprob, id, text) entries and a finish_reason dict), and `sglang`'s request classes and
serializer are stand-in modules with the names the adapter imports. What runs for real: the sampling translation,
output parsing, aborts, bucketed weight pushes with the cache flushed once, release/resume bookkeeping, and a
multi-turn tool trajectory through the agent-loop manager and router onto the replica. `bench/gpu_smoke.py` runs
the adapter against a real SGLang engine on a GPU.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import types
from typing import Any

import pytest
import torch

from hybridflow.agent.base import TokenOutput
from hybridflow.agent.manager import AgentLoopManager
from hybridflow.agent.router import Router
from hybridflow.config import load_config
from hybridflow.rollout import SERVER_ENGINES, async_sglang, get_rollout_cls
from hybridflow.rollout.async_sglang import (
    AsyncSGLangEngine,
    TokenizerManagerControl,
    weight_buckets,
    with_weights_backup,
)

EOS = 2


def rollout_cfg(*overrides: str) -> Any:
    return load_config(None, ["actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.mode=async",
                              *overrides]).actor_rollout_ref.rollout


class StandInManager:
    """The tokenizer manager's control coroutines, recording what they were given."""

    def __init__(self, engine: StandInEngine, answer: tuple[bool, str] = (True, "ok")) -> None:
        self.engine = engine
        self.answer = answer
        self.updates: list[Any] = []
        self.calls: list[str] = []

    async def update_weights_from_tensor(self, request: Any, http_request: Any) -> tuple[bool, str]:
        assert http_request is None
        self.updates.append(request)
        named = StandInSerializer.loads(request.serialized_named_tensors[0])
        if "w" in dict(named):
            self.engine.bias = int(dict(named)["w"].sum())
        return self.answer

    async def release_memory_occupation(self, request: Any, http_request: Any) -> None:
        self.calls.append(type(request).__name__)

    async def resume_memory_occupation(self, request: Any, http_request: Any) -> None:
        self.calls.append(type(request).__name__)

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.calls.append(f"abort {rid}")
        self.engine.aborted[rid] = True
        if rid in self.engine.held:
            self.engine.held[rid].set()


class StandInEngine:
    """`sglang.Engine.async_generate` in SGLang's output shape: each new token = (last + bias) % 10, stopping at a
    stop token (left out of output_ids, as SGLang does, and named in finish_reason). A request id in `hold` waits
    after its first token until it is aborted."""

    def __init__(self, raise_on_abort: bool = False) -> None:
        self.bias = 1
        self.requests: list[dict[str, Any]] = []
        self.hold: set[str] = set()
        self.held: dict[str, asyncio.Event] = {}
        self.aborted: dict[str, bool] = {}
        self.raise_on_abort = raise_on_abort
        self.tokenizer_manager = StandInManager(self)

    async def async_generate(self, *, input_ids: list[int], sampling_params: dict[str, Any], return_logprob: bool,
                             rid: str) -> dict[str, Any]:
        self.requests.append({"input_ids": list(input_ids), "sampling_params": dict(sampling_params),
                              "return_logprob": return_logprob, "rid": rid})
        out: list[int] = []
        last = input_ids[-1]
        finish: dict[str, Any] = {"type": "length", "length": sampling_params["max_new_tokens"]}
        for _ in range(sampling_params["max_new_tokens"]):
            last = (last + self.bias) % 10
            out.append(last)
            if rid in self.hold:
                self.held[rid] = asyncio.Event()
                await self.held[rid].wait()
                if self.raise_on_abort:
                    raise RuntimeError("request aborted")
                finish = {"type": "abort", "message": "aborted by the caller"}
                break
            if last in sampling_params["stop_token_ids"]:
                finish = {"type": "stop", "matched": last}
                break
        ids = out[:-1] if finish["type"] == "stop" else out
        meta: dict[str, Any] = {"finish_reason": finish, "cached_tokens": len(input_ids) - 1}
        if return_logprob:
            meta["output_token_logprobs"] = [(-0.5 * (k + 1), t, None) for k, t in enumerate(out)]
        return {"output_ids": ids, "meta_info": meta}

    def shutdown(self) -> None:
        self.requests.append({"shutdown": True})


class StandInSerializer:
    """`sglang.srt.utils.MultiprocessingSerializer`: bytes out, objects back (kept in a table here)."""

    table: dict[bytes, Any] = {}

    @staticmethod
    def serialize(obj: Any, output_str: bool = False) -> bytes:
        key = f"payload-{len(StandInSerializer.table)}".encode()
        StandInSerializer.table[key] = obj
        return key

    @staticmethod
    def loads(key: bytes) -> Any:
        return StandInSerializer.table[key]


@dataclasses.dataclass
class UpdateWeightsFromTensorReqInput:
    serialized_named_tensors: list[bytes]
    load_format: str | None = None
    flush_cache: bool = True


@dataclasses.dataclass
class ReleaseMemoryOccupationReqInput:
    pass


@dataclasses.dataclass
class ResumeMemoryOccupationReqInput:
    pass


@pytest.fixture
def sglang_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sglang.srt.managers.io_struct` and `sglang.srt.utils` as stand-in modules (the names the adapter imports)."""
    io_struct = types.ModuleType("sglang.srt.managers.io_struct")
    for cls in (UpdateWeightsFromTensorReqInput, ReleaseMemoryOccupationReqInput, ResumeMemoryOccupationReqInput):
        setattr(io_struct, cls.__name__, cls)
    utils = types.ModuleType("sglang.srt.utils")
    utils.MultiprocessingSerializer = StandInSerializer  # type: ignore[attr-defined]
    for name, module in {
        "sglang": types.ModuleType("sglang"), "sglang.srt": types.ModuleType("sglang.srt"),
        "sglang.srt.managers": types.ModuleType("sglang.srt.managers"),
        "sglang.srt.managers.io_struct": io_struct, "sglang.srt.utils": utils,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)


def make(engine: StandInEngine, *overrides: str, tp: int = 1) -> AsyncSGLangEngine:
    cfg = rollout_cfg(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}", *overrides)
    return AsyncSGLangEngine("unused", cfg, "cuda", response_length=4, prompt_length=8, engine=engine,
                             control=TokenizerManagerControl(engine, tp), eos_token_ids=[EOS])


def test_the_registry_names_the_sglang_server_replica() -> None:
    assert set(SERVER_ENGINES) == {"vllm", "sglang"}
    assert get_rollout_cls("sglang", server=True) is AsyncSGLangEngine
    with pytest.raises(ValueError, match=r"server-mode \(rollout.mode=async\) rollout engine 'hf'"):
        get_rollout_cls("hf", server=True)


def test_a_replica_needs_a_gpu_and_says_what_runs_on_cpu() -> None:
    with pytest.raises(RuntimeError, match="needs a CUDA GPU.*rollout.name=vllm"):
        AsyncSGLangEngine("unused", rollout_cfg(), "cpu", response_length=4, prompt_length=8)


def test_generate_translates_sampling_and_reads_sglang_output() -> None:
    engine = StandInEngine()
    replica = make(engine)
    # greedy (temperature 0): SGLang's greedy settings; the stop token SGLang left out of output_ids is restored
    out = asyncio.run(replica.generate([5, 9], {"temperature": 0.0, "top_p": 0.5, "max_tokens": 4}, "r0"))
    assert out == TokenOutput([0, 1, 2], [-0.5, -1.0, -1.5], "stop", 1)
    sent = engine.requests[-1]
    assert sent["input_ids"] == [5, 9] and sent["rid"] == "r0" and sent["return_logprob"] is True
    assert sent["sampling_params"] == {"n": 1, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 4,
                                       "stop_token_ids": [EOS], "ignore_eos": False, "skip_special_tokens": False}
    # sampled, no log-probs asked, budget reached: finish_reason length
    out = asyncio.run(replica.generate([3], {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "max_tokens": 2,
                                             "logprobs": False}, "r1"))
    assert out == TokenOutput([4, 5], None, "length", 0)
    params = engine.requests[-1]["sampling_params"]
    assert (params["temperature"], params["top_p"], params["top_k"], params["max_new_tokens"]) == (0.7, 0.9, 5, 2)
    # ignore_eos: no stop tokens
    ignoring = make(StandInEngine(), "actor_rollout_ref.rollout.ignore_eos=true")
    out = asyncio.run(ignoring.generate([0], {"max_tokens": 4}, "r2"))
    assert out.token_ids == [1, 2, 3, 4] and ignoring.engine.requests[-1]["sampling_params"]["stop_token_ids"] == []


@pytest.mark.parametrize("raise_on_abort", [False, True])
def test_an_aborted_request_returns_what_it_had_with_finish_reason_abort(raise_on_abort: bool) -> None:
    engine = StandInEngine(raise_on_abort=raise_on_abort)
    engine.hold.add("slow")
    replica = make(engine)

    async def scenario() -> TokenOutput:
        task = asyncio.create_task(replica.generate([0], {"max_tokens": 4}, "slow"))
        while "slow" not in engine.held:
            await asyncio.sleep(0)
        await replica.abort("slow")
        return await task

    out = asyncio.run(scenario())
    assert engine.tokenizer_manager.calls == ["abort slow"]
    assert out.finish_reason == "abort"
    assert out == (TokenOutput([], None, "abort") if raise_on_abort else TokenOutput([1], [-0.5], "abort", 0))
    assert replica.aborted == set()


def test_weights_go_in_buckets_to_every_rank_and_the_cache_is_flushed_once(
        sglang_modules: None, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = StandInEngine()
    replica = make(engine, tp=2)
    weights = [("a", torch.zeros(64)), ("b", torch.zeros(64)), ("w", torch.full((4,), 2.0)), ("c", torch.zeros(200))]
    monkeypatch.setattr(async_sglang, "WEIGHT_BUCKET_BYTES", 512)  # 64 float32 = 256 bytes; c alone is 800
    assert [[n for n, _ in b] for b in weight_buckets(weights)] == [["a", "b"], ["w"], ["c"]]
    asyncio.run(replica.load_weights(iter(weights)))
    updates = engine.tokenizer_manager.updates
    assert [u.flush_cache for u in updates] == [False, False, True]
    assert all(len(u.serialized_named_tensors) == 2 for u in updates)  # one payload per tensor-parallel rank
    assert [[n for n, _ in StandInSerializer.loads(u.serialized_named_tensors[1])] for u in updates] == [
        ["a", "b"], ["w"], ["c"]]
    # the new weights are served: bias = sum(w) = 8
    out = asyncio.run(replica.generate([1], {"temperature": 0, "max_tokens": 2}, "after"))
    assert out.token_ids == [9, 7]


def test_a_refused_weight_update_raises_with_sglang_s_message(sglang_modules: None) -> None:
    engine = StandInEngine()
    engine.tokenizer_manager.answer = (False, "shape mismatch for model.embed_tokens.weight")
    with pytest.raises(RuntimeError, match="SGLang refused the weight update: shape mismatch"):
        asyncio.run(make(engine).load_weights([("w", torch.ones(2))]))


def test_release_and_resume_follow_free_cache_engine(sglang_modules: None) -> None:
    engine = StandInEngine()
    replica = make(engine, "actor_rollout_ref.rollout.free_cache_engine=true")
    calls = engine.tokenizer_manager.calls

    async def scenario() -> None:
        await replica.sleep()
        await replica.sleep()  # released already: nothing more
        await replica.wake_up()
        await replica.wake_up()
        await replica.sleep()
        await replica.load_weights([("w", torch.ones(3))])  # a released replica resumes before taking weights

    asyncio.run(scenario())
    assert calls == ["ReleaseMemoryOccupationReqInput", "ResumeMemoryOccupationReqInput",
                     "ReleaseMemoryOccupationReqInput", "ResumeMemoryOccupationReqInput"]
    assert not replica.released and engine.bias == 3
    keeping = make(StandInEngine(), "actor_rollout_ref.rollout.free_cache_engine=false")  # keeps its memory
    asyncio.run(keeping.sleep())
    assert keeping.engine.tokenizer_manager.calls == [] and not keeping.released


def test_a_released_replica_gets_its_weights_back_from_a_cpu_copy(caplog: pytest.LogCaptureFixture) -> None:
    """It may serve again without a weight push after a release (validation before the first step), so SGLang keeps
    a CPU copy; an SGLang without that option keeps its memory instead, and says so."""
    kwargs = {"model_path": "/m", "enable_memory_saver": True}
    assert with_weights_backup(kwargs, {"enable_memory_saver", "enable_weights_cpu_backup"})[
        "enable_weights_cpu_backup"] is True
    older = with_weights_backup(kwargs, {"enable_memory_saver"})
    assert older["enable_memory_saver"] is False and "enable_weights_cpu_backup" not in older
    assert "free_cache_engine has no effect on this SGLang server replica" in caplog.text
    assert with_weights_backup({"enable_memory_saver": False}, set()) == {"enable_memory_saver": False}


class ReplicaClient:
    """The router's view of one replica (as `RayReplicaClient`, without Ray)."""

    def __init__(self, replica: AsyncSGLangEngine) -> None:
        self.replica = replica

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        return await self.replica.generate(prompt_ids, sampling_params, request_id)

    async def abort(self, *, request_id: str) -> None:
        await self.replica.abort(request_id)


class ScriptedSGLang(StandInEngine):
    """Answers each request of a trajectory with the next planned turn, in SGLang's output shape."""

    def __init__(self, turns: list[list[int]]) -> None:
        super().__init__()
        self.turns = turns
        self.turn_of: dict[str, int] = {}

    async def async_generate(self, *, input_ids: list[int], sampling_params: dict[str, Any], return_logprob: bool,
                             rid: str) -> dict[str, Any]:
        self.requests.append({"input_ids": list(input_ids), "rid": rid})
        turn = self.turn_of.get(rid, 0)
        self.turn_of[rid] = turn + 1
        tokens = self.turns[min(turn, len(self.turns) - 1)][: sampling_params["max_new_tokens"]]
        stop = tokens[-1] in sampling_params["stop_token_ids"]
        meta = {"finish_reason": {"type": "stop", "matched": tokens[-1]} if stop else {"type": "length"},
                "output_token_logprobs": [(-0.5, t, None) for t in tokens], "cached_tokens": 0}
        return {"output_ids": tokens[:-1] if stop else tokens, "meta_info": meta}


def test_a_tool_trajectory_runs_through_the_router_onto_an_sglang_replica() -> None:
    """The agent loop's token-in/token-out contract over the SGLang replica: each turn continues the exact ids of
    the last, tool tokens are masked, and the stop token SGLang leaves out of output_ids is in the response."""
    from hybridflow.data.dataset import collate_fn
    from hybridflow.data.toy import build_toy_tokenizer
    from hybridflow.data.toy_lookup import LOOKUP_CALL, build_rows
    from hybridflow.tools.lookup import LookupTool

    tok = build_toy_tokenizer(extra_words=[LOOKUP_CALL])
    call, eos = tok.convert_tokens_to_ids(LOOKUP_CALL), tok.eos_token_id
    cfg = load_config(None, [
        "actor_rollout_ref.model.path=/m", "data.train_files=/d", "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.multi_turn.enable=true",
        "data.max_response_length=24", "data.max_prompt_length=32",
    ])
    rows = build_rows(2, "train")
    value = rows[0]["reward_model"]["ground_truth"]
    answer = list(tok(value, add_special_tokens=False)["input_ids"])
    engine = ScriptedSGLang([[call, eos], [*answer, eos]])
    replica = AsyncSGLangEngine("unused", cfg.actor_rollout_ref.rollout, "cuda", response_length=24, prompt_length=32,
                                engine=engine, control=TokenizerManagerControl(engine, 1), eos_token_ids=[eos])
    items = []
    for row in rows:
        prompt_ids = list(tok(tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False),
                              add_special_tokens=False)["input_ids"])
        items.append({"input_ids": torch.tensor(prompt_ids), "raw_prompt_ids": prompt_ids, "raw_prompt": row["prompt"],
                      "extra_info": row["extra_info"], "agent_name": row["agent_name"],
                      "attention_mask": torch.ones(len(prompt_ids), dtype=torch.long)})
    manager = AgentLoopManager(cfg, tok, Router([ReplicaClient(replica)]), tools=[LookupTool({}, None)])
    try:
        out = manager.generate_sequences(collate_fn(items))
    finally:
        manager.events.close()
    mask = out.batch["response_mask"][0].tolist()
    responses = out.batch["responses"][0].tolist()
    n_model = 2 + len(answer) + 1
    assert sum(mask) == n_model and mask[:2] == [1, 1] and responses[:2] == [call, eos]
    first, second = [r for r in engine.requests if r["rid"] == engine.requests[0]["rid"]]
    assert second["input_ids"][: len(first["input_ids"]) + 2] == first["input_ids"] + [call, eos]
    assert out.meta_info["metrics"]["agent/tool_calls/mean"] == 1.0
