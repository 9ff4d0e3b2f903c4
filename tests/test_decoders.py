"""The benchmark's decoders (bench/decoders.py), small: the tutorial-style greedy translator and
the KV-cache beam-search translator (caches grown by concat, or preallocated and written with
tensor_scatter_nd_update). optimize() with input_fn's inputs fuses and tunes every matmul and
batch matmul in their loops (the decode step's attention: one query against t cached positions,
batched over sentences x beams x heads); the optimized models return the original's ids exactly
and its scores/logits within float32 tolerance, here and in a fresh process that loads only the
op library. The seeds' shape, [64 x 8, 1, 17, 128] + add / + transpose, is one of them."""

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from bench import decoders
from tf_dietcode import op_library

from conftest import shared_database
from test_control_flow import TINY_TUNING, TOKEN_RANGES
from test_loop_bodies import LOADER, PRODUCTS, _saved_functions

CONFIG = decoders.SMALL
ATTENTION_OPS = {"DietcodeFusedBatchMatMulAdd", "DietcodeFusedBatchMatMulTranspose"}
# the loop's products per decoder layer (and the logits' dense layer once)
# greedy: Keras MultiHeadAttention's 4 projections for self-attention, the query and output ones for
# cross-attention (its keys and values, projections of the encoder's output, are the same each step: they
# are computed once before the loop), 2 products twice, the FFN's 2 dense layers
# beam: self-attention's 4 projections and cross-attention's query and output (its keys and values are the
# encoder's, computed before the loop), 2 products each, the FFN's 2 dense layers
LOOP_PRODUCTS = {"greedy": (6 + 2, 4), "beam_concat": (6 + 2, 4), "beam_preallocated": (6 + 2, 4)}


def _model(name: str, config: decoders.DecoderConfig) -> tf.Module:
    if name == "greedy":
        return decoders.GreedyTranslator(config)
    return decoders.BeamSearchTranslator(config, cache=name.removeprefix("beam_"))


def _inputs(config, cells, seed=0):
    """[{tokens, max_len}] for (batch, source length, max_len) cells."""
    return [{"tokens": decoders.source_tokens(config, batch, length, seed + i), "max_len": np.int32(max_len)}
            for i, (batch, length, max_len) in enumerate(cells)]


def _optimized(directory, module, config, examples):
    decoders.export(module, directory / "original")
    report = tf_dietcode.optimize(directory / "original", directory / "optimized", shape_ranges=TOKEN_RANGES,
                                  input_fn=lambda: iter(examples), tuning=TINY_TUNING, database=shared_database())
    return directory / "optimized", report


@pytest.fixture(scope="module", params=list(LOOP_PRODUCTS))
def optimized_decoder(request, tmp_path_factory):
    """(name, original module, optimized directory, report), sized on input_fn's inputs up to 12 steps."""
    module = _model(request.param, CONFIG)
    examples = _inputs(CONFIG, [(1, 1, 1), (8, 64, 12), (3, 17, 6), (8, 1, 12)])
    directory, report = _optimized(tmp_path_factory.mktemp(request.param), module, CONFIG, examples)
    return request.param, module, directory, report


def _loop_bodies(directory) -> dict[str, set[str]]:
    functions = _saved_functions(directory)
    bodies = {node.attr["body"].func.name for f in functions.values() for node in f.node_def
              if node.op in ("While", "StatelessWhile")}
    return {name: {node.op for node in functions[name].node_def} for name in bodies}


def test_every_product_in_the_decoding_loop_is_fused_and_tuned(optimized_decoder):
    name, _, directory, report = optimized_decoder
    assert report.fused == report.found, report.summary()
    in_body = [layer for layer in report.layers if layer["where"]]
    dense = [layer for layer in in_body if layer["kind"] == "dense"]
    attention = [layer for layer in in_body if layer["kind"] == "attention"]
    per_layer_dense, per_layer_attention = LOOP_PRODUCTS[name]
    assert len(dense) == CONFIG.layers * per_layer_dense + 1, dense
    assert len(attention) == CONFIG.layers * per_layer_attention, attention
    assert all(layer["workload"] for layer in dense + attention), report.summary()
    assert not [note for note in report.notes if "left to TF" in note or "did not run" in note], report.notes
    assert report.coverage.share == 1.0, report.coverage
    (ops,) = _loop_bodies(directory).values()
    assert not ops & PRODUCTS and ops & ATTENTION_OPS and "DietcodeFusedMatMul" in ops, ops
    if name == "greedy":  # only the last position's logits are kept: the layers after the last attention
        # (its output projection, the feed-forward block, the logits) compute that row only
        assert any(f"in {where}" in note and "compute only the rows" in note
                   for note in report.notes for where in {layer["where"] for layer in in_body}), report.notes
        assert [note for note in report.notes if "computed once before the loop" in note], report.notes
        hoisted = [layer for layer in report.layers if not layer["where"] and "/hoisted/" in layer["node"]]
        assert len(hoisted) == 2 * CONFIG.layers and all(layer["workload"] for layer in hoisted), hoisted
    else:  # the cross-attention's scores + the source's padding bias, its context transposed
        assert ATTENTION_OPS <= ops, ops
        # one new query per sentence x beam x head against t cached positions, t = 1..12 (max_len 12)
        heads = CONFIG.beam * CONFIG.heads
        assert any(layer["workload"].startswith(f"batch matmul NT B={heads}..{8 * heads} M=1 N=1..12 K={CONFIG.depth}")
                   for layer in attention), attention
        # the projections of each step's newest tokens: one row per sentence x beam
        assert any(layer["workload"] == f"dense M={CONFIG.beam}..{8 * CONFIG.beam} N={CONFIG.d_model} "
                   f"K={CONFIG.d_model} bias=True none" for layer in dense), dense
        if name == "beam_concat":  # caches appended by concat, reordered by gather: one copy a step
            assert "DietcodeReorderAppend" in ops, ops
            assert any(f"{2 * CONFIG.layers} caches carried unreordered" in note for note in report.notes), report.notes


def _assert_same(actual: dict, expected: dict) -> None:
    for key, value in expected.items():
        if np.asarray(value).dtype == np.int32:
            np.testing.assert_array_equal(actual[key], value, err_msg=key)
        else:
            np.testing.assert_allclose(actual[key], value, rtol=1e-4, atol=1e-4, err_msg=key)


def test_the_optimized_decoder_decodes_as_the_original(optimized_decoder):
    _, module, directory, _ = optimized_decoder
    optimized = tf.saved_model.load(str(directory)).signatures["serving_default"]
    for example in _inputs(CONFIG, [(1, 1, 4), (2, 5, 13), (3, 17, 2), (8, 64, 12), (1, 64, 20), (5, 33, 1),
                                    (8, 8, 7), (4, 70, 3)], seed=100):
        expected = {key: value.numpy() for key, value in module.translate(**example).items()}
        _assert_same({key: value.numpy() for key, value in optimized(**example).items()}, expected)


def test_the_optimized_decoder_serves_in_a_fresh_process(optimized_decoder, tmp_path):
    _, module, directory, _ = optimized_decoder
    inputs, expected = {}, {}
    for i, example in enumerate(_inputs(CONFIG, [(1, 3, 5), (8, 40, 12), (2, 64, 9)], seed=200)):
        inputs.update({f"{name}{i}": value for name, value in example.items()})
        expected.update({f"{key}{i}": value.numpy() for key, value in module.translate(**example).items()})
    np.savez(tmp_path / "inputs.npz", **inputs)
    subprocess.run([sys.executable, "-c", LOADER, str(op_library.LIBRARY_PATH), str(directory),
                    str(tmp_path / "inputs.npz"), str(tmp_path / "outputs.npz")],
                   check=True, timeout=300, cwd=tmp_path)
    _assert_same(dict(np.load(tmp_path / "outputs.npz")), expected)


def test_the_seeds_decode_step_attention_is_fused_and_tuned(tmp_path):
    """64 sentence x beams (8 x 8) x 8 heads of depth 128: the cross-attention's scores [512, 1, 17]
    + the source's padding bias, and its context [512, 1, 128] transposed back to [64, 1, 8, 128]."""
    config = dataclasses.replace(CONFIG, layers=1, d_model=1024, heads=8, ffn=64, beam=8)
    module = decoders.BeamSearchTranslator(config)
    examples = _inputs(config, [(8, 17, 3), (1, 1, 2)])
    directory, report = _optimized(tmp_path, module, config, examples)
    attention = [layer["workload"] for layer in report.layers if layer["where"] and layer["kind"] == "attention"]
    assert "batch matmul NT B=64..512 M=1 N=1..17 K=128 addend=True" in attention, attention
    assert "batch matmul NN B=64..512 M=1 N=128 K=1..17 addend=False" in attention, attention
    (ops,) = _loop_bodies(directory).values()
    assert ATTENTION_OPS <= ops and not ops & PRODUCTS, ops
    optimized = tf.saved_model.load(str(directory)).signatures["serving_default"]
    for example in _inputs(config, [(8, 17, 3), (8, 9, 2)], seed=300):
        _assert_same({k: v.numpy() for k, v in optimized(**example).items()},
                     {k: v.numpy() for k, v in module.translate(**example).items()})
