"""Atomic, world-size-independent checkpoints in step folders under a local path or an fsspec URI.

Layout (verl's names where verl has them)::

    <root>/latest_checkpointed_iteration.txt   # "N", rewritten only after step N is committed
    <root>/global_step_N/actor/...             # written by the workers (model, optimizer, scheduler)
    <root>/global_step_N/critic/...
    <root>/global_step_N/trainer_state.json    # global step, dataloader position, RNG states, W&B run id
    <root>/global_step_N/manifest.json         # every file above with its size and sha256
    <root>/global_step_N/COMMITTED             # written last; holds the sha256 of manifest.json

A step counts only when its commit marker matches its manifest and (when verified) every file matches
the manifest. A crash at any moment therefore leaves either the previous committed step or the new
one, never a half-written "latest". On object storage the small files are single PUTs (atomic), every
I/O retries transient errors (`hybridflow.storage`), and a storage outage raises instead of silently
falling back to an older step.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from fsspec.spec import AbstractFileSystem

from hybridflow import storage

LATEST_FILE = "latest_checkpointed_iteration.txt"
MANIFEST_FILE = "manifest.json"
COMMIT_FILE = "COMMITTED"
TRAINER_STATE_FILE = "trainer_state.json"
STEP_PREFIX = "global_step_"
_STEP_RE = re.compile(rf"^{STEP_PREFIX}(\d+)$")
_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used (missing, uncommitted or corrupt); the message says which and why."""


def _fs(root: str) -> tuple[AbstractFileSystem, str]:
    fs, path = storage.open_fs(root)
    return fs, path.rstrip("/")


def _uri(root: str, rel: str) -> str:
    return f"{root.rstrip('/')}/{rel}"


def step_dir(root: str, step: int) -> str:
    """Return the step folder of `step` under `root`, keeping the URI scheme of `root`."""
    return f"{root.rstrip('/')}/{STEP_PREFIX}{step}"


def parse_step(path: str) -> int | None:
    """Return N for a path ending in `global_step_N`, else None."""
    match = _STEP_RE.match(path.rstrip("/").rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def _sha256(fs: AbstractFileSystem, path: str) -> str:
    def _digest() -> str:
        digest = hashlib.sha256()
        with fs.open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    return storage.with_retries(_digest, f"checksumming {path}")


def _payload_files(fs: AbstractFileSystem, path: str) -> dict[str, int]:
    """Map relative path -> size for every file in a step folder except the manifest and the marker."""
    found = storage.with_retries(lambda: fs.find(path, detail=True), f"listing {path}")
    files: dict[str, int] = {}
    for full, info in found.items():
        rel = full[len(path) :].lstrip("/")
        if rel in (MANIFEST_FILE, COMMIT_FILE) or info.get("type") == "directory":
            continue
        files[rel] = int(info["size"])
    return files


def build_manifest(step_uri: str) -> dict[str, Any]:
    """Describe every payload file of a step folder (size and sha256)."""
    fs, path = _fs(step_uri)
    files = _payload_files(fs, path)
    return {
        "step": parse_step(path),
        "files": {
            rel: {"size": size, "sha256": _sha256(fs, f"{path}/{rel}")} for rel, size in sorted(files.items())
        },
    }


def commit_step(root: str, step: int) -> None:
    """Seal a fully written step: manifest, then commit marker, then the latest-iteration file."""
    uri = step_dir(root, step)
    manifest_bytes = json.dumps(build_manifest(uri), indent=1, sort_keys=True).encode()
    storage.write_bytes(_uri(uri, MANIFEST_FILE), manifest_bytes)
    storage.write_bytes(_uri(uri, COMMIT_FILE), hashlib.sha256(manifest_bytes).hexdigest().encode())
    storage.write_bytes(_uri(root, LATEST_FILE), str(step).encode())


def verify_step(step_uri: str, *, deep: bool = True) -> str | None:
    """Return None when the step is committed and intact, else the reason it cannot be used.

    `deep=False` checks the marker, the manifest and the file sizes; `deep=True` also the checksums.
    """
    fs, path = _fs(step_uri)
    try:
        marker = storage.read_bytes(_uri(step_uri, COMMIT_FILE)).decode().strip()
    except FileNotFoundError:
        return "no commit marker (the save did not finish)"
    try:
        manifest_bytes = storage.read_bytes(_uri(step_uri, MANIFEST_FILE))
    except FileNotFoundError:
        return "commit marker without a manifest"
    if hashlib.sha256(manifest_bytes).hexdigest() != marker:
        return "manifest does not match its commit marker"
    try:
        manifest = json.loads(manifest_bytes)
    except json.JSONDecodeError as exc:
        return f"manifest is not valid JSON ({exc})"
    actual = _payload_files(fs, path)
    for rel, expected in manifest.get("files", {}).items():
        if rel not in actual:
            return f"missing file {rel}"
        if actual[rel] != expected["size"]:
            return f"size mismatch for {rel}: {actual[rel]} bytes, manifest says {expected['size']}"
        if deep and _sha256(fs, f"{path}/{rel}") != expected["sha256"]:
            return f"checksum mismatch for {rel}"
    return None


def list_steps(root: str) -> list[int]:
    """Return the step numbers of all `global_step_N` folders under root (committed or not), ascending."""
    fs, path = _fs(root)
    if not storage.with_retries(lambda: fs.exists(path), f"checking {root}"):
        return []
    entries = storage.with_retries(lambda: fs.ls(path, detail=False), f"listing {root}")
    steps = [parse_step(entry) for entry in entries]
    return sorted(step for step in steps if step is not None)


def find_latest_committed(root: str, *, deep: bool = True, log: Any = None) -> int | None:
    """Return the newest step under root that is committed and intact, falling back past corrupt ones.

    The latest-iteration file is only a hint (verl writes it too); the folders are the truth, so a
    step whose files were damaged after the commit is skipped with a message through `log`.
    """
    for step in reversed(list_steps(root)):
        problem = verify_step(step_dir(root, step), deep=deep)
        if problem is None:
            return step
        if log is not None:
            log(f"checkpoint {step_dir(root, step)} skipped: {problem}")
    return None


def apply_retention(root: str, keep: int | None, *, log: Any = None) -> list[int]:
    """Delete step folders older than the newest `keep` committed steps; return the deleted steps.

    Only runs relative to committed steps, so an old step is removed only once a newer one is safe.
    Uncommitted folders older than the newest commit (crashed saves) are removed too; newer
    uncommitted folders may be a save in progress and are left alone. `keep` None or <= 0 keeps all.
    """
    if keep is None or keep <= 0:
        return []
    steps = list_steps(root)
    committed = [s for s in steps if verify_step(step_dir(root, s), deep=False) is None]
    if not committed:
        return []
    kept = set(committed[-keep:])
    newest = committed[-1]
    doomed = [s for s in steps if s not in kept and s < newest]
    fs, _ = _fs(root)
    for step in doomed:
        doomed_path = _fs(step_dir(root, step))[1]
        storage.with_retries(lambda p=doomed_path: fs.rm(p, recursive=True), f"removing {doomed_path}")
        if log is not None:
            log(f"checkpoint retention: removed {step_dir(root, step)}")
    return doomed


# ---- trainer state ------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def capture_rng_state() -> dict[str, Any]:
    """Snapshot python, numpy and torch RNG states as JSON-serialisable values."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [
            np_name,
            _b64(np.asarray(np_keys, dtype=np.uint32).tobytes()),
            int(np_pos),
            int(np_has_gauss),
            float(np_gauss),
        ],
        "torch": _b64(torch.get_rng_state().numpy().tobytes()),
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore RNG states captured by `capture_rng_state`."""
    py_version, py_state, py_gauss = state["python"]
    random.setstate((py_version, tuple(py_state), py_gauss))
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    keys = np.frombuffer(base64.b64decode(np_keys), dtype=np.uint32).copy()
    np.random.set_state((np_name, keys, np_pos, np_has_gauss, np_gauss))
    torch_bytes = np.frombuffer(base64.b64decode(state["torch"]), dtype=np.uint8).copy()
    torch.set_rng_state(torch.from_numpy(torch_bytes))


@dataclass
class TrainerState:
    """What the driver needs besides the workers' weights to continue a run exactly."""

    global_step: int
    dataloader: dict[str, Any] = field(default_factory=dict)
    rng: dict[str, Any] = field(default_factory=dict)
    wandb_run_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def save_trainer_state(step_uri: str, state: TrainerState) -> None:
    """Write the trainer state as JSON into a step folder (before the step is committed)."""
    storage.write_bytes(_uri(step_uri, TRAINER_STATE_FILE), json.dumps(state.__dict__).encode())


ROLLOUT_QUEUE_FILE = "rollout_queue.pt"


def save_rollout_queue(step_uri: str, batches: list[Any]) -> None:
    """Asynchronous training: the finished groups generated but not yet trained, so a resume trains them
    (with the versions that generated them) instead of generating their prompts again."""
    import io

    buffer = io.BytesIO()
    torch.save(list(batches), buffer)
    storage.write_bytes(_uri(step_uri, ROLLOUT_QUEUE_FILE), buffer.getvalue())


def load_rollout_queue(step_uri: str) -> list[Any]:
    """The groups `save_rollout_queue` wrote (an empty list for a step written without them)."""
    import io

    try:
        raw = storage.read_bytes(_uri(step_uri, ROLLOUT_QUEUE_FILE))
    except FileNotFoundError:
        return []
    return list(torch.load(io.BytesIO(raw), weights_only=False))


def load_trainer_state(step_uri: str) -> TrainerState:
    """Read the trainer state of a step folder."""
    try:
        raw = json.loads(storage.read_bytes(_uri(step_uri, TRAINER_STATE_FILE)))
    except FileNotFoundError as exc:
        raise CheckpointError(
            f"{step_uri} has no {TRAINER_STATE_FILE}; it was not written by this trainer. "
            "Point trainer.resume_from_path at a global_step_N folder written by hybridflow."
        ) from exc
    return TrainerState(**raw)


# ---- resume decision ----------------------------------------------------------------------------


def resolve_resume_path(
    resume_mode: str, resume_from_path: str | None, root: str, latest_committed: int | None
) -> str | None:
    """Decide which step folder to resume from (pure: the caller finds `latest_committed`).

    - `disable`: start fresh (None).
    - `auto`: the latest committed step under `root`, or fresh when there is none.
    - `resume_path`: exactly `resume_from_path`, which must name a `global_step_N` folder.
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "auto":
        return None if latest_committed is None else step_dir(root, latest_committed)
    if resume_mode == "resume_path":
        if not resume_from_path:
            raise CheckpointError(
                "trainer.resume_mode=resume_path needs trainer.resume_from_path=<root>/global_step_N; "
                "set it, or use trainer.resume_mode=auto to pick the latest committed step."
            )
        if parse_step(resume_from_path) is None:
            raise CheckpointError(
                f"trainer.resume_from_path={resume_from_path!r} must end in a {STEP_PREFIX}N folder "
                "(e.g. checkpoints/proj/exp/global_step_20)."
            )
        return resume_from_path.rstrip("/")
    raise CheckpointError(
        f"trainer.resume_mode={resume_mode!r} is unknown; use auto, disable or resume_path."
    )


def check_resumable(step_uri: str) -> None:
    """Raise CheckpointError when an explicitly requested step cannot be used."""
    problem = verify_step(step_uri, deep=True)
    if problem is not None:
        raise CheckpointError(
            f"cannot resume from {step_uri}: {problem}. Pick an intact step, or use "
            "trainer.resume_mode=auto to fall back to the latest committed one."
        )
