"""The sandbox role on a real multi-node Ray cluster: the run_code servers land on the sandbox nodes, the code tool
and the code scorer run code through them, and a killed server is restarted by Ray while calls keep succeeding.

The nodes are started as the operator's RayJob starts the sandbox worker group's pods (its `rayStartParams`:
one unit of rljob.role/sandbox and num-cpus 0 per pod), and the trainer's side is driven the way main_ppo
drives it: plan_sandbox from the head pod's $HYBRIDFLOW_ROLE_RESOURCES, the router, the server actors, the tools.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hybridflow.controller.sandbox_service import SandboxDeployment, plan_sandbox
from hybridflow.rewards.registry import default_compute_score
from hybridflow.tools.config import load_tools
from rljob_operator import api, builders

pytestmark = [pytest.mark.ray, pytest.mark.slow]

JOB = {
    "apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "coder", "uid": "u"},
    "spec": {
        "config": {"trainer": {"nnodes": 1, "n_gpus_per_node": 1, "device": "cpu", "sandbox": {"replicas": 2}},
                   "actor_rollout_ref": {"rollout": {"mode": "async",
                                                     "multi_turn": {"tool_config_path": "/config/tools.yaml"}}}},
        "resources": {"cpu": 2, "memory": "8Gi", "sharedMemory": "1Gi"},
        "roles": {"sandbox": {"replicas": 2, "resources": {"cpu": 2, "memory": "4Gi"}}},
    },
}  # fmt: skip
TOOLS = "tools:\n  - class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool\n    config: {default_timeout: 10}\n"


def _rendered() -> tuple[dict[str, Any], dict[str, str]]:
    """The sandbox worker group and the head pod's env, as the operator renders them."""
    cluster = builders.build_rayjob(api.RLJob.model_validate(JOB), 1)["spec"]["rayClusterSpec"]
    (group,) = [g for g in cluster["workerGroupSpecs"] if g["groupName"] == "sandbox"]
    env = {e["name"]: e["value"] for e in cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
           if "value" in e}
    return group, env


@pytest.fixture(scope="module")
def cluster() -> Iterator[set[str]]:
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    group, _ = _rendered()
    (resources,) = shlex.split(group["rayStartParams"]["resources"])  # what `ray start --resources=` receives
    # the head stands in for the trainer's pods: it has CPUs, and no sandbox resource
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    sandbox_nodes = {nodes.add_node(num_cpus=int(group["rayStartParams"]["num-cpus"]),
                                    resources=json.loads(resources)).node_id for _ in range(group["replicas"])}
    ray.init(address=nodes.address, include_dashboard=False, log_to_driver=False)
    nodes.wait_for_nodes()
    try:
        yield sandbox_nodes
    finally:
        ray.shutdown()
        nodes.shutdown()


def _call(tool: Any, code: str) -> tuple[str, dict[str, Any]]:
    async def scenario() -> tuple[str, dict[str, Any]]:
        instance, _ = await tool.create()
        response, _, metrics = await tool.execute(instance, {"code": code})
        await tool.release(instance)
        return response.text, metrics

    return asyncio.run(scenario())


def test_servers_on_the_sandbox_nodes_serve_the_code_tool_and_scorer_and_survive_a_kill(
    cluster: set[str], tmp_path: Path
) -> None:
    import ray

    _, env = _rendered()
    tool_config = tmp_path / "tools.yaml"
    tool_config.write_text(TOOLS)
    cfg = builders.trainer_config(api.RLJob.model_validate(JOB))
    cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path = str(tool_config)
    plan = plan_sandbox(cfg, {"codecontests"}, env)
    assert plan is not None and plan.tools and plan.reward and plan.replicas == 2
    sandbox = SandboxDeployment(plan)
    try:
        sandbox.point_reward(cfg)
        urls = sandbox.start_servers()
        assert sandbox.service is not None
        servers = sandbox.service.servers
        # one server on each sandbox node; CPU-only work never lands there (Ray sees no CPUs on them)
        assert set(ray.get([s.node_id.remote() for s in servers])) == cluster
        cpu_nodes = ray.get([ray.remote(num_cpus=1)(lambda: ray.get_runtime_context().get_node_id()).remote()
                             for _ in range(4)])
        assert not set(cpu_nodes) & cluster

        (tool,) = tools = load_tools(tool_config)
        assert sandbox.point_tools(tools) == 1
        for i in range(4):
            text, metrics = _call(tool, f"print({i} ** 2)")
            assert text == f"{i ** 2}\n" and metrics["sandbox"] == "remote"
        assert sandbox.router.answered == {urls[0]: 2, urls[1]: 2}  # spread over both servers
        cases = json.dumps({"inputs": ["1 2\n", "40 2\n"], "outputs": ["3\n", "42\n"]})
        answer = "```python\nprint(sum(map(int, input().split())))\n```"
        score = default_compute_score("codecontests", answer, cases, sandbox_fusion_url=cfg.reward_model.sandbox_fusion.url)
        assert score["score"] == 1.0

        # kill one server: calls keep succeeding on the other, and Ray brings the killed one back
        victim, old_url = servers[0], urls[0]
        ray.kill(victim, no_restart=False)
        for i in range(3):
            text, _ = _call(tool, f"print('after kill {i}')")
            assert text == f"after kill {i}\n"
        assert sandbox.router.failovers >= 1
        deadline = time.monotonic() + 60
        while True:
            now = sandbox.service.urls()
            if len(now) == 2 and old_url not in now:
                break
            assert time.monotonic() < deadline, f"the killed sandbox server did not come back: {now}"
            time.sleep(0.5)
        new_url = ray.get(victim.url.remote())
        assert new_url != old_url and ray.get(victim.node_id.remote()) in cluster
        sandbox.router.refresh_s = 0.0  # list the servers again at the next call (default: every 5 s)
        for i in range(4):
            text, _ = _call(tool, f"print({i} + 100)")
            assert text == f"{i + 100}\n"
        assert sandbox.router.answered.get(new_url, 0) >= 1  # the replacement serves through the router too
        with urllib.request.urlopen(f"{new_url}/healthz", timeout=10) as response:
            assert json.loads(response.read())["status"] == "ok"
    finally:
        sandbox.close()
