"""tf-dietcode tune: a bundle and a readable table; bad input exits 2 with a message."""

import json

from tf_dietcode import cli
from tf_dietcode.tuning import bundle


def test_tune_from_a_spec_file_writes_a_bundle(tmp_path, capsys):
    spec = tmp_path / "workloads.json"
    spec.write_text(json.dumps([{"kind": "dense", "m": [1, 24], "n": 16, "k": 8, "activation": "tanh"}]))
    assert cli.main(["tune", "--spec", str(spec), "--out", str(tmp_path / "bundle"), "--trials", "3",
                     "--quick", "--db", str(tmp_path / "db.jsonl")]) == 0
    manifest = json.loads((tmp_path / "bundle" / bundle.MANIFEST).read_text())
    assert len(manifest["workloads"]) == 1
    out = capsys.readouterr().out
    assert "dense B=1, M=1..24, N=16, K=8" in out and "M     1.." in out
    assert (tmp_path / "db.jsonl").read_text().count("\n") >= 3


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["tune", "--m", "1:8", "--out", str(tmp_path / "b")]) == 2
    assert "give --spec FILE, or --m LO:HI with --n and --k" in capsys.readouterr().err
    assert cli.main(["tune", "--m", "9:1", "--n", "8", "--k", "8", "--out", str(tmp_path / "b")]) == 2
    assert "lo <= hi" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
