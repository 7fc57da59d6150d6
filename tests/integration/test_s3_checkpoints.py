"""Checkpoints on a real S3 HTTP endpoint (moto_server): save/resume, a killed writer, an endpoint outage,
a corrupt object and retention. Resume must always pick the last good committed step (issue 6).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from hybridflow import checkpoint as ck
from hybridflow import storage
from tests.support.s3 import MotoServer, TcpProxy, make_bucket, moto_s3, s3_env


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with moto_s3() as server:
        yield server


@pytest.fixture
def s3(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A fresh bucket; returns (endpoint, checkpoint root URI) with the AWS variables set."""
    for key, value in {**s3_env(moto.url), "AWS_MAX_ATTEMPTS": "2", storage.PART_SIZE_ENV: "5"}.items():
        monkeypatch.setenv(key, value)
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    make_bucket(moto.url, bucket)
    yield moto.url, f"s3://{bucket}/proj/exp"


def _client(endpoint: str):  # noqa: ANN202 - boto3 client type is dynamic
    env = s3_env(endpoint)
    return boto3.client("s3", endpoint_url=endpoint, region_name=env["AWS_DEFAULT_REGION"],
                        aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])


def _save_step(root: str, step: int, local_model: Path) -> None:
    """What the trainer does per checkpoint: workers upload, driver writes its state, then commits."""
    storage.upload_file(str(local_model), f"{ck.step_dir(root, step)}/actor/model.pt")
    ck.save_trainer_state(ck.step_dir(root, step), ck.TrainerState(global_step=step, dataloader={"pos": step}))
    ck.commit_step(root, step)


def _model(tmp_path: Path, fill: bytes, mib: int = 12) -> Path:
    path = tmp_path / f"model-{fill.decode()}.pt"
    path.write_bytes(fill * (mib << 20))
    return path


def test_save_and_resume_on_s3_uses_parallel_multipart(s3: tuple[str, str], tmp_path: Path) -> None:
    endpoint, root = s3
    model = _model(tmp_path, b"a")
    _save_step(root, 1, model)
    assert ck.find_latest_committed(root) == 1
    assert ck.load_trainer_state(ck.step_dir(root, 1)).dataloader == {"pos": 1}
    bucket, key = root.removeprefix("s3://").split("/", 1)
    head = _client(endpoint).head_object(Bucket=bucket, Key=f"{key}/global_step_1/actor/model.pt")
    assert head["ETag"].strip('"').endswith("-3")  # a multipart ETag: 3 parts of 5 MiB
    assert _client(endpoint).get_object(Bucket=bucket, Key=f"{key}/{ck.LATEST_FILE}")["Body"].read() == b"1"
    files = storage.download_dir(f"{ck.step_dir(root, 1)}/actor", str(tmp_path / "restore"))
    assert [Path(f).read_bytes() == model.read_bytes() for f in files] == [True]


WRITER = textwrap.dedent(
    """
    import sys
    from hybridflow import checkpoint as ck, storage
    root, model = sys.argv[1], sys.argv[2]
    ck.save_trainer_state(ck.step_dir(root, 2), ck.TrainerState(global_step=2))
    print("uploading", flush=True)
    storage.upload_file(model, ck.step_dir(root, 2) + "/actor/model.pt")
    ck.commit_step(root, 2)
    print("committed", flush=True)
    """
)


def test_writer_killed_mid_upload_resumes_from_last_commit(moto: MotoServer, s3: tuple[str, str],
                                                          tmp_path: Path) -> None:
    _, root = s3
    _save_step(root, 1, _model(tmp_path, b"a", mib=1))
    proxy = TcpProxy(moto.port, bytes_per_s=8 << 20).up()  # 24 MiB takes ~3 s through it
    try:
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy.url}
        writer = subprocess.Popen([sys.executable, "-c", WRITER, root, str(_model(tmp_path, b"b", mib=24))],
                                  env=env, stdout=subprocess.PIPE, text=True)
        assert writer.stdout is not None and writer.stdout.readline().strip() == "uploading"
        time.sleep(1.0)
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
    finally:
        proxy.down()
    bucket = root.removeprefix("s3://").split("/", 1)[0]
    uploads = _client(moto.url).list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    objects = [o["Key"] for o in _client(moto.url).list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert uploads, f"the writer should have died inside a multipart upload; objects: {objects}"
    assert ck.find_latest_committed(root) == 1
    assert ck.verify_step(ck.step_dir(root, 2)) == "no commit marker (the save did not finish)"
    fs, path = storage.open_fs(ck.step_dir(root, 2))
    assert not fs.exists(f"{path}/actor/model.pt")  # an unfinished multipart upload is invisible
    # The restarted attempt redoes step 2 and commits it; only then may retention drop step 1.
    _save_step(root, 2, _model(tmp_path, b"c", mib=1))
    assert ck.find_latest_committed(root) == 2
    assert ck.apply_retention(root, keep=1) == [1]


def test_endpoint_down_mid_upload(moto: MotoServer, s3: tuple[str, str], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _, root = s3
    _save_step(root, 1, _model(tmp_path, b"a", mib=1))
    proxy = TcpProxy(moto.port, bytes_per_s=8 << 20).up()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv(storage.ATTEMPTS_ENV, "2")
    big = _model(tmp_path, b"b", mib=16)
    # Outage 1: the endpoint vanishes for good during the upload -> a clear error, nothing committed.
    threading.Timer(0.7, proxy.down).start()
    started = time.monotonic()
    with pytest.raises(storage.StorageError, match="uploading .* failed 2 times"):
        _save_step(root, 2, big)
    assert time.monotonic() - started < 60
    proxy.up()
    assert ck.find_latest_committed(root) == 1
    # Outage 2: a blip; retries with backoff carry the save through and step 2 commits.
    monkeypatch.setenv(storage.ATTEMPTS_ENV, "6")
    threading.Timer(0.7, proxy.down).start()
    threading.Timer(1.5, proxy.up).start()
    _save_step(root, 2, big)
    proxy.down()
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)
    assert ck.find_latest_committed(root) == 2


def test_endpoint_stopped_fails_fast_with_a_clear_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = MotoServer().start()
    for key, value in {**s3_env(server.url), "AWS_MAX_ATTEMPTS": "1", storage.ATTEMPTS_ENV: "2"}.items():
        monkeypatch.setenv(key, value)
    make_bucket(server.url, "gone")
    server.stop()
    started = time.monotonic()
    with pytest.raises(storage.StorageError, match="Check that the storage endpoint is reachable"):
        _save_step("s3://gone/run", 1, _model(tmp_path, b"a", mib=1))
    assert time.monotonic() - started < 30


def test_corrupt_object_falls_back_and_retention_waits_for_a_newer_commit(s3: tuple[str, str],
                                                                          tmp_path: Path) -> None:
    endpoint, root = s3
    for step, fill in ((1, b"a"), (2, b"b")):
        _save_step(root, step, _model(tmp_path, fill, mib=1))
    bucket, key = root.removeprefix("s3://").split("/", 1)
    # Same size, different bytes: only the checksum can tell.
    _client(endpoint).put_object(Bucket=bucket, Key=f"{key}/global_step_2/actor/model.pt", Body=b"x" * (1 << 20))
    skipped: list[str] = []
    assert ck.find_latest_committed(root, log=skipped.append) == 1
    assert "checksum mismatch for actor/model.pt" in skipped[0]
    # A save of step 3 in progress (no marker yet): retention must not touch the last good steps.
    storage.upload_file(str(_model(tmp_path, b"c", mib=1)), f"{ck.step_dir(root, 3)}/actor/model.pt")
    assert ck.apply_retention(root, keep=1) == [1]  # newest committed (2, by its marker) is kept, 3 spared
    assert ck.list_steps(root) == [2, 3]
    ck.save_trainer_state(ck.step_dir(root, 3), ck.TrainerState(global_step=3))
    ck.commit_step(root, 3)
    assert ck.apply_retention(root, keep=1) == [2]
    assert ck.find_latest_committed(root) == 3
