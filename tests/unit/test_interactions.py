"""Interactions (simulated user turns) in the tool agent loop, against the scripted fake server of
test_agent_loops: exact tokens and masks, turn scores, limits, failures, verl's interaction config."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.agent.chat import turn_ids
from hybridflow.agent.loops import ToolAgentLoop
from hybridflow.agent.manager import AgentLoopManager, default_loop_name
from hybridflow.config import ConfigError
from hybridflow.data.dataset import collate_fn
from hybridflow.interactions import BaseInteraction, InteractionConfigError, load_interactions
from hybridflow.interactions.gsm8k import CORRECT, WRONG, Gsm8kInteraction
from tests.unit.test_agent_loops import EOS, TOK, ScriptedServer, config, ids

MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"


class Teacher(BaseInteraction):
    """Says "no" until the model's last answer is `answer`; scores 1 for it, else 0. Records what it saw."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.seen: list[list[dict[str, Any]]] = []
        self.started: dict[str, dict[str, Any]] = {}
        self.finalized: list[str] = []

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        self.started[str(instance_id)] = kwargs
        return str(instance_id)

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any):
        self.seen.append(messages)
        right = messages[-1]["content"].strip() == kwargs["answer"]
        return right, "yes" if right else "no", float(right), {}

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self.finalized.append(instance_id)


class Broken(Teacher):
    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any):
        raise RuntimeError("simulator crashed")


def sample(answer: str = "q", name: str = "teacher") -> dict[str, Any]:
    prompt = [{"role": "user", "content": "say q"}]
    return {
        "raw_prompt": prompt,
        "raw_prompt_ids": ids(TOK.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)),
        "extra_info": {"interaction_kwargs": {"name": name, "answer": answer}},
        "index": 7,
    }


def loop(server: ScriptedServer, interaction: BaseInteraction, *overrides: str, length: int = 60) -> ToolAgentLoop:
    cfg = config(f"{MULTI_TURN}.enable=true", *overrides, response_length=length)
    return ToolAgentLoop(cfg, server, TOK, tools=[], interactions={"teacher": interaction})


def test_a_wrong_answer_gets_a_user_turn_and_a_right_one_ends_the_trajectory() -> None:
    teacher = Teacher({})
    server = ScriptedServer([ids("x") + [EOS], ids("q") + [EOS]])
    s = sample()
    out = asyncio.run(loop(server, teacher).run({}, **s))
    user = turn_ids(TOK, [{"role": "user", "content": "no"}])
    assert out.response_ids == ids("x") + [EOS] + user + ids("q") + [EOS]
    assert out.response_mask == [1, 1] + [0] * len(user) + [1, 1]
    assert out.response_logprobs == [-0.5, -0.51] + [0.0] * len(user) + [-0.5, -0.51]
    assert server.calls[1]["prompt_ids"] == s["raw_prompt_ids"] + ids("x") + [EOS] + user  # exact continuation
    assert out.extra_fields["turn_scores"] == [0.0, 1.0]
    assert out.num_turns == 4 and out.metrics["interaction_turns"] == 1 and out.metrics["interaction_errors"] == 0
    # the interaction saw the conversation as messages: the prompt, then each model turn as text
    assert [m["role"] for m in teacher.seen[1]] == ["user", "assistant", "user", "assistant"]
    assert teacher.seen[1][1]["content"].strip() == "x" and teacher.seen[1][2]["content"] == "no"
    request_id = server.calls[0]["request_id"]
    assert teacher.started[request_id] == {"name": "teacher", "answer": "q"} and teacher.finalized == [request_id]


def test_user_turn_limit_budget_and_a_failing_interaction_end_on_the_model_turn() -> None:
    wrong_forever = ScriptedServer([ids("x") + [EOS]])
    out = asyncio.run(loop(wrong_forever, Teacher({}), f"{MULTI_TURN}.max_user_turns=2").run({}, **sample()))
    assert len(wrong_forever.calls) == 3 and out.extra_fields["turn_scores"] == [0.0, 0.0]
    assert out.response_mask[-1] == 1 and out.metrics["interaction_turns"] == 2
    # no room for the user turn: the trajectory stops before it
    out = asyncio.run(loop(ScriptedServer([ids("x") + [EOS]]), Teacher({}), length=4).run({}, **sample()))
    assert out.response_ids == ids("x") + [EOS]
    broken = Broken({})
    out = asyncio.run(loop(ScriptedServer([ids("x") + [EOS]]), broken).run({}, **sample()))
    assert out.response_ids == ids("x") + [EOS] and out.metrics["interaction_errors"] == 1
    assert len(broken.finalized) == 1  # released even so


@pytest.mark.parametrize(("fields", "message"), [
    ({"extra_info": {}}, "sample 7 has no extra_info.interaction_kwargs"),
    ({"extra_info": {"interaction_kwargs": {"name": "nope"}}}, "name='nope' is not an interaction"),
])
def test_a_sample_without_its_interaction_is_refused_by_name(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        asyncio.run(loop(ScriptedServer([[EOS]]), Teacher({})).run({}, **{**sample(), **fields}))


def test_gsm8k_interaction_scores_the_last_answer() -> None:
    gsm = Gsm8kInteraction({})

    async def talk(answer: str) -> tuple[bool, str, float, dict]:
        instance = await gsm.start_interaction("t", ground_truth="72")
        reply = await gsm.generate_response(instance, [{"role": "user", "content": "q"},
                                                       {"role": "assistant", "content": answer}])
        await gsm.finalize_interaction(instance)
        return reply

    assert asyncio.run(talk("#### 72")) == (True, CORRECT, 1.0, {})
    assert asyncio.run(talk("so it is 71")) == (False, WRONG, 0.0, {})
    assert asyncio.run(talk("72")) == (True, CORRECT, 1.0, {})  # "#### " is added as verl's example does
    assert gsm.instances == {}


def test_verl_interaction_config_loads_and_bad_ones_name_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "interaction.yaml"
    path.write_text(textwrap.dedent("""
        interaction:
          - name: gsm8k
            class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction
            config: {}
          - name: teacher
            class_name: tests.unit.test_interactions.Teacher
    """))
    loaded = load_interactions(path)
    assert isinstance(loaded["gsm8k"], Gsm8kInteraction) and isinstance(loaded["teacher"], Teacher)
    example = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_interaction.yaml"
    assert list(load_interactions(example)) == ["gsm8k"]
    assert loaded["gsm8k"].name == "gsm8k"
    bad = {
        "interaction: []": "non-empty 'interaction' list",
        "interaction: [{class_name: x.Y, nmae: a}]": "unknown keys ['nmae']",
        "interaction: [{class_name: hybridflow.tools.lookup.LookupTool}]": "is not a subclass of",
        "interaction: [{class_name: no.such.Thing}]": "cannot import 'no.such.Thing'",
        ("interaction: [{name: a, class_name: hybridflow.interactions.gsm8k.Gsm8kInteraction}, "
         "{name: a, class_name: hybridflow.interactions.gsm8k.Gsm8kInteraction}]"): "'a' appears more than once",
    }
    for text, message in bad.items():
        path.write_text(text)
        with pytest.raises(InteractionConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            load_interactions(path)
    with pytest.raises(InteractionConfigError, match="not found; fix actor_rollout_ref.rollout.multi_turn"):
        load_interactions(tmp_path / "missing.yaml")


def test_the_manager_runs_configured_interactions_and_hands_turn_scores_to_the_reward(tmp_path: Path) -> None:
    path = tmp_path / "interaction.yaml"
    path.write_text("interaction:\n  - {name: teacher, class_name: tests.unit.test_interactions.Teacher}\n")
    cfg = config(f"{MULTI_TURN}.interaction_config_path={path}", f"{MULTI_TURN}.max_user_turns=1",
                 response_length=16)
    assert default_loop_name(cfg) == "tool_agent"  # an interaction config alone selects the multi-turn loop
    items = []
    for answer in ("q", "z"):  # the model always answers q: right for the first row, wrong for the second
        row = sample(answer)
        items.append({"input_ids": torch.tensor(row["raw_prompt_ids"]), "raw_prompt_ids": row["raw_prompt_ids"],
                      "raw_prompt": row["raw_prompt"], "extra_info": {**row["extra_info"], "keep": answer},
                      "attention_mask": torch.ones(len(row["raw_prompt_ids"]), dtype=torch.long)})
    manager = AgentLoopManager(cfg, TOK, ScriptedServer([ids("q") + [EOS]]))
    try:
        out = manager.generate_sequences(collate_fn(items))
    finally:
        manager.events.close()
    infos = out.non_tensor_batch["extra_info"]
    # row 2: wrong, a user turn, wrong again; the user-turn limit ends it before a second score
    assert [info["turn_scores"] for info in infos] == [[1.0], [0.0]]
    assert [info["keep"] for info in infos] == ["q", "z"]  # the dataset's extra_info is kept beside them
    assert out.non_tensor_batch["num_turns"].tolist() == [2, 4]
    assert out.meta_info["metrics"]["agent/interaction_turns/mean"] == 0.5


def test_interactions_need_server_mode() -> None:
    with pytest.raises(ConfigError, match="server mode only"):
        config("actor_rollout_ref.rollout.mode=sync", f"{MULTI_TURN}.interaction_config_path=/x.yaml")
