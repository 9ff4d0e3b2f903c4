"""Instructions per call of one micro-kernel's symbolic build and its static builds, counted by
valgrind's callgrind, split into FMAs and the rest.

    python -m bench.studies.instruction_counts --workload bmm_nn --kernel m6_n16_k128_t1_ki_b --T 17 --T 128 [--out DIR]

Why: 2-vCPU virtual machines often expose no hardware counters, and two timer-sample
profiles of the same two builds disagreed on where a 5% gap lay. Callgrind counts
each instruction the kernel's library executes, per address: the same count on every run, so two
builds' code outside their FMA loops compares exactly (docs/decisions.md, Benchmarks).
A count is not a time: 31 thousand fewer instructions per call (of 1.1 million) left NN's timed
gap where it was. Needs valgrind and objdump (binutils); each build takes a few minutes under
valgrind. Writes instruction_counts.csv, instruction_counts.png and, per build, an annotated
listing (<kernel>_<build>_T<T>.annot: executions per call, address, instruction) in --out.
"""

import argparse
import collections
import pathlib
import re
import shutil
import subprocess
import sys

CALLS = 30  # per build, under valgrind; the counts are divided by it
_REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
_FMA = re.compile(r"^v?f(n)?m(add|sub)|^fmla")


def executed(callgrind_out: pathlib.Path, library: str) -> collections.Counter:
    """{address: instructions executed there} inside the object whose path ends in `library`, from a
    callgrind profile written with --dump-instr=yes (names compressed as `(id) name`, addresses
    absolute or relative to the line before, call-cost lines after `calls=` not the caller's own)."""
    counts: collections.Counter = collections.Counter()
    objects, current, address, call_cost = {}, None, 0, False
    with open(callgrind_out) as lines:
        for line in lines:
            named = re.match(r"(c?ob)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
            if named:
                kind, number, name = named.groups()
                if name:
                    objects[number] = name
                if kind == "ob":
                    current = objects.get(number)
                continue
            if line.startswith("calls="):
                call_cost = True
                continue
            if not line or line[0] not in "+-*0123456789":
                continue
            position, *rest = line.split()
            if position.startswith("0x"):
                address = int(position, 16)
            elif position[0] in "+-":
                address += int(position)
            if call_cost:
                call_cost = False
            elif current is not None and current.endswith(library) and len(rest) >= 2:
                counts[address] += int(rest[1])
    return counts


def annotated(counts: collections.Counter, disassembly: str, calls: int) -> tuple[list[str], float, float]:
    """(lines `executions per call  address: instruction`, instructions per call, FMAs per call)."""
    lines, total, fmas = [], 0.0, 0.0
    for match in re.finditer(r"^\s+([0-9a-f]+):\s+(.*)$", disassembly, re.MULTILINE):
        runs = counts.get(int(match.group(1), 16), 0) / calls
        if runs:
            total += runs
            fmas += runs * bool(_FMA.match(match.group(2)))
            lines.append(f"{runs:10.1f}  {match.group(1)}: {match.group(2)}")
    return lines, total, fmas


def count(library: pathlib.Path, profile: pathlib.Path, workload_key: str, kernel: str,
          t: int) -> tuple[list[str], float, float]:
    """Run the library CALLS times under callgrind (a driver that never imports TensorFlow)."""
    subprocess.run(["valgrind", "--tool=callgrind", "--dump-instr=yes", f"--callgrind-out-file={profile}",
                    sys.executable, "-m", "bench.studies.instruction_counts", "--call", str(library), workload_key,
                    kernel, str(t)], check=True, capture_output=True, cwd=_REPOSITORY)
    disassembly = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(library)], check=True,
                                 capture_output=True, text=True).stdout
    return annotated(executed(profile, library.name), disassembly, CALLS)


def call(library: str, workload_key: str, kernel_name: str, t: int) -> None:
    """The driver: CALLS calls of the library's main on one shape's random operands."""
    import numpy as np
    import tvm

    from tf_dietcode.tuning import hardware, templates
    from tf_dietcode.tuning.micro_kernel import space
    from tf_dietcode.tuning.workload import Workload

    workload = Workload.from_key(workload_key)
    kernel = {k.name: k for k in space(hardware.detect(), workload)}[kernel_name]
    template = templates.for_workload(workload)
    operands = template.random_operands(workload, workload.dims_at((t,)), np.random.default_rng(0))
    arguments = template.kernel_arguments(operands, workload, kernel)
    main = tvm.runtime.load_module(library)["main"]
    for _ in range(CALLS):
        main(*arguments)


def plot(rows: list[dict], path: pathlib.Path, title: str) -> None:
    from bench import report  # first: it sets matplotlib's headless backend

    import matplotlib.pyplot as plt
    import numpy as np

    figure, axis = plt.subplots(figsize=(8, 4.5), layout="constrained")
    labels = [f"T={row['T']}\n{row['build']}" for row in rows]
    positions = np.arange(len(rows))
    fmas = np.array([row["fma_per_call"] for row in rows])
    other = np.array([row["other_per_call"] for row in rows])
    axis.bar(positions, fmas, label="FMAs")
    axis.bar(positions, other, bottom=fmas, label="other instructions")
    axis.set_xticks(positions, labels, fontsize=7)
    axis.set_ylabel("instructions per call")
    axis.legend(fontsize=8)
    report.save(figure, path, title)


def main(argv=None):
    from bench import report
    from bench.threads import use_tvm_threads
    from bench.tuned_kernels import CASES
    from tf_dietcode.tuning import hardware, measure
    from tf_dietcode.tuning.micro_kernel import space

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/instruction_counts"))
    parser.add_argument("--workload", required=True, help="a prefix of one of bench.tuned_kernels' workloads")
    parser.add_argument("--kernel", required=True, help="a micro-kernel's name in this machine's space")
    parser.add_argument("--T", dest="ts", type=int, action="append", required=True)
    args = parser.parse_args(argv)
    missing = [tool for tool in ("valgrind", "objdump") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(f"bench.studies.instruction_counts needs {' and '.join(missing)} on PATH")
    cases = [case for case in CASES if case[0].startswith(args.workload)]
    if len(cases) != 1:
        raise SystemExit(f"--workload {args.workload!r} matches {len(cases)} of: {', '.join(c[0] for c in CASES)}")
    name, workload, shape_at, _ = cases[0]
    use_tvm_threads()  # the driver inherits the environment
    hw = hardware.detect()
    kernel = {k.name: k for k in space(hw, workload)}.get(args.kernel)
    if kernel is None:
        raise SystemExit(f"{args.kernel} is not in this machine's space for {name}")
    args.out.mkdir(parents=True, exist_ok=True)
    symbolic = args.out / f"{kernel.name}_symbolic.so"
    measure.compile_kernel(workload, kernel, hw).export_library(str(symbolic))
    rows = []
    for t in args.ts:
        static = args.out / f"{kernel.name}_static_T{t}.so"
        measure.compile_kernel(workload, kernel, hw, workload.dims_at(shape_at(t))).export_library(str(static))
        for build, library in (("symbolic", symbolic), ("static", static)):
            stem = args.out / f"{kernel.name}_{build}_T{t}"
            lines, total, fmas = count(library, stem.with_suffix(".callgrind"), workload.key(), kernel.name, t)
            stem.with_suffix(".annot").write_text("\n".join(lines) + "\n")
            rows.append({"workload": name, "kernel": kernel.name, "T": t, "build": build,
                         "instructions_per_call": total, "fma_per_call": fmas, "other_per_call": total - fmas})
            print(f"{name} {kernel.name} T = {t} {build}: {total:.0f} instructions per call "
                  f"({fmas:.0f} FMAs, {total - fmas:.0f} other)", flush=True)
    report.write_csv(rows, args.out / "instruction_counts.csv")
    plot(rows, args.out / "instruction_counts.png", f"{kernel.name}: instructions per call (callgrind, {hw.mcpu})")
    print(f"wrote {args.out / 'instruction_counts.csv'}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--call"]:
        call(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main()
