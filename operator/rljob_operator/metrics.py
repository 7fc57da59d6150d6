"""The operator's Prometheus metrics and its `/metrics` + `/healthz` HTTP endpoint."""

from __future__ import annotations

from collections import Counter as Tally

import aiohttp.web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

REGISTRY = CollectorRegistry()
RECONCILES = Counter("rljob_reconciles_total", "Reconciles of RLJobs, by trigger.", ["trigger"], registry=REGISTRY)
RECONCILE_ERRORS = Counter("rljob_reconcile_errors_total", "Failed reconciles, by trigger and error kind.",
                           ["trigger", "error"], registry=REGISTRY)
RECONCILE_SECONDS = Histogram("rljob_reconcile_duration_seconds", "Time spent in one reconcile.",
                              buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=REGISTRY)
JOBS = Gauge("rljob_jobs", "RLJobs known to this operator, by phase.", ["phase"], registry=REGISTRY)
ATTEMPTS = Counter("rljob_attempts_total", "Attempts started (RayJobs created).", registry=REGISTRY)
PODS_LOST = Counter("rljob_pods_lost_total", "Pods of running attempts lost (deleted, failed, Ray container restarted), "
                    "by role: a lost trainer pod ends its attempt.", ["role"], registry=REGISTRY)
API_ERRORS = Counter("rljob_api_errors_total", "Kubernetes API requests that failed, by verb and HTTP code.",
                     ["verb", "code"], registry=REGISTRY)
PHASES = ("Pending", "Invalid", "SmokeRun", "Queued", "Suspended", "Starting", "Running", "Retrying", "Restarting",
          "Succeeded", "Failed")


class PhaseTracker:
    """The phase of every known RLJob, mirrored into the `rljob_jobs{phase}` gauge."""

    def __init__(self) -> None:
        """Start with no jobs (every phase reported as 0)."""
        self._phases: dict[str, str] = {}
        self._publish()

    def set(self, uid: str, phase: str | None) -> None:
        """Record a job's phase (None: forget the job, e.g. deleted)."""
        if phase is None:
            self._phases.pop(uid, None)
        else:
            self._phases[uid] = phase
        self._publish()

    def _publish(self) -> None:
        counts = Tally(self._phases.values())
        for phase in set(PHASES) | set(counts):
            JOBS.labels(phase=phase).set(counts.get(phase, 0))


def record_api_error(verb: str, code: int) -> None:
    """Count a failed API request (hooked into the client)."""
    API_ERRORS.labels(verb=verb, code=str(code)).inc()


async def start_http(port: int, host: str = "0.0.0.0") -> aiohttp.web.AppRunner:
    """Serve `/metrics` (Prometheus text format) and `/healthz` (liveness) on `port`."""

    async def metrics(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        # The event loop answering is what liveness means here: a wedged operator loop cannot reply.
        return aiohttp.web.Response(text="ok\n")

    app = aiohttp.web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, host, port).start()
    return runner
