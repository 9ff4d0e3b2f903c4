"""How far bfloat16 and int8 dense layers move a model's outputs, and how well the accuracy gate's
ranking orders its layers: the figures behind the precisions' default max_error and the gate's
ranking (docs/decisions.md, "Precision").

Models: the tests' encoder block and bench.encoder's DEMO encoder (random weights, on the output
check's inputs and on random inputs), and the pretrained all-MiniLM-L6-v2 (bench/minilm.py) on the
representative inputs its test gives optimize() (a quarter of tests/data/sentences.txt), with every
sentence's cosine similarity to the float32 embedding beside. For each precision, the error (as the
output check measures it, output_check.row_error) with every dense layer converted; then the
ranking: each layer's error alone in the precision (accuracy_gate.rank, what the gate ranks by)
against a cheaper predictor, the layer's own output error on its inputs as the original computes
them (`own_error`), by Spearman's rank correlation; and the error with the first k layers of
each ranking back in float32, k = 1..8.

    python -m bench.studies.precision_error
"""

import pathlib
import sys
import tempfile

import numpy as np
import tensorflow as tf
from scipy import stats

from bench import encoder, minilm
from tf_dietcode import optimizer, output_check
from tf_dietcode.graph_rewrite.analysis import signature_graph
from tf_dietcode.precision import accuracy_gate
from tf_dietcode.precision.contract import LayerPrecision, Precision
from tf_dietcode.tuning import search

TUNING = search.SearchOptions(trials=2, batch=2, samples=3, finalists=0)
CURVE = range(1, 9)


def _encoder_block():
    sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "tests"))
    from conftest import ENCODER_RANGES, encoder_block

    return encoder_block(), ENCODER_RANGES, None


def _demo():
    return encoder.build(encoder.DEMO), {"input_ids": [(1, 2), (1, 64)]}, None


def _minilm():
    sentences = minilm.read_sentences()
    return minilm.pretrained(), None, sentences


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


def own_error(precision: Precision, weight: np.ndarray, inputs: list[np.ndarray]) -> float:
    """A dense layer's own output error in `precision` on its recorded inputs (each [..., K]): op(x)
    against x @ weight, as output_check.row_error measures it, over the rows of all of them."""
    k, n = weight.shape
    converted = {name: tf.constant(value) for name, value in precision.convert(weight, None).items()}
    rows = np.concatenate([np.asarray(x, np.float32).reshape(-1, k) for x in inputs])
    actual = precision.product(tf.constant(rows), converted, None, n=n, activation="none").numpy()
    return output_check.row_error(rows.astype(np.float64) @ weight.astype(np.float64), actual)


def _own_errors(converter: optimizer.Converter, reference: output_check.Reference) -> dict:
    """Each converted layer's own_error on its inputs as the original computes them, by (computation, core)."""
    errors = {}
    for graph in converter.graphs:
        converted = [match for _, match in converter._reduced(graph.key)]
        if reference.keys[graph.key] != graph.key or not converted:
            continue
        tensors = {f"x_{i}": match.x for i, match in enumerate(converted)}
        inputs = signature_graph.SignatureGraph(graph.key, graph.input_specs, graph.input_tensors, tensors,
                                                graph.captures, graph.graph_def).function()
        recorded = [inputs(*[run.feed[name] for name in graph.input_specs])
                    for run in reference.runs if run.key == graph.key]
        for i, match in enumerate(converted):
            errors[(converter._computations[graph.key], match.core)] = own_error(
                converter.precision, match.weight, [r[f"x_{i}"].numpy() for r in recorded])
    return errors


def _run(converter: optimizer.Converter, reference: output_check.Reference, kept: list) -> output_check.OutputCheck:
    converter._put_back = {layer: LayerPrecision("float32", "study") for layer in kept}
    converter._module()
    return output_check.compare(reference, converter._run_rewritten)


def _cosines(converter: optimizer.Converter, sentences: list[str], expected: np.ndarray) -> str:
    """The worst and mean cosine similarity of every sentence's embedding to the float32 original's."""
    actual = minilm.embed_with(lambda ids, mask: np.asarray(converter._run_rewritten(
        "serving_default", {"input_ids": tf.constant(ids), "attention_mask": tf.constant(mask)})["embeddings"]),
        sentences)
    cosine = np.sum(actual * expected, 1) / np.linalg.norm(actual, axis=1) / np.linalg.norm(expected, axis=1)
    return f" (sentences' cosine min {cosine.min():.5f}, mean {cosine.mean():.5f})"


def study(name: str, model, ranges, sentences, rng: np.random.Generator) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        model.export(f"{scratch}/model", verbose=False)
        examples = [] if sentences is None else minilm.examples(sentences[::4], 4, 64)
        expected = None if sentences is None else minilm.embed(
            tf.saved_model.load(f"{scratch}/model").signatures["serving_default"], sentences)
        for precision in ("bfloat16", "int8"):
            converter = optimizer.Converter(f"{scratch}/model", shape_ranges=ranges, precision=precision,
                                            tuning=TUNING)
            converter.convert().build((lambda: iter(examples)) if examples else None)
            signatures = {g.key: (g.input_specs, converter.ranges[g.key]) for g in converter.graphs}
            computations = converter._computations
            check = output_check.reference(converter.loaded, signatures, examples, computations)
            line = f"{name} {precision}: error {_run(converter, check, []).largest.error:.3g} on the check's inputs"
            if sentences is None:
                random = output_check.reference(converter.loaded, signatures, _random_inputs(converter, rng),
                                                computations)
                line += f", {_run(converter, random, []).largest.error:.3g} on random inputs"
            else:
                line += _cosines(converter, sentences, expected)
            print(line, flush=True)
            own = _own_errors(converter, check)
            layers = list(own)
            alone = accuracy_gate.rank(layers, lambda kept: _run(converter, check, kept))
            print(f"  {len(layers)} layers, each alone: error {alone[-1][1]:.2g}..{alone[0][1]:.2g}; Spearman "
                  f"own error vs alone {stats.spearmanr([own[layer] for layer, _ in alone], [e for _, e in alone])[0]:.2f}")
            for ranking, order in (("alone", [layer for layer, _ in alone]), ("own error", sorted(own, key=own.get)[::-1])):
                errors = []
                for k in CURVE:
                    errors.append(f"{_run(converter, check, order[:k]).largest.error:.3g}"
                                  + (_cosines(converter, sentences, expected) if sentences and k <= 4 else ""))
                print(f"  ranked by {ranking}, k = 1..{CURVE[-1]} back in float32: " + "; ".join(errors), flush=True)


def main() -> None:
    rng = np.random.default_rng(0)
    tf.get_logger().setLevel("ERROR")
    models = {"all-MiniLM-L6-v2": _minilm, "encoder_block": _encoder_block, "demo encoder 2x256": _demo}
    chosen = sys.argv[1:] or list(models)
    for name in chosen:
        study(name, *models[name](), rng)


if __name__ == "__main__":
    main()
