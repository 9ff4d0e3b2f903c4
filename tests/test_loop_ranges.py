"""Dims in loops sized from the loop itself (graph_rewrite.analysis.loop_ranges), without input_fn:
a prefix in a TensorArray and a KV cache grown by concat, bounded by a scalar input given a range
of values, by maximum_iterations and by a constant; a loop nested in a loop; a loop whose length
follows the data, left to running the model; ranges of values for scalar inputs and the errors
on bad ones."""

import numpy as np
import pytest
import sympy
import tensorflow as tf

import tf_dietcode
from tf_dietcode import control_flow
from tf_dietcode.graph_rewrite import bodies
from tf_dietcode.graph_rewrite.analysis import loop_ranges, shape_ranges, signature_graph
from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex
from tf_dietcode.graph_rewrite.analysis.symbolic_shapes import SymbolicShapes

from conftest import shared_database
from test_control_flow import TINY_TUNING

WIDTH, CONSTANT, MAX_ITERATIONS = 4, 4, 3
ROWS, MAX_LEN = (1, 3), (1, 5)  # x's rows and max_len's values
SPECS = [tf.TensorSpec([None, WIDTH], tf.float32, name="x"), tf.TensorSpec([], tf.int32, name="max_len")]
TRIPS = {"scalar": MAX_LEN[1], "constant": CONSTANT, "maximum_iterations": MAX_ITERATIONS}


def _weight(rng):
    return (rng.uniform(-1, 1, (WIDTH, WIDTH)) / WIDTH).astype(np.float32)


def _prefix_model(bound: str, rng):
    """Each step a dense layer and an attention over the whole prefix [rows, t, WIDTH] (a TensorArray
    of rows, transposed), its last position appended: t = 1 .. trips."""
    w = _weight(rng)

    def step(prefix):
        h = tf.reshape(tf.matmul(tf.reshape(prefix, [-1, WIDTH]), w), tf.shape(prefix))
        scores = tf.nn.softmax(tf.matmul(h, prefix, transpose_b=True))
        return tf.tanh(tf.matmul(scores, prefix))[:, -1, :]

    def serve(x, max_len):
        rows = tf.TensorArray(tf.float32, size=0, dynamic_size=True).write(0, x)
        if bound == "maximum_iterations":
            _, rows = tf.while_loop(
                lambda i, rows: tf.reduce_all(tf.math.is_finite(x)),
                lambda i, rows: (i + 1, rows.write(i + 1, step(tf.transpose(rows.stack(), [1, 0, 2])))),
                (0, rows), maximum_iterations=MAX_ITERATIONS)
        else:
            for i in tf.range(max_len if bound == "scalar" else CONSTANT):
                rows = rows.write(i + 1, step(tf.transpose(rows.stack(), [1, 0, 2])))
        return {"out": tf.transpose(rows.stack(), [1, 0, 2])}
    return serve


def _cache_model(bound: str, rng):
    """Each step the newest row's key appended to a cache [rows, t, WIDTH] by concat, one query
    attending over it: t = 1 .. trips."""
    w, v = _weight(rng), _weight(rng)

    def step(h, cache):
        cache = tf.concat([cache, tf.matmul(h, w)[:, tf.newaxis, :]], axis=1)
        scores = tf.nn.softmax(tf.matmul(h[:, tf.newaxis, :], cache, transpose_b=True))
        return tf.tanh(tf.matmul(scores, cache)[:, 0, :] + tf.matmul(h, v)), cache

    def serve(x, max_len):
        h, cache = x, tf.zeros([tf.shape(x)[0], 0, WIDTH])
        if bound == "maximum_iterations":
            _, h, _ = tf.while_loop(lambda i, h, cache: tf.reduce_all(tf.math.is_finite(h)),
                                    lambda i, h, cache: (i + 1, *step(h, cache)), (0, h, cache),
                                    shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, WIDTH]),
                                                      tf.TensorShape([None, None, WIDTH])),
                                    maximum_iterations=MAX_ITERATIONS)
        else:
            for _ in tf.range(max_len if bound == "scalar" else CONSTANT):
                tf.autograph.experimental.set_loop_options(
                    shape_invariants=[(cache, tf.TensorShape([None, None, WIDTH]))])
                h, cache = step(h, cache)
        return {"out": h}
    return serve


def _expected(form: str, trips: int) -> set[str]:
    """The workloads of the loop's products, as the loop bounds them."""
    rows = f"{ROWS[0]}..{ROWS[1]}"
    if form == "prefix":
        return {f"dense M=1..{ROWS[1] * trips} N={WIDTH} K={WIDTH} bias=False none",
                f"batch matmul NT B={rows} M=1..{trips} N=1..{trips} K={WIDTH} ties M=N addend=False",
                f"batch matmul NN B={rows} M=1..{trips} N={WIDTH} K=1..{trips} ties M=K addend=False"}
    return {f"dense M={rows} N={WIDTH} K={WIDTH} bias=False none",
            f"batch matmul NT B={rows} M=1 N=1..{trips} K={WIDTH} addend=False",
            f"batch matmul NN B={rows} M=1 N={WIDTH} K=1..{trips} addend=False"}


def _derived(tmp_path, serve, ranges: dict) -> tuple[dict[str, loop_ranges.DerivedBody], list[bodies.Body]]:
    """The loops' derived bodies of `serve` exported as a SavedModel signature, and its bodies."""
    _saved(tmp_path, serve)
    loaded = tf.saved_model.load(str(tmp_path / "in")).signatures["serving_default"]
    graph = signature_graph.from_signature("serving_default", loaded)
    index = GraphIndex(graph.graph_def, {})
    found = bodies.find(graph.graph_def, index)
    resolved, _ = shape_ranges.resolve(graph.input_specs, ranges)
    return loop_ranges.derive(found, SymbolicShapes(index, graph.input_tensors, resolved)), found


def _product_ranges(derived: loop_ranges.DerivedBody, body: bodies.Body) -> dict[str, list]:
    """Each product's operands' dim ranges in a derived body, by op."""
    ranges = {}
    for node in body.index.nodes.values():
        if node.op in ("MatMul", "BatchMatMulV2"):
            shapes = [derived.shapes.shape(operand) for operand in node.input[:2]]
            ranges.setdefault(node.op, []).append(
                [None if shape is None else [derived.shapes.range_of(d) for d in shape] for shape in shapes])
    return ranges


@pytest.mark.parametrize("bound", list(TRIPS))
def test_a_prefix_grown_in_a_tensor_array_is_ranged_from_the_loop_bound(bound, tmp_path, rng):
    derived, found = _derived(tmp_path, _prefix_model(bound, rng), {"x": [ROWS, WIDTH], "max_len": MAX_LEN})
    (body,) = [b for b in found if b.call.attr == "body"]
    trips = TRIPS[bound]
    assert f"0..{trips - 1}" in derived[body.where].how, derived[body.where].how
    products = _product_ranges(derived[body.where], body)
    # the dense layer's rows: rows x t; the attention's operands [rows, t, WIDTH]
    assert products["MatMul"] == [[[(1, ROWS[1] * trips), (WIDTH, WIDTH)], [(WIDTH, WIDTH), (WIDTH, WIDTH)]]]
    prefix, scores = [ROWS, (1, trips), (WIDTH, WIDTH)], [ROWS, (1, trips), (1, trips)]
    assert products["BatchMatMulV2"] == [[prefix, prefix], [scores, prefix]], products


def test_a_cache_grown_by_concat_is_ranged_and_unchanged_dims_keep_their_symbols(tmp_path, rng):
    derived, found = _derived(tmp_path, _cache_model("scalar", rng), {"x": [ROWS, WIDTH], "max_len": MAX_LEN})
    (body,) = [b for b in found if b.call.attr == "body"]
    shapes = derived[body.where].shapes
    products = _product_ranges(derived[body.where], body)
    assert products["MatMul"] == [[[ROWS, (WIDTH, WIDTH)], [(WIDTH, WIDTH), (WIDTH, WIDTH)]]] * 2
    cache = [node for node in body.index.nodes.values() if node.op == "ConcatV2"]
    (dims,) = [shapes.shape(f"{node.name}:0") for node in cache]
    x_rows = sympy.Symbol("x[0]", integer=True, nonnegative=True)
    assert dims[0] == x_rows and dims[2] == WIDTH, dims  # the signature's symbol, carried through the loop
    assert shapes.range_of(dims[1]) == (1, MAX_LEN[1]), dims


def _nested_model(rng):
    """for i in range(max_len): a cache grown over range(i + 1) steps: t = 1 .. max_len."""
    w = _weight(rng)

    def serve(x, max_len):
        h = x
        for i in tf.range(max_len):
            cache = tf.zeros([tf.shape(x)[0], 0, WIDTH])
            for _ in tf.range(i + 1):
                tf.autograph.experimental.set_loop_options(
                    shape_invariants=[(cache, tf.TensorShape([None, None, WIDTH]))])
                cache = tf.concat([cache, h[:, tf.newaxis, :]], axis=1)
                h = tf.tanh(tf.matmul(tf.nn.softmax(tf.matmul(h[:, tf.newaxis, :], cache, transpose_b=True)),
                                      cache)[:, 0, :] + tf.matmul(h, w))
        return {"out": h}
    return serve


def test_a_loop_nested_in_a_loop_is_bounded_by_the_outer_counter(tmp_path, rng):
    derived, found = _derived(tmp_path, _nested_model(rng), {"x": [ROWS, WIDTH], "max_len": MAX_LEN})
    (inner,) = [b for b in found if b.call.attr == "body" and len(b.path) == 2]
    assert inner.where in derived and "0..4" in derived[inner.where].how, derived.get(inner.where)
    products = _product_ranges(derived[inner.where], inner)["BatchMatMulV2"]
    assert all(operands[1] == [ROWS, (1, MAX_LEN[1]), (WIDTH, WIDTH)] for operands in products), products


def test_a_loop_bounded_by_the_data_keeps_only_the_dims_it_does_not_change(tmp_path, rng):
    """Its length follows the values (no counter compared with a bound): the growing cache is not
    ranged; the rows of the dense layer on the unchanged input are."""
    derived, found = _derived(tmp_path, _data_bounded_model(rng), {"x": [ROWS, WIDTH], "max_len": MAX_LEN})
    (body,) = [b for b in found if b.call.attr == "body"]
    assert derived[body.where].how == "the arguments the loop passes unchanged"
    products = _product_ranges(derived[body.where], body)
    assert [ROWS, (WIDTH, WIDTH)] in [operands[0] for operands in products["MatMul"]], products
    assert all(operands[1] is None or None in operands[1] for operands in products["BatchMatMulV2"]), products


def _data_bounded_model(rng):
    w, v = _weight(rng), _weight(rng)

    def serve(x, max_len):
        def body(h, cache):
            cache = tf.concat([cache, tf.matmul(x, w)[:, tf.newaxis, :]], axis=1)
            scores = tf.nn.softmax(tf.matmul(h[:, tf.newaxis, :], cache, transpose_b=True))
            return tf.tanh(tf.matmul(scores, cache)[:, 0, :] + tf.matmul(h, v)), cache

        h, _ = tf.while_loop(lambda h, cache: tf.reduce_sum(tf.ones_like(cache)) < 3.0 * WIDTH, body,
                             (x, tf.zeros([tf.shape(x)[0], 0, WIDTH])),
                             shape_invariants=(tf.TensorShape([None, WIDTH]), tf.TensorShape([None, None, WIDTH])))
        return {"out": h}
    return serve


# ---- optimize() without input_fn ----------------------------------------------------------------------


def _saved(tmp_path, serve):
    module = tf.Module()
    module.serve = tf.function(serve, input_signature=SPECS)
    tf.saved_model.save(module, str(tmp_path / "in"), signatures={"serving_default": module.serve})
    return module


def _assert_same_outputs(module, directory, rng, lengths) -> None:
    optimized = tf.saved_model.load(str(directory)).signatures["serving_default"]
    for rows, max_len in lengths:
        x = rng.uniform(-1, 1, (rows, WIDTH)).astype(np.float32)
        expected = module.serve(x, tf.constant(max_len))["out"]
        np.testing.assert_allclose(optimized(x=x, max_len=tf.constant(max_len))["out"], expected,
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form, bound", [("prefix", "scalar"), ("cache", "scalar"), ("prefix", "maximum_iterations"),
                                         ("cache", "constant")])
def test_loops_are_tuned_from_their_bound_without_input_fn(form, bound, tmp_path, rng):
    serve = (_prefix_model if form == "prefix" else _cache_model)(bound, rng)
    module = _saved(tmp_path, serve)
    ranges = {"x": [ROWS, WIDTH], **({"max_len": MAX_LEN} if bound == "scalar" else {})}
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", shape_ranges=ranges, tuning=TINY_TUNING,
                                  database=shared_database())
    in_body = [layer for layer in report.layers if layer["where"] and layer["kind"] in ("dense", "attention")]
    assert report.fused == report.found and len(in_body) == (3 if form == "prefix" else 4), report.summary()
    assert {layer["workload"] for layer in in_body} == _expected(form, TRIPS[bound]), report.summary()
    assert not [note for note in report.notes if "did not run" in note or "seen when optimize() ran" in note]
    (proved,) = [note for note in report.notes if "sized from what the loop proves" in note]
    assert f"at most {TRIPS[bound]} iterations" in proved, proved
    assert f"derived in {in_body[0]['where']}" in report.summary()
    if bound == "scalar":
        assert "serving_default.max_len: 1..5" in report.summary()
    # the range's ends, inside it, 0 steps, and beyond it (generic kernels)
    _assert_same_outputs(module, tmp_path / "out", rng, [(1, 1), (3, 5), (2, 3), (1, 0), (3, 8), (5, 2)])


def test_a_loop_nested_in_a_loop_is_tuned_from_the_bounds(tmp_path, rng):
    module = _saved(tmp_path, _nested_model(rng))
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", shape_ranges={"x": [ROWS, WIDTH],
                                                                                  "max_len": MAX_LEN},
                                  tuning=TINY_TUNING, database=shared_database())
    in_body = [layer for layer in report.layers if layer["where"] and layer["kind"] in ("dense", "attention")]
    assert report.fused == report.found and len(in_body) == 3, report.summary()
    assert all(", in while body" in layer["where"] for layer in in_body), in_body
    assert {layer["workload"] for layer in in_body} == _expected("cache", MAX_LEN[1]), report.summary()
    assert not [note for note in report.notes if "did not run" in note or "seen when optimize() ran" in note]
    _assert_same_outputs(module, tmp_path / "out", rng, [(1, 1), (3, 5), (2, 3), (1, 0), (3, 7)])


def test_a_loop_bounded_by_the_data_is_sized_from_the_runs(tmp_path, rng):
    module = _saved(tmp_path, _data_bounded_model(rng))
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", shape_ranges={"x": [ROWS, WIDTH]},
                                  tuning=TINY_TUNING, database=shared_database())
    in_body = [layer for layer in report.layers if layer["where"] and layer["kind"] in ("dense", "attention")]
    assert report.fused == report.found and all(layer["workload"] for layer in in_body), report.summary()
    (runs,) = [note for note in report.notes if "seen when optimize() ran the model" in note]
    (proved,) = [note for note in report.notes if "sized from what the loop proves" in note]
    assert "the arguments the loop passes unchanged" in proved and "do not follow from the loop" in runs
    # the cache's length follows the rows: 3 steps for 1 row, 2 for 2, 1 for 3
    assert any(layer["workload"].startswith(f"batch matmul NT B=1..3 M=1 N=1..3 K={WIDTH}") for layer in in_body)
    _assert_same_outputs(module, tmp_path / "out", rng, [(1, 0), (2, 0), (3, 0), (5, 0)])


def test_runs_beyond_the_derived_range_are_noted_and_tuned_for(tmp_path, rng):
    """Recorded shapes outside what the loop proves (which would mean a wrong proof) widen the
    workload to both, with a note: the check control_flow.sized makes of the runs."""
    _saved(tmp_path, _cache_model("scalar", rng))
    converter = tf_dietcode.Converter(tmp_path / "in", shape_ranges={"x": [ROWS, WIDTH], "max_len": MAX_LEN}).convert()
    graph = converter.graphs[0]
    found = converter._bodies[graph.key]
    derived = loop_ranges.derive(found.bodies, SymbolicShapes(converter._indexes[graph.key], graph.input_tensors,
                                                              converter.ranges[graph.key]))
    recorded = {}  # every dynamic dim seen 10 beyond its derived range
    for scope_key, body in found.scopes():
        for fusion, match in found.tuned(scope_key):
            for name, tensor in fusion.operands(match).items():
                ranges = [derived[body.where].shapes.range_of(d) for d in derived[body.where].shapes.shape(tensor)]
                recorded[(body.where, match.core, name)] = ([lo for lo, _ in ranges],
                                                            [hi + 10 * (lo != hi) for lo, hi in ranges])
    workloads, _, notes = control_flow.sized(found, control_flow.Observed(recorded, {}, []), derived, False, [])
    assert sorted(w.describe() for w in workloads.values()) == sorted([
        f"dense M=1..13 N={WIDTH} K={WIDTH} bias=False none"] * 2 + [
        f"batch matmul NT B=1..13 M=1 N=1..15 K={WIDTH} addend=False",
        f"batch matmul NN B=1..13 M=1 N={WIDTH} K=1..15 addend=False"])
    outside = [note for note in notes if "outside the" in note]
    assert len(outside) == 4 and all("it is tuned for both" in note for note in outside), notes


# ---- ranges of scalar inputs ------------------------------------------------------------------------------


@pytest.mark.parametrize("given, expected", [((1, 64), [(1, 64)]), (20, [(20, 20)]), ([(2, 9)], [(2, 9)]),
                                             ([7], [(7, 7)]), ([], []), (None, [])])
def test_an_integer_scalar_takes_a_range_of_values(given, expected):
    specs = {"max_len": tf.TensorSpec([], tf.int32), "x": tf.TensorSpec([None], tf.float32)}
    ranges, _ = shape_ranges.resolve(specs, {"max_len": given, "x": [(1, 4)]})
    assert ranges["max_len"] == expected
    low, high = shape_ranges.corner_inputs(specs, ranges)
    assert low[0].numpy() == (expected[0][0] if expected else 0) and low[0].shape == []
    assert high[0].numpy() == (expected[0][1] if expected else 0) and high[1].shape == [4]


@pytest.mark.parametrize("dtype, given, message", [
    (tf.float32, (0.5, 1.0), "is a float32 scalar: shape_ranges gives a scalar a range of values only where it is "
                             "an integer"),
    (tf.int32, (5, 2), r"needs 0 <= min <= max, got \(5, 2\)"),
    (tf.int32, (-1, 3), r"needs 0 <= min <= max, got \(-1, 3\)"),
    (tf.int32, (1.5, 3), r"its entry is the range of its values: an int or \(lo, hi\)"),
    (tf.int32, [1, 2, 3], r"its entry is the range of its values: an int or \(lo, hi\)"),
    (tf.int32, [(1, 2), 3], r"an int or \(lo, hi\)"),
    (tf.int32, (True, 3), r"an int or \(lo, hi\)"),
    (tf.int8, (1, 300), "300 does not fit the input's dtype int8"),
])
def test_a_bad_range_of_values_is_refused_clearly(dtype, given, message):
    with pytest.raises(ValueError, match=message):
        shape_ranges.resolve({"s": tf.TensorSpec([], dtype)}, {"s": given})


def test_representative_inputs_range_the_integer_scalars_they_hold():
    specs = {"max_len": tf.TensorSpec([], tf.int32), "scale": tf.TensorSpec([], tf.float32),
             "x": tf.TensorSpec([None], tf.float32)}
    examples = [{"max_len": np.int32(n), "scale": np.float32(0.5), "x": np.zeros(n + 1, np.float32)} for n in (3, 9)]
    assert shape_ranges.from_examples(specs, examples) == {"max_len": [(3, 9)], "scale": [], "x": [(4, 10)]}
