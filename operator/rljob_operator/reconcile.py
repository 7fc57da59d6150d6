"""Reconcile one RLJob: make its children exist for the current attempt, write status once, post Events.

Level-based and idempotent: the plan (`status.decide`) is computed from what is observed; child names
are fixed by the plan before any write; creates that hit 409 read the existing object instead; the
status is patched only when it differs from the one observed. Safe to run again at any moment.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from rljob_operator import api, metrics, names
from rljob_operator.builders import RAY_API_VERSION, build_children
from rljob_operator.kube import KubeApiError, KubeClient
from rljob_operator.status import Plan, attempt_of, decide
from rljob_operator.validation import validate_rljob

Obj = dict[str, Any]
log = logging.getLogger(__name__)


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


async def ensure_rayjob(client: KubeClient, desired: Obj, existing: Obj | None, suspend: bool | None) -> tuple[Obj, bool]:
    """Create the attempt's RayJob unless it exists; align `spec.suspend`. Returns (RayJob, created)."""
    meta = desired["metadata"]
    created = False
    if existing is None:
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


def _status_patch(old: Obj, new: Obj) -> Obj:
    """A merge patch turning `old` status into `new` (keys that disappeared are set to null)."""
    return {**{k: None for k in old if k not in new}, **new}


async def reconcile(client: KubeClient, rljob: Obj, rayjobs: list[Obj], now: datetime.datetime) -> tuple[Plan, Obj]:
    """Reconcile one RLJob given its observed RayJobs; returns the plan and the RLJob as last written/seen."""
    meta = rljob["metadata"]
    ns, name = meta["namespace"], meta["name"]
    owned = [r for r in rayjobs if owned_by(r, rljob)]
    problems = validate_rljob(rljob)
    plan = decide(rljob, owned, problems, now)
    created_attempt = None
    for stale in plan.stop:
        await stop_rayjob(client, ns, stale)
    if plan.attempt is not None:
        model = api.RLJob.model_validate(rljob)
        if plan.checkpoint_uri is not None:  # a change of the location is refused: keep the pinned one
            model.spec.checkpoint.uri = plan.checkpoint_uri
        configmap, rayjob = build_children(model, plan.attempt, plan.annotations)
        existing = next((r for r in owned if attempt_of(r) == plan.attempt), None)
        # The ConfigMap is (re)applied when an attempt starts or the spec changed, not on every event.
        if existing is None or meta.get("generation") != (rljob.get("status") or {}).get("observedGeneration"):
            await ensure_configmap(client, configmap)
        current, created = await ensure_rayjob(client, rayjob, existing, plan.suspend)
        if created:
            metrics.ATTEMPTS.inc()
            created_attempt = plan.attempt
        if created or current is not existing:
            # Decide again with what we just wrote, so the status reflects it in this one write.
            seen = [r for r in owned if attempt_of(r) != plan.attempt] + [current]
            first_events = plan.events
            plan = decide(rljob, seen, problems, now)
            reasons = {e.reason for e in first_events}
            plan.events = first_events + [e for e in plan.events if e.reason not in reasons]
    old_status = rljob.get("status") or {}
    if plan.status != old_status:
        rljob = await client.patch(api.API_VERSION, api.PLURAL, ns, name,
                                   {"status": _status_patch(old_status, plan.status)}, subresource="status")
    if created_attempt is not None:
        limit = int(((rljob.get("spec") or {}).get("runPolicy") or {}).get("backoffLimit", 3)) + 1
        await client.post_event(rljob, "Normal", "AttemptStarted",
                                f"Created RayJob {names.ray_job_name(name, created_attempt)} "
                                f"(attempt {created_attempt} of at most {limit}).", now)
    for event in plan.events:
        await client.post_event(rljob, event.type, event.reason, event.message, now)
    return plan, rljob
