"""graph_rewrite/weight_arena.py: the weights a rewritten model only reads go into one variable per
dtype, read as views of it (no copy); variables the model assigns, gathers from or cannot split on
64-byte lines stay variables of their own, and every output and every assignment stays as it was."""
import ctypes
import gc

import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from conftest import TINY_TUNING_OPTIONS, shared_database
from tf_dietcode.graph_rewrite import weight_arena
from tf_dietcode.tuning import search


def _address(tensor: tf.Tensor) -> int:
    """Where the tensor's data lies: its DLPack export (no copy) read as a DLTensor (data pointer
    first, byte_offset after device, ndim, dtype, shape and strides)."""
    capsule = tf.experimental.dlpack.to_dlpack(tensor)
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    dl_tensor = get_pointer(capsule, b"dltensor")
    data = ctypes.c_void_p.from_address(dl_tensor).value
    return data + ctypes.c_uint64.from_address(dl_tensor + 40).value


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.int32, tf.bfloat16.as_numpy_dtype])
def test_a_split_on_64_byte_lines_shares_the_arena_buffer(dtype):
    """What packing relies on: TF's SplitV hands out views where every part starts on a 64-byte line."""
    lines = 64 // np.dtype(dtype).itemsize
    sizes = [3 * lines, lines, 5 * lines]
    arena = tf.constant(np.arange(sum(sizes)).astype(dtype))
    parts = tf.raw_ops.SplitV(value=arena, size_splits=sizes, axis=0, num_split=len(sizes))
    start = _address(arena)
    assert [_address(part) - start for part in parts] == [0, 3 * 64, 4 * 64]


@pytest.fixture(scope="module")
def stateful_model(tmp_path_factory):
    """A model reading two dense weights, a vector of 3 floats
    (12 bytes: no whole 64-byte line), an embedding table it gathers from and a counter of its calls it assigns."""
    rng = np.random.default_rng(0)
    module = tf.Module()
    module.w1 = tf.Variable(rng.uniform(-1, 1, (16, 32)).astype(np.float32))
    module.w2 = tf.Variable(rng.uniform(-1, 1, (32, 16)).astype(np.float32))
    module.b2 = tf.Variable(rng.uniform(-1, 1, 3).astype(np.float32))
    module.table = tf.Variable(rng.uniform(-1, 1, (10, 16)).astype(np.float32))
    module.calls = tf.Variable(np.zeros(16, np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="ids")])
    def serve(ids):
        module.calls.assign_add(tf.ones(16))
        x = tf.reduce_sum(tf.gather(module.table, ids), axis=1)
        hidden = tf.nn.relu(tf.matmul(x, module.w1))
        return {"out": tf.matmul(hidden, module.w2)[:, :3] + module.b2}

    module.serve = serve
    root = tmp_path_factory.mktemp("arena")
    tf.saved_model.save(module, str(root / "original"), signatures={"serving_default": serve})
    report = tf_dietcode.optimize(root / "original", root / "optimized", shape_ranges={"ids": [(1, 4), (1, 6)]},
                                  tuning=search.SearchOptions(**TINY_TUNING_OPTIONS), database=shared_database())
    return root, report


def test_only_read_weights_are_packed_and_outputs_and_state_are_unchanged(stateful_model):
    root, _ = stateful_model
    original, optimized = (tf.saved_model.load(str(root / name)) for name in ("original", "optimized"))
    variables = list({id(v): v for v in tf.train.TrackableView(optimized).descendants()
                      if isinstance(v, tf.Variable)}.values())
    assert [v.name for v in variables if v.name.startswith("dietcode_weights_")] == ["dietcode_weights_float32:0"]
    # packed: the two dense weights (in their kernels' layout); apart: the vector of 12 bytes, the
    # gathered table, the assigned counter
    assert sorted(v.shape.num_elements() for v in variables if not v.name.startswith("dietcode_weights_")) == \
        [3, 16, 10 * 16]
    ids = np.array([[1, 2, 3], [4, 5, 9]], np.int32)
    counter = next(v for v in variables if v.shape == (16,))
    counted = counter.numpy()
    for _ in range(3):
        expected = original.signatures["serving_default"](ids=ids)["out"].numpy()
        actual = optimized.signatures["serving_default"](ids=ids)["out"].numpy()
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(counter.numpy(), counted + 3)  # still a variable it assigns


def test_a_save_holds_each_packed_weight_once(stateful_model, tmp_path):
    """Once packed, the per-layer variables optimize() converted the weights into are freed, the
    converter still alive: a save holds each weight once (in its arena), not twice."""
    def weight_variables() -> list[tf.Variable]:
        gc.collect()
        return [v for v in gc.get_objects() if isinstance(v, tf.Variable) and v.name.startswith("dietcode_weight")]

    root, _ = stateful_model
    # what earlier tests in this process keep alive is theirs (held here, so no id is reused)
    before = weight_variables()
    converter = tf_dietcode.Converter(root / "original", shape_ranges={"ids": [(1, 4), (1, 6)]},
                                      tuning=search.SearchOptions(**TINY_TUNING_OPTIONS), database=shared_database())
    converter.convert().build().save(tmp_path / "optimized")
    live = [v.name for v in weight_variables() if all(v is not earlier for earlier in before)]
    assert live == [], live


def test_packing_leaves_nothing_unaligned_or_written():
    """packable() on a graph by hand: a read-only weight is packed; the same weight also assigned in
    another graph, one of 12 bytes and one of strings are not."""
    read_only, assigned = tf.Variable(np.ones(16, np.float32)), tf.Variable(np.ones(16, np.float32))
    small, words = tf.Variable(np.ones(3, np.float32)), tf.Variable(["a"] * 16)
    graphs = [_graph({"a": read_only, "b": assigned, "c": small, "d": words}, reads=["a", "b", "c", "d"]),
              _graph({"b": assigned}, reads=[], assigns=["b"])]
    variables = {id(v.handle): v for v in (read_only, assigned, small, words)}
    assert weight_arena.packable(graphs, lambda t: variables.get(id(t))) == [read_only]


def _graph(captured: dict, reads: list[str], assigns: tuple = ()):
    from tf_dietcode.graph_rewrite.analysis.signature_graph import SignatureGraph

    graph_def = tf.compat.v1.GraphDef()
    for name in captured:
        graph_def.node.add(name=name, op="Placeholder").attr["dtype"].type = tf.resource.as_datatype_enum
    for name in reads:
        graph_def.node.add(name=f"{name}/read", op="ReadVariableOp", input=[name]).attr["dtype"].type = \
            captured[name].dtype.as_datatype_enum
    for name in assigns:
        graph_def.node.add(name=f"{name}/assign", op="AssignVariableOp", input=[name, "value"])
    return SignatureGraph("serving_default", {}, {}, {}, {name: v.handle for name, v in captured.items()}, graph_def)
