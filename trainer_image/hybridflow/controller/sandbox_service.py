"""The code sandbox as a service on the RLJob's sandbox pods (issue 15: the sandbox role).

When $HYBRIDFLOW_ROLE_RESOURCES names a sandbox role, the trainer starts trainer.sandbox.replicas run_code
servers (`SandboxServerWorker`), Ray actors that each need one unit of the role's resource, so each lands on
its own sandbox pod, and that Ray restarts when lost (`max_restarts=-1`: a lost pod is replaced by KubeRay and
the server comes back on it). The code consumers that have no URL of their own are pointed at a
`SandboxRouter` on the driver's loopback interface, which spreads their requests over the servers and skips a
dead one: the code_interpreter tools without sandbox_fusion_url, and the built-in code scorers when
reward_model.sandbox_fusion.url is null (they run in worker processes of the driver's pod).

    plan = plan_sandbox(cfg, data_sources)      # None without a sandbox role; ValueError if it would serve nothing
    sandbox = SandboxDeployment(plan)           # the router (no Ray yet); points the code scorers at it
    ... init Ray ...
    sandbox.start_servers()                     # the actors, waiting until each has a URL
    sandbox.point_tools(tools)                  # the agent loop's code tools
    sandbox.close()

Without the role nothing changes: code runs in the local sandbox of the process that calls it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hybridflow._config.sandbox import REWARD_KEY, TOOL_KEY, sandbox_consumers
from hybridflow.controller.resource_pool import ROLE_RESOURCES_ENV, SANDBOX_ROLE, role_resources_from_env

logger = logging.getLogger(__name__)

#: Seconds to wait for every server to be placed and listening before the run fails.
READY_TIMEOUT_S = 300.0
#: Seconds one server may take to say its URL before it is left out of a listing (restarting, lost).
LIST_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class SandboxPlan:
    """What the sandbox role serves in this run."""

    #: The Ray custom resource of the sandbox pods (rljob.role/sandbox).
    resource: str
    replicas: int
    max_concurrency: int
    #: Point the code_interpreter tools without a URL at the servers.
    tools: bool
    #: Point the built-in code scorers at the servers.
    reward: bool


def plan_sandbox(cfg: Any, data_sources: Iterable[str], environ: Mapping[str, str] | None = None) -> SandboxPlan | None:
    """The sandbox role's plan for this run, or None without the role; ValueError when the role cannot serve."""
    resource = role_resources_from_env(environ).get(SANDBOX_ROLE)
    replicas = cfg.trainer.sandbox.replicas
    if not resource:
        if replicas:
            logger.info("trainer.sandbox.replicas=%d, but $%s names no sandbox role: code runs in the local sandbox",
                        replicas, ROLE_RESOURCES_ENV)
        return None
    if replicas == 0:
        raise ValueError(
            f"${ROLE_RESOURCES_ENV} names a sandbox role ({resource}), but trainer.sandbox.replicas is 0, so no "
            "run_code server would use its pods; set trainer.sandbox.replicas to the RLJob's sandbox pod count "
            "(spec.roles.sandbox), or remove spec.roles.sandbox")
    users, why_not = sandbox_consumers(cfg)
    tools = "tools" in users and _has_local_code_tool(cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path)
    if "tools" in users and not tools:
        why_not.append(f"the tool config ({TOOL_KEY}) has no code_interpreter tool without sandbox_fusion_url")
    from hybridflow.rewards.code import SOURCES

    code_sources = sorted(set(data_sources) & set(SOURCES))
    reward = "reward" in users and bool(code_sources)
    if "reward" in users and not reward:
        why_not.append(f"no data source is scored by running code (those are {', '.join(SOURCES)})")
    if not (tools or reward):
        raise ValueError(
            f"the RLJob has a sandbox role, but nothing in this run uses it: {'; '.join(why_not)}. Add a "
            "code_interpreter tool (verl's SandboxFusionTool) without sandbox_fusion_url to the tool config, or "
            f"code data sources with {REWARD_KEY} unset; or remove spec.roles.sandbox and trainer.sandbox.replicas")
    return SandboxPlan(resource, replicas, cfg.trainer.sandbox.max_concurrency, tools, reward)


def _has_local_code_tool(path: str) -> bool:
    from hybridflow.tools.code_interpreter import CodeInterpreterTool
    from hybridflow.tools.config import load_tools

    return any(isinstance(t, CodeInterpreterTool) and t.runs_locally for t in load_tools(path))


class SandboxService:
    """`plan.replicas` run_code server actors, each on a node advertising `plan.resource`."""

    def __init__(self, plan: SandboxPlan) -> None:
        import ray

        from hybridflow.workers.sandbox_worker import SandboxServerWorker

        self.plan = plan
        # num_cpus=0: the sandbox pods advertise no CPUs (only the role's resource), see rljob_operator.roles
        remote = ray.remote(max_restarts=-1, max_task_retries=0)(SandboxServerWorker)
        self.servers = [remote.options(num_cpus=0, resources={plan.resource: 1}).remote(plan.max_concurrency)
                        for _ in range(plan.replicas)]

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> list[str]:
        """Every server's URL, once each is placed and listening; RuntimeError saying what is missing."""
        import ray

        try:
            return ray.get([s.url.remote() for s in self.servers], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as err:
            have = ray.cluster_resources().get(self.plan.resource, 0)
            raise RuntimeError(
                f"the code sandbox's {self.plan.replicas} run_code server(s) were not all up within {timeout_s:.0f}s: "
                f"each needs one unit of {self.plan.resource!r} (one sandbox pod), and the Ray cluster has {have:g}. "
                "Check that the RLJob's sandbox pods are running, and that spec.roles.sandbox and "
                "spec.config.trainer.sandbox.replicas agree (re-render the job with `rljob render`)."
            ) from err

    def urls(self) -> list[str]:
        """The URLs of the servers that answer now (a restarting or lost one is left out)."""
        import ray

        refs = [s.url.remote() for s in self.servers]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=LIST_TIMEOUT_S)
        urls = []
        for ref in ready:
            try:
                urls.append(ray.get(ref))
            except ray.exceptions.RayError as exc:  # died or restarting: the router lists it again later
                logger.info("sandbox server left out of the list: %s", type(exc).__name__)
        return urls

    def shutdown(self) -> None:
        """Kill the servers (no restart)."""
        import ray

        for server in self.servers:
            ray.kill(server, no_restart=True)
        self.servers = []


class SandboxDeployment:
    """The router the consumers call, and (after `start_servers`) the servers behind it."""

    def __init__(self, plan: SandboxPlan) -> None:
        from hybridflow.tools.sandbox_router import SandboxRouter

        self.plan = plan
        self.service: SandboxService | None = None
        self.router = SandboxRouter(self._urls).start()

    def point_reward(self, cfg: Any) -> None:
        """The built-in code scorers send test cases to the router (before the reward managers are built)."""
        if self.plan.reward:
            cfg.reward_model.sandbox_fusion.url = self.router.url

    def start_servers(self) -> list[str]:
        """Start the server actors (Ray must be up) and wait until each listens; returns their URLs."""
        self.service = SandboxService(self.plan)
        urls = self.service.wait_ready()
        logger.info("code sandbox: %d run_code server(s) on the sandbox pods %s, behind %s", len(urls), urls,
                    self.router.url)
        return urls

    def point_tools(self, tools: Iterable[Any]) -> int:
        """Send the code_interpreter tools without a URL of their own to the router; returns how many."""
        from hybridflow.tools.code_interpreter import CodeInterpreterTool

        pointed = 0
        for tool in tools:
            if self.plan.tools and isinstance(tool, CodeInterpreterTool) and tool.runs_locally:
                tool.use_sandbox_service(self.router.url)
                pointed += 1
        return pointed

    def close(self) -> None:
        """Stop the router and the servers."""
        self.router.close()
        if self.service is not None:
            self.service.shutdown()

    def _urls(self) -> list[str]:
        return self.service.urls() if self.service is not None else []
