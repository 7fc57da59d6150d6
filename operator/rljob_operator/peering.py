"""Two or more replicas, one active: kopf peering, plus the same rule for our own resync loop.

kopf pauses its watches when a live peer with a higher priority exists, and pauses every operator
when two share a priority (https://docs.kopf.dev/en/latest/peering/). Replicas of one Deployment
therefore need different priorities: each replica picks a random one at start-up unless
`--priority` is given, so the replica with the highest priority is active and the others wait. When
the active one stops, it removes its keep-alive and another takes over at once; when it dies
without stopping, another takes over once the keep-alive's lifetime (`--peering-lifetime`) is over.

kopf only pauses what it runs. Our periodic resync is a plain asyncio task (see handlers.py for
why), so it checks the peering object with `is_active`, kopf's rule, before each round.
"""

from __future__ import annotations

import datetime
import logging
import os
import secrets
import socket
from collections.abc import Mapping
from typing import Any

from rljob_operator.kube import KubeApiError, KubeClient

Obj = dict[str, Any]
API_VERSION = "kopf.dev/v1"
log = logging.getLogger(__name__)


def own_identity(env: Mapping[str, str] | None = None) -> str:
    """This process's id in the peering object: the pod name (POD_ID, as kopf reads it) or host/pid."""
    env = os.environ if env is None else env
    base = env.get("POD_ID") or socket.gethostname()
    return f"{base}/{os.getpid()}/{secrets.token_hex(2)}"


def random_priority() -> int:
    """A priority for a replica started without `--priority` (collisions: 1 in ~10^9)."""
    return 1 + secrets.randbelow(2**30)


def peering_object(name: str, namespace: str | None) -> Obj:
    """The ClusterKopfPeering (namespace None) or KopfPeering object kopf writes keep-alives into."""
    if namespace is None:
        return {"apiVersion": API_VERSION, "kind": "ClusterKopfPeering", "metadata": {"name": name}}
    return {"apiVersion": API_VERSION, "kind": "KopfPeering", "metadata": {"name": name, "namespace": namespace}}


def _parse_time(value: Any) -> datetime.datetime | None:
    try:
        stamp = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=datetime.timezone.utc)


def is_active(peers: Mapping[str, Any], identity: str, priority: int, now: datetime.datetime) -> bool:
    """kopf's rule: active unless another live peer has a priority >= ours (equal ones pause each other)."""
    for peer_id, info in peers.items():
        if peer_id == identity or not isinstance(info, Mapping):
            continue
        seen = _parse_time(info.get("lastseen"))
        lifetime = datetime.timedelta(seconds=int(info.get("lifetime", 60)))
        if seen is not None and seen + lifetime <= now:
            continue  # dead: its keep-alive expired
        if int(info.get("priority", 0)) >= priority:
            return False
    return True


async def ensure_peering(client: KubeClient, name: str, namespaces: tuple[str, ...]) -> None:
    """Create the peering object(s) when missing, so that replicas see each other from the start."""
    for namespace in namespaces or (None,):
        try:
            await client.create(peering_object(name, namespace))
        except KubeApiError as err:
            if err.code == 409:
                continue
            # 404: kopf's peering CRDs are not installed (kopf then runs alone and says so);
            # 403: no RBAC to create it (the Helm chart creates it).
            log.warning("cannot create the peering object %s%s (%s); install crds/kopf.dev_peerings.yaml and "
                        "create it, or run a single replica with --standalone", name,
                        f" in {namespace}" if namespace else "", err)


async def check_active(client: KubeClient, name: str, namespaces: tuple[str, ...], identity: str,
                       priority: int, now: datetime.datetime) -> bool:
    """Whether this replica is the active one according to the peering object(s); True when there is none."""
    for namespace in namespaces or (None,):
        obj = peering_object(name, namespace)
        plural = "clusterkopfpeerings" if namespace is None else "kopfpeerings"
        try:
            current = await client.get(API_VERSION, plural, namespace, obj["metadata"]["name"])
        except KubeApiError as err:
            if err.code in (403, 404):
                continue
            raise
        if not is_active(current.get("status") or {}, identity, priority, now):
            return False
    return True
