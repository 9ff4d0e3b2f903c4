"""Benchmarks against peers; never part of the test suite. The product benchmarks sit at this level
with what they share (timing.py: how everything is timed), one-off studies under studies/."""
