"""Roles on a real multi-node Ray cluster: each role's pool lands on that role's nodes.

The nodes are started with the custom resources the operator's RayJob gives each worker group
(`rayStartParams.resources`, read through a shell as KubeRay passes it to `ray start`), and the trainer's
pools are built from the `HYBRIDFLOW_ROLE_RESOURCES` the head pod carries, the way main_ppo builds them
(global pool for the actor, rollout pool for the rollout, split placement). Worker groups of real actors
then report the node they run on.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from hybridflow.controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayWorkerGroup,
    ResourcePoolManager,
    Worker,
    register,
)
from hybridflow.controller.resource_pool import role_resources_from_env
from rljob_operator import api, builders

pytestmark = [pytest.mark.ray, pytest.mark.slow]

JOB = {
    "apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "roles", "uid": "u"},
    "spec": {
        "config": {"trainer": {"nnodes": 1, "n_gpus_per_node": 2, "device": "cpu", "placement": "split"},
                   "actor_rollout_ref": {"rollout": {"mode": "async"}}},
        "resources": {"cpu": 2, "memory": "8Gi", "sharedMemory": "1Gi"},
        "roles": {"rollout": {"resources": {"cpu": 2}}},
    },
}  # fmt: skip


class WhereWorker(Worker):
    """Says which Ray node it runs on."""

    @register(Dispatch.ONE_TO_ALL)
    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def _groups() -> tuple[dict[str, Any], dict[str, str]]:
    rayjob = builders.build_rayjob(api.RLJob.model_validate(JOB), 1)
    cluster = rayjob["spec"]["rayClusterSpec"]
    advertised = {}
    for group in cluster["workerGroupSpecs"]:
        (value,) = shlex.split(group["rayStartParams"]["resources"])  # what `ray start --resources=` receives
        advertised[group["groupName"]] = json.loads(value)
    env = {e["name"]: e["value"] for e in cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
           if "value" in e}
    return advertised, env


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    import ray
    import ray.cloudpickle
    from ray.cluster_utils import Cluster

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    advertised, _ = _groups()
    # the head runs only the driver (rayStartParams num-cpus 0), as on the cluster
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    ids = {name: nodes.add_node(num_cpus=2, resources=resources).node_id for name, resources in advertised.items()}
    ray.init(address=nodes.address, include_dashboard=False, log_to_driver=False)
    nodes.wait_for_nodes()
    try:
        yield ids
    finally:
        ray.shutdown()
        nodes.shutdown()


def test_each_roles_pool_runs_on_its_roles_nodes(cluster: dict[str, str]) -> None:
    _, env = _groups()
    manager = ResourcePoolManager({"global_pool": [2], "rollout_pool": [2]},
                                  {"actor_rollout_ref": "global_pool", "rollout": "rollout_pool"},
                                  role_resources=role_resources_from_env(env))
    # the rollout pool first: without its resource it could take the trainer node, which has room for it
    rollout = RayWorkerGroup(manager.get_resource_pool("rollout"), RayClassWithInitArgs(WhereWorker),
                             name_prefix="rollout")
    actor = RayWorkerGroup(manager.get_resource_pool("actor_rollout_ref"), RayClassWithInitArgs(WhereWorker),
                           name_prefix="actor")
    assert set(rollout.node()) == {cluster["rollout"]}
    assert set(actor.node()) == {cluster["trainer"]}
