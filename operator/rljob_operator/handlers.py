"""kopf handlers: the only module with @kopf decorators; each hands off to `Runtime.reconcile`.

Triggers: an RLJob resumed/created/updated; an event on one of our RayJobs (routed to its owner by
the `rl.hybridflow.dev/rljob` label); a periodic resync (level-based, and the progress hook). The
resync is our own task rather than `@kopf.timer`, because kopf 1.45 puts a finalizer on every object
with a timer, and deletion should need no running operator. Two kopf
indexes keep the RLJobs and our RayJobs in memory, so a reconcile needs no extra reads. kopf fills
every index before the first handler runs, so a restarted operator sees existing RayJobs and creates
no duplicates. Deletion adds no finalizer: children carry ownerReferences and the garbage collector
removes them.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from rljob_operator import api, metrics, names, peering, reconcile
from rljob_operator.builders import RAY_API_VERSION
from rljob_operator.kube import KubeApiError, KubeClient, load_credentials
from rljob_operator.settings import Settings

RLJOBS = (api.GROUP, api.VERSION, api.PLURAL)
RAYJOBS = (*RAY_API_VERSION.split("/"), "rayjobs")
OURS = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
log = logging.getLogger(__name__)


def plain(body: Mapping[str, Any]) -> dict[str, Any]:
    """A deep, plain-dict copy of a kopf body (safe to keep and to mutate)."""
    return {k: copy.deepcopy(v) for k, v in body.items()}


def read_progress(rljob: dict[str, Any], rayjob: dict[str, Any] | None) -> dict[str, Any] | None:
    """Hook for the trainer's progress and metrics (status.progress/metrics/checkpoint).

    Not implemented yet (a later issue): it will read the driver's Prometheus endpoint or the JSONL
    next to the checkpoints and return a status fragment; None means "nothing new".
    """
    return None


@dataclass
class Runtime:
    """What the handlers share (kept in kopf's memo): settings, the API client, per-job locks and caches."""

    settings: Settings
    client: KubeClient
    identity: str = ""
    http: Any = None
    tracker: metrics.PhaseTracker = field(default_factory=metrics.PhaseTracker)
    locks: defaultdict[str, asyncio.Lock] = field(default_factory=lambda: defaultdict(asyncio.Lock))
    latest: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: kopf's live indexes, captured from the first handler call (activities do not receive them).
    indexes: dict[str, Any] = field(default_factory=lambda: {"rljobs": {}, "rayjobs": {}})
    resync_task: asyncio.Task[None] | None = None

    async def reconcile(self, rljob: dict[str, Any], rayjobs: Iterable[dict[str, Any]], trigger: str) -> None:
        """Reconcile one RLJob under its lock, using the newest copy of it we know of."""
        uid = rljob["metadata"]["uid"]
        async with self.locks[uid]:
            known = self.latest.get(uid)
            if known and int(known["metadata"]["resourceVersion"]) > int(rljob["metadata"]["resourceVersion"]):
                rljob = known  # our own status write is newer than the event that triggered us
            try:
                with metrics.RECONCILE_SECONDS.time():
                    plan, written = await reconcile.reconcile(self.client, rljob, list(rayjobs),
                                                              datetime.datetime.now(datetime.timezone.utc))
            except Exception as err:
                metrics.RECONCILE_ERRORS.labels(trigger=trigger, error=type(err).__name__).inc()
                raise
            metrics.RECONCILES.labels(trigger=trigger).inc()
            self.latest[uid] = written
            self.tracker.set(uid, plan.status.get("phase"))

    async def resync_forever(self) -> None:
        """Every `resync_seconds`, reconcile every known RLJob again (and read its progress)."""
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            if not await self.active():
                continue
            for uid, known in list(self.latest.items()):
                key = (known["metadata"]["namespace"], known["metadata"]["name"])
                current = max([known, *self.indexes["rljobs"].get(key, [])],
                              key=lambda o: int(o["metadata"]["resourceVersion"]))
                rayjobs = list(self.indexes["rayjobs"].get(key, []))
                read_progress(current, max(rayjobs, key=lambda r: r["metadata"]["name"], default=None))
                try:
                    await self.reconcile(current, rayjobs, "timer")
                except KubeApiError as err:
                    if err.code == 404:
                        self.forget(uid)  # deleted while we were not looking
                    else:
                        log.warning("resync of %s/%s failed: %s", *key, err)
                except Exception:  # keep the loop alive; the error is counted in metrics
                    log.exception("resync of %s/%s failed", *key)

    async def active(self) -> bool:
        """Whether this replica is the active one (kopf pauses its handlers, not our resync task)."""
        ours = self.settings
        if ours.peering is None or ours.priority is None:
            return True
        try:
            return await peering.check_active(self.client, ours.peering, ours.namespaces, self.identity,
                                              ours.priority, datetime.datetime.now(datetime.timezone.utc))
        except Exception as err:  # cannot tell: skip this round rather than risk acting twice
            log.warning("cannot read the peering object %s: %s; skipping this resync", ours.peering, err)
            return False

    def forget(self, uid: str) -> None:
        """Drop a deleted RLJob from caches and metrics."""
        self.latest.pop(uid, None)
        self.locks.pop(uid, None)
        self.tracker.set(uid, None)


def _indexes(memo: Any, kwargs: dict[str, Any]) -> tuple[kopf.Index[Any, Any], kopf.Index[Any, Any]]:
    """kopf passes indexes as keyword arguments named after the index functions; keep them for the resync."""
    rayjobs, rljobs = kwargs["rayjobs_by_owner"], kwargs["rljobs_by_name"]
    memo.runtime.indexes.update(rljobs=rljobs, rayjobs=rayjobs)
    return rayjobs, rljobs


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: Any, logger: logging.Logger | logging.LoggerAdapter[Any], **_: Any) -> None:
    """Configure kopf, open the API client and the metrics endpoint."""
    ours: Settings = memo.settings
    settings.posting.level = logging.WARNING  # handler warnings/errors become Events on the RLJob
    settings.peering.mandatory = False  # without kopf's peering CRD: warn and run alone
    settings.peering.lifetime = ours.peering_lifetime
    settings.watching.server_timeout = 300  # re-establish watches now and then, like kubectl does
    client = KubeClient(load_credentials(), on_error=metrics.record_api_error)
    await client.__aenter__()
    memo.runtime = Runtime(settings=ours, client=client, identity=getattr(memo, "identity", ""))
    if ours.peering:
        await peering.ensure_peering(client, ours.peering, ours.namespaces)
    memo.runtime.resync_task = asyncio.create_task(memo.runtime.resync_forever())
    if ours.metrics_port:
        memo.runtime.http = await metrics.start_http(ours.metrics_port)
    logger.info("rljob operator started: namespaces=%s peering=%s priority=%s metrics-port=%s",
                list(ours.namespaces) or "all", ours.peering or "standalone", ours.priority,
                ours.metrics_port or "off")


@kopf.on.cleanup()
async def cleanup(memo: Any, **_: Any) -> None:
    """Close the API client and the metrics endpoint."""
    runtime: Runtime | None = getattr(memo, "runtime", None)
    if runtime is not None:
        if runtime.resync_task is not None:
            runtime.resync_task.cancel()
        await runtime.client.__aexit__(None, None, None)
        if runtime.http is not None:
            await runtime.http.cleanup()


@kopf.index(*RAYJOBS, labels=OURS)
def rayjobs_by_owner(body: kopf.Body, namespace: str | None, labels: Mapping[str, str], **_: Any) -> dict[Any, Any]:
    """Our RayJobs by (namespace, owner RLJob name)."""
    return {(namespace, labels.get(names.LABEL_RLJOB)): plain(body)}


@kopf.index(*RLJOBS)
def rljobs_by_name(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[Any, Any]:
    """RLJobs by (namespace, name)."""
    return {(namespace, name): plain(body)}


@kopf.on.resume(*RLJOBS, backoff=5)
@kopf.on.create(*RLJOBS, backoff=5)
@kopf.on.update(*RLJOBS, backoff=5)
async def rljob_changed(body: kopf.Body, namespace: str | None, name: str, memo: Any, **kwargs: Any) -> None:
    """An RLJob appeared or its spec/metadata changed: reconcile it."""
    rayjobs, rljobs = _indexes(memo, kwargs)
    await memo.runtime.reconcile(plain(body), rayjobs.get((namespace, name), []), "rljob")


@kopf.on.event(*RAYJOBS, labels=OURS)
async def rayjob_event(namespace: str | None, labels: Mapping[str, str], memo: Any, **kwargs: Any) -> None:
    """One of our RayJobs changed (KubeRay status, deletion): reconcile its owner."""
    rayjobs, rljobs = _indexes(memo, kwargs)
    key = (namespace, labels.get(names.LABEL_RLJOB))
    for rljob in list(rljobs.get(key, [])):
        await memo.runtime.reconcile(rljob, rayjobs.get(key, []), "rayjob")


@kopf.on.delete(*RLJOBS, optional=True)
async def rljob_deleted(uid: str, memo: Any, **_: Any) -> None:
    """An RLJob is gone: forget it (its children are garbage-collected through ownerReferences)."""
    memo.runtime.forget(uid)
