"""DietDense against keras.layers.Dense with the same weights.

    python -m bench.diet_dense [--quick] [--out bench/results/diet_dense]

For [16,T,768]->2304 and [1,T,768]->3072: builds the Dense layer, converts it
(tf_dietcode.keras.convert), tunes the DietDense for T in [1, 128] (tuning
database <out>/tuning.jsonl, resumed), checks both layers agree, then at each
T times each layer in-graph (calls in one tf.function loop for ~30 ms a
sample, the two layers in interleaved rounds, medians: bench.timing's
rounds). Writes diet_dense.csv and diet_dense.png and prints the
geometric-mean speed-up per case.
"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from bench import cli, report, timing  # noqa: E402
from bench.threads import use_threads, use_tvm_threads  # noqa: E402
from tf_dietcode import keras as diet_keras  # noqa: E402
from tf_dietcode.tuning.database import Database  # noqa: E402

CASES = [("b16_[16,T,768]->2304", 16, 2304), ("b1_[1,T,768]->3072", 1, 3072)]
MAX_T, K = 128, 768


def _models(batch: int, units: int) -> tuple[keras.Model, keras.Model]:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, K), batch_size=batch)
    dense = keras.Model(inputs, keras.layers.Dense(units)(inputs))
    return dense, diet_keras.convert(dense)


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results/diet_dense", "quick tuning and a few T")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    use_threads()
    use_tvm_threads()
    database = Database(args.out / "tuning.jsonl")
    rng = np.random.default_rng(0)
    rows = []
    for name, batch, units in CASES:
        dense, diet = _models(batch, units)
        start = time.perf_counter()
        diet_keras.tune(diet, [batch, (1, MAX_T), K], database=database,
                        tuning=cli.search_options(args.quick))
        print(f"{name}: tuned in {time.perf_counter() - start:.0f} s (resumed from {database.path})")
        layers = {"tensorflow": dense.layers[-1], "dietcode": diet.layers[-1]}
        for t in cli.sequence_lengths(args.quick):
            x = rng.uniform(-1, 1, (batch, t, K)).astype(np.float32)
            np.testing.assert_allclose(layers["dietcode"](x), layers["tensorflow"](x), rtol=1e-4, atol=1e-4)
            timers = [timing.in_graph_timer(layer, [x]) for layer in layers.values()]
            seconds = dict(zip(layers, timing.median_seconds(*timers)))
            base = seconds["tensorflow"]
            for peer in layers:
                median = seconds[peer]
                rows.append({"workload": name, "T": t, "peer": peer, "ms": median * 1e3,
                             "gflops": 2 * batch * t * K * units / median / 1e9,
                             "speedup_vs_tensorflow": base / median})
            print(f"  T={t:4d}: DietDense {base / seconds['dietcode']:.2f}x")
    report.write_csv(rows, args.out / "diet_dense.csv")
    report.plot_by_t(rows, args.out / "diet_dense.png", "DietDense vs keras.layers.Dense (same weights)")
    for name, _, _ in CASES:
        speedups = [r["speedup_vs_tensorflow"] for r in rows if r["workload"] == name and r["peer"] == "dietcode"]
        print(f"{name}: geometric-mean speed-up {report.geomean(speedups):.2f}x "
              f"(worst {min(speedups):.2f}x)")


if __name__ == "__main__":
    main()
