"""Shared test helpers: seeded fresh inputs and a float64 TF reference check."""

import os
import random
import zlib

import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode

SEED = int(os.environ.get("TF_DIETCODE_TEST_SEED", random.SystemRandom().randrange(2**31)))


def pytest_report_header(config):
    return f"tf_dietcode test seed: {SEED} (set TF_DIETCODE_TEST_SEED to repeat)"


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

    The bound scales with the reference applied to |inputs|, the sum of
    absolute terms each output element adds up, as float32 rounding does.
    """
    as64 = [None if x is None else tf.constant(np.asarray(x, np.float64)) for x in inputs]
    abs64 = [None if x is None else tf.abs(x) for x in as64]
    expected = reference_fn(*as64, **attrs).numpy()
    magnitude = np.abs(reference_fn(*abs64, **{**attrs, **_linear(attrs)}).numpy())
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_array_less(np.abs(actual - expected), 2e-5 * magnitude + 1e-5 * np.abs(expected) + 1e-6)


def _linear(attrs):
    """The magnitude bound is taken before the activation."""
    return {"activation": "none"} if "activation" in attrs else {}


@pytest.fixture(scope="session")
def tuned_bundle(tmp_path_factory):
    """A quick-tuned bundle: dense (bias, relu, packed weight), batch matmul NT, NN and NT
    with an addend, dense (gelu, weight in place). Returns the bundle's path and the
    tuning report (its trees decide the kernels)."""
    from tf_dietcode.tuning import search
    from tf_dietcode.tuning.tune import tune
    from tf_dietcode.tuning.workload import Workload

    workloads = [Workload("dense", (1, 40), 40, 24, bias=True, activation="relu", weight_layout="packed"),
                 Workload("batch_matmul", (1, 20), (1, 20), 8, b=3, ties=("m", "n")),
                 Workload("batch_matmul", (1, 16), 12, (1, 16), b=(2, 8), transpose_b=False, ties=("m", "k")),
                 Workload("batch_matmul", (1, 20), (1, 20), 8, b=6, bias=True, ties=("m", "n")),
                 Workload("dense", (1, 40), 48, 24, activation="gelu", weight_layout="in_place")]
    path = tmp_path_factory.mktemp("tuned") / "bundle"
    report = tune(workloads, path, options=search.SearchOptions(trials=4, batch=4, samples=3, seed=SEED % 1000),
                  progress=False)
    return path, report
