"""The command line every benchmark shares: `--quick` (a few T and, where a
benchmark tunes, the quick search budget) and `--out`, and what --quick picks."""

import argparse
import pathlib
import shutil

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


def tuning_database(path: pathlib.Path, copy_from: pathlib.Path | None = None):
    """The tuning database at `path`, holding (when copy_from is given) copy_from's tuning.jsonl
    records and the kernels kept compiled beside it: a later part of the suite reads an earlier
    part's tuning instead of repeating it, and never writes into that part's database. Records
    already at `path` stay (a rerun of the part keeps what it tuned itself: the precision part's
    MiniLM, 16 of its 38 minutes); a fresh output folder starts from the copy alone."""
    from tf_dietcode.tuning.database import Database

    if copy_from is not None:
        own = path.read_text().splitlines() if path.exists() else []
        copied = (copy_from / "tuning.jsonl").read_text().splitlines()
        path.write_text("".join(f"{line}\n" for line in dict.fromkeys(own + copied)))
        kept = (copy_from / "tuning.jsonl").with_suffix(".kernels")
        if kept.is_dir():
            shutil.copytree(kept, path.with_suffix(".kernels"), dirs_exist_ok=True)
    return Database(path)
