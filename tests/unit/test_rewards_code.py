"""The code sources of verl's default scorer (codecontests, apps, codeforces, taco): test cases run in a sandbox.

Real sandboxes: the local one (hybridflow.tools.sandbox) and the SandboxFusion-compatible HTTP server over it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from hybridflow.config import ConfigError, load_config
from hybridflow.rewards import code, default_compute_score, known_data_sources
from hybridflow.tools.sandbox_server import ServerSettings, serve_in_thread

DOUBLE = "Read a number, print twice it.\n```python\nn = int(input())\nprint(2 * n)\n```\n"
CASES = {"inputs": ["1\n", "21\n", "-3\n"], "outputs": ["2\n", "42\n", "-6\n"]}


@pytest.fixture(scope="module")
def sandbox_url() -> Iterator[str]:
    server, url = serve_in_thread("127.0.0.1", 0, ServerSettings(max_concurrency=2, max_run_timeout=30))
    try:
        yield f"{url}/run_code"
    finally:
        server.shutdown()
        server.server_close()


def test_code_sources_are_known() -> None:
    assert all(source in known_data_sources() for source in code.SOURCES)


def test_all_cases_pass_locally() -> None:
    result = default_compute_score("codecontests", DOUBLE, json.dumps(CASES))
    assert result == {"score": 1.0, "acc": True, "passed": 3, "cases": 3}


def test_score_is_the_fraction_of_cases_passed() -> None:
    wrong_on_negatives = "```python\nn = int(input())\nprint(abs(2 * n))\n```"
    result = code.compute_score(wrong_on_negatives, CASES)
    assert result["score"] == pytest.approx(2 / 3) and result["acc"] is False


def test_test_cases_as_parquet_gives_them() -> None:
    """A ground truth read back from parquet holds numpy arrays: they are plain lists to the scorer."""
    import numpy as np

    arrays = {"inputs": np.array(["1\n", "21\n"], dtype=object), "outputs": np.array(["2\n", "41\n"], dtype=object)}
    assert code.compute_score(DOUBLE, arrays)["score"] == 0.5
    calls = {"fn_name": "add", "inputs": np.array([np.array([1, 2])], dtype=object), "outputs": np.array([[3]])}
    assert code.compute_score("```python\ndef add(a, b):\n    return a + b\n```", calls)["score"] == 1.0


def test_no_code_block_or_a_crash_scores_zero() -> None:
    assert code.compute_score("print(2 * int(input()))", CASES)["score"] == 0.0  # not fenced
    assert code.compute_score("```python\nraise SystemExit(3)\n```", CASES)["score"] == 0.0


def test_fenced_code_search_is_linear() -> None:
    """A degenerate completion (an unclosed fence, thousands of backtick runs) is searched in linear time."""
    import time

    started = time.perf_counter()
    assert code.extract_code("```python\n" + "x" * 1_000_000) is None
    assert code.extract_code("```!" * 200_000) is None
    assert time.perf_counter() - started < 1.0


def test_outputs_compare_line_by_line_ignoring_trailing_whitespace() -> None:
    assert code.same_output("1 2  \n3\n\n", "1 2\n3")
    assert not code.same_output("1 2\n3", "1  2\n3")
    assert code.same_output("a\nb\n", ["a", "b"])


def test_call_based_problems_with_a_function_or_a_solution_class() -> None:
    cases = {"fn_name": "add", "inputs": [[1, 2], [5, -5]], "outputs": [[3], [0]]}  # APPS wraps outputs in a list
    function = "```python\ndef add(a, b):\n    return a + b\n```"
    assert code.compute_score(function, cases)["score"] == 1.0
    method = "```python\nclass Solution:\n    def add(self, a, b):\n        return a * b + 1\n```"
    assert code.compute_score(method, cases)["score"] == 0.5  # right for (1, 2) only


def test_the_last_python_block_is_the_program() -> None:
    text = "```python\nprint('draft')\n```\nthen\n```text\nnotes\n```\n```python\nprint(7)\n```"
    assert code.extract_code(text) == "print(7)\n"
    assert code.extract_code("```\nprint(1)\n```") == "print(1)\n"
    assert code.extract_code("no code") is None


def test_a_program_that_runs_too_long_fails_its_case() -> None:
    forever = "```python\nwhile True:\n    pass\n```"
    result = code.compute_score(forever, {"inputs": [""], "outputs": [""]}, code.Sandbox(run_timeout=1.0))
    assert result["score"] == 0.0


def test_malformed_ground_truth_names_the_problem() -> None:
    with pytest.raises(ValueError, match="not JSON test cases"):
        code.compute_score(DOUBLE, "{not json")
    with pytest.raises(ValueError, match=r'must hold \{"inputs"'):
        code.compute_score(DOUBLE, {"tests": []})
    with pytest.raises(ValueError, match="must be lists"):
        code.compute_score(DOUBLE, {"inputs": "1", "outputs": "2"})
    with pytest.raises(ValueError, match="2 inputs and 1 outputs"):
        code.compute_score(DOUBLE, {"inputs": ["1", "2"], "outputs": ["2"]})


def test_a_sandbox_fusion_service_runs_the_cases(sandbox_url: str) -> None:
    """With reward_model.sandbox_fusion.url the cases are POSTed to run_code (here HybridFlow's own server)."""
    result = default_compute_score("apps", DOUBLE, CASES, sandbox_fusion_url=sandbox_url)
    assert result["score"] == 1.0
    wrong = "```python\nprint(0)\n```"
    assert default_compute_score("taco", wrong, CASES, sandbox_fusion_url=sandbox_url)["score"] == 0.0


def test_an_unreachable_sandbox_raises_rather_than_scoring_a_wrong_answer() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(code.SandboxUnavailable, match="unreachable.*reward_model.sandbox_fusion.url"):
        default_compute_score("codeforces", DOUBLE, CASES, sandbox_fusion_url=f"http://127.0.0.1:{port}/run_code")


def test_config_keys_reach_the_reward_manager() -> None:
    """verl's reward_model.sandbox_fusion.* keys are fields; the manager's built-in scorer gets url and memory, and
    max_concurrent caps the scoring processes."""
    from hybridflow.rewards import RewardManager

    cfg = load_config(None, ["reward_model.sandbox_fusion.url=http://sandbox:8080/run_code",
                             "reward_model.sandbox_fusion.max_concurrent=1",
                             "reward_model.sandbox_fusion.memory_limit_mb=512"])
    manager = RewardManager.from_config(cfg)
    assert manager.compute_score.keywords == {"sandbox_fusion_url": "http://sandbox:8080/run_code",
                                              "memory_limit_mb": 512}
    assert manager._budgeted.workers == 1
    with pytest.raises(ConfigError, match="reward_model.sandbox_fusion.max_concurrent"):
        load_config(None, ["reward_model.sandbox_fusion.max_concurrent=0"])


def test_the_managers_scorer_runs_code_in_its_worker_processes(sandbox_url: str) -> None:
    """The reward manager's scorer (a pickled partial) runs in scoring processes under the time budget: the local
    sandbox and the service both score there; an unreachable service is an error outcome, not a wrong answer."""
    from hybridflow.rewards import RewardManager
    from hybridflow.rewards.budget import Call

    def calls(source: str) -> list[Call]:
        kwargs = {"data_source": source, "solution_str": DOUBLE, "ground_truth": json.dumps(CASES), "extra_info": None}
        return [Call(kwargs, 30.0)]

    for url in (None, sandbox_url):
        manager = RewardManager.from_config(load_config(None, [f"reward_model.sandbox_fusion.url={url or 'null'}"]))
        try:
            (outcome,) = manager._budgeted.run(calls("apps"))
        finally:
            manager._budgeted.close()
        assert manager._budgeted._local_reason is None  # it ran in a worker process
        assert outcome.status == "ok" and outcome.value["score"] == 1.0, outcome
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = RewardManager.from_config(load_config(None, [f"reward_model.sandbox_fusion.url=http://127.0.0.1:{port}/x"]))
    try:
        (outcome,) = manager._budgeted.run(calls("taco"))
    finally:
        manager._budgeted.close()
    assert outcome.status != "ok" and "unreachable" in outcome.message
