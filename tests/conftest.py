"""Shared test helpers: seeded fresh inputs and a float64 TF reference check."""

import atexit
import contextlib
import dataclasses
import fcntl
import hashlib
import os
import pathlib
import pickle
import random
import shutil
import tempfile
import zlib

import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from tf_dietcode.reference import ACTIVATIONS

# In the environment, so that pytest-xdist's workers (and fresh processes) draw from the same seed.
SEED = int(os.environ.setdefault("TF_DIETCODE_TEST_SEED", str(random.SystemRandom().randrange(2**31))))


def _shared_tuning_database() -> pathlib.Path:
    """One tuning database per test run, in the environment so that pytest-xdist's workers and
    the pytest runs tests start (the Bazel-built library's op tests) share it; CI exports one
    for `make test` and `make sanitize` together. A workload measured once is then resumed
    (search.search: no new measurements), not tuned again, and its bundle links the kernels
    kept compiled beside the database (Database.kernel_objects). Tests of the search itself
    keep their own databases."""
    if "TF_DIETCODE_TEST_TUNING_DATABASE" not in os.environ:
        folder = tempfile.mkdtemp(prefix="tf_dietcode-tests-")
        atexit.register(shutil.rmtree, folder, True)  # this process started first and ends last
        os.environ["TF_DIETCODE_TEST_TUNING_DATABASE"] = os.path.join(folder, "tuning.jsonl")
    return pathlib.Path(os.environ["TF_DIETCODE_TEST_TUNING_DATABASE"])


TUNING_DATABASE = _shared_tuning_database()


def _private_user_cache() -> None:
    """The user's cache (tf_dietcode.user_cache: the default tuning database, kept kernels and
    bundles) is a temporary directory of this test run, so tests never read or write the user's
    own; in the environment, so that pytest-xdist's workers and the processes tests start share it."""
    if "TF_DIETCODE_TEST_CACHE" not in os.environ:
        folder = tempfile.mkdtemp(prefix="tf_dietcode-test-cache-")
        atexit.register(shutil.rmtree, folder, True)  # this process started first and ends last
        os.environ["TF_DIETCODE_TEST_CACHE"] = folder
    os.environ["TF_DIETCODE_CACHE"] = os.environ["TF_DIETCODE_TEST_CACHE"]


_private_user_cache()


def shared_database():
    """The run's shared tuning database (above), for optimize() and tune() calls whose tests
    are not about the search. Processes may append to it at once: each batch of records is
    one short append, and a line cut short would be skipped when read."""
    from tf_dietcode.tuning.database import Database

    return Database(TUNING_DATABASE)


@contextlib.contextmanager
def tuning_alone():
    """Holds the shared database's lock: a process about to tune what another is tuning waits
    for it, then resumes its records instead of measuring the same kernels again."""
    TUNING_DATABASE.parent.mkdir(parents=True, exist_ok=True)
    with open(TUNING_DATABASE.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def pytest_report_header(config):
    from tf_dietcode.op_library import LIBRARY_PATH

    return [f"tf_dietcode test seed: {SEED} (set TF_DIETCODE_TEST_SEED to repeat)",
            f"tf_dietcode op library: {LIBRARY_PATH}",
            f"tf_dietcode tuning database: {TUNING_DATABASE} (shared by this run's quick tunings)"]


@pytest.fixture
def rng(request):
    """Fresh inputs every session, reproducible from the printed seed."""
    return np.random.default_rng([SEED, zlib.crc32(request.node.nodeid.encode())])


@pytest.fixture(scope="session", autouse=True)
def op_library():
    return tf_dietcode.load_op_library()


def random_tensor(rng, shape):
    return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def assert_matches_reference(actual, reference_fn, inputs, **attrs):
    """Compares a fused op's float32 output with the reference run in float64.

    Finite results must agree within a bound that scales with the reference
    applied to |inputs|, the sum of absolute terms each output element adds up,
    as float32 rounding does. NaN and infinities must agree exactly, except
    where float32 partial sums may overflow (that sum nears float32's limit):
    there the result may also be the activation of an overflowed sum. TensorFlow
    runs kernels with denormals flushed to zero, so the output may instead
    match the reference with denormal inputs read as zeros.
    """
    actual = np.asarray(actual)
    inputs = [None if x is None else np.asarray(x, np.float64) for x in inputs]
    expected, agrees = _compare(actual, reference_fn, inputs, attrs)
    flushed = [None if x is None else np.where(np.abs(x) < FLOAT32_TINY, 0.0, x) for x in inputs]
    if any(x is not None and not np.array_equal(x, f) for x, f in zip(inputs, flushed)):
        agrees |= _compare(actual, reference_fn, flushed, attrs)[1]
    if not agrees.all():
        first = [tuple(i) for i in np.argwhere(~agrees)[:5]]
        raise AssertionError(f"{(~agrees).sum()} of {agrees.size} elements differ from the reference, e.g. "
                             + ", ".join(f"at {i}: {actual[i]!r} vs {expected[i]!r}" for i in first))


FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32


def _reference(reference_fn, inputs, attrs):
    return reference_fn(*[None if x is None else tf.constant(x) for x in inputs], **attrs).numpy()


def _compare(actual, reference_fn, inputs, attrs):
    """The reference on `inputs`, and where `actual` agrees with it (as above)."""
    expected = _reference(reference_fn, inputs, attrs)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    finite = [None if x is None else np.abs(np.where(np.isfinite(x), x, 0.0)) for x in inputs]
    linear = {**attrs, "activation": "none"} if "activation" in attrs else dict(attrs)
    if "alpha" in attrs:  # the sum is scaled after it is added up: both may overflow
        unscaled = np.abs(_reference(reference_fn, finite, {**linear, "alpha": 1.0}))
        linear["alpha"] = abs(attrs["alpha"])
    magnitude = np.abs(_reference(reference_fn, finite, linear))
    may_overflow = np.maximum(magnitude, unscaled if "alpha" in attrs else 0.0) > FLOAT32_MAX / 2
    with np.errstate(invalid="ignore"):
        close = np.abs(actual - expected) <= 2e-5 * magnitude + 1e-5 * np.abs(expected) + 1e-6
    # An overflowed sum is an infinity, or NaN where infinities of both signs met.
    overflow_ends = ACTIVATIONS[attrs.get("activation", "none")](tf.constant([-np.inf, np.inf], tf.float64))
    overflowed = may_overflow & (np.isnan(actual) | np.isin(actual, overflow_ends.numpy()))
    agrees = np.where(np.isnan(expected), np.isnan(actual),
                      np.where(np.isinf(expected), (actual == expected) | (may_overflow & np.isnan(actual)),
                               close | overflowed))
    return expected, agrees


@pytest.fixture(scope="session")
def tuned_bundle(tmp_path_factory):
    """A quick-tuned bundle: dense (bias, relu, packed weight), batch matmul NT, NN and NT
    with an addend, dense (gelu, weight in place), three dense layers side by side (groups).
    Returns the bundle's path (this process's copy) and the tuning report (its trees decide
    the kernels).

    Built once per tuning database, beside it, with the seed of the run that built it: the
    pytest-xdist workers, the Bazel-built library's op tests and CI's sanitizer run copy it
    instead of building it again (70 s a process on a 2-vCPU Xeon when each compiled its
    kernels; now each would link the kept ones and check the bundle)."""
    from tf_dietcode.tuning import search
    from tf_dietcode.tuning.tune import tune
    from tf_dietcode.tuning.workload import Workload

    workloads = [Workload("dense", (1, 40), 40, 24, bias=True, activation="relu", weight_layout="packed"),
                 Workload("batch_matmul", (1, 20), (1, 20), 8, b=3, ties=("m", "n")),
                 Workload("batch_matmul", (1, 16), 12, (1, 16), b=(2, 8), transpose_b=False, ties=("m", "k")),
                 Workload("batch_matmul", (1, 20), (1, 20), 8, b=6, bias=True, ties=("m", "n")),
                 Workload("dense", (1, 40), 48, 24, activation="gelu", weight_layout="in_place"),
                 Workload("dense", (1, 40), 48, 24, bias=True, activation="relu", weight_layout="packed", groups=3)]
    options = search.SearchOptions(trials=4, batch=4, samples=3, seed=SEED % 1000)
    key = hashlib.sha256(repr((workloads, dataclasses.replace(options, seed=0))).encode()).hexdigest()[:16]
    built = TUNING_DATABASE.parent / f"tuned_bundle-{key}"
    with tuning_alone():
        if not (built / "report.pickle").exists():
            shutil.rmtree(built, ignore_errors=True)  # a process that died building it
            report = tune(workloads, built / "bundle", options=options, database=shared_database(), progress=False)
            (built / "report.partial").write_bytes(pickle.dumps(report))
            (built / "report.partial").rename(built / "report.pickle")
        report = pickle.loads((built / "report.pickle").read_bytes())
    path = tmp_path_factory.mktemp("tuned") / "bundle"
    shutil.copytree(built / "bundle", path)
    return path, report


def save_dense_model(path, rng, activation=tf.nn.relu) -> tf.Module:
    """A one-layer SavedModel at `path`, x[?, 16] -> activation(x @ w[16, 24] + b), serving
    it as "serving_default"; returns the module (its `serve` is the reference)."""
    weight, bias = rng.uniform(-1, 1, (16, 24)).astype(np.float32), rng.uniform(-1, 1, 24).astype(np.float32)

    class Layer(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
        def serve(self, x):
            return {"out": activation(tf.matmul(x, weight) + bias)}

    layer = Layer()
    tf.saved_model.save(layer, str(path), signatures={"serving_default": layer.serve})
    return layer


def save_keras_text_model(directory, vocabulary, rng):
    """Keras' StringLookup: a lookup table the model holds, initialized from the file."""
    import keras  # here: the op tests (also run under the sanitizers) need no Keras

    words = keras.Input((None,), dtype="string", name="words")
    hidden = keras.layers.Embedding(51, 16)(keras.layers.StringLookup(vocabulary=str(vocabulary))(words))
    model = keras.Model(words, keras.layers.Dense(8)(keras.layers.Dense(24, activation="relu")(hidden)))
    model.export(str(directory), verbose=False)


def save_tf1_text_model(directory, vocabulary, rng):
    """A TF1 SavedModel: the table is made in the graph and filled by the model's init op."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        words = tf.compat.v1.placeholder(tf.string, [None, None], name="words")
        table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
            str(vocabulary), tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
            tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER), default_value=-1)
        weights = [tf.compat.v1.get_variable(name, initializer=rng.uniform(-1, 1, shape).astype(np.float32))
                   for name, shape in [("embedding", (51, 16)), ("w1", (16, 24)), ("b1", (24,)), ("w2", (24, 8))]]
        embedding, w1, b1, w2 = weights
        hidden = tf.nn.relu(tf.tensordot(tf.gather(embedding, table.lookup(words) + 1), w1, 1) + b1)
        session.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.tables_initializer()])
        tf.compat.v1.saved_model.simple_save(session, str(directory), {"words": words},
                                             {"output_0": tf.tensordot(hidden, w2, 1)},
                                             legacy_init_op=tf.compat.v1.tables_initializer())


# Models that map words to ids through a lookup table filled from a vocabulary file of w0..w49
# (unknown words: one more id), then embed them and run two dense layers; output "output_0".
TEXT_MODELS = [save_keras_text_model, save_tf1_text_model]


# For the tests of rewrites and ops, whose kernels need only be right: two kernels per workload (each compile
# costs 1-5 s; four took horizontal fusion's fixture 90 s, two 52 s), no finalists measured again (search.QUICK's
# reason). test_quick_tune_writes_a_checked_bundle and the tuned_bundle fixture tune more.
TINY_TUNING_OPTIONS = dict(trials=2, batch=2, samples=3, finalists=0)
ENCODER_RANGES = {"x": [(1, 2), (1, 12), 32]}


def encoder_block():
    """Dense (exact GELU) on 3-D input, Dense, MultiHeadAttention, residual add and LayerNormalization,
    Dense (relu) on 2-D input."""
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, 32), name="x")
    hidden = keras.layers.Dense(64, activation="gelu")(inputs)
    hidden = keras.layers.Dense(32)(hidden)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=16)(hidden, hidden)
    normed = keras.layers.LayerNormalization()(hidden + attended)
    outputs = keras.layers.Dense(8, activation="relu")(normed[:, 0])
    return keras.Model(inputs, outputs)


@pytest.fixture(scope="session")
def optimized_encoder(tmp_path_factory):
    """encoder_block() exported to root/original and optimized (quick tuning, horizontal fusion) to root/optimized,
    for x in batch 1..2, T 1..12. Returns (root, report)."""
    from tf_dietcode.tuning import search

    root = tmp_path_factory.mktemp("optimize")
    encoder_block().export(str(root / "original"), verbose=False)
    report = tf_dietcode.optimize(root / "original", root / "optimized", shape_ranges=ENCODER_RANGES,
                                  tuning=search.SearchOptions(**TINY_TUNING_OPTIONS), horizontal_fusion=True,
                                  database=shared_database())
    return root, report
