"""bench.tuning_budget's pieces: each budget's own tuning database (the default's copied from an
earlier run, kernels and all; a rerun's own records kept beside the copy), and the
default-over-quick ratio it reports."""

import json

import pytest

from bench import cli, tuning_budget


def test_each_budget_gets_its_own_database_and_only_the_default_starts_from_the_copy(tmp_path):
    earlier = tmp_path / "suite_bert_base"
    (earlier / "tuning.kernels").mkdir(parents=True)
    (earlier / "tuning.kernels" / "kernel.so").write_bytes(b"compiled")
    (earlier / "tuning.jsonl").write_text(json.dumps({"workload": "w", "target": "t"}) + "\n")
    folder = tmp_path / "family"
    folder.mkdir()
    (folder / "tuning_quick.jsonl").write_text("a stale line from an earlier run\n")

    found = tuning_budget.databases(folder, earlier)

    assert sorted(found) == ["default", "quick"]
    assert (folder / "tuning_default.jsonl").read_text() == (earlier / "tuning.jsonl").read_text()
    assert (folder / "tuning_default.kernels" / "kernel.so").read_bytes() == b"compiled"
    assert not (folder / "tuning_quick.jsonl").exists()  # the quick budget tunes from nothing
    assert found["quick"].path == folder / "tuning_quick.jsonl"
    assert (earlier / "tuning.jsonl").read_text().count("\n") == 1  # the earlier run's database untouched


def test_a_rerun_keeps_its_own_records_beside_the_copied_ones(tmp_path):
    earlier = tmp_path / "bert_base"
    earlier.mkdir()
    copied = [json.dumps({"workload": w, "target": "t"}) for w in ("bert", "shared")]
    (earlier / "tuning.jsonl").write_text("".join(f"{line}\n" for line in copied))
    own = [json.dumps({"workload": w, "target": "t"}) for w in ("minilm", "shared")]
    path = tmp_path / "precision" / "tuning.jsonl"
    path.parent.mkdir()
    path.write_text("".join(f"{line}\n" for line in own))

    cli.tuning_database(path, earlier)

    assert path.read_text().splitlines() == [own[0], own[1], copied[0]]  # each record once
    assert (earlier / "tuning.jsonl").read_text().splitlines() == copied


def test_a_database_without_a_source_starts_empty(tmp_path):
    database = cli.tuning_database(tmp_path / "tuning.jsonl")
    assert database.path == tmp_path / "tuning.jsonl" and not database.path.exists()


def test_default_over_quick_is_the_quick_time_over_the_default_time_per_t():
    rows = [{"workload": "enc_batch1", "T": t, "peer": name, "ms": ms}
            for t, times in [(1, {"tensorflow": 9.0, "dietcode_default": 4.0, "dietcode_quick": 5.0}),
                             (5, {"tensorflow": 9.0, "dietcode_default": 4.0, "dietcode_quick": 3.0})]
            for name, ms in times.items()]
    assert tuning_budget.default_over_quick(rows) == {"enc_batch1": pytest.approx([1.25, 0.75])}
