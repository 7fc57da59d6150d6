"""`trainer.sandbox`: the code sandbox as a service, on the RLJob's sandbox pods (HybridFlow, not a verl key).

With `replicas` > 0 and an RLJob sandbox role (spec.roles.sandbox, which the operator names in
$HYBRIDFLOW_ROLE_RESOURCES), the trainer starts that many SandboxFusion-compatible `run_code` servers as Ray
actors, one on each sandbox pod, and points the code consumers that have no URL of their own at them: every
code_interpreter tool (verl's SandboxFusionTool) without `sandbox_fusion_url`, and the built-in code scorers
(codecontests, apps, codeforces, taco) when `reward_model.sandbox_fusion.url` is null. Without the role (a local
run) nothing changes: code runs in the local sandbox of the process that calls it. The operator sizes the role
from `replicas`, so the manifest and the trainer cannot disagree (rljob_operator.roles).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from .common import Section

if TYPE_CHECKING:
    from .root import HybridFlowConfig

#: No real job runs more sandbox pods; the bound keeps a typo (an extra digit or ten) from sizing a cluster.
MAX_SANDBOX_REPLICAS = 4096


class SandboxServiceConfig(Section):
    """run_code servers on the RLJob's sandbox pods (see the module docstring)."""

    replicas: int = Field(
        default=0,
        ge=0,
        le=MAX_SANDBOX_REPLICAS,
        description="HybridFlow addition (not in verl): run_code servers on the RLJob's sandbox role, one per sandbox "
        "pod (spec.roles.sandbox gets this many pods); 0: no servers, code runs in the local sandbox of the process "
        "that calls it (or at a configured sandbox_fusion_url). Without a sandbox role (a local run) it has no effect.",
    )
    max_concurrency: int = Field(
        default=4,
        ge=1,
        description="Programs each server runs at once (further requests wait); give each sandbox pod at least this "
        "many CPUs.",
    )


#: Where each kind of code consumer is configured (named in messages).
TOOL_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
REWARD_KEY = "reward_model.sandbox_fusion.url"


def sandbox_consumers(cfg: HybridFlowConfig) -> tuple[list[str], list[str]]:
    """(the code consumers sandbox servers could serve, by what the config alone shows; why each other one cannot).

    Consumers: "tools" (a tool config, which may list a code_interpreter tool without sandbox_fusion_url) and
    "reward" (the built-in code scorers with reward_model.sandbox_fusion.url null). The tool config file and the
    data sources decide the rest when the trainer starts (hybridflow.controller.sandbox_service.plan_sandbox).
    """
    users: list[str] = []
    why_not: list[str] = []
    if cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path:
        users.append("tools")
    else:
        why_not.append(f"no tool config ({TOOL_KEY} is unset)")
    rm = cfg.reward_model
    reward_out = (
        "a reward model scores every response (reward_model.enable)" if rm.enable
        else "custom_reward_function.path replaces the built-in code scorers" if cfg.custom_reward_function.path
        else "reward_model.reward_manager batch calls a user function" if rm.reward_manager == "batch"
        else f"the code scorers use their own service ({REWARD_KEY} is {rm.sandbox_fusion.url})"
        if rm.sandbox_fusion.url else None
    )
    if reward_out is None:
        users.append("reward")
    else:
        why_not.append(reward_out)
    return users, why_not
