"""Keras 3 integration: `DietDense`, a `keras.layers.Dense` that runs the fused op.

A model built with DietDense (or turned into one by `convert`) computes its
dense layers with `DietcodeFusedMatMul` (matmul, bias and activation in one op)
while keeping everything else Keras knows about Dense: arguments, weights,
config, masking, training, saving. `tune` tunes its layers for the model's
input shape ranges; each tuned layer then carries its kernel bundle as assets,
in `.keras` files and in `model.export()` SavedModels alike. A layer in
bfloat16 or int8 (`precision`) trains on its float32 kernel; `tune` converts
that kernel once into the weights its reduced-precision op reads at inference.
"""

import collections
import dataclasses
import math
import pathlib
import shutil
import uuid

import keras
import tensorflow as tf
from keras.src.models.functional import Functional  # what clone_model itself checks; Keras exports no name for it

from tf_dietcode import bundle_store, ops
from tf_dietcode.graph_rewrite.analysis import shape_ranges as input_ranges
from tf_dietcode.precision import modes
from tf_dietcode.tuned_bundles import tune_and_install
from tf_dietcode.tuning import hardware, micro_kernel
from tf_dietcode.tuning.workload import Workload

# Row counts (M) each DietDense layer sees, by id(layer), while tune() runs the model at
# the corners of its input ranges; None the rest of the time.
_observed_rows: dict[int, list[int]] | None = None

# Keras activations the op's epilogue computes exactly, by the op's name for them.
# Sigmoid is left out on purpose: Keras' sigmoid tags its output with the logits
# (`_keras_logits`), which binary cross-entropy reads to stay stable on saturated
# outputs; a fused sigmoid would lose them and change the loss.
_FUSED_ACTIVATIONS = {"linear": "none", "relu": "relu", "tanh": "tanh", "gelu": "gelu", "silu": "silu"}


def _fused_activation(activation) -> str | None:
    """The op's name for a Keras activation it computes, None if it must run after the op."""
    if activation is None:  # Dense's call skips a None activation
        return "none"
    for keras_name, op_name in _FUSED_ACTIVATIONS.items():
        if activation is keras.activations.get(keras_name):
            return op_name
    return None


class _BundleAssets(tf.saved_model.experimental.TrackableResource):
    """A bundle's manifest and library as SavedModel assets (copied on save, their paths
    resolved where the model is loaded). A resource because `model.export()` keeps only
    the TrackableResources (lookup tables, normally) among a model's objects; its own
    handle is a variable handle nothing reads."""

    def __init__(self, manifest_path: str | pathlib.Path):
        super().__init__()
        manifest, library = bundle_store.files(manifest_path)
        self.manifest = tf.saved_model.Asset(str(manifest))
        self.library = tf.saved_model.Asset(str(library))
        self._handle_name = f"tf_dietcode_bundle_{uuid.uuid4().hex}"

    def _create_resource(self):
        return tf.raw_ops.VarHandleOp(dtype=tf.int32, shape=[], shared_name=self._handle_name)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        return {**super()._trackable_children(save_type, **kwargs),
                "manifest": self.manifest, "library": self.library}


@keras.saving.register_keras_serializable(package="tf_dietcode")
class DietDense(keras.layers.Dense):
    """`keras.layers.Dense` computed by `DietcodeFusedMatMul`; a drop-in replacement.

    Float32 layers run the op on the input flattened to [-1, K]. Other compute
    dtypes (mixed precision, float64) and inputs that are not dense float32
    tensors run Dense's own `call`: the op is float32 only. Quantized layers
    never reach `call` (Keras runs `quantized_call` instead), and LoRA is
    already merged into `self.kernel`, which is what the op reads.

    precision: "float32" (the default), "bfloat16" or "int8" (tf_dietcode.precision).
    The kernel stays float32 and trainable, and training reads it; once
    `convert_weights()` (which `tune` calls) has converted it, inference reads
    the converted weights (non-trainable weights of the layer, saved with it)
    with that precision's op. Convert again after training further.
    """

    def __init__(self, units: int, precision: str = "float32", **kwargs):
        super().__init__(units, **kwargs)
        # An instance attribute: keras.layers.Layer.__init__ sets supports_jit = True
        # on every instance, which would hide a class attribute.
        self.supports_jit = False  # the custom op has no XLA kernel
        self._bundle = None  # a _BundleAssets once tuned
        self.precision = modes.get(precision).name
        self._converted: dict[str, keras.Variable] = {}  # the kernel as the precision's op reads it, once converted

    def get_config(self) -> dict:
        return {**super().get_config(), "precision": self.precision}

    def convert_weights(self) -> None:
        """Converts the float32 kernel to the layer's precision (bfloat16, int8) into the weights
        inference reads; nothing to convert in float32."""
        precision = modes.get(self.precision)
        if precision is modes.FLOAT32:
            return
        values = precision.convert(keras.ops.convert_to_numpy(self.kernel), None)
        if [f"{self.precision}_{name}" for name in values] != [v.name for v in self._converted.values()]:
            if self._converted:
                raise ValueError(f"{self.name}: its weights were converted to another precision than {self.precision}")
            self._tracker.unlock()  # weights added after build, as keras.layers.Dense.quantize adds its own
            self._converted = {name: self.add_weight(name=f"{self.precision}_{name}", shape=value.shape,
                                                     dtype=str(value.dtype), initializer="zeros", trainable=False,
                                                     autocast=False)
                               for name, value in values.items()}
            self._tracker.lock()
        for name, value in values.items():
            self._converted[name].assign(value)

    def save_own_variables(self, store) -> None:
        """Keras' saving: Dense's kernel and bias, then the converted weights."""
        super().save_own_variables(store)
        first = len(store.keys())
        for i, variable in enumerate(self._converted.values()):
            store[str(first + i)] = keras.ops.convert_to_numpy(variable)

    def load_own_variables(self, store) -> None:
        """Keras' loading: a store holding more than Dense's kernel and bias holds converted weights."""
        own = 2 if self.use_bias else 1
        if self.built and len(store.keys()) > own:
            self.convert_weights()  # makes the weights the store holds
        super().load_own_variables(store)
        for i, variable in enumerate(self._converted.values()):
            variable.assign(store[str(own + i)])

    @property
    def bundle_path(self) -> str:
        """Path of the tuned kernel bundle's manifest the op uses, "" for the generic kernel."""
        return "" if self._bundle is None else self._bundle.manifest.asset_path.numpy().decode()

    def use_bundle(self, manifest_path: str | pathlib.Path | None) -> None:
        """Runs the layer on the tuned kernels of this bundle (None: the generic kernel).
        Functions traced before (e.g. Keras' predict function) keep what they traced with."""
        self._bundle = None if manifest_path is None else _BundleAssets(manifest_path)

    def save_assets(self, dir_path: str) -> None:
        """Keras' `.keras` saving: the bundle's two files travel with the layer."""
        if self._bundle is not None:
            for path in bundle_store.files(self.bundle_path):
                shutil.copy(path, dir_path)

    def load_assets(self, dir_path: str | None) -> None:
        """Keras' `.keras` loading: Keras deletes `dir_path` afterwards, so the bundle goes to the
        store. Keras passes None for a layer that saved no assets (an untuned one)."""
        manifests = sorted(pathlib.Path(dir_path).glob("*.json")) if dir_path else []
        self.use_bundle(bundle_store.install(manifests[0]) if manifests else None)

    def call(self, inputs, training=None):
        if not (self.compute_dtype == "float32" and isinstance(inputs, tf.Tensor) and inputs.dtype == tf.float32):
            return super().call(inputs, training=training)
        fused = _fused_activation(self.activation)
        if _observed_rows is not None:
            _observed_rows[id(self)].append(math.prod(inputs.shape[:-1]))
        if self._converted and not training:
            y = modes.get(self.precision).product(inputs, {name: v.value for name, v in self._converted.items()},
                                                  self.bias, n=self.units, activation=fused or "none")
        else:
            bundle = "" if self._bundle is None else self._bundle.manifest.asset_path
            y = ops.fused_matmul(inputs, self.kernel, self.bias, activation=fused or "none", bundle=bundle)
        return y if fused else self.activation(y)


def convert(model: keras.Model) -> keras.Model:
    """A copy of a Functional or Sequential model with every `keras.layers.Dense` a `DietDense`.

    Nested Functional and Sequential models are converted too; Dense layers
    inside other layers (custom layers' sublayers) stay Dense. All weights are
    copied; the input model is left as it was.
    """
    if not isinstance(model, (keras.Sequential, Functional)):
        raise TypeError(
            f"convert() takes a Functional or Sequential model, got {type(model).__name__}, a subclassed "
            "model whose layer graph keras.models.clone_model cannot rebuild; use "
            "tf_dietcode.keras.DietDense in its code in place of keras.layers.Dense")
    clones = []

    def clone(operation: keras.Operation) -> keras.Operation:
        # clone_model passes every node: layers, and the plain ops (keras.ops calls) between them.
        cls = DietDense if type(operation) is keras.layers.Dense else type(operation)
        copy = cls.from_config(operation.get_config())
        if isinstance(copy, keras.layers.Layer):
            clones.append((operation, copy))
        return copy

    converted = keras.models.clone_model(model, clone_function=clone, recursive=True)
    for original, copy in clones:
        copy.set_weights(original.get_weights())
    return converted


@dataclasses.dataclass
class TuningReport:
    """What tune() did: each DietDense layer's workload, its precision where its weights were
    converted instead, or why it was left generic."""

    tuned: dict[str, Workload] = dataclasses.field(default_factory=dict)      # by layer path
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)         # layer path -> why
    notes: list[str] = dataclasses.field(default_factory=list)                # ranges assumed
    converted: dict[str, str] = dataclasses.field(default_factory=dict)      # layer path -> its precision

    def summary(self) -> str:
        lines = [f"tuned {len(self.tuned)} DietDense layer(s) as {len(set(self.tuned.values()))} workload(s)"]
        lines += [f"  {name}: M {w.m.lo}..{w.m.hi}, [{w.k.hi}] -> [{w.n.hi}], {w.activation}"
                  for name, w in self.tuned.items()]
        lines += [f"  {name}: {precision}, weights converted; {modes.get(precision).kernel_path()} kernels the op "
                  "chooses (not tuned)" for name, precision in self.converted.items()]
        lines += [f"  {name}: generic kernel ({why})" for name, why in self.skipped.items()]
        return "\n".join(lines + [f"note: {note}" for note in self.notes])


def tune(model: keras.Model, shape_ranges: dict | list | None = None, *, precision: str | None = None,
         tuning=None, database=None, progress: bool = True) -> TuningReport:
    """Tunes every float32 DietDense layer of `model` for the row counts its input ranges imply,
    and attaches each layer's bundle to it; converts the weights of every layer in bfloat16 or
    int8 (their ops choose their kernels: nothing to tune).

    shape_ranges: per model input (by name; a plain list for a single input), per dim a
    size, an inclusive (lo, hi) range or None (the declared size, or a default range),
    as for `tf_dietcode.optimize`. Layers with the same workload share kernels.
    precision: every DietDense layer's precision ("float32", "bfloat16", "int8"); None keeps each
    layer's own.
    tuning: a `tf_dietcode.tuning.search.SearchOptions` or a budget's name, "quick" or "default"
    (default: the full search). database: a `tf_dietcode.tuning.database.Database` (default: the
    user's, which every tuning reuses and extends).
    """
    from tf_dietcode.tuning import search  # the tuner, imported when it runs
    from tf_dietcode.tuning.progress import display_for

    options = search.budget(tuning)
    layers = [layer for layer in model._flatten_layers(include_self=False) if isinstance(layer, DietDense)]
    for layer in layers if precision is not None else []:
        layer.precision = modes.get(precision).name
    rows, notes = _row_ranges(model, shape_ranges, layers)
    report = TuningReport(notes=notes)
    workloads = {}
    for layer in layers:
        if id(layer) in rows and layer.precision != "float32":
            layer.convert_weights()
            report.converted[layer.path] = layer.precision
    layers = [layer for layer in layers if layer.path not in report.converted]
    weight_bytes = sum(4 * math.prod(layer.kernel.shape) for layer in layers if id(layer) in rows)
    cold_weight = not hardware.detect().holds_in_cache(weight_bytes)  # streamed from DRAM at every call
    for layer in layers:
        if id(layer) not in rows:
            report.skipped[layer.path] = (f"does not run the fused op in {layer.compute_dtype} "
                                          "or is not reached by the inputs")
            continue
        workload = Workload("dense", rows[id(layer)], layer.units, layer.kernel.shape[0], bias=layer.use_bias,
                            activation=_fused_activation(layer.activation) or "none", weight_layout="in_place",
                            cold_weight=cold_weight)
        if not micro_kernel.space(hardware.detect(), workload):
            report.skipped[layer.path] = f"no micro-kernel splits its {layer.units} output columns exactly"
            continue
        workloads[layer] = report.tuned[layer.path] = workload
    distinct = list(dict.fromkeys(workloads.values()))
    with display_for(progress, len(distinct), options.trials + options.finalists) as display:  # one over all
        bundles = {workload: tune_and_install([workload], options=options, database=database, progress=display).manifest
                   for workload in distinct}
    for layer, workload in workloads.items():
        layer.use_bundle(bundles[workload])
    model.train_function = model.test_function = model.predict_function = None  # retraced with the bundles
    return report


def _row_ranges(model: keras.Model, shape_ranges, layers) -> tuple[dict[int, tuple[int, int]], list[str]]:
    """Each layer's (lo, hi) rows, from running the model on zeros at the corners of the input ranges."""
    global _observed_rows
    try:
        inputs = model.inputs
    except (AttributeError, ValueError) as error:
        raise ValueError("tune() needs a model with known inputs (built from keras.Input)") from error
    specs = {t.name: tf.TensorSpec(t.shape, t.dtype) for t in inputs}
    if isinstance(shape_ranges, (list, tuple)):
        if len(specs) != 1:
            raise ValueError(f"the model has inputs {list(specs)}: give shape_ranges as a dict by input name")
        shape_ranges = {next(iter(specs)): shape_ranges}
    ranges, notes = input_ranges.resolve(specs, shape_ranges)
    _observed_rows = collections.defaultdict(list)
    try:
        for corner in input_ranges.corner_inputs(specs, ranges):
            model(corner if len(corner) > 1 else corner[0])
        observed = _observed_rows
    finally:
        _observed_rows = None
    return {id(layer): (max(min(observed[id(layer)]), 1), max(max(observed[id(layer)]), 1))
            for layer in layers if observed[id(layer)]}, notes

