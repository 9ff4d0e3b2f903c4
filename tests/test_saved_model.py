"""A SavedModel using the fused ops, saved here, serves in a fresh process that
loads only the op library (not tf_dietcode's Python package)."""

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import tensorflow as tf

from conftest import random_tensor
from tf_dietcode import ops, op_library

LOADER = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    tf.load_op_library(sys.argv[1])
    model = tf.saved_model.load(sys.argv[2])
    inputs = np.load(sys.argv[3])
    serve = model.signatures["serving_default"]
    outputs = {}
    for t in (1, 7, 64):
        result = serve(hidden=tf.constant(inputs[f"hidden{t}"]), mask=tf.constant(inputs[f"mask{t}"]))
        outputs.update({f"{key}{t}": value.numpy() for key, value in result.items()})
    np.savez(sys.argv[4], **outputs)
""")


class Attention(tf.Module):
    def __init__(self, rng, bundle_file):
        super().__init__()
        self.bundle = tf.saved_model.Asset(str(bundle_file))
        self.w_qkv = tf.Variable(random_tensor(rng, (3 * 32, 32)))
        self.b_qkv = tf.Variable(random_tensor(rng, (3 * 32,)))

    @tf.function(input_signature=[tf.TensorSpec([None, None, 32], tf.float32, name="hidden"),
                                  tf.TensorSpec([None, 1, 1, None], tf.float32, name="mask")])
    def __call__(self, hidden, mask):
        batch, time = tf.shape(hidden)[0], tf.shape(hidden)[1]
        qkv = ops.fused_matmul(tf.reshape(hidden, [-1, 32]), self.w_qkv, self.b_qkv,
                               transpose_b=True, activation="gelu_tanh", bundle=self.bundle.asset_path)
        q, k, v = (tf.transpose(tf.reshape(part, [batch, time, 4, 8]), [0, 2, 1, 3])
                   for part in tf.split(qkv, 3, axis=-1))
        scores = ops.fused_batch_matmul_add(q, k, mask, adj_y=True, alpha=8 ** -0.5)
        context = ops.fused_batch_matmul_transpose(tf.nn.softmax(scores), v, [0, 2, 1, 3])
        return {"context": context, "scores": scores}


def test_saved_model_serves_in_fresh_process_from_a_copied_directory(rng, tmp_path):
    bundle_file = tmp_path / "kernels.bundle"
    bundle_file.write_text("stand-in bundle: only its path matters here")
    module = Attention(rng, bundle_file)
    saved = tmp_path / "saved"
    tf.saved_model.save(module, str(saved), signatures={"serving_default": module.__call__})
    moved = tmp_path / "moved"
    shutil.copytree(saved, moved)
    shutil.rmtree(saved)

    inputs, expected = {}, {}
    for t in (1, 7, 64):
        hidden, mask = random_tensor(rng, (2, t, 32)), random_tensor(rng, (2, 1, 1, t))
        inputs.update({f"hidden{t}": hidden, f"mask{t}": mask})
        expected.update({f"{key}{t}": value.numpy() for key, value in module(hidden, mask).items()})
    np.savez(tmp_path / "inputs.npz", **inputs)

    loaded = subprocess.run([sys.executable, "-c", LOADER, str(op_library.LIBRARY_PATH), str(moved),
                             str(tmp_path / "inputs.npz"), str(tmp_path / "outputs.npz")],
                            check=True, timeout=300, cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})  # keep the warning
    # The bundle reaches the op as an asset path resolved inside the moved model.
    assert f"kernel bundle '{moved / 'assets' / 'kernels.bundle'}'" in loaded.stderr
    outputs = np.load(tmp_path / "outputs.npz")
    assert sorted(outputs.files) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(outputs[key], value, rtol=1e-6, atol=1e-6)
