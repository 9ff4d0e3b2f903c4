"""TF Serving warm-up requests written with the optimized model.

TF Serving replays `assets.extra/tf_serving_warmup_requests` (a TFRecord file
of PredictionLog records) when it loads a model, before the model takes
traffic. Replaying requests from short to long sequences makes the fused ops
load and check the kernel bundle and run tuned kernels of several shape
classes then, not on the first user's request.

Inputs are zeros (empty strings for string inputs), the one value valid for
every input a model can have (token ids, masks, features, text), and an
integer scalar given a range of values (a loop's length) at its value; a request
that fails would fail the model's load, so optimize() writes only those the
original model runs (shape ranges may reach beyond what a model accepts, e.g.
a sequence longer than its position table).
"""

import pathlib

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

from tf_dietcode.graph_rewrite.analysis.shape_ranges import DimRanges, tensor_at

WARMUP_FILE = pathlib.Path("assets.extra") / "tf_serving_warmup_requests"
POINTS = 4   # shapes per signature, from the lowest to the highest corner of its ranges


def warmup_shapes(ranges: DimRanges, points: int = POINTS) -> list[dict[str, list[int]]]:
    """Input shapes at `points` evenly spaced steps from the lowest to the highest corner
    (dims of size 0 become 1: an empty request warms nothing; a ranged scalar's [value] alike)."""
    shapes = []
    for step in range(points):
        shape = {name: [max(lo + (hi - lo) * step // (points - 1), 1) for lo, hi in dims]
                 for name, dims in ranges.items()}
        if shape not in shapes:
            shapes.append(shape)
    return shapes


Request = tuple[str, dict[str, np.ndarray]]  # (signature key, inputs by name)


def requests(signatures: dict[str, tuple[dict[str, tf.TensorSpec], DimRanges]]) -> list[Request]:
    """The zero-input requests of every signature ({key: (input specs, ranges)}), short to long."""
    return [(key, {name: tensor_at(spec, shape[name], tf.zeros).numpy() for name, spec in specs.items()})
            for key, (specs, ranges) in signatures.items() for shape in warmup_shapes(ranges)]


def write(path: pathlib.Path, requests: list[Request]) -> int:
    """Writes the requests as PredictionLogs; returns their count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for key, inputs in requests:
            request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(signature_name=key))
            for name, value in inputs.items():
                request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return len(requests)


def read(path: pathlib.Path) -> list[predict_pb2.PredictRequest]:
    """The PredictRequests of a warm-up file, in order."""
    requests = []
    for record in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
        log = prediction_log_pb2.PredictionLog.FromString(record)
        if log.WhichOneof("log_type") != "predict_log":
            raise ValueError(f"{path}: expected PredictLog records, found {log.WhichOneof('log_type')}")
        requests.append(log.predict_log.request)
    return requests
