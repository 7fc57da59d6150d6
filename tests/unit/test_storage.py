"""Storage helpers: options from the AWS environment, transient-error classification, retries, transfers."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import fsspec
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from hybridflow import storage


@pytest.mark.parametrize(
    ("protocol", "env", "expected"),
    [
        ("file", {"AWS_ENDPOINT_URL": "http://x"}, {}),
        ("gs", {"AWS_ENDPOINT_URL": "http://x"}, {}),
        ("s3", {}, {"use_listings_cache": False}),
        (
            "s3",
            {"AWS_ENDPOINT_URL": "http://minio:9000", "AWS_REGION": "eu-west-1",
             "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t"},
            {"use_listings_cache": False, "endpoint_url": "http://minio:9000", "key": "k", "secret": "s",
             "token": "t", "client_kwargs": {"region_name": "eu-west-1"}},
        ),
        (  # the service-specific endpoint wins; AWS_DEFAULT_REGION is the fallback region
            "s3a",
            {"AWS_ENDPOINT_URL": "http://a", "AWS_ENDPOINT_URL_S3": "http://b", "AWS_DEFAULT_REGION": "us-east-1"},
            {"use_listings_cache": False, "endpoint_url": "http://b", "client_kwargs": {"region_name": "us-east-1"}},
        ),
        ("s3", {"AWS_ACCESS_KEY_ID": "k"}, {"use_listings_cache": False}),  # half a key pair: botocore decides
    ],
)
def test_build_storage_options(protocol: str, env: dict[str, str], expected: dict) -> None:
    assert storage.build_storage_options(protocol, env) == expected


@pytest.mark.parametrize(
    ("uri", "protocol"),
    [("s3://b/p", "s3"), ("GS://b", "gs"), ("/tmp/x", "file"), ("rel/x", "file"), ("memory://a", "memory")],
)
def test_protocol_of(uri: str, protocol: str) -> None:
    assert storage.protocol_of(uri) == protocol


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


def _wrapped(cause: BaseException) -> OSError:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise OSError(errno.EIO, "s3fs wrapped") from inner
    except OSError as outer:
        return outer


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (ConnectionRefusedError(), True),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (EndpointConnectionError(endpoint_url="http://x"), True),
        (_client_error("SlowDown", 503), True),
        (_client_error("InternalError", 500), True),
        (_client_error("AccessDenied", 403), False),
        (_client_error("NoSuchBucket", 404), False),
        (NoCredentialsError(), False),
        (FileNotFoundError("x"), False),
        (PermissionError("x"), False),
        (_wrapped(_client_error("ServiceUnavailable", 503)), True),
        (_wrapped(NoCredentialsError()), False),
        (OSError(errno.EIO, "plain"), True),
        (ValueError("bad"), False),
    ],
)
def test_is_transient(exc: BaseException, transient: bool) -> None:
    assert storage.is_transient(exc) is transient


def test_with_retries_backs_off_then_succeeds() -> None:
    calls, sleeps, logs = [], [], []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset")
        return "ok"

    policy = storage.RetryPolicy(attempts=4, base_delay_s=1.0, max_delay_s=3.0)
    assert storage.with_retries(flaky, "writing x", policy=policy, sleep=sleeps.append, log=logs.append) == "ok"
    assert len(calls) == 3 and len(sleeps) == 2 and all(0 <= s <= 3.0 for s in sleeps)
    assert "retry 1/3" in logs[0]


def test_with_retries_gives_up_with_a_clear_error() -> None:
    def down() -> None:
        raise ConnectionRefusedError("refused")

    with pytest.raises(storage.StorageError, match="writing s3://b/k failed 2 times.*AWS_ENDPOINT_URL"):
        storage.with_retries(down, "writing s3://b/k", policy=storage.RetryPolicy(attempts=2), sleep=lambda s: None)


def test_with_retries_does_not_retry_permanent_errors() -> None:
    calls = []

    def missing() -> None:
        calls.append(1)
        raise FileNotFoundError("nope")

    with pytest.raises(FileNotFoundError):
        storage.with_retries(missing, "reading", policy=storage.RetryPolicy(attempts=5), sleep=lambda s: None)
    assert len(calls) == 1


def test_backoff_delay_is_capped_full_jitter() -> None:
    policy = storage.RetryPolicy(base_delay_s=0.5, max_delay_s=4.0)
    assert [policy.delay(n, rand=lambda: 1.0) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert policy.delay(3, rand=lambda: 0.25) == 0.5


def test_policy_and_transfer_from_env() -> None:
    assert storage.retry_policy_from_env({storage.ATTEMPTS_ENV: "2"}).attempts == 2
    with pytest.raises(ValueError, match="at least 1"):
        storage.retry_policy_from_env({storage.ATTEMPTS_ENV: "0"})
    transfer = storage.Transfer.from_env({storage.PART_SIZE_ENV: "8", storage.CONCURRENCY_ENV: "3"})
    assert (transfer.part_size, transfer.concurrency) == (8 << 20, 3)
    with pytest.raises(ValueError, match="smallest part"):
        storage.Transfer.from_env({storage.PART_SIZE_ENV: "1"})
    assert transfer.kwargs(fsspec.filesystem("memory")) == {}


def test_local_write_is_atomic_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b.json"
    storage.write_bytes(str(target), b"one")
    storage.write_bytes(f"file://{target}", b"two")
    assert target.read_bytes() == b"two"
    assert os.listdir(target.parent) == ["b.json"]
    assert storage.read_bytes(str(target)) == b"two"


def test_memory_round_trip_files_and_dirs(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "model.pt").write_bytes(b"m" * 1000)
    (src / "sub" / "config.json").write_text("{}")
    written = storage.upload_dir(str(src), "memory://bucket/ckpt/actor")
    assert sorted(written) == ["memory://bucket/ckpt/actor/model.pt", "memory://bucket/ckpt/actor/sub/config.json"]
    out = storage.download_dir("memory://bucket/ckpt/actor", str(tmp_path / "dst"))
    assert (tmp_path / "dst" / "model.pt").read_bytes() == b"m" * 1000
    assert (tmp_path / "dst" / "sub" / "config.json").read_text() == "{}"
    assert len(out) == 2 and not list((tmp_path / "dst").glob("*.part-*"))
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("memory://bucket/ckpt/absent")
    fsspec.filesystem("memory").rm("/bucket", recursive=True)
