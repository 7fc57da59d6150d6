"""One `run_code` URL in front of several sandbox servers: requests spread over them, a dead one skipped.

The trainer runs the code sandbox's servers on the RLJob's sandbox pods (hybridflow.controller.sandbox_service).
Their addresses change when Ray restarts one (a new port, or a new pod), and the code scorers run in worker
processes that cannot ask Ray, so the consumers are given this router's address instead: it listens on the
driver's loopback interface, forwards each `POST /run_code` body unchanged to the next server in turn, and
returns that server's answer. A server that cannot be reached, closes the connection, times out or answers
5xx is marked down and the request goes to the next one (the sandbox runs are side-effect free, so a run cut
short is run again). A server that answers SandboxError (its sandbox could not run the code: say it is being
killed and its supervisor died first) stays listed, but the request goes to another server; only when every
server answered so does the caller get that answer. The list of servers comes from `backends()`, asked again when none is left, and every
`refresh_s` while one is down (a restarted server comes back under a new address). When no server answers
for `give_up_s` the router replies 503 with what went wrong, before the consumers' own timeouts (the code
scorer waits run_timeout + 30 s) would hide it. Listing holds the router's lock (a listing that asks Ray takes
up to a couple of seconds), so requests wait for it rather than hitting servers already known to be gone. `GET /healthz` lists the servers. Ray-free: the
caller passes `backends`.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http import HTTPStatus
from http.server import ThreadingHTTPServer

from hybridflow.tools.sandbox_server import MAX_BODY_BYTES, JSONHandler

logger = logging.getLogger(__name__)

#: Seconds a forwarded request may take beyond its run_timeout (start-up, queueing behind max_concurrency).
FORWARD_MARGIN_S = 60.0


class _Down(Exception):
    """A server did not give an answer (unreachable, cut off, timed out, 5xx): try another."""


class SandboxRouter:
    """Forward run_code requests over the servers `backends()` lists (base URLs such as http://10.0.0.7:41234)."""

    def __init__(self, backends: Callable[[], list[str]], *, host: str = "127.0.0.1", port: int = 0,
                 refresh_s: float = 5.0, give_up_s: float = 30.0) -> None:
        self._backends = backends
        self.refresh_s = refresh_s
        self.give_up_s = give_up_s
        self._lock = threading.Lock()
        self._servers: list[str] = []
        self._down: set[str] = set()
        self._turn = itertools.count()
        self._refreshed_at = float("-inf")
        #: Requests moved to another server after one failed, and answers per server (for logs and tests).
        self.failovers = 0
        self.answered: dict[str, int] = {}
        self._http = ThreadingHTTPServer((host, port), _Handler)
        self._http.daemon_threads = True
        self._http.router = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The run_code endpoint to give consumers (sandbox_fusion_url)."""
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}/run_code"

    def start(self) -> SandboxRouter:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(target=self._http.serve_forever, name="sandbox-router", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving."""
        if self._thread is not None:
            self._http.shutdown()
            self._thread = None
        self._http.server_close()

    def servers(self) -> list[str]:
        """The servers as last listed (some may be marked down)."""
        with self._lock:
            return list(self._servers)

    def forward(self, body: bytes, run_timeout: float) -> tuple[int, bytes]:
        """(HTTP status, body) of the first server that answers; 503 when none does within give_up_s."""
        deadline = time.monotonic() + self.give_up_s
        problems: list[str] = []
        tried: set[str] = set()  # servers that answered a sandbox error for this request
        sandbox_error: tuple[int, bytes] | None = None
        while True:
            server = self._pick(exclude=tried)
            if server is not None:
                try:
                    answer = self._post(server, body, run_timeout)
                except _Down as exc:
                    self._mark_down(server, str(exc))
                    problems.append(f"{server}: {exc}")
                else:
                    with self._lock:
                        self.answered[server] = self.answered.get(server, 0) + 1
                    if not _is_sandbox_error(answer):
                        return answer
                    # The server could not run the code (its sandbox failed: say the server is being killed and
                    # its supervisor went first); another may. The server stays listed: it did answer.
                    with self._lock:
                        self.failovers += 1
                    logger.warning("sandbox server %s could not run the code (SandboxError); trying another", server)
                    tried.add(server)
                    sandbox_error = answer
                    continue
            if sandbox_error is not None and (server is None or time.monotonic() >= deadline):
                return sandbox_error  # every server that answered failed to run it: the caller reads why
            if time.monotonic() >= deadline:
                seen = "; ".join(problems[-3:]) or "no server is listed (none started, or all are restarting)"
                message = (f"no sandbox server answered within {self.give_up_s:g}s ({seen}); check that the sandbox "
                           "pods (the RLJob's spec.roles.sandbox) are running and their run_code servers are up")
                return HTTPStatus.SERVICE_UNAVAILABLE, json.dumps({"message": message}).encode()
            if server is None:
                time.sleep(0.2)  # every server is down until the next listing (refresh_s): wait for it

    def _pick(self, exclude: set[str]) -> str | None:
        with self._lock:
            stale = time.monotonic() - self._refreshed_at >= self.refresh_s
            if stale and (self._down or not self._servers):
                self._refresh_locked()
            usable = [s for s in self._servers if s not in self._down and s not in exclude]
            if not usable:
                return None
            return usable[next(self._turn) % len(usable)]

    def _refresh_locked(self) -> None:
        try:
            servers = list(self._backends())
        except Exception as exc:  # noqa: BLE001 - whatever listing fails with, keep the last list and say why
            logger.warning("sandbox router: listing the sandbox servers failed (%s); keeping %s", exc, self._servers)
            servers = self._servers
        self._servers = servers
        self._down = set()  # a listed server answered its owner just now: give it another chance
        self._refreshed_at = time.monotonic()

    def _mark_down(self, server: str, why: str) -> None:
        with self._lock:
            if server not in self._down:
                self._down.add(server)
                self.failovers += 1
                logger.warning("sandbox server %s is down (%s); its requests go to the others", server, why)

    @staticmethod
    def _post(server: str, body: bytes, run_timeout: float) -> tuple[int, bytes]:
        request = urllib.request.Request(f"{server}/run_code", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=run_timeout + FORWARD_MARGIN_S) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            if exc.code >= 500:
                raise _Down(f"HTTP {exc.code}") from None
            return exc.code, exc.read()  # the request's own fault: the caller reads the server's message
        except (urllib.error.URLError, OSError) as exc:  # refused, reset, timed out
            raise _Down(str(getattr(exc, "reason", None) or exc)) from None


def _is_sandbox_error(answer: tuple[int, bytes]) -> bool:
    """A 200 whose body says SandboxError: the server answered but its sandbox could not run the code."""
    status, body = answer
    if status != HTTPStatus.OK:
        return False
    try:
        return json.loads(body).get("status") == "SandboxError"
    except (ValueError, AttributeError):
        return False


class _Handler(JSONHandler):
    protocol_version = "HTTP/1.1"

    @property
    def router(self) -> SandboxRouter:
        return self.server.router  # type: ignore[attr-defined]

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path != "/healthz":
            self._reply(HTTPStatus.NOT_FOUND, {"message": f"no such endpoint {self.path}: use POST /run_code or GET /healthz"})
            return
        self._reply(HTTPStatus.OK, {"status": "ok", "servers": self.router.servers()})

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/run_code":
            self._reply(HTTPStatus.NOT_FOUND, {"message": f"no such endpoint {self.path}: use POST /run_code or GET /healthz"})
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit() or int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            self._reply(HTTPStatus.BAD_REQUEST, {"message": f"send a JSON body of at most {MAX_BODY_BYTES} bytes "
                                                            "with a Content-Length header"})
            return
        body = self.rfile.read(int(length))
        status, answer = self.router.forward(body, _run_timeout(body))
        self._send(status, answer)



def _run_timeout(body: bytes) -> float:
    """The request's run_timeout (the servers check it; here it only sizes the forwarding timeout)."""
    try:
        value = json.loads(body).get("run_timeout", 10.0)
    except (ValueError, AttributeError):
        return 10.0
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else 10.0
