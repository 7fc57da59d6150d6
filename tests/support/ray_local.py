"""A local Ray session for tests: one `ray.init` per block, shut down at its end."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def local_ray(num_cpus: int) -> Iterator[None]:
    """Run a local Ray session with `num_cpus` logical CPUs (no dashboard, no driver log) for the block."""
    import ray  # imported here so that modules skipped for other reasons collect without Ray

    # Ray 2.60 turns token auth on by default (writing ~/.ray/auth_token); a test session needs none.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@contextmanager
def local_ray_address(num_cpus: int) -> Iterator[str]:
    """`local_ray`, yielding the session's address for drivers started as subprocesses (RAY_ADDRESS)."""
    import ray

    with local_ray(num_cpus):
        yield ray.get_runtime_context().gcs_address
