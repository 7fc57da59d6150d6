"""Agent loops, the Hermes parser (gpt-oss's in test_tool_parser.py), tool configs, the router and the batch manager, against a fake server.

The fake server is a script: per request it returns the next planned turn (token ids + log-probs), and
records what it was asked, so the token-in/token-out contract can be checked exactly.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.agent.base import AgentLoopOutput, TokenOutput, get_agent_loop
from hybridflow.agent.chat import turn_ids
from hybridflow.agent.loops import SingleTurnAgentLoop, ToolAgentLoop
from hybridflow.agent.manager import AgentLoopManager
from hybridflow.agent.router import NoReplicaAvailable, ReplicaUnavailable, Router
from hybridflow.agent.tool_parser import FunctionCall, ToolCallError, parse_hermes
from hybridflow.config import load_config
from hybridflow.data.dataset import collate_fn
from hybridflow.data.toy import build_toy_tokenizer
from hybridflow.data.toy_lookup import LOOKUP_CALL, build_rows
from hybridflow.rewards.toy import score_lookup
from hybridflow.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolResponse
from hybridflow.tools.config import ToolConfigError, load_tools
from hybridflow.tools.lookup import LookupTool

UNKNOWN_CALL = '<tool_call>{"name": "nope"}</tool_call>'
TOK = build_toy_tokenizer(extra_words=[LOOKUP_CALL, UNKNOWN_CALL])  # the toy characters lack <, _ and {
CALL = TOK.convert_tokens_to_ids(LOOKUP_CALL)
EOS = TOK.eos_token_id


def ids(text: str) -> list[int]:
    return list(TOK(text, add_special_tokens=False)["input_ids"])


def config(*overrides: str, response_length: int = 24) -> Any:
    return load_config(None, [
        "actor_rollout_ref.model.path=/m", "data.train_files=/d", "actor_rollout_ref.rollout.mode=async",
        f"data.max_response_length={response_length}", "data.max_prompt_length=32", *overrides,
    ])


class ScriptedServer:
    """Returns planned turns in order (the same plan for every request id); records each request."""

    def __init__(self, turns: list[list[int]], fail_first: int = 0, delay: float = 0.0) -> None:
        self.turns = turns
        self.calls: list[dict[str, Any]] = []
        self.by_request: dict[str, int] = {}
        self.fail_first = fail_first
        self.delay = delay

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        if self.fail_first > 0:
            self.fail_first -= 1
            raise ReplicaUnavailable("replica died")
        await asyncio.sleep(self.delay)
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "params": dict(sampling_params)})
        turn = self.by_request.get(request_id, 0)
        self.by_request[request_id] = turn + 1
        tokens = self.turns[min(turn, len(self.turns) - 1)][: sampling_params["max_tokens"]]
        return TokenOutput(tokens, [-0.5 - 0.01 * i for i in range(len(tokens))], "stop")


def lookup_sample(value: str = "q") -> dict[str, Any]:
    prompt = [{"role": "user", "content": "value of c?"}]
    return {
        "raw_prompt": prompt,
        "raw_prompt_ids": ids(TOK.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)),
        "extra_info": {"tools_kwargs": {"lookup": {"create_kwargs": {"table": {"c": value}, "key": "c"}}}},
    }


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- the Hermes parser ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', [FunctionCall("f", {"x": 1})]),
        ('a <tool_call>\n{"name": "f", "arguments": "{\\"x\\": 2}"}\n</tool_call> b', [FunctionCall("f", {"x": 2})]),
        ('<tool_call>{"name": "f"}</tool_call><tool_call>{"name": "g", "arguments": {}}</tool_call>',
         [FunctionCall("f", {}), FunctionCall("g", {})]),
        ("no call here", []),
    ],
)
def test_hermes_parser_reads_calls(text: str, expected: list[FunctionCall]) -> None:
    assert parse_hermes(text)[1] == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'string "name"'),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "f"', "not closed"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "not valid JSON"),
    ],
)
def test_hermes_parser_turns_malformed_calls_into_messages(text: str, message: str) -> None:
    _, calls = parse_hermes(text)
    assert len(calls) == 1 and isinstance(calls[0], ToolCallError) and message in calls[0].message


# -- the loops ----------------------------------------------------------------------------------------


def test_single_turn_loop_sends_the_dataset_prompt_ids_unchanged() -> None:
    cfg = config()
    server = ScriptedServer([ids("abc") + [EOS]])
    sample = lookup_sample()
    out = run(SingleTurnAgentLoop(cfg, server, TOK).run({"temperature": 1.0}, **sample))
    assert server.calls[0]["prompt_ids"] == sample["raw_prompt_ids"]
    assert server.calls[0]["params"]["max_tokens"] == 24
    assert out.response_ids == ids("abc") + [EOS] and out.response_mask == [1, 1, 1, 1]


def test_tool_loop_keeps_exact_tokens_masks_tool_turns_and_aligns_logprobs() -> None:
    cfg = config("actor_rollout_ref.rollout.multi_turn.enable=true", response_length=40)
    server = ScriptedServer([[CALL, EOS], ids("q") + [EOS]])
    loop = ToolAgentLoop(cfg, server, TOK, tools=[LookupTool({}, None)])
    sample = lookup_sample("q")
    out = run(loop.run({"temperature": 1.0}, **sample))
    tool_turn = turn_ids(TOK, [{"role": "tool", "content": "q"}])
    assert out.prompt_ids == sample["raw_prompt_ids"]  # the toy template renders no tool schemas
    assert out.response_ids == [CALL, EOS] + tool_turn + ids("q") + [EOS]
    assert out.response_mask == [1, 1] + [0] * len(tool_turn) + [1, 1]
    assert out.response_logprobs == [-0.5, -0.51] + [0.0] * len(tool_turn) + [-0.5, -0.51]
    # the second turn continued exactly the ids of the first plus the tool turn (no re-tokenisation)
    assert server.calls[1]["prompt_ids"] == sample["raw_prompt_ids"] + [CALL, EOS] + tool_turn
    assert server.calls[0]["request_id"] == server.calls[1]["request_id"]
    assert out.num_turns == 4 and out.metrics["tool_calls"] == 1 and out.metrics["tool_errors"] == 0
    assert score_lookup(TOK.decode(out.response_ids, skip_special_tokens=True), "q")["score"] == 1.0


class FailingTool(BaseTool):
    def __init__(self, config: dict[str, Any], schema: Any = None, *, hang: bool = False) -> None:
        super().__init__({"timeout": 0.2, **config}, schema or LookupTool({}, None).tool_schema)
        self.hang = hang

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        if self.hang:
            await asyncio.sleep(60)
        raise RuntimeError("disk on fire")


@pytest.mark.parametrize(("hang", "message"), [(False, "failed: RuntimeError: disk on fire"), (True, "did not answer within 0.2 s")])
def test_a_raising_or_hanging_tool_becomes_an_error_message_and_the_trajectory_goes_on(hang: bool, message: str) -> None:
    cfg = config("actor_rollout_ref.rollout.multi_turn.enable=true", response_length=200)
    server = ScriptedServer([[CALL, EOS], ids("x") + [EOS]])
    loop = ToolAgentLoop(cfg, server, TOK, tools=[FailingTool({}, hang=hang)])
    out = run(loop.run({}, **lookup_sample()))
    tool_text = server.calls[1]["prompt_ids"][len(lookup_sample()["raw_prompt_ids"]) + 2:]
    assert message.replace(" ", "") in TOK.decode(tool_text).replace(" ", "")
    assert out.metrics["tool_errors"] == 1 and out.num_turns == 4


def test_an_unknown_tool_is_reported_to_the_model() -> None:
    bad = ids(UNKNOWN_CALL) + [EOS]
    cfg = config("actor_rollout_ref.rollout.multi_turn.enable=true", response_length=400)
    server = ScriptedServer([bad, ids("x") + [EOS]])
    out = run(ToolAgentLoop(cfg, server, TOK, tools=[LookupTool({}, None)]).run({}, **lookup_sample()))
    assert "nope" in TOK.decode(server.calls[1]["prompt_ids"]) and out.metrics["tool_errors"] == 1


def test_turn_limits_and_budget_end_the_trajectory_on_a_model_turn() -> None:
    cfg = config("actor_rollout_ref.rollout.multi_turn.enable=true",
                 "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2", response_length=200)
    server = ScriptedServer([[CALL, EOS]])  # the model calls forever
    out = run(ToolAgentLoop(cfg, server, TOK, tools=[LookupTool({}, None)]).run({}, **lookup_sample()))
    assert len(server.calls) == 2 and out.response_mask[-1] == 1
    # no room for a tool turn and an answer: the loop stops before appending the tool turn
    cfg = config("actor_rollout_ref.rollout.multi_turn.enable=true", response_length=5)
    out = run(ToolAgentLoop(cfg, ScriptedServer([[CALL, EOS]]), TOK, tools=[LookupTool({}, None)]).run({}, **lookup_sample()))
    assert out.response_ids == [CALL, EOS] and out.response_mask == [1, 1]


def test_tool_response_is_truncated_on_the_configured_side() -> None:
    cfg = config("actor_rollout_ref.rollout.multi_turn.max_tool_response_length=10",
                 "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=left")
    loop = ToolAgentLoop(cfg, ScriptedServer([[EOS]]), TOK, tools=[])
    assert loop._truncate("0123456789abcdef") == "0123456789...(truncated)"


# -- other tool-call formats, chat-template kwargs -----------------------------------------------------

HARMONY = ["<|start|>", "<|channel|>", "<|constrain|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>"]


def test_tool_loop_runs_a_gpt_oss_trajectory_read_with_its_special_tokens() -> None:
    """Harmony's markers are special tokens (as in gpt-oss's tokenizer): the call is read only because the
    format decodes the turn with them; the tool's reply is a Harmony turn, masked."""
    tok = build_toy_tokenizer(extra_words=["{", "}"])
    tok.add_special_tokens({"additional_special_tokens": HARMONY})

    def h(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    cfg = config("actor_rollout_ref.rollout.multi_turn.enable=true",
                 "actor_rollout_ref.rollout.multi_turn.format=gpt-oss", response_length=300)
    call = h("<|channel|>analysis<|message|>the table has it<|end|><|start|>assistant<|channel|>commentary "
             'to=functions.lookup <|constrain|>json<|message|>{"key": "z"}<|call|>')
    answer = h("<|channel|>final<|message|>w<|return|>")
    server = ScriptedServer([call, answer])
    prompt = [{"role": "user", "content": "value of z?"}]
    sample = {"raw_prompt": prompt, "raw_prompt_ids": h(tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)),
              "extra_info": {"tools_kwargs": {"lookup": {"create_kwargs": {"table": {"c": "q", "z": "w"}, "key": "c"}}}}}
    out = run(ToolAgentLoop(cfg, server, tok, tools=[LookupTool({}, None)]).run({}, **sample))
    # the arguments reached the tool: key z's value (the sample's own key, c, would give q)
    tool_turn = h("<|start|>functions.lookup to=assistant<|channel|>commentary<|message|>w<|end|><|start|>assistant")
    assert out.response_ids == call + tool_turn + answer
    assert out.response_mask == [1] * len(call) + [0] * len(tool_turn) + [1] * len(answer)
    assert server.calls[1]["prompt_ids"] == out.prompt_ids + call + tool_turn
    assert out.metrics["tool_calls"] == 1 and out.metrics["tool_errors"] == 0 and out.num_turns == 4


class RepeatTool(BaseTool):
    """Repeats a word `times` times (an integer parameter), recording the arguments it was given."""

    seen: list[dict[str, Any]] = []

    def __init__(self) -> None:
        super().__init__({}, OpenAIFunctionToolSchema.model_validate({
            "type": "function", "function": {"name": "repeat", "description": "repeat a word", "parameters": {
                "type": "object", "properties": {"word": {"type": "string"}, "times": {"type": "integer"}},
                "required": ["word", "times"]}}}))

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        RepeatTool.seen.append(dict(parameters))
        return ToolResponse(text=parameters["word"] * parameters["times"]), 0.0, {}


def test_tool_loop_runs_a_qwen3_coder_trajectory_with_arguments_typed_by_the_tool_schema() -> None:
    """Qwen3-Coder's XML call: the values are text in the turn, and the tool gets them typed as its schema says."""
    words = ["<tool_call>", "</tool_call>", "<function=repeat>", "</function>", "<parameter=word>",
             "<parameter=times>", "</parameter>"]
    tok = build_toy_tokenizer(extra_words=words)

    def h(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    cfg = config("actor_rollout_ref.rollout.multi_turn.enable=true",
                 "actor_rollout_ref.rollout.multi_turn.format=qwen3_coder", response_length=300)
    call = h("<tool_call>\n<function=repeat>\n<parameter=word>\nab\n</parameter>\n<parameter=times>\n3\n"
             "</parameter>\n</function>\n</tool_call>") + [tok.eos_token_id]
    bad = h("<tool_call>\n<function=repeat>\n<parameter=word>\nab\n</parameter>\n<parameter=times>\nx\n"
            "</parameter>\n</function>\n</tool_call>") + [tok.eos_token_id]
    server = ScriptedServer([call, bad, h("ababab") + [tok.eos_token_id]])
    prompt = [{"role": "user", "content": "ab three times"}]
    sample = {"raw_prompt": prompt,
              "raw_prompt_ids": h(tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False))}
    RepeatTool.seen = []
    out = run(ToolAgentLoop(cfg, server, tok, tools=[RepeatTool()]).run({}, **sample))
    assert RepeatTool.seen == [{"word": "ab", "times": 3}]  # an int, as the schema types it
    second_prompt = tok.decode(server.calls[1]["prompt_ids"]).replace(" ", "")
    third_prompt = tok.decode(server.calls[2]["prompt_ids"]).replace(" ", "")
    assert "ababab" in second_prompt  # the tool's reply
    assert "parametertimesofrepeatmustbeoftypeinteger" in "".join(ch for ch in third_prompt if ch.isalnum())
    assert out.metrics["tool_calls"] == 2 and out.metrics["tool_errors"] == 1


def test_format_qwen_is_read_as_hermes_with_a_start_up_note() -> None:
    cfg = config("actor_rollout_ref.rollout.multi_turn.enable=true",
                 "actor_rollout_ref.rollout.multi_turn.format=qwen", response_length=40)
    assert cfg.actor_rollout_ref.rollout.multi_turn.format == "hermes"
    assert any(note.startswith("multi_turn.format=qwen is read as hermes") for note in cfg.verl_notes)
    server = ScriptedServer([[CALL, EOS], ids("q") + [EOS]])
    out = run(ToolAgentLoop(cfg, server, TOK, tools=[LookupTool({}, None)]).run({}, **lookup_sample("q")))
    assert out.metrics["tool_calls"] == 1 and out.metrics["tool_errors"] == 0


def test_chat_template_kwargs_reach_the_tool_agents_prompt_and_turns() -> None:
    """data.apply_chat_template_kwargs go to every render of the tool agent, as to the dataset's."""
    tok = build_toy_tokenizer(extra_words=[LOOKUP_CALL, UNKNOWN_CALL])
    tok.chat_template = tok.chat_template.replace(
        "{{ message['role'] }}: ", "{{ message['role'] }}{% if effort %}/{{ effort }}{% endif %}: ")
    cfg = config("actor_rollout_ref.rollout.multi_turn.enable=true", "+data.apply_chat_template_kwargs.effort=hi",
                 response_length=60)
    server = ScriptedServer([[CALL, EOS], ids("q") + [EOS]])
    out = run(ToolAgentLoop(cfg, server, tok, tools=[LookupTool({}, None)]).run({}, **lookup_sample("q")))
    assert "user/hi: value of c?" in tok.decode(out.prompt_ids)
    tool_turn = turn_ids(tok, [{"role": "tool", "name": "lookup", "content": "q"}], template_kwargs={"effort": "hi"})
    assert "tool/hi: q" in tok.decode(tool_turn)
    assert out.response_ids == [CALL, EOS] + tool_turn + ids("q") + [EOS]


def test_output_validates_lengths() -> None:
    with pytest.raises(ValueError, match="mask"):
        AgentLoopOutput(prompt_ids=[1], response_ids=[1, 2], response_mask=[1])


def test_unknown_agent_name_lists_the_registered_loops() -> None:
    with pytest.raises(KeyError, match="single_turn_agent"):
        get_agent_loop("no_such_loop")


# -- tool config ------------------------------------------------------------------------------------


def test_verl_tool_config_loads_with_verl_class_names(tmp_path: Path) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent("""
        tools:
          - class_name: verl.tools.gsm8k_tool.Gsm8kTool
            config: {type: native}
            tool_schema:
              type: function
              function:
                name: calc_gsm8k_reward
                description: check an answer
                parameters: {type: object, properties: {answer: {type: string}}, required: [answer]}
          - class_name: hybridflow.tools.lookup.LookupTool
            config: {}
    """))
    tools = load_tools(path)
    assert [t.name for t in tools] == ["calc_gsm8k_reward", "lookup"]

    async def score() -> tuple[float, float]:
        iid, _ = await tools[0].create(ground_truth="72")
        _, _, metrics = await tools[0].execute(iid, {"answer": "72"})
        return metrics["score"], await tools[0].calc_reward(iid)

    assert run(score()) == (1.0, 1.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tools: 3", "'tools' list"),
        ("tools: [{class_name: no.such.Tool}]", "cannot import"),
        ("tools: [{class_name: hybridflow.tools.lookup.LookupTool, extra: 1}]", "unknown keys"),
        ("tools: [{class_name: os.path.join}]", "not a subclass"),
        ("tools: [{class_name: hybridflow.tools.lookup.LookupTool}, {class_name: hybridflow.tools.lookup.LookupTool}]", "more than once"),
        ("tools: [{class_name: hybridflow.tools.lookup.LookupTool, tool_schema: {type: function}}]", "not an OpenAI function schema"),
        ("tools: [", "not valid YAML"),
    ],
)
def test_bad_tool_configs_are_refused_with_the_entry_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text(text)
    with pytest.raises(ToolConfigError, match=message):
        load_tools(path)


# -- router ------------------------------------------------------------------------------------------


def test_router_balances_new_sessions_and_keeps_a_session_on_its_replica() -> None:
    async def main() -> tuple[list[int], list[int]]:
        servers = [ScriptedServer([[1]], delay=0.01) for _ in range(3)]
        router = Router(servers)
        await asyncio.gather(*(router.generate(request_id=f"r{i}", prompt_ids=[0], sampling_params={"max_tokens": 1})
                               for i in range(30)))
        first = [len(s.calls) for s in servers]
        for _ in range(5):
            await router.generate(request_id="r0", prompt_ids=[0], sampling_params={"max_tokens": 1})
        return first, [len(s.calls) for s in servers]

    first, after = run(main())
    assert first == [10, 10, 10]
    assert sorted(a - f for a, f in zip(after, first, strict=True)) == [0, 0, 5]


def test_router_retries_on_another_replica_and_recovers_the_failed_one() -> None:
    async def main() -> tuple[list[bool], int, int]:
        dead, good = ScriptedServer([[1]], fail_first=1), ScriptedServer([[2]])
        recovered: list[int] = []

        async def rejoin(index: int) -> None:
            recovered.append(index)

        router = Router([dead, good], on_failure=rejoin)
        router.outstanding[1] = 5  # make the failing replica the first choice
        out = await router.generate(request_id="a", prompt_ids=[0], sampling_params={"max_tokens": 1})
        await router.wait_recovered()
        return router.alive, out.token_ids[0], recovered[0]

    alive, token, recovered = run(main())
    assert token == 2 and recovered == 0 and alive == [True, True]


def test_router_counts_failovers_and_logs_a_recovery_that_fails(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> tuple[int, list[bool]]:
        async def cannot_rejoin(index: int) -> None:
            raise RuntimeError("the replica did not come back")

        router = Router([ScriptedServer([[1]], fail_first=1), ScriptedServer([[2]])], on_failure=cannot_rejoin)
        router.outstanding[1] = 5
        await router.generate(request_id="a", prompt_ids=[0], sampling_params={"max_tokens": 1})
        await router.wait_recovered()
        return router.failovers, router.alive

    failovers, alive = run(main())
    assert failovers == 1 and alive == [False, True]  # the others keep serving
    assert "could not be recovered" in caplog.text


def test_router_close_cancels_recoveries_in_progress() -> None:
    async def main() -> bool:
        started = asyncio.Event()

        async def slow_rejoin(index: int) -> None:
            started.set()
            await asyncio.sleep(3600)

        router = Router([ScriptedServer([[1]], fail_first=1), ScriptedServer([[2]])], on_failure=slow_rejoin)
        router.outstanding[1] = 5
        await router.generate(request_id="a", prompt_ids=[0], sampling_params={"max_tokens": 1})
        await started.wait()
        await asyncio.wait_for(router.close(), 5)
        return not router._recoveries

    assert run(main())


def test_router_without_live_replicas_says_so() -> None:
    async def main() -> None:
        router = Router([ScriptedServer([[1]], fail_first=100)])
        await router.generate(request_id="a", prompt_ids=[0], sampling_params={"max_tokens": 1})

    with pytest.raises(NoReplicaAvailable, match="down"):
        run(main())


# -- manager -------------------------------------------------------------------------------------------


def test_manager_packs_trajectories_like_the_batch_rollout_with_tool_turns_masked() -> None:
    cfg = config("actor_rollout_ref.rollout.multi_turn.enable=true", "actor_rollout_ref.rollout.calculate_log_probs=true",
                 response_length=24)
    rows = build_rows(4, "train")
    items = []
    for row in rows:
        prompt_ids = ids(TOK.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False))
        items.append({"input_ids": torch.tensor(prompt_ids), "raw_prompt_ids": prompt_ids, "raw_prompt": row["prompt"],
                      "extra_info": row["extra_info"], "agent_name": row["agent_name"],
                      "attention_mask": torch.ones(len(prompt_ids), dtype=torch.long)})
    batch = collate_fn(items)
    value = rows[0]["reward_model"]["ground_truth"]
    server = ScriptedServer([[CALL, EOS], ids(value)])
    manager = AgentLoopManager(cfg, TOK, server, tools=[LookupTool({}, None)])
    try:
        out = manager.generate_sequences(batch)
    finally:
        manager.events.close()
    b = out.batch
    assert b["prompts"].shape == (4, 32) and b["responses"].shape == (4, 24)
    tool_len = len(turn_ids(TOK, [{"role": "tool", "content": value}]))
    row0 = b["response_mask"][0].tolist()
    assert row0[: 2 + tool_len + 1] == [1, 1] + [0] * tool_len + [1] and sum(row0) == 3
    assert b["attention_mask"][0, 32:].sum() == 2 + tool_len + 1  # tool tokens are attended to
    assert (b["rollout_log_probs"][0] * (1 - b["response_mask"][0])).abs().sum() == 0
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))
    assert out.meta_info["metrics"]["agent/tool_calls/mean"] == 1.0
    assert out.non_tensor_batch["num_turns"].tolist() == [4, 4, 4, 4]


class CachingServer(ScriptedServer):
    """Reports, as vLLM does, how many prompt tokens its prefix cache served: a later turn of a trajectory
    finds everything the earlier turns sent and produced."""

    def __init__(self, turns: list[list[int]]) -> None:
        super().__init__(turns)
        self.seen: dict[str, int] = {}

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        out = await super().generate(request_id=request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        cached = self.seen.get(request_id, 0)
        self.seen[request_id] = len(prompt_ids) + len(out.token_ids)
        return TokenOutput(out.token_ids, out.log_probs, out.finish_reason, cached)


def test_manager_reports_the_prefix_cache_hit_rate_over_every_turn() -> None:
    cfg = config("actor_rollout_ref.rollout.multi_turn.enable=true", response_length=40)
    row = build_rows(1, "train")[0]
    prompt_ids = ids(TOK.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False))
    batch = collate_fn([{"input_ids": torch.tensor(prompt_ids), "raw_prompt_ids": prompt_ids, "raw_prompt": row["prompt"],
                         "extra_info": row["extra_info"], "agent_name": row["agent_name"],
                         "attention_mask": torch.ones(len(prompt_ids), dtype=torch.long)}])
    server = CachingServer([[CALL, EOS], ids("q") + [EOS]])
    manager = AgentLoopManager(cfg, TOK, server, tools=[LookupTool({}, None)])
    try:
        metrics = manager.generate_sequences(batch).meta_info["metrics"]
        outputs = manager.run_trajectories(batch)
    finally:
        manager.events.close()
    first, second = (len(c["prompt_ids"]) for c in server.calls[:2])
    assert metrics["agent/prefix_cache_hit_rate"] == pytest.approx((len(prompt_ids) + 2) / (first + second))
    assert metrics["agent/replica_failovers"] == 0.0
    assert len(outputs) == 1 and outputs[0].metrics["prompt_tokens"] == first + second
