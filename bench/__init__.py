"""Benchmarks against peers; never part of the test suite."""
