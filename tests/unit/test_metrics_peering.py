"""Operator metrics (phase gauge, API errors, /metrics + /healthz) and the peering rule for replicas."""

from __future__ import annotations

import datetime

import aiohttp
import pytest
from prometheus_client import generate_latest

from rljob_operator import metrics, peering
from tests.support.operator_proc import free_port

NOW = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.timezone.utc)


def gauge(phase: str) -> float:
    return metrics.JOBS.labels(phase=phase)._value.get()


def test_phase_tracker_counts_jobs_by_phase() -> None:
    tracker = metrics.PhaseTracker()
    assert all(gauge(p) == 0 for p in metrics.PHASES)  # every phase is reported, also at 0
    tracker.set("a", "Running")
    tracker.set("b", "Running")
    tracker.set("c", "Failed")
    assert (gauge("Running"), gauge("Failed")) == (2, 1)
    tracker.set("a", "Succeeded")  # a job moves: counted once, in its new phase
    tracker.set("c", None)  # deleted
    assert (gauge("Running"), gauge("Succeeded"), gauge("Failed")) == (1, 1, 0)
    tracker.set("b", None)
    tracker.set("a", None)


def test_api_errors_by_verb_and_code() -> None:
    before = metrics.API_ERRORS.labels(verb="patch", code="409")._value.get()
    metrics.record_api_error("patch", 409)
    assert metrics.API_ERRORS.labels(verb="patch", code="409")._value.get() == before + 1
    assert b'rljob_api_errors_total{code="409",verb="patch"}' in generate_latest(metrics.REGISTRY)


@pytest.mark.asyncio
async def test_metrics_and_health_endpoint() -> None:
    port = free_port()
    runner = await metrics.start_http(port, host="127.0.0.1")
    try:
        metrics.RECONCILES.labels(trigger="test").inc()
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                text = await resp.text()
                assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
            async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                assert (resp.status, await resp.text()) == (200, "ok\n")
    finally:
        await runner.cleanup()
    assert 'rljob_reconciles_total{trigger="test"}' in text
    assert "rljob_reconcile_duration_seconds_bucket" in text and 'rljob_jobs{phase="Restarting"}' in text


def peer(priority: int, seconds_ago: float = 1, lifetime: int = 60) -> dict[str, object]:
    seen = NOW - datetime.timedelta(seconds=seconds_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


@pytest.mark.parametrize(("peers", "active"), [
    ({}, True),
    ({"me": peer(10)}, True),  # our own keep-alive does not count
    ({"me": peer(10), "other": peer(5)}, True),
    ({"me": peer(10), "other": peer(20)}, False),
    ({"me": peer(10), "other": peer(10)}, False),  # equal priorities pause both, as in kopf
    ({"me": peer(10), "other": peer(20, seconds_ago=61)}, True),  # its keep-alive expired: it crashed
    ({"me": peer(10), "other": peer(20, seconds_ago=5, lifetime=3)}, True),
    ({"me": peer(10), "other": {"priority": 20}}, False),  # no lastseen: treated as alive
    ({"me": peer(10), "odd": "not a mapping"}, True),
])
def test_is_active_follows_kopf(peers: dict[str, object], active: bool) -> None:
    assert peering.is_active(peers, "me", 10, NOW) is active


def test_identity_priority_and_objects() -> None:
    assert peering.own_identity({"POD_ID": "op-7d9"}).startswith("op-7d9/")
    assert peering.own_identity({}) != peering.own_identity({})
    assert 1 <= peering.random_priority() <= 2**30
    assert peering.peering_object("p", None)["kind"] == "ClusterKopfPeering"
    assert peering.peering_object("p", "ns") == {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                                                 "metadata": {"name": "p", "namespace": "ns"}}
