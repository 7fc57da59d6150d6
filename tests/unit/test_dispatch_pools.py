"""Resource pool sizing and role mapping (no Ray cluster needed)."""

from __future__ import annotations

import pytest

from hybridflow.controller import RayResourcePool, ResourcePoolManager


def test_pool_world_size_and_colocated_shares() -> None:
    pool = RayResourcePool([2, 2], use_gpu=True, max_colocate_count=2, cpus_per_process=4.0)
    assert pool.world_size == 4
    assert pool.bundle() == {"CPU": 4.0, "GPU": 1.0}
    assert pool.actor_resources() == {"num_cpus": 2.0, "num_gpus": 0.5}
    cpu_pool = RayResourcePool([3], cpus_per_process=0.5)
    assert cpu_pool.bundle() == {"CPU": 0.5} and cpu_pool.actor_resources() == {"num_cpus": 0.5}


@pytest.mark.parametrize("nodes", [[], [0], [2, -1]])
def test_pool_rejects_empty_nodes(nodes: list[int]) -> None:
    with pytest.raises(ValueError, match="at least one process"):
        RayResourcePool(nodes)


def test_manager_maps_roles_and_reports_unknown_pools() -> None:
    manager = ResourcePoolManager({"global_pool": [2], "rollout_pool": [1]}, {"actor": "global_pool", "rollout": "rollout_pool"})
    assert manager.get_resource_pool("actor").world_size == 2
    assert manager.get_resource_pool("rollout").world_size == 1
    assert manager.get_resource_pool("actor") is manager.get_resource_pool("actor")
    with pytest.raises(KeyError, match="mapped roles"):
        manager.get_resource_pool("critic")
    with pytest.raises(ValueError, match="undefined resource pools"):
        ResourcePoolManager({"global_pool": [2]}, {"actor": "nope"})
