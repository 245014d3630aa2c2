"""Helpers that only tests use (what benchmarks share with tests lives in support/)."""
