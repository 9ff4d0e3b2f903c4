"""The command line every benchmark shares: `--quick` (a few T and, where a
benchmark tunes, the quick search budget) and `--out`, and what --quick picks."""

import argparse
import pathlib

from bench.workloads import QUICK_SEQUENCE_LENGTHS, SEQUENCE_LENGTHS


def parser(description: str, default_out: str | None, quick_help: str) -> argparse.ArgumentParser:
    """A parser with --quick and --out (default_out None: the benchmark picks it from other arguments);
    benchmarks add their own arguments."""
    result = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    result.add_argument("--quick", action="store_true", help=quick_help)
    result.add_argument("--out", type=pathlib.Path, default=None if default_out is None else pathlib.Path(default_out))
    return result


def sequence_lengths(quick: bool) -> tuple[int, ...]:
    return QUICK_SEQUENCE_LENGTHS if quick else SEQUENCE_LENGTHS


def search_options(quick: bool):
    """The tuner's budget (imported here: benchmarks that do not tune start without TVM)."""
    from tf_dietcode.tuning import search

    return search.QUICK if quick else search.SearchOptions()
