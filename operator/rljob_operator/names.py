"""Deterministic names and labels of an RLJob's children (pure; decided before any side effect)."""

from __future__ import annotations

import re

#: KubeRay rejects RayJob names longer than this: it appends 6 characters to make the RayCluster name,
#: which may have at most 53 (utils.MaxRayJobNameLength in ray-operator).
MAX_RAYJOB_NAME_LENGTH = 47
#: KubeRay also requires a RayJob name to be a DNS-1035 label (starts with a letter). Match it with
#: `fullmatch`: `$` alone also matches before a final newline, so "demo\n" would pass.
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

CONFIG_KEY = "config.yaml"
CONFIG_MOUNT_DIR = "/etc/hybridflow"
CONFIG_PATH = f"{CONFIG_MOUNT_DIR}/{CONFIG_KEY}"
#: The smoke run's trainer config, a second key of the same ConfigMap.
SMOKE_CONFIG_KEY = "smoke-config.yaml"
SMOKE_CONFIG_PATH = f"{CONFIG_MOUNT_DIR}/{SMOKE_CONFIG_KEY}"
SMOKE_SUFFIX = "-smoke"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_RLJOB = "rl.hybridflow.dev/rljob"
LABEL_ATTEMPT = "rl.hybridflow.dev/attempt"
#: On the smoke run's RayJob and pods (spec.runPolicy.smokeRun), which carry no attempt label.
LABEL_SMOKE_RUN = "rl.hybridflow.dev/smoke-run"
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
MANAGED_BY = "rljob-operator"

WORKER_GROUP = "workers"


def config_map_name(rljob_name: str) -> str:
    """Name of the ConfigMap holding the resolved trainer config: `<rljob>-config`."""
    return f"{rljob_name}-config"


def ray_job_name(rljob_name: str, attempt: int) -> str:
    """Name of the RayJob of one attempt (1-based): `<rljob>-a<attempt>`, e.g. `demo-a2`."""
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    return f"{rljob_name}-a{attempt}"


def smoke_run_name(rljob_name: str) -> str:
    """Name of the RayJob of the smoke run (spec.runPolicy.smokeRun): `<rljob>-smoke`."""
    return f"{rljob_name}{SMOKE_SUFFIX}"


def max_rljob_name_length(max_attempt: int, smoke_run: bool = False) -> int:
    """Longest RLJob name whose RayJob for attempt `max_attempt` (and its smoke run's) satisfies KubeRay's limit."""
    suffix = max(len(f"-a{max_attempt}"), len(SMOKE_SUFFIX) if smoke_run else 0)
    return MAX_RAYJOB_NAME_LENGTH - suffix


def base_labels(rljob_name: str) -> dict[str, str]:
    """Labels on every child of an RLJob (standard app.kubernetes.io labels plus the owner)."""
    return {
        LABEL_NAME: "rljob",
        LABEL_INSTANCE: rljob_name,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_RLJOB: rljob_name,
    }


def attempt_labels(rljob_name: str, attempt: int) -> dict[str, str]:
    """Labels on the children of one attempt: base labels plus `rl.hybridflow.dev/attempt`."""
    return {**base_labels(rljob_name), LABEL_ATTEMPT: str(attempt)}


def smoke_run_labels(rljob_name: str) -> dict[str, str]:
    """Labels on the smoke run's RayJob and pods: base labels plus `rl.hybridflow.dev/smoke-run`."""
    return {**base_labels(rljob_name), LABEL_SMOKE_RUN: "true"}


def attempt_selector(rljob_name: str) -> str:
    """Label selector matching every RayJob (all attempts, and the smoke run) of an RLJob."""
    return f"{LABEL_RLJOB}={rljob_name},{LABEL_MANAGED_BY}={MANAGED_BY}"
