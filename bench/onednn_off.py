"""TF with oneDNN off as a peer. TF reads TF_ENABLE_ONEDNN_OPTS once at start-up,
so a benchmark times that peer in a child process of itself, run with
`--onednn-off-worker`, which writes its timings as JSON; the ratio to the
parent's TF timings then crosses processes (and carries the machine's drift between them)."""

import json
import os
import pathlib
import subprocess
import sys

FLAG = "--onednn-off-worker"


def timings_from_child(module: str, argv: list[str], out: pathlib.Path):
    """Runs `python -m module FLAG *argv --out out` with oneDNN off; returns what it wrote."""
    subprocess.run([sys.executable, "-m", module, FLAG, *argv, "--out", str(out)], check=True,
                   env=dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0"))
    return json.loads(result_path(out).read_text())


def result_path(out: pathlib.Path) -> pathlib.Path:
    return out / "onednn_off.json"
