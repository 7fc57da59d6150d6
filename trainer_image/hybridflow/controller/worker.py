"""Base class for the Ray actors of a worker group: rank, world size and torch.distributed set-up.

`RayWorkerGroup` creates rank 0 first; rank 0 picks the rendezvous address (its node IP and a free
port); the other ranks are created with it. Every rank finds `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
`MASTER_ADDR` and `MASTER_PORT` in `os.environ` before the subclass's `__init__` runs, which is what
`torch.distributed.init_process_group(init_method="env://")` reads.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from hybridflow.controller.decorator import Dispatch, register

DIST_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def find_free_port() -> int:
    """A TCP port free on this host right now (bound then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def node_ip_address() -> str:
    """This node's address as Ray sees it (the interface other nodes reach), else 127.0.0.1."""
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:  # not inside Ray (unit tests, single process)
        return "127.0.0.1"


class Worker:
    """A member of a worker group; subclasses add `@register`-ed methods.

    Outside a group (tests, a single process) the rank is 0 of 1 unless the environment says otherwise.
    """

    def __init__(self) -> None:
        self._rank = int(os.environ.get("RANK", "0"))
        self._world_size = int(os.environ.get("WORLD_SIZE", "1"))

    @property
    def rank(self) -> int:
        """This worker's global rank in its group."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Number of workers in the group."""
        return self._world_size

    def init_distributed(self, backend: str) -> None:
        """Join the group's torch.distributed process group (`gloo` on CPU, `nccl` on GPU); idempotent.

        Call it from a group method (e.g. `init_model`), never from `__init__`: the group creates rank 0
        and waits for its `__init__` to finish before creating the other ranks, so a rendezvous in
        `__init__` would wait forever.
        """
        import torch.distributed as dist

        if dist.is_initialized():
            return
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise RuntimeError(
                f"torch.distributed set-up needs {missing} in the environment; create this worker "
                "through RayWorkerGroup (which sets them) or export them before calling init_distributed"
            )
        dist.init_process_group(backend=backend, rank=self.rank, world_size=self.world_size)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_dist_info(self) -> dict[str, Any]:
        """Rank, world size, rendezvous address and host (for checks and debugging)."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "master_addr": os.environ.get("MASTER_ADDR"),
            "master_port": os.environ.get("MASTER_PORT"),
            "pid": os.getpid(),
            "node_ip": node_ip_address(),
        }

    def _hybridflow_master_address(self) -> tuple[str, str]:
        """Rank 0 only: the rendezvous address it chose at start-up (read by the group)."""
        return os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]


def apply_dist_env(dist_env: dict[str, str]) -> None:
    """Export the group's rendezvous variables; rank 0 picks MASTER_ADDR/PORT when they are absent."""
    os.environ.update(dist_env)
    if dist_env.get("RANK") == "0" and "MASTER_PORT" not in dist_env:
        os.environ["MASTER_ADDR"] = node_ip_address()
        os.environ["MASTER_PORT"] = str(find_free_port())
