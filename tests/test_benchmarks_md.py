"""docs/BENCHMARKS.md: its precision section, its per-T losses and its header, from rows shaped like the suite's CSVs;
bench.suite --parts rerunning one part."""

import pathlib

import pytest

from bench import benchmarks_md

MS = {"tensorflow": 20.0, "tensorflow_bf16_amp": 25.0, "onnxruntime": 12.0, "onnxruntime_int8": 6.0,
      "dietcode_float32": 13.0, "dietcode_bfloat16": 8.0, "dietcode_int8": 5.0}


def rows(t: int, faster_ort_int8: bool = False) -> list[dict]:
    times = MS | ({"onnxruntime_int8": 4.0} if faster_ort_int8 else {})
    return [{"workload": "minilm_batch1", "T": t, "peer": peer, "ms": ms, "speedup_vs_tensorflow": 20.0 / ms}
            for peer, ms in times.items()]


def test_behind_at_each_t_names_every_t_where_the_rival_was_faster_and_no_other():
    found = benchmarks_md.behind_at_each_t(rows(1) + rows(62, faster_ort_int8=True),
                                           benchmarks_md.PRECISION_RIVALS)
    assert found == ["- `minilm_batch1`: dietcode_float32 behind onnxruntime at T=1 (12.00 against 13.00 ms), "
                     "T=62 (12.00 against 13.00 ms)",
                     "- `minilm_batch1`: dietcode_int8 behind onnxruntime_int8 at T=62 (4.00 against 5.00 ms)"]
    assert benchmarks_md.behind_at_each_t([], benchmarks_md.PRECISION_RIVALS) == []


def test_precision_section_tabulates_speedups_accuracy_and_the_dram_floor():
    accuracy = [{"model": "minilm", "peer": "dietcode_int8", "min_cosine": 0.99612, "row_error": 0.081,
                 "dense_layers_put_back": 6.0, "put_back_in": "bfloat16"}]
    limits = [{"model": "minilm", "peer": "dietcode_int8", "weight_mib": 10.2, "fits_in_llc": "True",
               "dram_gbps": 34.5, "dram_floor_ms": 0.3, "call_ms": 0.28},
              {"model": "minilm", "peer": "tensorflow", "weight_mib": 41.0, "fits_in_llc": "False",
               "dram_gbps": 34.5, "dram_floor_ms": 1.24, "call_ms": 0.28}]
    peaks = [{"measure": "fma_loop", "value": 200.0, "unit": "GFLOP/s"},
             {"measure": "int8_dot_loop", "value": 800.0, "unit": "GOP/s"}]
    text = benchmarks_md.precision_section(rows(1) + rows(5), accuracy, limits, peaks, lambda name: name)

    assert "| `minilm_batch1` | 0.80x (0.80x at T=1) | 1.67x (1.67x at T=1) |" in text
    assert text.count("4.00x (4.00x at T=1)") == 1  # int8's column
    assert "| `minilm` | dietcode_int8 | 0.99612 | 0.081 | 6 in bfloat16 |" in text
    assert "(34.5 GB/s)" in text and "T = 1:" in text
    assert "| `minilm` | dietcode_int8 | 10 | 5.00 | in the LLC | 0.28 |" in text
    assert "| `minilm` | tensorflow | 41 | 20.00 | 1.24 | 0.28 |" in text
    # at the largest T (5): 2 * 41 MiB / 4 bytes * 5 rows = 0.107 GFLOP over each precision's loop; no bf16 loop
    assert "| `minilm_batch1` | tensorflow | 0.107 | 20.0 | 0.5 (fma_loop, 200 GFLOP/s) |" in text
    assert "| `minilm_batch1` | dietcode_int8 | 0.107 | 5.0 | 0.1 (int8_dot_loop, 800 GOP/s) |" in text
    assert "| `minilm_batch1` | dietcode_bfloat16 | 0.107 | 8.0 | no such loop in peak.csv |" in text


def test_header_names_each_parts_commit_where_a_rerun_part_differs():
    runs = [{"part": "peak", "commit": "aaa"}, {"part": "bert_base", "commit": "aaa"}]
    assert benchmarks_md.commits(runs) == "commit aaa"
    assert benchmarks_md.commits(runs + [{"part": "precision", "commit": "bbb"}]) == \
        "commits aaa (peak, bert_base); bbb (precision)"


def test_suite_parts_rerun_one_part_and_keep_the_others_runs(tmp_path, monkeypatch):
    from bench import report, suite

    out, docs = tmp_path / "out", tmp_path / "docs"
    out.mkdir()
    report.write_csv([{"part": part, "command": "old", "seconds": 1.0, "commit": "old"} for part, _, _ in suite.PARTS],
                     out / "suite_runs.csv")
    ran = []

    def run(line, check):  # a part writes its CSV
        ran.append(line)
        part_out = pathlib.Path(line[line.index("--out") + 1])
        part_out.mkdir(parents=True, exist_ok=True)
        (part_out / f"{part_out.name}.csv").write_text("x\n1\n")

    monkeypatch.setattr(suite.subprocess, "run", run)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(suite, "source_commit", lambda: "new")
    monkeypatch.setattr(suite.benchmarks_md, "render", lambda published, docs_dir, quick: "rendered\n")
    with pytest.raises(SystemExit):  # precision reads bert_base's output, not there yet
        suite.main(["--out", str(out), "--docs", str(docs), "--parts", "precision"])
    (out / "bert_base").mkdir()
    suite.main(["--out", str(out), "--docs", str(docs), "--parts", "precision"])

    assert [line[2] for line in ran] == ["bench.precision"]
    assert "--tuning-database-from" in ran[0] and str(out / "bert_base") in ran[0]
    runs = report.read(out / "suite_runs.csv")
    assert [run["part"] for run in runs] == [part for part, _, _ in suite.PARTS]
    assert {run["part"]: run["commit"] for run in runs}["precision"] == "new"
    assert {run["part"]: run["command"] for run in runs}["precision"] == \
        "python -m bench.precision --tuning-database-from out/bert_base --out out/precision"  # never tmp_path
    assert {run["commit"] for run in runs if run["part"] != "precision"} == {"old"}
    assert (docs / "results" / "suite" / "precision.csv").exists() and (docs / "BENCHMARKS.md").read_text() == "rendered\n"
