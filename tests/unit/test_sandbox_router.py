"""The sandbox role without Ray: the router over real run_code servers (127.0.0.1), the code tool switched to it,
and the trainer's plan for the role (hybridflow.controller.sandbox_service.plan_sandbox)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hybridflow.config import HybridFlowConfig
from hybridflow.controller.resource_pool import ROLE_RESOURCES_ENV
from hybridflow.controller.sandbox_service import SandboxDeployment, SandboxPlan, plan_sandbox
from hybridflow.rewards.registry import default_compute_score
from hybridflow.tools.code_interpreter import CodeInterpreterTool
from hybridflow.tools.sandbox_router import SandboxRouter
from hybridflow.tools.sandbox_server import ServerSettings, serve_in_thread
from tests.unit.test_sandbox_server import _closed_port, _post

ROLE_ENV = {ROLE_RESOURCES_ENV: json.dumps({"trainer": "rljob.role/trainer", "sandbox": "rljob.role/sandbox"})}
CODE_TOOL = "tools:\n  - class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool\n    config: {default_timeout: 5}\n"


@pytest.fixture
def servers() -> Iterator[list[Any]]:
    started = [serve_in_thread("127.0.0.1", 0, ServerSettings(max_concurrency=2)) for _ in range(2)]
    yield started
    for server, _ in started:
        server.shutdown()
        server.server_close()


def _run(url: str, code: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    return _post(url, {"code": code, "language": "python", "run_timeout": 5, **extra})


def _closed_url() -> str:
    return f"http://127.0.0.1:{_closed_port()}"


def test_requests_spread_over_the_servers_and_a_dead_one_is_skipped(servers: list[Any]) -> None:
    urls = [url for _, url in servers]
    router = SandboxRouter(lambda: list(urls), refresh_s=0.0).start()
    try:
        for i in range(4):
            status, body = _run(router.url, f"print({i} * 7)")
            assert status == 200 and body["run_result"]["stdout"] == f"{i * 7}\n"
        assert router.answered == {urls[0]: 2, urls[1]: 2}
        dead, _ = servers[0]
        dead.shutdown()
        dead.server_close()  # its port now refuses connections
        for _ in range(3):
            status, body = _run(router.url, "print('still')")
            assert status == 200 and body["status"] == "Success", body
        assert router.failovers >= 1 and router.answered[urls[1]] == 5
        # the request's own mistakes come back as the server said them, not as a dead server
        status, body = _run(router.url, "print(1)", language="cobol")
        assert status == 400 and "language 'cobol' is not supported" in body["message"]
    finally:
        router.close()


@pytest.fixture
def broken_sandbox() -> Iterator[str]:
    """A server whose sandbox cannot run anything: it answers SandboxFusion's SandboxError to every run (as a run_code
    server does while Ray kills it: the program's supervisor dies first, the server still answers)."""
    from http.server import ThreadingHTTPServer

    from hybridflow.tools.sandbox_server import JSONHandler

    class Broken(JSONHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self._reply(200, {"status": "SandboxError", "run_result": None,
                              "message": "the sandbox supervisor exited (-9) without the program's status"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_sandbox_error_is_run_again_on_another_server(servers: list[Any], broken_sandbox: str) -> None:
    healthy = servers[0][1]
    router = SandboxRouter(lambda: [broken_sandbox, healthy], refresh_s=0.0, give_up_s=5).start()
    try:
        for i in range(4):  # the turn comes to the broken server first for some of them
            status, body = _run(router.url, f"print({i})")
            assert status == 200 and body["status"] == "Success" and body["run_result"]["stdout"] == f"{i}\n", body
        assert router.answered[healthy] == 4 and router.failovers == router.answered[broken_sandbox] >= 1
        assert router.servers() == [broken_sandbox, healthy]  # it answered: still listed
    finally:
        router.close()
    # when every server fails that way, the caller gets the sandbox's own answer (not a 503 after give_up_s)
    router = SandboxRouter(lambda: [broken_sandbox], refresh_s=0.0, give_up_s=30).start()
    try:
        status, body = _run(router.url, "print(1)")
        assert status == 200 and body["status"] == "SandboxError" and "supervisor exited" in body["message"]
    finally:
        router.close()


def test_a_restarted_server_is_found_under_its_new_address(servers: list[Any]) -> None:
    # the owner lists first a server that is gone, then (restarted) the same server at a new address
    listings = iter([[_closed_url()], [servers[1][1]]])
    router = SandboxRouter(lambda: next(listings, [servers[1][1]]), refresh_s=0.0, give_up_s=10).start()
    try:
        status, body = _run(router.url, "print('back')")
        assert status == 200 and body["run_result"]["stdout"] == "back\n"
        assert router.failovers == 1 and router.servers() == [servers[1][1]]
    finally:
        router.close()


def test_no_server_at_all_is_a_503_saying_what_to_check() -> None:
    router = SandboxRouter(lambda: [_closed_url()], refresh_s=0.0, give_up_s=0.5).start()
    try:
        status, body = _run(router.url, "print(1)")
        assert status == 503
        assert "no sandbox server answered within 0.5s" in body["message"]
        assert "spec.roles.sandbox" in body["message"] and "Connection refused" in body["message"]
    finally:
        router.close()


def test_the_code_tool_and_the_code_scorer_run_through_the_router(servers: list[Any], tmp_path: Path) -> None:
    router = SandboxRouter(lambda: [url for _, url in servers], refresh_s=0.0).start()
    try:
        tool = CodeInterpreterTool({"default_timeout": 5}, None)
        assert tool.runs_locally
        tool.use_sandbox_service(router.url)
        assert not tool.runs_locally

        async def call() -> tuple[Any, dict[str, Any]]:
            instance, _ = await tool.create()
            response, _, metrics = await tool.execute(instance, {"code": "print(6 * 7)"})
            return response, metrics

        response, metrics = asyncio.run(call())
        assert response.text == "42\n" and metrics["sandbox"] == "remote"
        with pytest.raises(ValueError, match="already runs code at"):
            tool.use_sandbox_service(router.url)
        cases = json.dumps({"inputs": ["2 3\n", "10 5\n"], "outputs": ["5\n", "15\n"]})
        answer = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
        score = default_compute_score("codecontests", answer, cases, sandbox_fusion_url=router.url)
        assert score["score"] == 1.0 and score["acc"]
        assert sum(router.answered.values()) == 3  # one tool call, two test cases
    finally:
        router.close()


# ------------------------------------------------------------------------------------------- the plan


def _cfg(tmp_path: Path, *, replicas: int = 2, tool: str | None = CODE_TOOL, **reward: Any) -> HybridFlowConfig:
    mapping: dict[str, Any] = {"trainer": {"sandbox": {"replicas": replicas}},
                               "actor_rollout_ref": {"rollout": {"mode": "async"}}}
    if tool is not None:
        path = tmp_path / "tools.yaml"
        path.write_text(tool)
        mapping["actor_rollout_ref"]["rollout"]["multi_turn"] = {"tool_config_path": str(path)}
    if reward:
        mapping["reward_model"] = reward
    return HybridFlowConfig.model_validate(mapping)


def test_the_plan_serves_what_runs_code(tmp_path: Path) -> None:
    plan = plan_sandbox(_cfg(tmp_path), {"gsm8k"}, ROLE_ENV)
    assert plan == SandboxPlan("rljob.role/sandbox", 2, 4, tools=True, reward=False)
    plan = plan_sandbox(_cfg(tmp_path, tool=None), {"codecontests", "gsm8k"}, ROLE_ENV)
    assert plan is not None and (plan.tools, plan.reward) == (False, True)
    # without the role nothing changes: no plan, code runs locally
    assert plan_sandbox(_cfg(tmp_path), {"codecontests"}, {}) is None


LOOKUP_TOOL = "tools:\n  - class_name: hybridflow.tools.lookup.LookupTool\n    config: {type: native}\n"


@pytest.mark.parametrize(
    ("kwargs", "sources", "expected"),
    [
        ({"replicas": 0}, {"codecontests"}, "trainer.sandbox.replicas is 0, so no run_code server would use its pods"),
        ({"tool": LOOKUP_TOOL}, {"gsm8k"}, "the tool config (actor_rollout_ref.rollout.multi_turn.tool_config_path) "
                                           "has no code_interpreter tool without sandbox_fusion_url"),
        ({"tool": None}, {"gsm8k"}, "no data source is scored by running code"),
        ({"tool": None, "sandbox_fusion": {"url": "http://sf:8080/run_code"}}, {"codecontests"},
         "the code scorers use their own service (reward_model.sandbox_fusion.url is http://sf:8080/run_code)"),
    ],
    ids=["no-replicas", "tool-without-code", "no-code-sources", "external-service"],
)
def test_a_role_that_would_serve_nothing_is_refused(tmp_path: Path, kwargs: dict, sources: set, expected: str) -> None:
    with pytest.raises(ValueError) as err:
        plan_sandbox(_cfg(tmp_path, **kwargs), sources, ROLE_ENV)
    assert expected in str(err.value)
    assert "remove spec.roles.sandbox" in str(err.value)


def test_the_deployment_points_only_consumers_without_a_url(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, tool=None)
    deployment = SandboxDeployment(SandboxPlan("rljob.role/sandbox", 1, 4, tools=True, reward=True))
    try:
        deployment.point_reward(cfg)
        assert cfg.reward_model.sandbox_fusion.url == deployment.router.url
        own = CodeInterpreterTool({"sandbox_fusion_url": "http://sf:8080/run_code"}, None)
        local = CodeInterpreterTool({}, None)
        assert deployment.point_tools([own, local]) == 1
        assert own.settings.sandbox_fusion_url == "http://sf:8080/run_code"
        assert local.settings.sandbox_fusion_url == deployment.router.url
    finally:
        deployment.close()


def test_main_ppo_points_the_code_scorers_at_the_router_only_with_the_role(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hybridflow.trainer.main_ppo import build_reward_fns, start_sandbox

    monkeypatch.delenv(ROLE_RESOURCES_ENV, raising=False)
    cfg = _cfg(tmp_path, tool=None)
    assert start_sandbox(cfg, {"codecontests"}) is None  # no role: the scorers run the local sandbox
    assert cfg.reward_model.sandbox_fusion.url is None
    monkeypatch.setenv(ROLE_RESOURCES_ENV, ROLE_ENV[ROLE_RESOURCES_ENV])
    sandbox = start_sandbox(cfg, {"codecontests"})
    try:
        assert sandbox is not None and cfg.reward_model.sandbox_fusion.url == sandbox.router.url
        train_fn, val_fn = build_reward_fns(cfg, None, {"codecontests"})
        for fn in (train_fn, val_fn):
            assert fn.compute_score.keywords["sandbox_fusion_url"] == sandbox.router.url
    finally:
        sandbox.close()
    with pytest.raises(ValueError, match="nothing in this run uses it"):
        start_sandbox(_cfg(tmp_path, tool=None), {"gsm8k"})
