"""Single controller: resource pools, worker groups and the `@register` dispatch decorator."""

from hybridflow.controller.decorator import Dispatch, Execute, register
from hybridflow.controller.resource_pool import RayResourcePool, ResourcePoolManager
from hybridflow.controller.worker import Worker
from hybridflow.controller.worker_group import GroupFuture, RayClassWithInitArgs, RayWorkerGroup

__all__ = [
    "Dispatch",
    "Execute",
    "GroupFuture",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePoolManager",
    "Worker",
    "register",
]
