"""Smoke test of the scale benchmark (N=5): it converges and stays within the request budget."""

from __future__ import annotations

from bench.operator_scale import run_benchmark


def test_scale_benchmark_smoke() -> None:
    result = run_benchmark(5, timeout=60)
    assert result["completed"], result
    assert result["requests_per_rljob"] < 10, result["requests_by_verb"]
    assert 0 < result["operator_peak_rss_mb"] < 300
