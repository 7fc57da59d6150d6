"""A real S3 HTTP endpoint for tests: `moto_server` on 127.0.0.1, optionally behind a TCP proxy.

The proxy lets a test take "the endpoint" down and bring it back while moto keeps its objects (moto
keeps everything in memory, so stopping moto itself would also lose the checkpoints under test), and
can slow traffic down so a test reliably catches an upload in the middle.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from tests.support.server_process import free_port, start_http_server, stop_process

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _moto_command() -> list[str]:
    exe = Path(sys.executable).with_name("moto_server")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("moto_server")
    if found:
        return [found]
    return [sys.executable, "-m", "moto.server"]


class MotoServer:
    """`moto_server -H 127.0.0.1 -p <port>` as a subprocess; `stop()` ends it (and its objects)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> MotoServer:
        """Start the server and wait until it answers HTTP."""
        self.process = start_http_server(
            [*_moto_command(), "-H", "127.0.0.1", "-p", str(self.port)], f"{self.url}/moto-api/",
            name="moto_server", timeout_s=timeout_s, died_hint="is moto[server] installed?",
        )
        return self

    def reset(self) -> None:
        """Drop every bucket and object (moto's reset API)."""
        req = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=5).close()

    def stop(self) -> None:
        """Terminate the server (idempotent)."""
        stop_process(self.process)
        self.process = None


class TcpProxy:
    """Forward 127.0.0.1:<port> to a target port; `down()` refuses and cuts connections, `up()` resumes.

    `bytes_per_s` caps the total traffic through the proxy (all connections together, as a slow link
    would), so a large upload takes a predictable while however many parts go in parallel.
    """

    def __init__(self, target_port: int, bytes_per_s: float | None = None) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.bytes_per_s = bytes_per_s
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._link_free_at = 0.0

    def up(self) -> TcpProxy:
        """Start accepting connections on the same port."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def down(self) -> None:
        """Stop listening and reset every open connection (the endpoint vanishes)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _throttle(self, nbytes: int) -> None:
        if not self.bytes_per_s:
            return
        with self._lock:
            now = time.monotonic()
            self._link_free_at = max(now, self._link_free_at) + nbytes / self.bytes_per_s
            wait = self._link_free_at - now
        time.sleep(wait)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                self._throttle(len(chunk))
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with self._lock:
                self._conns.difference_update((src, dst))


def s3_env(endpoint: str) -> dict[str, str]:
    """The AWS variables a trainer process needs to talk to `endpoint`."""
    return {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}


@contextmanager
def moto_s3() -> Iterator[MotoServer]:
    """Run a moto S3 server for the duration of the block."""
    server = MotoServer().start()
    try:
        yield server
    finally:
        server.stop()


def make_bucket(endpoint: str, bucket: str) -> None:
    """Create a bucket through boto3 (what a user does once, outside the trainer)."""
    import boto3

    env = s3_env(endpoint)
    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name=env["AWS_DEFAULT_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    client.create_bucket(Bucket=bucket)


def environ_for(endpoint: str) -> dict[str, str]:
    """os.environ plus the S3 variables, for subprocesses."""
    return {**os.environ, **s3_env(endpoint)}
