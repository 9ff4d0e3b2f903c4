"""How far bfloat16 and int8 dense layers move a model's outputs, and which sensitivity measure
ranks its layers best: the figures behind the precisions' default max_error and the accuracy
gate's ranking (docs/decisions.md, "Precision").

For each model (the tests' encoder block, bench.encoder's DEMO encoder) and precision, the
model is optimized with every dense layer in that precision and its largest output error
(relative to the output's largest |value|, as the output check measures it) is read on the
check's inputs and on random inputs. Then, in int8, each layer alone is put in int8 (the
others float32) and its effect on the output is measured, against two predictors: the
layer's own output error on its recorded inputs (accuracy_gate.own_error, what the gate
uses) and its weight's quantization error (max |w - dequantized w| / max |w|). Spearman's
rank correlation says which predictor orders the layers as their effect does.

    python -m bench.studies.precision_error
"""

import pathlib
import sys
import tempfile

import numpy as np
import tensorflow as tf
from scipy import stats

from bench import encoder
from tf_dietcode import optimizer, output_check
from tf_dietcode.precision import accuracy_gate, int8_weights
from tf_dietcode.tuning import search

TUNING = search.SearchOptions(trials=2, batch=2, samples=3, finalists=0)


def _encoder_block():
    sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "tests"))
    from conftest import ENCODER_RANGES, encoder_block

    return encoder_block(), ENCODER_RANGES


def _demo():
    return encoder.build(encoder.DEMO), {"input_ids": [(1, 2), (1, 64)]}


def _random_inputs(converter: optimizer.Converter, rng: np.random.Generator) -> list[dict]:
    """Inputs within the ranges: token ids over the vocabulary, floats in [-1, 1)."""
    (graph,) = [g for g in converter.graphs if g.key == "serving_default"]
    inputs = []
    for _ in range(8):
        example = {}
        for name, spec in graph.input_specs.items():
            shape = [int(rng.integers(lo, hi + 1)) for lo, hi in converter.ranges[graph.key][name]]
            example[name] = (rng.uniform(-1, 1, shape).astype(np.float32) if spec.dtype.is_floating
                             else rng.integers(0, 1000, shape).astype(spec.dtype.as_numpy_dtype))
        inputs.append(example)
    return inputs


def _error(converter: optimizer.Converter, reference: output_check.Reference) -> float:
    converter._module()
    return output_check.compare(reference, converter._run_rewritten).largest.error


def study(name: str, model, ranges, rng: np.random.Generator) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        model.export(f"{scratch}/model", verbose=False)
        for precision in ("bfloat16", "int8"):
            converter = optimizer.Converter(f"{scratch}/model", shape_ranges=ranges, precision=precision,
                                            tuning=TUNING)
            converter.convert().build()
            signatures = {g.key: (g.input_specs, converter.ranges[g.key]) for g in converter.graphs}
            computations = converter._computations
            check = output_check.reference(converter.loaded, signatures, [], computations)
            random = output_check.reference(converter.loaded, signatures, _random_inputs(converter, rng), computations)
            print(f"{name} {precision}: error {_error(converter, check):.2g} on the check's inputs, "
                  f"{_error(converter, random):.2g} on random inputs")
            if precision != "int8":
                continue
            ranked = converter._ranked(check)
            effect, own, weight = [], [], []
            matches = {match.core: match for g in converter.graphs for _, match in converter._reduced(g.key)}
            for computation, core, own_error in ranked:
                converter._gate_kept = {(c, other): "study" for c, other, _ in ranked if other != core}
                effect.append(_error(converter, check))
                own.append(own_error)
                w = matches[core].weight
                weight.append(float(np.abs(int8_weights.quantize(w).dequantized() - w).max() / np.abs(w).max()))
            converter._gate_kept = {}
            print(f"  {len(ranked)} layers, each alone in int8: output error {min(effect):.2g}..{max(effect):.2g}; "
                  f"Spearman vs own error {stats.spearmanr(effect, own)[0]:.2f}, "
                  f"vs weight quantization error {stats.spearmanr(effect, weight)[0]:.2f}")


def main() -> None:
    rng = np.random.default_rng(0)
    tf.get_logger().setLevel("ERROR")
    for name, build in (("encoder_block", _encoder_block), ("demo encoder 2x256", _demo)):
        model, ranges = build()
        study(name, model, ranges, rng)


if __name__ == "__main__":
    main()
