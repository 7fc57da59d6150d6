"""Benchmarks (run by hand: `python -m bench.<name>`; not part of the test suite)."""
