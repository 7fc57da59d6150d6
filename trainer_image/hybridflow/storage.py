"""Object storage through fsspec: one place that opens filesystems, moves big files and retries.

Any fsspec URI works (`s3://bucket/prefix`, `gs://...`, `memory://...`, `file://...` or a plain path).
For S3 the endpoint, region and credentials come from the standard AWS variables (`AWS_ENDPOINT_URL`,
`AWS_ENDPOINT_URL_S3`, `AWS_REGION`/`AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_SESSION_TOKEN`), which is also how the operator passes a Secret's keys to the pods; a mounted
credentials file (`AWS_SHARED_CREDENTIALS_FILE`) works through botocore as usual.

Large objects move in parts, several at a time (s3fs's multipart upload and ranged downloads), and every
operation here retries transient errors (connection refused or reset, timeouts, 5xx, throttling) with
exponential backoff (issue 6). A multipart upload that dies is never visible as an object: S3 only
shows the object once the upload is completed, which is what the checkpoint commit protocol relies on.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import fsspec
from fsspec.spec import AbstractFileSystem

T = TypeVar("T")

PART_SIZE_ENV = "HYBRIDFLOW_STORAGE_PART_MB"
CONCURRENCY_ENV = "HYBRIDFLOW_STORAGE_CONCURRENCY"
ATTEMPTS_ENV = "HYBRIDFLOW_STORAGE_RETRIES"
DEFAULT_PART_SIZE = 16 << 20  # S3 needs >= 5 MiB per part except the last
MIN_PART_SIZE = 5 << 20
DEFAULT_CONCURRENCY = 8
_S3_PROTOCOLS = ("s3", "s3a")


class StorageError(OSError):
    """An object-storage operation failed for good (after retries); the message says what to check."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a transient storage error (full-jitter exponential backoff)."""

    attempts: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 10.0

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retry number `attempt` (1-based): uniform in [0, min(max, base * 2^(n-1))].

        "Full jitter" from AWS's Architecture Blog, "Exponential Backoff And Jitter" (2015).
        """
        return rand() * min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))


def retry_policy_from_env(env: Mapping[str, str] | None = None) -> RetryPolicy:
    """Default policy, with the attempt count from $HYBRIDFLOW_STORAGE_RETRIES when set."""
    env = os.environ if env is None else env
    raw = env.get(ATTEMPTS_ENV)
    if not raw:
        return RetryPolicy()
    try:
        attempts = int(raw)
    except ValueError as exc:
        raise ValueError(f"${ATTEMPTS_ENV}={raw!r} is not a whole number; set it to e.g. 5") from exc
    if attempts < 1:
        raise ValueError(f"${ATTEMPTS_ENV}={raw!r} must be at least 1 (1 means no retries)")
    return RetryPolicy(attempts=attempts)


def protocol_of(uri: str) -> str:
    """Return the URI's scheme (`s3`, `gs`, `memory`, ...), or `file` for a plain path."""
    return uri.split("://", 1)[0].lower() if "://" in uri else "file"


def build_storage_options(protocol: str, env: Mapping[str, str]) -> dict[str, Any]:
    """fsspec keyword arguments for `protocol`, taken from the standard AWS environment (pure).

    Only S3 needs help: its listings cache is switched off because the workers and the driver write
    the same prefixes from different processes, and a stale listing would hide a fresh step.
    """
    if protocol not in _S3_PROTOCOLS:
        return {}
    options: dict[str, Any] = {"use_listings_cache": False}
    client: dict[str, Any] = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["endpoint_url"] = endpoint
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        client["region_name"] = region
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        options["key"] = env["AWS_ACCESS_KEY_ID"]
        options["secret"] = env["AWS_SECRET_ACCESS_KEY"]
        if env.get("AWS_SESSION_TOKEN"):
            options["token"] = env["AWS_SESSION_TOKEN"]
    if client:
        options["client_kwargs"] = client
    return options


def open_fs(uri: str, env: Mapping[str, str] | None = None) -> tuple[AbstractFileSystem, str]:
    """Return (filesystem, path without scheme) for `uri`, configured from the environment."""
    env = os.environ if env is None else env
    protocol = protocol_of(uri)
    try:
        fs, path = fsspec.core.url_to_fs(uri, **build_storage_options(protocol, env))
    except ImportError as exc:
        extra = "pip install 'rljob-hybridflow[s3]' (s3fs)" if protocol in _S3_PROTOCOLS else "its fsspec driver"
        raise StorageError(f"cannot open {uri!r}: the {protocol}:// driver is missing; install {extra}") from exc
    return fs, path.rstrip("/") or path


def is_s3(fs: AbstractFileSystem) -> bool:
    """True when `fs` is s3fs (multipart/concurrency keyword arguments apply)."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return any(p in _S3_PROTOCOLS for p in protocols)


def is_local(fs: AbstractFileSystem) -> bool:
    """True for the local filesystem (atomic rename available)."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocols or "local" in protocols


# ---- retries ------------------------------------------------------------------------------------

_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
_TRANSIENT_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
    "InternalError", "ServiceUnavailable", "503", "500", "502", "504",
}
_PERMANENT_BOTO = {"NoCredentialsError", "PartialCredentialsError", "ParamValidationError", "NoRegionError"}


def is_transient(exc: BaseException) -> bool:
    """Classify an exception from fsspec/s3fs/botocore: worth retrying (network, 5xx, throttling) or not.

    Missing objects, denied access and bad parameters are permanent; connection failures, timeouts and
    server-side errors are transient.
    """
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    name = type(exc).__name__
    module = type(exc).__module__
    if module.startswith(("botocore", "aiobotocore")):
        if name in _PERMANENT_BOTO:
            return False
        response = getattr(exc, "response", None)
        if isinstance(response, dict):  # ClientError: decided by the service's error code
            error = response.get("Error", {})
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            return error.get("Code") in _TRANSIENT_CODES or int(status or 0) >= 500
        return True  # EndpointConnectionError, ConnectionClosedError, ReadTimeoutError, ...
    if module.startswith(("aiohttp", "urllib3")):
        return True
    if isinstance(exc, OSError):
        # s3fs turns unknown service errors into plain OSError; look at the cause when there is one.
        cause = exc.__cause__ or exc.__context__
        return is_transient(cause) if cause is not None else True
    return False


def with_retries(
    fn: Callable[[], T],
    what: str,
    *,
    policy: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] | None = None,
) -> T:
    """Call `fn`, retrying transient errors per `policy`; permanent errors propagate at once.

    When every attempt fails the last error is re-raised as StorageError naming `what` and the fix.
    """
    policy = policy or retry_policy_from_env()
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if attempt == policy.attempts:
                raise StorageError(
                    f"{what} failed {policy.attempts} times, last with {type(exc).__name__}: {exc}. "
                    "Check that the storage endpoint is reachable (AWS_ENDPOINT_URL) and healthy; raise "
                    f"${ATTEMPTS_ENV} to retry longer."
                ) from exc
            wait = policy.delay(attempt)
            if log is not None:
                log(f"{what}: {type(exc).__name__}: {exc}; retry {attempt}/{policy.attempts - 1} in {wait:.1f}s")
            sleep(wait)
    raise AssertionError("unreachable: the loop returns or raises")


# ---- transfers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transfer:
    """Part size and parallelism for large objects (defaults overridable by environment)."""

    part_size: int = DEFAULT_PART_SIZE
    concurrency: int = DEFAULT_CONCURRENCY

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Transfer:
        """Read $HYBRIDFLOW_STORAGE_PART_MB and $HYBRIDFLOW_STORAGE_CONCURRENCY (both optional)."""
        env = os.environ if env is None else env
        part = int(env[PART_SIZE_ENV]) << 20 if env.get(PART_SIZE_ENV) else DEFAULT_PART_SIZE
        concurrency = int(env[CONCURRENCY_ENV]) if env.get(CONCURRENCY_ENV) else DEFAULT_CONCURRENCY
        if part < MIN_PART_SIZE or concurrency < 1:
            raise ValueError(
                f"${PART_SIZE_ENV} must be >= 5 (S3's smallest part, MiB) and ${CONCURRENCY_ENV} >= 1; "
                f"got {part >> 20} MiB and {concurrency}"
            )
        return cls(part_size=part, concurrency=concurrency)

    def kwargs(self, fs: AbstractFileSystem) -> dict[str, Any]:
        """Keyword arguments for s3fs's pipe/put/get/cat (other filesystems take none)."""
        return {"chunksize": self.part_size, "max_concurrency": self.concurrency} if is_s3(fs) else {}


def write_bytes(uri: str, data: bytes, *, transfer: Transfer | None = None, policy: RetryPolicy | None = None,
                log: Callable[[str], None] | None = None) -> None:
    """Write `data` to `uri` so readers see the old object or the whole new one, never a prefix.

    Object stores give that for a single PUT or a completed multipart upload; a local file is written
    beside the target and renamed over it.
    """
    fs, path = open_fs(uri)
    transfer = transfer or Transfer.from_env()

    def _write() -> None:
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        if is_local(fs):
            if parent:
                os.makedirs(parent, exist_ok=True)
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            try:
                with open(tmp, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            return
        fs.pipe_file(path, data, **transfer.kwargs(fs))

    with_retries(_write, f"writing {uri}", policy=policy, log=log)


def read_bytes(uri: str, *, transfer: Transfer | None = None, policy: RetryPolicy | None = None,
               log: Callable[[str], None] | None = None) -> bytes:
    """Read a whole object (ranged parts in parallel on S3); FileNotFoundError when it is absent."""
    fs, path = open_fs(uri)
    transfer = transfer or Transfer.from_env()
    return with_retries(lambda: fs.cat_file(path, **transfer.kwargs(fs)), f"reading {uri}", policy=policy, log=log)


def upload_file(local_path: str, uri: str, *, transfer: Transfer | None = None,
                policy: RetryPolicy | None = None, log: Callable[[str], None] | None = None) -> None:
    """Copy a local file to `uri` (multipart, parts in parallel on S3); all-or-nothing on object stores."""
    fs, path = open_fs(uri)
    transfer = transfer or Transfer.from_env()
    if is_local(fs):
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
    with_retries(lambda: fs.put_file(local_path, path, **transfer.kwargs(fs)), f"uploading {local_path} to {uri}",
                 policy=policy, log=log)


def download_file(uri: str, local_path: str, *, transfer: Transfer | None = None,
                  policy: RetryPolicy | None = None, log: Callable[[str], None] | None = None) -> None:
    """Copy `uri` to a local file (ranged parts in parallel on S3); the target appears only when complete."""
    fs, path = open_fs(uri)
    transfer = transfer or Transfer.from_env()
    parent = os.path.dirname(os.path.abspath(local_path))
    os.makedirs(parent, exist_ok=True)
    tmp = f"{local_path}.part-{uuid.uuid4().hex[:8]}"

    def _get() -> None:
        try:
            fs.get_file(path, tmp, **transfer.kwargs(fs))
            os.replace(tmp, local_path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    with_retries(_get, f"downloading {uri}", policy=policy, log=log)


def upload_dir(local_dir: str, uri: str, **kwargs: Any) -> list[str]:
    """Upload every file under `local_dir` to the same relative paths under `uri`; return the URIs."""
    written = []
    for folder, _, files in os.walk(local_dir):
        for name in sorted(files):
            full = os.path.join(folder, name)
            rel = os.path.relpath(full, local_dir).replace(os.sep, "/")
            target = f"{uri.rstrip('/')}/{rel}"
            upload_file(full, target, **kwargs)
            written.append(target)
    return written


def download_dir(uri: str, local_dir: str, **kwargs: Any) -> list[str]:
    """Download every object under `uri` into `local_dir` keeping relative paths; return the local files."""
    fs, path = open_fs(uri)
    found = with_retries(lambda: fs.find(path), f"listing {uri}", policy=kwargs.get("policy"))
    scheme = uri.split("://", 1)[0] + "://" if "://" in uri else ""
    written = []
    for full in sorted(found):
        rel = full[len(path):].lstrip("/")
        target = os.path.join(local_dir, *rel.split("/"))
        download_file(f"{scheme}{full}" if scheme else full, target, **kwargs)
        written.append(target)
    return written
