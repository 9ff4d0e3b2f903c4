"""tf_dietcode.optimize() and Converter: a SavedModel in, a faster SavedModel out.

Like TF-TRT's converter: `optimize(input_dir, output_dir, ...)` in one call,
or `Converter(input_dir, ...)` with `convert()`, `build(input_fn)`,
`save(output_dir)` and `summary()`. Every signature is kept with its name and
inputs/outputs, variables stay variables (nothing is frozen), the kernel
bundle travels in the output's assets/, and the output appears atomically.
"""

import collections
import dataclasses
import hashlib
import json
import math
import pathlib
import shutil
import tempfile

import tensorflow as tf

from tf_dietcode import bundle_store, endpoints, serving_warmup
from tf_dietcode.atomic_output import atomic_directory
from tf_dietcode.graph_rewrite import (attention_patterns, dense_patterns, horizontal_fusion, layer_norm_patterns,
                                       rewrite, shape_ranges, signature_graph, softmax_patterns)
from tf_dietcode.graph_rewrite.graph_index import GraphIndex
from tf_dietcode.graph_rewrite.symbolic_shapes import SymbolicShapes
from tf_dietcode.op_library import load_op_library
from tf_dietcode.tuning import hardware, search
from tf_dietcode.tuning.templates import dense
from tf_dietcode.tuning.workload import Workload


@dataclasses.dataclass
class Report:
    signatures: list[str]
    ranges: dict[str, dict[str, list[tuple[int, int]]]]   # signature -> input -> (lo, hi) per dim
    notes: list[str]
    found: collections.Counter                            # per form
    fused: collections.Counter
    left_alone: list[dense_patterns.LeftAlone]
    workloads: list[Workload]
    merged: tuple[int, int] = (0, 0)                      # GEMMs merged by horizontal fusion, into how many
    horizontal_fusion: bool = False                       # whether the pass ran
    dims: dict[Workload, str] = dataclasses.field(default_factory=dict)  # its dims as the graph computes them
    output_dir: str | None = None
    warmup_requests: int = 0                              # in assets.extra/, for TF Serving

    def summary(self) -> str:
        lines = [f"signatures: {', '.join(self.signatures)}"]
        for key, inputs in self.ranges.items():
            lines += [f"  {key}.{name}: " + (" x ".join(f"{lo}..{hi}" if lo != hi else f"{lo}" for lo, hi in dims)
                                             or "scalar") for name, dims in inputs.items()]
        lines += [f"note: {note}" for note in self.notes]
        lines.append("patterns (found / fused):")
        own_forms = ("attention", layer_norm_patterns.FORM, softmax_patterns.FORM)  # the rest are dense forms
        lines += [f"  {form if form.startswith(own_forms) else f'dense ({form})'}: "
                  f"{count} / {self.fused[form]}" for form, count in sorted(self.found.items())]
        lines += [f"  left alone: {p.form} {p.node}: {p.reason}"  # signatures of one computation name it alike
                  for p in dict.fromkeys(self.left_alone)]
        lines.append("horizontal fusion: {} GEMMs sharing an input merged into {}".format(*self.merged)
                     if self.horizontal_fusion else "horizontal fusion: off (the default; horizontal_fusion=True or "
                     "--horizontal_fusion merges dense layers that read the same input)")
        lines.append(f"workloads tuned: {len(self.workloads)}")
        lines += [f"  {w.describe()}" + (f" ({self.dims[w]})" if w in self.dims else "") for w in self.workloads]
        if self.output_dir:
            lines.append(f"written to {self.output_dir}, with {self.warmup_requests} TF Serving warm-up requests "
                         f"in {serving_warmup.WARMUP_FILE}")
        return "\n".join(lines)


def _computation(graph: signature_graph.SignatureGraph) -> tuple:
    """What a signature computes: its graph without the `_user_specified_name` attrs (which
    differ between the signatures of one Keras export), its inputs and the variables it captures."""
    graph_def = tf.compat.v1.GraphDef()
    graph_def.CopyFrom(graph.graph_def)
    for node in graph_def.node:
        node.attr.pop("_user_specified_name", None)
    return (graph_def.SerializeToString(deterministic=True), repr(graph.input_specs), repr(graph.input_tensors),
            tuple((name, id(t)) for name, t in sorted(graph.captures.items())))


def _dense_workload(layer: horizontal_fusion.DenseGroup, rows: tuple[int, int], cold_weight: bool) -> Workload:
    return Workload("dense", (max(rows[0], 1), max(rows[1], 1)), layer.n, layer.k,
                    bias=layer.has_bias, activation=layer.activation, cold_weight=cold_weight, groups=layer.groups,
                    weight_layout="packed" if layer.groups > 1 else "any")


def _attention_workload(match: attention_patterns.AttentionMatch, ranges: dict, same_size: dict) -> Workload:
    """The product's workload from the ranges of its dims.

    Dynamic dims are one shape variable where `same_size` gives them the same key: their
    expression when the graph's shapes sized them (attention's rows and columns both follow
    the sequence length), else their range; the largest such group is tied.
    """
    groups = collections.defaultdict(list)
    for d, (lo, hi) in ranges.items():
        if lo != hi:
            groups[same_size[d]].append(d)
    ties = max(groups.values(), key=len, default=[])
    return Workload("batch_matmul", ranges["m"], ranges["n"], ranges["k"], b=ranges["b"],
                    transpose_b=match.adj_y, bias=match.addend is not None,
                    ties=tuple(ties) if len(ties) > 1 else ())


def _symbolic_product_dims(match: attention_patterns.AttentionMatch, shapes: SymbolicShapes) -> dict | None:
    """b, m, n, k of an attention product as expressions of the input dims, or None."""
    x, y = shapes.shape(match.x), shapes.shape(match.y)
    if x is None or y is None or None in x or None in y:
        return None
    try:
        return {d: shapes.canonical(e) for d, e in attention_patterns.product_dims(match, x, y).items()}
    except ValueError:
        return None


def _left_running_note(node: str, op: str, xla: bool) -> str:
    if xla:
        return (f"the products in {node} are left to XLA (jit_compile=True), which compiles them for each new "
                "input shape: export the model without jit_compile to have them fused")
    return f"the products in {node} ({op}) are left to TF: the rewriter does not enter control-flow bodies"


class Converter:
    """Finds fusable patterns, tunes them for the model's shape ranges, writes the optimized model."""

    def __init__(self, input_saved_model_dir: str | pathlib.Path, *, tags=("serve",),
                 signature_keys: list[str] | None = None, shape_ranges: dict | None = None,
                 tuning: search.SearchOptions = search.SearchOptions(), database=None,
                 horizontal_fusion: bool = False, layer_norm_fusion: bool = True):
        self.input_dir = pathlib.Path(input_saved_model_dir)
        if not tf.saved_model.contains_saved_model(str(self.input_dir)):
            raise ValueError(f"{self.input_dir} is not a SavedModel directory")
        self.tags, self.signature_keys, self.shape_ranges = list(tags), signature_keys, shape_ranges
        self.tuning, self.database, self.horizontal_fusion = tuning, database, horizontal_fusion
        self.layer_norm_fusion = layer_norm_fusion
        self._converted = self._built = False
        self._bundle_manifest: pathlib.Path | None = None

    def convert(self) -> "Converter":
        """Loads the model, matches patterns in every signature and sizes them from the shape ranges."""
        load_op_library()
        try:
            self.loaded = tf.saved_model.load(str(self.input_dir), tags=self.tags)
        except (RuntimeError, ValueError) as error:
            raise ValueError(f"cannot load {self.input_dir} with tags {self.tags}: {error}") from error
        keys = self.signature_keys or sorted(self.loaded.signatures)
        missing = sorted(set(keys) - set(self.loaded.signatures))
        if missing:
            raise ValueError(f"unknown signature(s) {missing}; the model has {sorted(self.loaded.signatures)}")
        resources = signature_graph.resources_of(self.loaded)
        self.graphs = [signature_graph.from_signature(k, self.loaded.signatures[k]) for k in keys]
        self._computations = {graph.key: _computation(graph) for graph in self.graphs}
        self.dense_layers, self.attention, self.layer_norms, self.softmaxes = {}, {}, {}, {}
        self.ranges, self._indexes, self._range_notes = {}, {}, []
        notes, left, found = [], [], collections.Counter()
        lanes = hardware.detect().vector_lanes
        for graph in self.graphs:
            captured = {name: resources[id(t)].numpy() for name, t in graph.captures.items()
                        if isinstance(resources.get(id(t)), tf.Variable)}
            index = self._indexes[graph.key] = GraphIndex(graph.graph_def, captured)
            matches, left_alone = dense_patterns.find(index)
            self.dense_layers[graph.key] = horizontal_fusion.group(matches, self.horizontal_fusion, lanes)
            left += left_alone
            self.attention[graph.key] = attention_patterns.find(index)
            provisional, _ = shape_ranges.resolve(graph.input_specs, self.shape_ranges)
            shapes = SymbolicShapes(index, graph.input_tensors, provisional)
            self.layer_norms[graph.key] = layer_norm_patterns.find(index, shapes.shape) if self.layer_norm_fusion else []
            self.softmaxes[graph.key] = softmax_patterns.find(index)
            found.update(m.form for m in [*matches, *self._matches_besides_dense(graph.key)])
            maxima = shapes.declared_maxima()
            self.ranges[graph.key], graph_notes = shape_ranges.resolve(graph.input_specs, self.shape_ranges, maxima)
            self._range_notes += [f"{graph.key}: {note}" for note in graph_notes]
            notes += [f"{graph.key}: {_left_running_note(*call)}"
                      for call in signature_graph.calls_left_running(graph.graph_def, set(dense_patterns.CORES))]
        self._resources = resources
        groups = [g for layers in self.dense_layers.values() for g in layers if len(g.members) > 1]
        self.report = Report(keys, self.ranges, self._range_notes + notes, found, collections.Counter(), left, [],
                             merged=(sum(len(g.members) for g in groups), len(groups)),
                             horizontal_fusion=self.horizontal_fusion)
        self._converted = True
        return self

    def build(self, input_fn=None) -> "Converter":
        """Tunes every distinct workload; with `input_fn` (yielding dicts of inputs), the shape
        ranges span the inputs it yields instead, and layers the graph's shapes do not size are
        also run on them (dims that follow the inputs' values, such as words split from text)."""
        if not self._converted:
            self.convert()
        self._examples = [] if input_fn is None else list(input_fn())
        if input_fn is not None:
            self.ranges = {g.key: shape_ranges.from_examples(g.input_specs, self._examples) for g in self.graphs}
            self.report.ranges = self.ranges
            self.report.notes = [note for note in self.report.notes if note not in self._range_notes]
        self._workloads, self._built = {}, True
        cold_weights = self._cold_weights()
        corners_seen = {}  # Keras exports "serve" and "serving_default" alike: run the model at its corners once
        for graph in self.graphs:
            dense_layers = self.dense_layers[graph.key]
            products = [a for a in self.attention[graph.key] if not a.adj_x]  # tuned kernels read x as is
            if dense_layers or products:
                self._workloads.update(self._sized_by_graph(graph, dense_layers, products, cold_weights)
                                       or self._sized_at_corners(graph, dense_layers, products, cold_weights,
                                                                 corners_seen))
        workloads = list(dict.fromkeys(self._workloads.values()))
        self.report.workloads = workloads
        if not workloads:
            return self
        from tf_dietcode.tuning.tune import tune

        self._tuning_dir = tempfile.TemporaryDirectory(prefix="tf_dietcode-")  # removed with the converter
        tuned_dir = pathlib.Path(self._tuning_dir.name) / "tuned"
        manifest = tune(workloads, tuned_dir, options=self.tuning, database=self.database).manifest
        # Named by content in the output's assets/ (bundle_store's docstring says why).
        self._bundle_manifest = bundle_store.install(tuned_dir, store=pathlib.Path(self._tuning_dir.name) / "bundle")
        self._layouts = {w: entry.get("weight_layout") for w, entry in zip(workloads, manifest["workloads"])}
        return self

    def _sized_by_graph(self, graph, dense_layers, products, cold_weights: bool) -> dict | None:
        """Workloads sized from the graph's symbolic shapes (graph_rewrite.symbolic_shapes), or
        None where some dim does not follow from them."""
        shapes = SymbolicShapes(self._indexes[graph.key], graph.input_tensors, self.ranges[graph.key])
        sized, described = {}, {}
        for layer in dense_layers:
            x = shapes.shape(layer.x)
            rows = None if x is None or None in x else shapes.canonical(math.prod(x) / layer.k)
            if shapes.range_of(rows) is None:
                return self._not_sized_by_graph(graph, layer.core)
            workload = sized[(graph.key, layer.core)] = _dense_workload(layer, shapes.range_of(rows), cold_weights)
            described.setdefault(workload, f"M = {rows}")
        for match in products:
            dims = _symbolic_product_dims(match, shapes)
            ranges = {d: shapes.range_of(e) for d, e in (dims or {}).items()}
            if dims is None or None in ranges.values():
                return self._not_sized_by_graph(graph, match.core)
            workload = sized[(graph.key, match.core)] = _attention_workload(match, ranges, dims)
            described.setdefault(workload, ", ".join(f"{d.upper()} = {e}" for d, e in dims.items()
                                                     if ranges[d][0] != ranges[d][1]))
        for workload, text in described.items():
            self.report.dims.setdefault(workload, text)
        return sized

    def _not_sized_by_graph(self, graph, core: str) -> None:
        self.report.notes.append(f"{graph.key}: the dims of {core} do not follow from the graph's shapes; "
                                 "its layers are sized by running the model at the corners of the ranges")

    def _sized_at_corners(self, graph, dense_layers, products, cold_weights: bool, corners_seen: dict) -> dict:
        """Workloads sized by running the model on zero inputs at the lowest and highest corner of
        the ranges, and on input_fn's inputs (once per computation: `corners_seen`)."""
        tensors = {**{f"dense_{i}": m.x for i, m in enumerate(dense_layers)},
                   **{f"x_{i}": a.x for i, a in enumerate(products)},
                   **{f"y_{i}": a.y for i, a in enumerate(products)}}
        seen = (self._computations[graph.key], repr(tensors), repr(self.ranges[graph.key]))
        first_run = seen not in corners_seen
        if first_run:
            operands = signature_graph.SignatureGraph(graph.key, graph.input_specs, graph.input_tensors,
                                                      tensors, graph.captures, graph.graph_def).function()
            corners_seen[seen] = shape_ranges.observed_shapes(operands, graph.input_specs, self.ranges[graph.key],
                                                              self._examples)
        observed, sized, fixed = corners_seen[seen], {}, []
        for i, layer in enumerate(dense_layers):
            rows = shape_ranges.row_range(observed[f"dense_{i}"], layer.k)
            sized[(graph.key, layer.core)] = _dense_workload(layer, rows, cold_weights)
            fixed += [layer.core] if rows[0] == rows[1] else []
        for i, match in enumerate(products):
            runs = [attention_patterns.product_dims(match, x, y)
                    for x, y in zip(observed[f"x_{i}"], observed[f"y_{i}"])]
            ranges = {d: (min(run[d] for run in runs), max(run[d] for run in runs)) for d in runs[0]}
            sized[(graph.key, match.core)] = _attention_workload(match, ranges, ranges)
            fixed += [match.core] if all(lo == hi for lo, hi in ranges.values()) else []
        if first_run:
            self._note_fixed_on_zeros(graph, fixed)
        return sized

    def _note_fixed_on_zeros(self, graph, fixed: list[str]) -> None:
        """Without input_fn, a note on layers of one size at both corners of ranges that vary:
        their dims may follow the inputs' values (words split from text, say), which zero inputs
        do not show."""
        varying = any(lo != hi for dims in self.ranges[graph.key].values() for lo, hi in dims)
        if fixed and varying and not self._examples:
            self.report.notes.append(
                f"{graph.key}: {', '.join(fixed)} ran at the same size on zero inputs at both corners of the "
                "ranges; such dims may follow the inputs' values (words split from text, say) rather than their "
                "shapes: build(input_fn) / optimize(input_fn=...) with representative inputs sizes them")

    def _cold_weights(self) -> bool:
        """Whether one call of a signature reads more dense weights than the last-level cache
        holds, so that every call streams them from DRAM: its kernels are then tuned cold."""
        weight_bytes = max((sum(layer.weight.nbytes for layer in layers) for layers in self.dense_layers.values()),
                           default=0)
        hw = hardware.detect()
        if hw.holds_in_cache(weight_bytes):
            return False
        self.report.notes.append(f"dense weights of {weight_bytes / 2**20:.1f} MiB per call outgrow the "
                                 f"{hw.l3_bytes / 2**20:.1f} MiB last-level cache: kernels are timed with "
                                 "their weights read from DRAM")
        return True

    def save(self, output_saved_model_dir: str | pathlib.Path, *, overwrite: bool = False) -> Report:
        """Writes the optimized SavedModel (atomically: a staging directory renamed at the end)."""
        output = _checked_output(output_saved_model_dir, self.input_dir, overwrite)
        if not self._built:
            self.build()
        module = self._module()
        with atomic_directory(output) as staging:
            _save(module, staging, self._signatures, self.report.notes)
            self.report.warmup_requests = serving_warmup.write(staging / serving_warmup.WARMUP_FILE, self._runnable(
                serving_warmup.requests({g.key: (g.input_specs, self.ranges[g.key]) for g in self.graphs})))
        self.report.output_dir = str(output)
        return self.report

    def summary(self) -> str:
        return self.report.summary()

    def _runnable(self, requests: list[serving_warmup.Request]) -> list[serving_warmup.Request]:
        """The requests the original model runs (once per computation and shape), each other one
        left out with a note: TF Serving would fail the model's load on it."""
        failures, kept = {}, []
        for key, inputs in requests:
            seen = (self._computations[key], tuple((name, value.shape) for name, value in inputs.items()))
            if seen not in failures:
                try:
                    self.loaded.signatures[key](**{name: tf.constant(v) for name, v in inputs.items()})
                    failures[seen] = None
                except tf.errors.OpError as error:
                    failures[seen] = shape_ranges.op_error_summary(error)
            if failures[seen] is None:
                kept.append((key, inputs))
            else:
                self.report.notes.append(f"{key}: no warm-up request at {shape_ranges.shapes_text(inputs)}: "
                                         "the original model fails there "
                                         f"({failures[seen]}); the shape ranges reach beyond what it accepts")
        return kept

    def _module(self) -> tf.Module:
        """A module tracking the variables, tables, packed weights and bundle the rewritten signatures
        capture, and the input's assets; it has the input's own functions that are signatures too."""
        module = tf.Module()
        module.resources_kept, module.dense_weights, self._signatures = [], [], {}
        module.assets_kept = signature_graph.assets_of(self.loaded)
        module.tf1_initializer = signature_graph.tf1_initializer(self.loaded)
        self._weights_by_content: dict[tuple, tuple[tf.Variable, int]] = {}  # signatures share layers
        self.report.fused = collections.Counter()  # counted afresh by every save()
        if self._bundle_manifest is not None:  # set only when there were workloads to tune
            manifest, library = bundle_store.files(self._bundle_manifest)
            module.bundle_manifest = tf.saved_model.Asset(str(manifest))
            module.bundle_library = tf.saved_model.Asset(str(library))
        rewritten_functions = {}  # signatures that compute alike (Keras' serve, serving_default) share one
        for graph in self.graphs:
            computation = self._computations[graph.key]
            if computation not in rewritten_functions:
                rewritten = self._rewrite(graph, module)
                module.resources_kept += [self._resources[id(t)] for t in graph.captures.values()
                                          if id(t) in self._resources]
                function = rewritten.function()
                specs = [tf.TensorSpec(spec.shape, spec.dtype, name=name) for name, spec in graph.input_specs.items()]
                rewritten_functions[computation] = tf.function(lambda *args, f=function: f(*args),
                                                               input_signature=specs).get_concrete_function()
            self._signatures[graph.key] = rewritten_functions[computation]
            own = endpoints.endpoint(self.loaded, graph.key, rewritten_functions[computation], list(graph.input_specs))
            if own is not None and not hasattr(module, graph.key):  # Keras' `serve`, called as loaded.serve(x)
                setattr(module, graph.key, own)
            self.report.fused.update(m.form for layer in self.dense_layers[graph.key] for m in layer.members)
            self.report.fused.update(m.form for m in self._matches_besides_dense(graph.key))
        return module

    def _matches_besides_dense(self, key: str) -> list:
        return [*self.attention[key], *self.layer_norms[key], *self.softmaxes[key]]

    def _rewrite(self, graph: signature_graph.SignatureGraph, module: tf.Module) -> signature_graph.SignatureGraph:
        """The signature with every match spliced in as a fused op."""
        graph_def, captures, outputs = tf.compat.v1.GraphDef(), dict(graph.captures), dict(graph.output_tensors)
        graph_def.CopyFrom(graph.graph_def)
        dense_layers, attention_matches = self.dense_layers[graph.key], self.attention[graph.key]
        if hasattr(module, "bundle_manifest"):
            rewrite.add_placeholder(graph_def, rewrite.BUNDLE_PLACEHOLDER, tf.string)
            captures[rewrite.BUNDLE_PLACEHOLDER] = module.bundle_manifest.asset_path
        else:  # nothing tuned: every op runs the generic kernel
            rewrite.add_string_constant(graph_def, rewrite.BUNDLE_PLACEHOLDER, "")
        replaced: dict[str, str] = {}
        bundle = f"{rewrite.BUNDLE_PLACEHOLDER}:0"

        def splice(matches, replacement, bound, prefix):
            new = rewrite.splice(graph_def, replacement, bound, prefix,
                                 {m.output: f"out_{i}" for i, m in enumerate(matches)}, replaced)
            outputs.update({k: new[v] for k, v in outputs.items() if v in new})

        for i, layer in enumerate(dense_layers):
            placeholder = f"dietcode/packed_{i}"
            rewrite.add_placeholder(graph_def, placeholder, tf.resource)
            weight, packed_n = self._weight_operand(layer, self._workloads[(graph.key, layer.core)], module)
            captures[placeholder] = weight.handle
            members = {f"{name}_{j}": tensor for j, m in enumerate(layer.members)
                       for name, tensor in (("bias", m.bias), ("out_shape", m.out_shape))}
            splice(layer.members, rewrite.dense_replacement(layer, packed_n),
                   {"x": layer.x, "packed": f"{placeholder}:0", "bundle": bundle, **members}, f"dietcode/dense_{i}")
        for i, match in enumerate(attention_matches):
            splice([match], rewrite.attention_replacement(match),
                   {"x": match.x, "y": match.y, "addend": match.addend, "bundle": bundle}, f"dietcode/attention_{i}")
        for i, match in enumerate(self.layer_norms[graph.key]):
            splice([match], rewrite.layer_norm_replacement(match),
                   {"x": match.x, "gamma": match.gamma, "beta": match.beta, "residual": match.residual},
                   f"dietcode/layer_norm_{i}")
        softmax = rewrite.softmax_replacement()
        for i, match in enumerate(self.softmaxes[graph.key]):
            splice([match], softmax, {"x": match.x}, f"dietcode/softmax_{i}")
        return signature_graph.SignatureGraph(graph.key, graph.input_specs, graph.input_tensors, outputs,
                                              captures, graph_def)

    def _weight_operand(self, match: horizontal_fusion.DenseGroup, workload: Workload,
                        module: tf.Module) -> tuple[tf.Variable, int]:
        """The layer's weight in its kernels' layout, as a variable (one per distinct weight and
        layout), and the op's packed_n (0: read in place as [K, N])."""
        layout = self._layouts[workload]
        key = (hashlib.sha1(match.weight.tobytes()).hexdigest(), match.weight.shape, json.dumps(layout))
        if key not in self._weights_by_content:  # packed once, however many signatures share it
            value, packed_n = dense.weight_operand(match.weight.T, layout)
            variable = tf.Variable(value, trainable=False, name=f"dietcode_weight_{len(self._weights_by_content)}")
            module.dense_weights.append(variable)
            self._weights_by_content[key] = variable, packed_n
        return self._weights_by_content[key]


def _save(module: tf.Module, directory: pathlib.Path, signatures: dict, notes: list[str]) -> None:
    """tf.saved_model.save, and again without custom gradients where TF cannot save the original's
    with the rewritten graph: it traces each `tf.custom_gradient` left in it again, and one that
    captured a tensor of the original function has nothing to capture in the new one."""
    try:
        tf.saved_model.save(module, str(directory), signatures=signatures)
    except ValueError as error:
        if "custom gradients" not in str(error) and "tracing gradients" not in str(error):
            raise
        for path in directory.iterdir():  # whatever the first attempt wrote
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        tf.saved_model.save(module, str(directory), signatures=signatures,
                            options=tf.saved_model.SaveOptions(experimental_custom_gradients=False))
        notes.append("the model's custom gradients (tf.custom_gradient) could not be saved with the rewritten "
                     f"graph ({error}); outputs are unchanged, but gradients through those ops are an error")


def _checked_output(output_dir: str | pathlib.Path, input_dir: str | pathlib.Path, overwrite: bool) -> pathlib.Path:
    """The output directory as an absolute path, if the optimized model may be written there."""
    output = pathlib.Path(output_dir).absolute()
    if output.exists() and not overwrite:
        raise FileExistsError(f"{output} exists; pass overwrite=True to replace it")
    resolved, source = output.resolve(), pathlib.Path(input_dir).resolve()
    if resolved == source or source in resolved.parents or resolved in source.parents:
        raise ValueError("the output directory must neither be, hold nor sit inside the input "
                         "(the input is never modified)")
    return output


def optimize(input_saved_model_dir: str | pathlib.Path, output_saved_model_dir: str | pathlib.Path, *,
             tags=("serve",), signature_keys: list[str] | None = None, shape_ranges: dict | None = None,
             input_fn=None, tuning: search.SearchOptions = search.SearchOptions(), database=None,
             horizontal_fusion: bool = False, layer_norm_fusion: bool = True, overwrite: bool = False) -> Report:
    """Optimizes a SavedModel for the given shape ranges (or representative inputs); returns the report.

    horizontal_fusion: dense layers that read the same input (attention's query, key and value
    projections) run as one GEMM over their concatenated weights. Off by default: on BERT-base,
    timed paired against the model without it, it was slower beyond noise at batch 1, T = 1-24
    (3-5%) since small calls join TF's pool, and faster at T = 43-62 (docs/decisions.md).

    layer_norm_fusion: each layer norm TF runs as a dozen ops (Keras' LayerNormalization,
    tf.nn.batch_normalization over tf.nn.moments) runs as one DietcodeLayerNorm.
    """
    converter = Converter(input_saved_model_dir, tags=tags, signature_keys=signature_keys,
                          shape_ranges=shape_ranges, tuning=tuning, database=database,
                          horizontal_fusion=horizontal_fusion, layer_norm_fusion=layer_norm_fusion)
    _checked_output(output_saved_model_dir, converter.input_dir, overwrite)  # before the tuning, not after it
    converter.convert().build(input_fn)
    return converter.save(output_saved_model_dir, overwrite=overwrite)
