"""The code-tool task for SmolLM2 (hybridflow.data.code_arithmetic) and its scorer."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hybridflow.agent.tool_parser import FunctionCall, parse_hermes
from hybridflow.data import code_arithmetic as task
from hybridflow.rewards.registry import default_compute_score
from hybridflow.rewards.toy import CODE_ARITHMETIC


def test_rows_ask_for_a_times_b_plus_c_after_a_worked_example() -> None:
    rows = task.build_rows(20, "train")
    assert rows == task.build_rows(20, "train") and rows != task.build_rows(20, "test")  # seeded per split
    for row in rows:
        question = row["prompt"][-1]["content"]
        a, b, c = (int(x) for x in question.removeprefix("What is ").removesuffix("?").replace("*", "+").split("+"))
        assert row["reward_model"]["ground_truth"] == str(a * b + c)
        assert [m["role"] for m in row["prompt"]] == ["system", "user", "assistant", "tool", "assistant", "user"]
        assert row["agent_name"] == "tool_agent" and row["data_source"] == CODE_ARITHMETIC


def test_the_worked_example_is_a_call_the_tool_agent_parses_and_the_sandbox_runs() -> None:
    example = task.build_rows(1, "train")[0]["prompt"]
    _, (call,) = parse_hermes(example[2]["content"])
    assert isinstance(call, FunctionCall) and call.name == task.TOOL
    done = subprocess.run([sys.executable, "-c", call.arguments["code"]], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == example[3]["content"] == example[4]["content"]


@pytest.mark.parametrize(("response", "score"), [
    ('<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(57 * 81 + 3)"}}</tool_call>\ntool\n4620\n'
     "assistant\n4620", 1.0),
    ("4620", 1.0),                                      # right without the tool (a guess): still the answer
    ('<tool_call>{"name": "code_interpreter"}</tool_call>\ntool\nerror\nassistant\n4621', 0.0),
    ("<tool_call>{}</tool_call>", 0.0),                 # no final answer
    ("assistant\nThe answer is 4620", 0.0),             # the number alone is asked for
])
def test_the_final_turn_must_start_with_the_result(response: str, score: float) -> None:
    assert default_compute_score(CODE_ARITHMETIC, response, "4620")["score"] == score


def test_the_cli_refuses_a_model_folder_without_a_config(tmp_path) -> None:
    with pytest.raises(SystemExit):
        task.main(["--out", str(tmp_path / "out"), "--model", str(tmp_path)])
