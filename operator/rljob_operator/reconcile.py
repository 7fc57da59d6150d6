"""Reconcile one RLJob: make its children exist for the current attempt, write status once, post Events.

Level-based and idempotent: the plan (`status.decide`) is computed from what is observed; child names
are fixed by the plan before any write; creates that hit 409 read the existing object instead; the
status is patched only when it differs from the one observed. Safe to run again at any moment. A
finished job whose `spec.runPolicy.ttlSecondsAfterFinished` passed has its RayJobs and ConfigMap deleted
here (`status.finished_plan` decides); the RLJob stays.

`read_progress` is the other I/O here: it asks a running trainer how far it got (its Prometheus
endpoint, else the progress record beside its checkpoints) for status.progress/metrics/checkpoint.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from hybridflow import yamlio
from rljob_operator import api, changes, metrics, names
from rljob_operator.builders import RAY_API_VERSION, build_children, build_smoke_children
from rljob_operator.kube import KubeApiError, KubeClient
from rljob_operator.role_status import RolesSeen
from rljob_operator.settings import TRAINER_METRICS_URL
from rljob_operator.status import (
    Abandon,
    Plan,
    attempt_of,
    decide,
    describe_smoke,
    is_smoke_run,
    rayjob_outcome,
)
from rljob_operator.trainer_progress import (
    PROGRESS_FILE,
    TrainerReport,
    build_progress_status,
    parse_progress_record,
    parse_trainer_metrics,
    trainer_metrics_url,
)
from rljob_operator.validation import validate_rljob

Obj = dict[str, Any]
log = logging.getLogger(__name__)


def nesting_problems(rljob: Obj) -> list[str]:
    """A problem when some value of the RLJob is nested deeper than the YAML loader allows, else none.

    The API server hands us JSON, which skips hybridflow.yamlio's depth limit; deeper values would make
    building, dumping or copying the children recurse too deep (issue 12), so they are refused up front.
    """
    path = yamlio.find_too_deep({k: v for k, v in rljob.items() if k != "status"})
    if path is None:
        return []
    return [f"{path}: nested deeper than {yamlio.DEFAULT_LIMITS.max_depth} levels; flatten it (no RLJob "
            "needs that many)"]


def owned_by(child: Obj, rljob: Obj) -> bool:
    """Whether `child` has a controller ownerReference to this very RLJob (same uid)."""
    uid = rljob["metadata"].get("uid")
    return any(ref.get("uid") == uid and ref.get("controller") for ref in
               (child.get("metadata") or {}).get("ownerReferences") or [])


async def ensure_configmap(client: KubeClient, desired: Obj) -> Obj:
    """Create the ConfigMap, or patch it when its data, labels or owner differ."""
    meta = desired["metadata"]
    try:
        return await client.create(desired)
    except KubeApiError as err:
        if err.code != 409:
            raise
    current = await client.get("v1", "configmaps", meta["namespace"], meta["name"])
    cur_meta = current["metadata"]
    if current.get("data") == desired["data"] and cur_meta.get("ownerReferences") == meta["ownerReferences"] \
            and {**(cur_meta.get("labels") or {}), **meta["labels"]} == cur_meta.get("labels"):
        return current
    patch = {"data": desired["data"], "metadata": {"labels": meta["labels"],
                                                   "ownerReferences": meta["ownerReferences"]}}
    return await client.patch("v1", "configmaps", meta["namespace"], meta["name"], patch)


async def ensure_rayjob(client: KubeClient, desired: Obj | None, existing: Obj | None,
                        suspend: bool | None) -> tuple[Obj, bool]:
    """Create the attempt's RayJob unless it exists; align `spec.suspend`. Returns (RayJob, created).

    `desired` may be None when `existing` is given (nothing is created then)."""
    source = desired if desired is not None else existing
    assert source is not None, "ensure_rayjob needs the desired RayJob when none exists"
    meta = source["metadata"]
    created = False
    if existing is None:
        assert desired is not None
        try:
            existing, created = await client.create(desired), True
        except KubeApiError as err:
            if err.code != 409:
                raise
            existing = await client.get(RAY_API_VERSION, "rayjobs", meta["namespace"], meta["name"])
    # Only spec.suspend is ever changed on a live RayJob: KubeRay treats the rest as fixed per attempt.
    if suspend is not None and bool((existing.get("spec") or {}).get("suspend")) != suspend:
        existing = await client.patch(RAY_API_VERSION, "rayjobs", meta["namespace"], meta["name"],
                                      {"spec": {"suspend": suspend}})
    return existing, created


async def stop_rayjob(client: KubeClient, namespace: str, name: str) -> None:
    """Delete a superseded attempt's RayJob; Foreground keeps it visible until its Ray cluster is gone."""
    try:
        await client.delete(RAY_API_VERSION, "rayjobs", namespace, name, propagation="Foreground")
    except KubeApiError as err:
        if err.code != 404:
            raise


async def delete_configmap(client: KubeClient, namespace: str, name: str) -> None:
    """Delete the RLJob's ConfigMap (a finished job's TTL expired); already gone is fine."""
    try:
        await client.delete("v1", "configmaps", namespace, name)
    except KubeApiError as err:
        if err.code != 404:
            raise


def _status_patch(old: Obj, new: Obj) -> Obj:
    """A merge patch turning `old` status into `new` (keys that disappeared are set to null)."""
    return {**{k: None for k in old if k not in new}, **new}


async def reconcile(client: KubeClient, rljob: Obj, rayjobs: list[Obj], now: datetime.datetime, *,
                    progress: Obj | None = None, abandon: Abandon | None = None,
                    roles: RolesSeen | None = None,
                    default_image: str = api.DEFAULT_IMAGE,
                    pod_defaults: api.PodSpec | None = None) -> tuple[Plan, Obj]:
    """Reconcile one RLJob given its observed RayJobs; returns the plan and the RLJob as last written/seen.

    `progress`: a status fragment from `read_progress` (progress/metrics/checkpoint) to write with the
    status. `abandon`: why the running attempt must end (it stalled, it lost a trainer pod); `roles`: its pods
    as last seen (status.roles, RolesReady).
    `default_image`: the trainer image of a new attempt when the RLJob sets no `spec.image`;
    `pod_defaults`: the operator's pod settings under the RLJob's own spec.pod (builders.with_pod_defaults).
    """
    meta = rljob["metadata"]
    ns, name = meta["namespace"], meta["name"]
    owned = [r for r in rayjobs if owned_by(r, rljob)]
    problems = nesting_problems(rljob) or validate_rljob(rljob)
    smoke_step = await _failed_smoke_step(rljob, owned) if not problems else None
    plan = decide(rljob, owned, problems, now, abandon=abandon, smoke_step=smoke_step, roles=roles)
    created_attempt, created_smoke = None, False
    for stale in plan.stop:
        await stop_rayjob(client, ns, stale)
    if plan.delete_config_map:
        await delete_configmap(client, ns, names.config_map_name(name))
    if plan.attempt is not None or plan.smoke:
        mine: Callable[[Obj], bool] = is_smoke_run if plan.smoke else _of_attempt(int(plan.attempt or 0))
        existing = next((r for r in owned if mine(r)), None)
        # The ConfigMap is (re)applied when an attempt starts or the spec changed, not on every event; the
        # children are only built then (dumping the trainer config is most of a reconcile's CPU).
        if existing is None or meta.get("generation") != (rljob.get("status") or {}).get("observedGeneration"):
            configmap, rayjob = _build(rljob, plan, default_image, pod_defaults)
            await ensure_configmap(client, configmap)
        else:
            rayjob = None  # the RayJob exists: at most its spec.suspend is aligned
        current, created = await ensure_rayjob(client, rayjob, existing, plan.suspend)
        if created and plan.smoke:
            created_smoke = True
        elif created:
            metrics.ATTEMPTS.inc()
            created_attempt = plan.attempt
        if created or current is not existing:
            # Decide again with what we just wrote, so the status reflects it in this one write.
            seen = [r for r in owned if not mine(r)] + [current]
            first_events = plan.events
            plan = decide(rljob, seen, problems, now, roles=roles)
            reasons = {e.reason for e in first_events}
            plan.events = first_events + [e for e in plan.events if e.reason not in reasons]
    old_status = rljob.get("status") or {}
    if progress and not problems:
        plan.status = {**plan.status, **progress}
    if plan.status != old_status:
        rljob = await client.patch(api.API_VERSION, api.PLURAL, ns, name,
                                   {"status": _status_patch(old_status, plan.status)}, subresource="status")
    if created_smoke:
        smoke = plan.status.get("smokeRun") or {}
        await client.post_event(rljob, "Normal", "SmokeRunStarted",
                                f"Created RayJob {names.smoke_run_name(name)}: a smoke run of "
                                f"{describe_smoke(smoke)}, writing to {smoke.get('checkpointUri')}; the full run "
                                f"(attempt 1) starts once it succeeds.", now)
    if created_attempt is not None:
        limit = int(((rljob.get("spec") or {}).get("runPolicy") or {}).get("backoffLimit", 3)) + 1
        await client.post_event(rljob, "Normal", "AttemptStarted",
                                f"Created RayJob {names.ray_job_name(name, created_attempt)} "
                                f"(attempt {created_attempt} of at most {limit}).", now)
    for event in plan.events:
        await client.post_event(rljob, event.type, event.reason, event.message, now)
    return plan, rljob


def _build(rljob: Obj, plan: Plan, default_image: str, pod_defaults: api.PodSpec | None) -> tuple[Obj, Obj]:
    """The ConfigMap and RayJob the plan asks for (the smoke run's or the attempt's)."""
    model = api.RLJob.model_validate(rljob)
    if plan.checkpoint_uri is not None:  # a change of the location is refused: keep the pinned one
        model.spec.checkpoint.uri = plan.checkpoint_uri
    if plan.smoke:
        configmap, rayjob = build_smoke_children(model, plan.annotations, default_image=default_image,
                                                 pod_defaults=pod_defaults)
    else:
        assert plan.attempt is not None  # a plan ensures the children of an attempt or of the smoke run
        configmap, rayjob = build_children(model, plan.attempt, plan.annotations, default_image=default_image,
                                           pod_defaults=pod_defaults)
    return configmap, rayjob


def _of_attempt(attempt: int) -> Callable[[Obj], bool]:
    """Whether a RayJob is the one of `attempt`."""
    return lambda rayjob: attempt_of(rayjob) == attempt


async def _failed_smoke_step(rljob: Obj, rayjobs: list[Obj], timeout: float = 5.0) -> int | None:
    """The last step a failed smoke run recorded (its progress.json), read once: when its failure is not yet in
    status. None when it did not fail, is already recorded, or nothing can be read in `timeout` seconds."""
    smoke = next((r for r in rayjobs if is_smoke_run(r)), None)
    recorded = (rljob.get("status") or {}).get("smokeRun") or {}
    if smoke is None or rayjob_outcome(smoke) not in ("failed", "invalid") or recorded.get("state") == "Failed":
        return None
    location = changes.pinned_location([smoke]) or recorded.get("checkpointUri")
    if not location:
        return None
    try:
        data = await asyncio.wait_for(asyncio.to_thread(_read_file, f"{location.rstrip('/')}/{PROGRESS_FILE}"), timeout)
        report = parse_progress_record(data)
    except Exception as err:  # not written (it failed before step 1), storage unreachable: the message says less
        log.debug("no progress record of smoke run %s: %s", smoke["metadata"]["name"], err)
        return None
    return report.step if report is not None else None


@dataclass
class TrainerRead:
    """One look at a trainer: the status fragment (None: nothing could be read) and what failed on the way."""

    fragment: Obj | None
    problems: list[str] = field(default_factory=list)


def progress_root(rljob: Obj, rayjob: Obj | None) -> str:
    """Where the attempt keeps checkpoints and progress.json: the location its RayJob was built with."""
    pinned = changes.pinned_location([rayjob]) if rayjob is not None else None
    return pinned or changes.checkpoint_location(rljob)


def _read_file(uri: str) -> bytes:
    """Read a whole (small) object through fsspec, configured like the trainer (AWS_* variables)."""
    try:
        from hybridflow.storage import open_fs  # fsspec: part of the operator extra
    except ImportError as err:
        raise OSError(f"fsspec is missing ({err}); install rljob-hybridflow[operator]") from None
    fs, path = open_fs(uri)
    data: bytes = fs.cat_file(path)
    return data


async def _read_metrics(session: aiohttp.ClientSession, url: str, timeout: float) -> TrainerReport:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        if resp.status != 200:
            raise ValueError(f"HTTP {resp.status}")
        report = parse_trainer_metrics(await resp.text())
    if report is None:
        raise ValueError("no hybridflow_step metric (is it a hybridflow trainer?)")
    return report


async def read_progress(session: aiohttp.ClientSession, rljob: Obj, rayjob: Obj | None, *,
                        url_template: str = TRAINER_METRICS_URL, timeout: float = 3.0) -> TrainerRead:
    """Read a trainer's progress: its /metrics (through the head Service), else `<checkpoints>/progress.json`.

    Issue 6: the endpoint is the live source; the record beside the checkpoints is the fallback when the
    pods cannot be reached (the cluster is starting, gone or partitioned). Never raises: what failed is
    in `problems`, for a log line and the stall message.
    """
    root = progress_root(rljob, rayjob)
    problems: list[str] = []
    report: TrainerReport | None = None
    url = trainer_metrics_url(rayjob, template=url_template)
    if url is None:
        problems.append("the RayJob names no Ray cluster yet")
    else:
        try:
            report = await _read_metrics(session, url, timeout)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, UnicodeDecodeError) as err:
            problems.append(f"{url}: {str(err) or type(err).__name__}")
    if report is None and root:
        uri = f"{root.rstrip('/')}/{PROGRESS_FILE}"
        try:
            report = parse_progress_record(await asyncio.wait_for(asyncio.to_thread(_read_file, uri), 4 * timeout))
            if report is None:
                problems.append(f"{uri}: not a hybridflow progress record")
        except FileNotFoundError:
            problems.append(f"{uri}: not written yet")
        except asyncio.TimeoutError:
            problems.append(f"{uri}: no answer within {4 * timeout:g}s")
        except Exception as err:  # any storage error (credentials, driver missing): degrade to "unknown"
            problems.append(f"{uri}: {str(err) or type(err).__name__}")
    return TrainerRead(build_progress_status(report, root) if report is not None else None, problems)
