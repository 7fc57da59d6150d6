"""kopf handlers: the only module with @kopf decorators; each hands off to `Runtime.reconcile`.

Triggers: an RLJob resumed/created/updated; an event on one of our RayJobs (routed to its owner by
the `rl.hybridflow.dev/rljob` label); a periodic resync (level-based; it also reads each running
trainer's progress into status and restarts an attempt whose step stops advancing, issue 6); a delayed
reconcile when a plan asks for one (`Plan.requeue_after`: a finished job's TTL runs out then); an event on
one of our pods (status.roles, RolesReady; a lost pod, see role_status). The
resync is our own task rather than `@kopf.timer`, because kopf 1.45 puts a finalizer on every object
with a timer, and deletion should need no running operator. Three kopf
indexes keep the RLJobs, our RayJobs and a small view of our pods in memory, so a reconcile needs no extra
reads. kopf fills
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

import aiohttp
import kopf

from rljob_operator import api, metrics, names, peering, reconcile, role_status
from rljob_operator.builders import RAY_API_VERSION
from rljob_operator.kube import KubeApiError, KubeClient, load_credentials
from rljob_operator.reconcile import TrainerRead
from rljob_operator.roles import TRAINER
from rljob_operator.settings import Settings
from rljob_operator.status import TERMINAL_PHASES, Abandon, attempt_of, rayjob_outcome
from rljob_operator.trainer_progress import StepWatch, is_stalled, stall_message, watch_step

RLJOBS = (api.GROUP, api.VERSION, api.PLURAL)
RAYJOBS = (*RAY_API_VERSION.split("/"), "rayjobs")
PODS = ("", "v1", "pods")
OURS = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
log = logging.getLogger(__name__)


def plain(body: Mapping[str, Any]) -> dict[str, Any]:
    """A deep, plain-dict copy of a kopf body (safe to keep and to mutate)."""
    return {k: copy.deepcopy(v) for k, v in body.items()}


def current_rayjob(rljob: dict[str, Any], rayjobs: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The RayJob of the RLJob's current attempt (status.attempt), if it is known."""
    attempt = (rljob.get("status") or {}).get("attempt")
    return next((r for r in rayjobs if attempt_of(r) == attempt), None)


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
    indexes: dict[str, Any] = field(default_factory=lambda: {"rljobs": {}, "rayjobs": {}, "pods": {}})
    resync_task: asyncio.Task[None] | None = None
    #: HTTP session for reading trainers' /metrics (opened at start-up).
    trainers: aiohttp.ClientSession | None = None
    #: Per RLJob uid: the stall clock of its running attempt.
    watches: dict[str, StepWatch] = field(default_factory=dict)
    #: RLJobs whose trainer was read while running (they get one last read once finished).
    reading: set[str] = field(default_factory=set)
    #: Per RLJob uid: the last reason its progress could not be read (logged when it changes).
    unread: dict[str, str] = field(default_factory=dict)
    read_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(16))
    #: Per RLJob uid: the pending delayed reconcile (a finished job's TTL, Plan.requeue_after).
    requeues: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    #: Per RLJob uid: its current attempt's pods as last seen, and the pods it lost (role_status).
    tracks: dict[str, role_status.RoleTrack] = field(default_factory=dict)

    async def reconcile(self, rljob: dict[str, Any], rayjobs: Iterable[dict[str, Any]], trigger: str, *,
                        progress: dict[str, Any] | None = None, abandon: Abandon | None = None) -> None:
        """Reconcile one RLJob under its lock, using the newest copy of it we know of."""
        uid = rljob["metadata"]["uid"]
        rayjobs = list(rayjobs)
        async with self.locks[uid]:
            known = self.latest.get(uid)
            if known and int(known["metadata"]["resourceVersion"]) > int(rljob["metadata"]["resourceVersion"]):
                rljob = known  # our own status write is newer than the event that triggered us
            now = datetime.datetime.now(datetime.timezone.utc)
            roles, lost, wait = self.observe_pods(uid, rljob, rayjobs, now)
            try:
                with metrics.RECONCILE_SECONDS.time():
                    plan, written = await reconcile.reconcile(self.client, rljob, rayjobs, now,
                                                              progress=progress, abandon=abandon or lost, roles=roles,
                                                              default_image=self.settings.trainer_image,
                                                              pod_defaults=self.settings.pod_defaults)
            except Exception as err:
                metrics.RECONCILE_ERRORS.labels(trigger=trigger, error=type(err).__name__).inc()
                raise
            metrics.RECONCILES.labels(trigger=trigger).inc()
            self.latest[uid] = written
            self.tracker.set(uid, plan.status.get("phase"))
        delays = [d for d in (plan.requeue_after, wait) if d is not None]
        if delays:
            self.requeue(uid, min(delays))

    def observe_pods(self, uid: str, rljob: dict[str, Any], rayjobs: list[dict[str, Any]], now: datetime.datetime
                     ) -> tuple[role_status.RolesSeen, Abandon | None, float | None]:
        """Look at the RLJob's pods again: what status.roles shows, the end of the attempt when it lost a trainer
        pod, and when to look again for a loss not yet confirmed (role_status.confirm_losses)."""
        status, meta = rljob.get("status") or {}, rljob["metadata"]
        pods = self.indexes["pods"].get((meta["namespace"], meta["name"]), [])
        track = self.tracks[uid] = role_status.track_pods(self.tracks.get(uid), status, pods, now)
        rayjob = current_rayjob(rljob, rayjobs)
        running = rayjob is not None and not rayjob["metadata"].get("deletionTimestamp") \
            and rayjob_outcome(rayjob) in ("starting", "running")
        losses, wait = role_status.confirm_losses(track, now, self.settings.pod_loss_grace_seconds, running,
                                                  trainer_running=status.get("phase") == "Running")
        for loss in losses:
            metrics.PODS_LOST.labels(role=loss.role).inc()
        ended = track.ended_by
        lost = Abandon("TrainerPodLost", role_status.trainer_loss_message(ended, track.attempt)) \
            if ended is not None else None
        return role_status.roles_seen(track, [x for x in losses if x.role != TRAINER]), lost, wait

    def requeue(self, uid: str, delay: float) -> None:
        """Reconcile an RLJob again in `delay` seconds (replacing a pending requeue of it)."""
        pending = self.requeues.get(uid)
        if pending is not None and pending is not asyncio.current_task():
            pending.cancel()
        self.requeues[uid] = asyncio.create_task(self._requeued(uid, delay))

    async def _requeued(self, uid: str, delay: float) -> None:
        """The delayed reconcile: the newest known copy of the RLJob, if this replica is the active one.

        A standby skips it; the active replica's own reconcile (resume, resync) schedules it again.
        """
        # A little late rather than early: the TTL is compared with whole-second timestamps.
        await asyncio.sleep(delay + 0.05)
        known = self.latest.get(uid)
        if known is None or not await self.active():
            return
        key = (known["metadata"]["namespace"], known["metadata"]["name"])
        current = max([known, *self.indexes["rljobs"].get(key, [])], key=lambda o: int(o["metadata"]["resourceVersion"]))
        try:
            await self.reconcile(current, list(self.indexes["rayjobs"].get(key, [])), "requeue")
        except KubeApiError as err:
            if err.code == 404:
                self.forget(uid)
            else:
                log.warning("delayed reconcile of %s/%s failed: %s; the next resync retries", *key, err)
        except Exception:  # a task nobody awaits: log here, the next resync retries
            log.exception("delayed reconcile of %s/%s failed", *key)

    async def resync_forever(self) -> None:
        """Every `resync_seconds`, reconcile every known RLJob again, with its trainer's progress."""
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            if not await self.active():
                continue
            jobs = []
            for uid, known in list(self.latest.items()):
                key = (known["metadata"]["namespace"], known["metadata"]["name"])
                current = max([known, *self.indexes["rljobs"].get(key, [])],
                              key=lambda o: int(o["metadata"]["resourceVersion"]))
                jobs.append((uid, key, current, list(self.indexes["rayjobs"].get(key, []))))
            # Trainers are read concurrently (a slow endpoint costs its timeout once, not once per job).
            reads = await asyncio.gather(*(self.read_trainer(uid, job, rayjobs) for uid, _, job, rayjobs in jobs),
                                         return_exceptions=True)
            now = datetime.datetime.now(datetime.timezone.utc)
            for (uid, key, current, rayjobs), got in zip(jobs, reads, strict=True):
                if isinstance(got, BaseException):
                    log.error("reading the trainer of %s/%s failed: %r", *key, got)
                read = got if isinstance(got, TrainerRead) else None
                try:
                    stalled = self.check_stall(uid, current, read, now)
                    await self.reconcile(current, rayjobs, "timer", progress=read.fragment if read else None,
                                         abandon=Abandon("Stalled", stalled) if stalled else None)
                except KubeApiError as err:
                    if err.code == 404:
                        self.forget(uid)  # deleted while we were not looking
                    else:
                        log.warning("resync of %s/%s failed: %s", *key, err)
                except Exception:  # keep the loop alive; the error is counted in metrics
                    log.exception("resync of %s/%s failed", *key)

    async def read_trainer(self, uid: str, rljob: dict[str, Any],
                           rayjobs: list[dict[str, Any]]) -> TrainerRead | None:
        """Read the trainer of a running RLJob (and once more when it finished); None: not read."""
        phase = (rljob.get("status") or {}).get("phase")
        if phase == "Running":
            self.reading.add(uid)
        elif phase in TERMINAL_PHASES and uid in self.reading:
            self.reading.discard(uid)  # the last steps may have landed after the previous read
        else:
            return None
        async with self.read_slots:
            if self.trainers is None:
                self.trainers = aiohttp.ClientSession()
            read = await reconcile.read_progress(self.trainers, rljob, current_rayjob(rljob, rayjobs),
                                                 url_template=self.settings.trainer_metrics_url)
        problem = "; ".join(read.problems) if read.fragment is None else ""
        if problem and problem != self.unread.get(uid):
            log.warning("cannot read the progress of RLJob %s/%s: %s", rljob["metadata"]["namespace"],
                        rljob["metadata"]["name"], problem)
        self.unread[uid] = problem
        return read

    def check_stall(self, uid: str, rljob: dict[str, Any], read: TrainerRead | None,
                    now: datetime.datetime) -> str | None:
        """Keep the stall clock of a running attempt; the stall message once no step came for the timeout."""
        status, spec = rljob.get("status") or {}, rljob.get("spec") or {}
        timeout = (spec.get("runPolicy") or {}).get("stallTimeoutSeconds")
        if status.get("phase") != "Running" or not timeout:
            self.watches.pop(uid, None)  # the clock only runs while the trainer runs
            return None
        step = (((read.fragment if read else None) or {}).get("progress") or {}).get("step")
        watch = self.watches[uid] = watch_step(self.watches.get(uid), int(status.get("attempt") or 1), step, now)
        if not is_stalled(watch, now, int(timeout)):
            return None
        return stall_message(watch, int(timeout), self.unread.get(uid) or None)

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
        self.watches.pop(uid, None)
        self.unread.pop(uid, None)
        self.reading.discard(uid)
        self.tracks.pop(uid, None)
        self.tracker.set(uid, None)
        pending = self.requeues.pop(uid, None)
        if pending is not None and pending is not asyncio.current_task():
            pending.cancel()


def _indexes(memo: Any, kwargs: dict[str, Any]) -> tuple[kopf.Index[Any, Any], kopf.Index[Any, Any]]:
    """kopf passes indexes as keyword arguments named after the index functions; keep them for the resync."""
    rayjobs, rljobs = kwargs["rayjobs_by_owner"], kwargs["rljobs_by_name"]
    memo.runtime.indexes.update(rljobs=rljobs, rayjobs=rayjobs, pods=kwargs["pods_by_owner"])
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
    if not ours.clusterwide and await client.may("list", "", "namespaces") is False:
        # Namespaced RBAC (the chart's rbac.scope=namespaced): kopf would retry the refused namespace list for
        # about a minute before watching anything. Watch the namespaces as given instead, and the resource
        # kinds found now (its CRD scan needs a cluster-wide grant too): KubeRay installed later needs a restart.
        settings.scanning.disabled = True
        logger.info("not allowed to list namespaces: watching %s as given; resource kinds (KubeRay's CRDs) are "
                    "read once, at this start", ", ".join(ours.namespaces))
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
        for pending in runtime.requeues.values():
            pending.cancel()
        await runtime.client.__aexit__(None, None, None)
        if runtime.trainers is not None:
            await runtime.trainers.close()
        if runtime.http is not None:
            await runtime.http.cleanup()


@kopf.index(*RAYJOBS, labels=OURS)
def rayjobs_by_owner(body: kopf.Body, namespace: str | None, labels: Mapping[str, str], **_: Any) -> dict[Any, Any]:
    """Our RayJobs by (namespace, owner RLJob name)."""
    return {(namespace, labels.get(names.LABEL_RLJOB)): plain(body)}


@kopf.index(*PODS, labels=OURS)
def pods_by_owner(body: kopf.Body, namespace: str | None, labels: Mapping[str, str], **_: Any) -> dict[Any, Any] | None:
    """What the operator keeps of our pods (role_status.PodView), by (namespace, owner RLJob name); not the
    smoke run's."""
    view = role_status.view_pod(plain(body))
    return None if view is None else {(namespace, labels.get(names.LABEL_RLJOB)): view}


@kopf.on.event(*PODS, labels=OURS)
async def pod_event(namespace: str | None, labels: Mapping[str, str], memo: Any, **kwargs: Any) -> None:
    """One of our pods changed (ready, restarted, failed, deleted): reconcile its owner (status.roles)."""
    rayjobs, rljobs = _indexes(memo, kwargs)
    key = (namespace, labels.get(names.LABEL_RLJOB))
    for rljob in list(rljobs.get(key, [])):
        await memo.runtime.reconcile(rljob, rayjobs.get(key, []), "pod")


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
