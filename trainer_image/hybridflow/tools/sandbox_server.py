"""A small HTTP service speaking SandboxFusion's `POST /run_code` API over the local sandbox.

Request (JSON): code, language (only "python"), run_timeout, compile_timeout (accepted, unused),
memory_limit_MB (<= 0: the server default), stdin; files / fetch_files / args must be empty.
Response: {"status": "Success" | "Failed" | "SandboxError", "message", "compile_result": null,
"run_result": {status, execution_time, return_code, stdout, stderr}, "executor_pod_name": null,
"files": {}, "sandbox": {isolation, network_isolated, limits_hit, reason}} -- the last key is ours.
`GET /healthz` reports the isolation in effect. Bad requests get HTTP 400 with a message saying what
to change. Run it with `python -m hybridflow.tools.sandbox_server --host 127.0.0.1 --port 8080`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hybridflow.tools.sandbox import SUPPORTED_LANGUAGES, RunResult, isolation_report, run_code

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """Limits the server enforces on every request."""

    max_concurrency: int = 4  # sandboxes at once; further requests wait for a slot
    max_run_timeout: float = 300.0  # seconds; larger run_timeout values are rejected
    default_memory_mb: int = 1024  # used when a request sends memory_limit_MB <= 0 (SandboxFusion's -1)
    max_memory_mb: int = 8192
    max_output_bytes: int = 1 << 20  # per stream, as SandboxFusion caps its captured output


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """A validated `run_code` request."""

    code: str
    language: str
    run_timeout: float
    memory_limit_mb: int
    stdin: str | None


class BadRequest(ValueError):
    """A request the server refuses; the message says what to change."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


def parse_run_request(payload: Any, settings: ServerSettings) -> RunRequest:
    """Validate a decoded `run_code` body against SandboxFusion's shape and the server's limits."""
    if not isinstance(payload, dict):
        raise BadRequest(f"the body must be a JSON object with at least 'code', not a JSON {type(payload).__name__}")
    code = payload.get("code")
    if not isinstance(code, str):
        raise BadRequest("'code' is required and must be a string (the program to run)" if code is None
                         else f"'code' must be a string, not {type(code).__name__}")
    language = payload.get("language", "python")
    if language not in SUPPORTED_LANGUAGES:
        raise BadRequest(f"language {language!r} is not supported here; use one of: {', '.join(SUPPORTED_LANGUAGES)}")
    run_timeout = _number(payload, "run_timeout", 10.0)
    _number(payload, "compile_timeout", 10.0)  # SandboxFusion's field; python has no compile step
    if not 0 < run_timeout <= settings.max_run_timeout:
        raise BadRequest(f"run_timeout={run_timeout:g} must be > 0 and <= {settings.max_run_timeout:g} seconds")
    memory = payload.get("memory_limit_MB", -1)
    if not isinstance(memory, int) or isinstance(memory, bool):
        raise BadRequest(f"'memory_limit_MB' must be an integer number of MB (-1 for the default), not {memory!r}")
    memory = settings.default_memory_mb if memory <= 0 else memory
    if not 32 <= memory <= settings.max_memory_mb:
        raise BadRequest(f"memory_limit_MB={memory} must be between 32 and {settings.max_memory_mb}")
    stdin = payload.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        raise BadRequest(f"'stdin' must be a string or null, not {type(stdin).__name__}")
    for key in ("files", "fetch_files", "args"):
        if payload.get(key):
            raise BadRequest(f"'{key}' is not supported by this sandbox: send it empty and inline the data in the code")
    return RunRequest(code, language, run_timeout, memory, stdin)


def _number(payload: dict, key: str, default: float) -> float:
    value = payload.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise BadRequest(f"'{key}' must be a number of seconds, not {value!r}")
    return float(value)


def build_response(result: RunResult) -> dict[str, Any]:
    """SandboxFusion's RunCodeResponse for a local run (status rules as in its parse_run_status)."""
    if result.status == "Error":
        status, message = "SandboxError", result.sandbox_error or result.reason
    elif result.status == "TimeLimitExceeded" or result.return_code != 0:
        status, message = "Failed", ""
    else:
        status, message = "Success", ""
    return {
        "status": status,
        "message": message,
        "compile_result": None,
        "run_result": {
            "status": result.status,
            "execution_time": result.execution_time,
            "return_code": result.return_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
        },
        "executor_pod_name": None,
        "files": {},
        "sandbox": {"isolation": result.isolation, "network_isolated": result.network_isolated,
                    "limits_hit": result.limits_hit, "reason": result.reason},
    }


def result_from_response(body: dict[str, Any]) -> RunResult:
    """A RunResult from a SandboxFusion response (ours or the real service's); raises ValueError if malformed."""
    run = body.get("run_result") or {}
    extra = body.get("sandbox") or {}
    if not isinstance(run, dict) or not isinstance(extra, dict) or "status" not in body:
        raise ValueError(f"not a SandboxFusion run_code response: {json.dumps(body)[:200]}")
    if body["status"] == "SandboxError" or not run:
        message = body.get("message") or "the sandbox reported an error without a message"
        return RunResult("Error", None, "", "", 0.0, reason=str(message), sandbox_error=str(message))
    return RunResult(
        status=run.get("status", "Error"),
        return_code=run.get("return_code"),
        stdout=run.get("stdout") or "",
        stderr=run.get("stderr") or "",
        execution_time=float(run.get("execution_time") or 0.0),
        limits_hit=list(extra.get("limits_hit", [])),
        reason=str(extra.get("reason", "")),
        isolation=str(extra.get("isolation", "remote")),
        network_isolated=bool(extra.get("network_isolated", False)),
    )


class SandboxServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that runs at most `settings.max_concurrency` sandboxes at once."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], settings: ServerSettings | None = None) -> None:
        self.settings = settings or ServerSettings()
        if self.settings.max_concurrency < 1:
            raise ValueError(f"max_concurrency={self.settings.max_concurrency} must be at least 1")
        self.slots = threading.BoundedSemaphore(self.settings.max_concurrency)
        super().__init__(address, _Handler)


class JSONHandler(BaseHTTPRequestHandler):
    """A request handler that answers JSON and logs at debug level (the run_code server's and the router's)."""

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        self._send(status, json.dumps(body).encode())

    def _send(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        logger.debug("%s %s", self.address_string(), format % args)


class _Handler(JSONHandler):
    server: SandboxServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path != "/healthz":
            self._reply(HTTPStatus.NOT_FOUND, {"message": f"no such endpoint {self.path}: use POST /run_code or GET /healthz"})
            return
        self._reply(HTTPStatus.OK, {"status": "ok", **isolation_report()})

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/run_code":
            self._reply(HTTPStatus.NOT_FOUND, {"message": f"no such endpoint {self.path}: use POST /run_code or GET /healthz"})
            return
        try:
            request = parse_run_request(self._read_json(), self.server.settings)
        except BadRequest as exc:
            self._reply(exc.status, {"message": str(exc)})
            return
        with self.server.slots:
            result = run_code(
                request.code, language=request.language, run_timeout=request.run_timeout,
                memory_limit_mb=request.memory_limit_mb, stdin=request.stdin,
                max_output_bytes=self.server.settings.max_output_bytes,
            )
        self._reply(HTTPStatus.OK, build_response(result))

    def _read_json(self) -> Any:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise BadRequest("send the JSON body with a Content-Length header", HTTPStatus.LENGTH_REQUIRED)
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            raise BadRequest(f"the body is {length} bytes; the limit is {MAX_BODY_BYTES}", HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        raw = self.rfile.read(int(length))
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise BadRequest(f"the body is not valid JSON ({exc}); send a JSON object such as "
                             '{"code": "print(1)", "language": "python"}') from None



def serve_in_thread(host: str = "127.0.0.1", port: int = 0,
                    settings: ServerSettings | None = None) -> tuple[SandboxServer, str]:
    """Start a server in a daemon thread; returns it and its base URL (stop: shutdown(), server_close())."""
    server = SandboxServer((host, port), settings)
    threading.Thread(target=server.serve_forever, name="sandbox-server", daemon=True).start()
    return server, f"http://{host}:{server.server_address[1]}"


def main(argv: list[str] | None = None) -> None:
    """CLI: serve `run_code` until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m hybridflow.tools.sandbox_server", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (the pod IP or 0.0.0.0 on a cluster)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--max-concurrency", type=int, default=ServerSettings.max_concurrency)
    parser.add_argument("--max-run-timeout", type=float, default=ServerSettings.max_run_timeout)
    parser.add_argument("--default-memory-mb", type=int, default=ServerSettings.default_memory_mb)
    args = parser.parse_args(argv)
    if args.max_concurrency < 1:
        parser.error(f"--max-concurrency={args.max_concurrency} must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ServerSettings(max_concurrency=args.max_concurrency, max_run_timeout=args.max_run_timeout,
                              default_memory_mb=args.default_memory_mb)
    server = SandboxServer((args.host, args.port), settings)
    logger.info("sandbox server on http://%s:%d (POST /run_code); isolation: %s", args.host,
                server.server_address[1], isolation_report())
    signal.signal(signal.SIGTERM, _raise_interrupt)  # Kubernetes stops pods with SIGTERM
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        logger.info("sandbox server stopping; runs in flight are killed with it")
    finally:
        server.server_close()


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
