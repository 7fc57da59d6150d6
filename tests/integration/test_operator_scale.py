"""Smoke test of the scale benchmark (small N): it converges with the webhook in the path, within the request budget."""

from __future__ import annotations

import math

import pytest

from bench.operator_scale import percentile, run_benchmark
from tests.support import binaries


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([3.0], 99) == 3.0 and math.isnan(percentile([], 50))


def test_scale_benchmark_with_the_webhook_in_the_path() -> None:
    try:
        binaries.ensure("helm")
    except binaries.BinaryUnavailable as err:
        pytest.skip(f"no helm binary to render the chart's webhook configuration: {err}")
    result = run_benchmark(6, timeout=60, webhook=True, concurrency=3, probe=20)
    assert result["completed"], result
    assert result["create_failures"] == 0 and result["rayjobs"] == result["validated"] == 6
    assert result["requests_per_rljob"] < 10, result["requests_by_verb"]
    assert 0 < result["operator_peak_rss_mb"] < 300
    # Admission was in the path: the invalid copy was refused, every create was sent to the webhook and allowed,
    # and the operator counted the answers on its own side.
    assert result["invalid_refused"]
    assert result["webhook_calls"] >= 6 and set(result["webhook_outcomes"]) == {"allowed"}, result["webhook_outcomes"]
    assert result["webhook_operator_answered"] >= 6 and result["webhook_operator_mean_ms"] > 0
    assert result["probe_reviews"] == 20 and 0 < result["probe_p50_ms"] <= result["probe_p99_ms"]
    assert 0 < result["webhook_p50_ms"] <= result["webhook_p99_ms"] and result["create_p99_ms"] > 0


def test_scale_benchmark_without_the_webhook() -> None:
    result = run_benchmark(5, timeout=60, webhook=False, concurrency=5)
    assert result["completed"], result
    assert result["requests_per_rljob"] < 10, result["requests_by_verb"]
    assert "webhook_calls" not in result and "webhook_p99_ms" not in result["targets_met"]
