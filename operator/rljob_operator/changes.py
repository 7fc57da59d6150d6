"""Spec edits of a running RLJob: which apply live, which start a new attempt, which are refused (pure).

The policy (written down for users in docs/spec-changes.md):

- live: `spec.suspend` and `spec.runPolicy.*` are read by the operator only, so a change is in effect at
  the next reconcile; the running attempt is not touched (suspend is forwarded to its RayJob).
- new attempt: every other field shapes the trainer's pods or config (`config` including
  `trainer.nnodes`, `image*`, `resources`, `pod`, `scheduling`, `queueName`, `checkpoint.secretRef`/`keep`).
  KubeRay treats a RayJob's spec as fixed, and the trainer reads its config once at start-up, so the only way
  to apply such an edit is a new attempt: the running one is stopped, the next one is built from the
  new spec and resumes from the latest checkpoint (checkpoints do not depend on the world size, so a
  new `trainer.nnodes` resumes too). Such a restart is not a failure and does not use up retries.
- refused: the checkpoint location (`spec.checkpoint.uri`, or `config.trainer.default_local_dir`
  when no URI is set) once an attempt exists: a new attempt would resume from an empty place and
  lose the progress. The location of the first attempt stays pinned for every later attempt, and
  the condition SpecApplied=False (reason CheckpointChangeRefused) plus a Warning Event say so.

Detection is level-based, from what the children carry: every RayJob records the per-field digests
of the spec it was built from and its checkpoint location in annotations, so a restarted operator
reaches the same decision. Digests are taken over the spec as written (not over defaults), so an
operator upgrade that changes a default restarts nothing.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rljob_operator import api, builders, names

Obj = dict[str, Any]
#: Spec fields read by the operator only: changing them never restarts an attempt.
LIVE_FIELDS = ("suspend", "runPolicy")
ANNOTATION_FINGERPRINT = "rl.hybridflow.dev/spec-fingerprint"
ANNOTATION_CHECKPOINT = "rl.hybridflow.dev/checkpoint-location"
ANNOTATION_GENERATION = "rl.hybridflow.dev/spec-generation"
#: On the smoke run's RayJob: digest of the spec.runPolicy.smokeRun it was built from.
ANNOTATION_SMOKE_RUN = "rl.hybridflow.dev/smoke-run-spec"


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _without_location(config: Any) -> Any:
    """The trainer config minus the keys the operator overrides (location, resume mode)."""
    if not isinstance(config, dict) or not isinstance(config.get("trainer"), dict):
        return config
    trainer = {k: v for k, v in config["trainer"].items() if k not in ("default_local_dir", "resume_mode")}
    return {**config, "trainer": trainer}


def fingerprint(spec: Obj) -> dict[str, str]:
    """Digest per top-level spec field that shapes an attempt (all but the live fields and the location)."""
    parts: dict[str, str] = {}
    for key, value in sorted(spec.items()):
        if key in LIVE_FIELDS:
            continue
        if key == "checkpoint" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k != "uri"}
        elif key == "config":
            value = _without_location(value)
        if value in (None, {}, []):
            continue  # an empty field is the same as an absent one
        parts[key] = _digest(value)
    return parts


def checkpoint_location(rljob: Obj) -> str:
    """Where attempts of this RLJob write and resume checkpoints (the trainer's resolved default_local_dir)."""
    spec = rljob.get("spec") or {}
    try:
        model = api.RLJob.model_validate({"metadata": rljob.get("metadata") or {"name": "x"}, "spec": spec})
        return str(builders.trainer_config(model).trainer.default_local_dir)
    except Exception:  # an invalid spec never gets this far in the operator; keep the raw value for tests
        uri = (spec.get("checkpoint") or {}).get("uri")
        trainer = (spec.get("config") or {}).get("trainer") or {}
        return str(uri or trainer.get("default_local_dir") or "")


def attempt_annotations(rljob: Obj, location: str) -> dict[str, str]:
    """Annotations of a new attempt's RayJob: the spec it is built from and its checkpoint location."""
    return {
        ANNOTATION_FINGERPRINT: json.dumps(fingerprint(rljob.get("spec") or {}), sort_keys=True,
                                           separators=(",", ":")),
        ANNOTATION_CHECKPOINT: location,
        ANNOTATION_GENERATION: str((rljob.get("metadata") or {}).get("generation") or 0),
    }


def _smoke_digest(rljob: Obj) -> str:
    return _digest(((rljob.get("spec") or {}).get("runPolicy") or {}).get("smokeRun"))


def smoke_annotations(rljob: Obj, location: str) -> dict[str, str]:
    """Annotations of the smoke run's RayJob: an attempt's, plus the smokeRun settings it was built from."""
    return {**attempt_annotations(rljob, location), ANNOTATION_SMOKE_RUN: _smoke_digest(rljob)}


def smoke_changed_fields(rljob: Obj, rayjob: Obj) -> list[str]:
    """Spec fields whose edit makes the running smoke run stale: those of changed_fields, plus
    runPolicy.smokeRun (live for attempts, but it shapes the smoke run). Same generation guard."""
    changed = changed_fields(rljob, rayjob)
    notes = _annotations(rayjob)
    try:
        newer = int((rljob.get("metadata") or {}).get("generation") or 0) > int(notes.get(ANNOTATION_GENERATION, ""))
    except ValueError:
        return changed
    if newer and ANNOTATION_SMOKE_RUN in notes and notes[ANNOTATION_SMOKE_RUN] != _smoke_digest(rljob):
        changed.append("runPolicy.smokeRun")
    return changed


def _annotations(rayjob: Obj) -> dict[str, str]:
    return (rayjob.get("metadata") or {}).get("annotations") or {}


def changed_fields(rljob: Obj, rayjob: Obj) -> list[str]:
    """Spec fields whose edit needs a new attempt: they differ from what `rayjob` was built from.

    Empty when the RayJob does not record its spec (made by an older operator) or when the RLJob's
    generation is not newer than the one it was built from: a restart always needs a new spec edit,
    so no quirk of the comparison can restart a job in a loop.
    """
    notes = _annotations(rayjob)
    try:
        built: dict[str, str] = json.loads(notes[ANNOTATION_FINGERPRINT])
        built_generation = int(notes.get(ANNOTATION_GENERATION, "0"))
    except (KeyError, ValueError, TypeError):
        return []
    if int((rljob.get("metadata") or {}).get("generation") or 0) <= built_generation:
        return []
    now = fingerprint(rljob.get("spec") or {})
    return sorted(k for k in set(built) | set(now) if built.get(k) != now.get(k))


def pinned_location(rayjobs: list[Obj]) -> str | None:
    """The checkpoint location recorded by the newest attempt that has one; None before any attempt."""
    for rayjob in sorted(rayjobs, key=lambda r: _attempt(r), reverse=True):
        location = _annotations(rayjob).get(ANNOTATION_CHECKPOINT)
        if location is not None:
            return location
    return None


def _attempt(rayjob: Obj) -> int:
    try:
        return int(((rayjob.get("metadata") or {}).get("labels") or {}).get(names.LABEL_ATTEMPT, "0"))
    except ValueError:
        return 0
