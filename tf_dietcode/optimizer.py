"""tf_dietcode.optimize() and Converter: a SavedModel in, a faster SavedModel out.

Like TF-TRT's converter: `optimize(input_dir, output_dir, ...)` in one call,
or `Converter(input_dir, ...)` with `convert()`, `build(input_fn)`,
`save(output_dir)` and `summary()`. Every signature is kept with its name and
inputs/outputs, variables stay variables (nothing is frozen), the kernel
bundle travels in the output's assets/, and the output appears atomically.
Dense layers run in the precision asked for (tf_dietcode.precision), their
weights converted once here; in a reduced precision the accuracy gate puts
layers back in a wider one where the outputs need it.
"""

import collections
import dataclasses
import hashlib
import json
import logging
import numbers
import pathlib
import shutil
import tempfile
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tf_dietcode import bundle_store, control_flow, endpoints, output_check, serving_warmup
from tf_dietcode.atomic_output import atomic_directory
from tf_dietcode.coverage import Coverage
from tf_dietcode.graph_rewrite import cache_reorder, fusions, loop_invariants, slice_sinking, splice, weight_arena
from tf_dietcode.graph_rewrite.analysis import loop_ranges, shape_ranges, signature_graph
from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex, node_name
from tf_dietcode.graph_rewrite.analysis.symbolic_shapes import SymbolicShapes
from tf_dietcode.graph_rewrite.fusions.contract import Found, LeftAlone, Switches, TunedFusion
from tf_dietcode.op_library import load_op_library
from tf_dietcode.output_check import BOUND, OutputCheck
from tf_dietcode.precision import accuracy_gate, modes
from tf_dietcode.precision.accuracy_gate import GateResult
from tf_dietcode.precision.contract import LayerPrecision, Precision
from tf_dietcode.tuned_bundles import tune_and_install
from tf_dietcode.tuning import hardware, search
from tf_dietcode.tuning.workload import Workload

_log = logging.getLogger(__name__)


@dataclasses.dataclass
class Report:
    signatures: list[str]
    ranges: dict[str, dict[str, list[tuple[int, int]]]]   # signature -> input -> (lo, hi) per dim
    notes: list[str]
    found: collections.Counter                            # per form
    fused: collections.Counter
    left_alone: list[LeftAlone]
    workloads: list[Workload]
    labels: dict[str, str] = dataclasses.field(default_factory=dict)  # form -> how the summary names it
    # per kind: how many of its patterns were merged into shared ops (horizontal fusion's GEMMs), into how many
    merged_by_kind: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    switches: Switches = Switches()
    dims: dict[Workload, str] = dataclasses.field(default_factory=dict)  # its dims as the graph computes them
    output_dir: str | None = None
    warmup_requests: int = 0                              # in assets.extra/, for TF Serving
    layers: list[dict] = dataclasses.field(default_factory=list)   # per fused match of every signature
    coverage: Coverage | None = None                      # share of product FLOPs fused
    output_check: OutputCheck | None = None               # None with validate=False
    tuning_times: dict = dataclasses.field(default_factory=dict)   # Workload -> tuning.progress.WorkloadTime
    timings: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds per step (convert, build, ...)
    precision: str = "float32"                            # asked for (optimize's precision)
    max_error: float = BOUND                              # the bound on the outputs' error
    kernel_paths: dict[str, str] = dataclasses.field(default_factory=dict)  # precision -> the kernels it runs
    accuracy_gate: GateResult | None = None               # None in float32 and with validate=False

    def summary(self) -> str:
        lines = [f"signatures: {', '.join(self.signatures)}"]
        for key, inputs in self.ranges.items():
            lines += [f"  {key}.{name}: " + (" x ".join(f"{lo}..{hi}" if lo != hi else f"{lo}" for lo, hi in dims)
                                             or "scalar") for name, dims in inputs.items()]
        lines += [f"note: {note}" for note in self.notes]
        lines.append("patterns (found / fused):")
        lines += [f"  {self.labels[form]}: {count} / {self.fused[form]}" for form, count in sorted(self.found.items())]
        lines += [f"  left alone: {p.form} {p.node}: {p.reason}"  # signatures of one computation name it alike
                  for p in dict.fromkeys(self.left_alone)]
        lines += [line for fusion in fusions.FUSIONS
                  for line in fusion.summary(self.merged_by_kind.get(fusion.name, (0, 0)), self.switches)]
        lines.append(f"workloads tuned: {len(self.workloads)}")
        lines += [f"  {w.describe()}" + (f" ({self.dims[w]})" if w in self.dims else "") for w in self.workloads]
        if self.tuning_times:
            resumed = sum(not t.kernels_measured for t in self.tuning_times.values())
            lines.append(f"tuning took {self.timings.get('build', 0.0):.0f} s; {resumed} of {len(self.tuning_times)} "
                         "workloads needed no new measurement (from the tuning database)")
        if self.coverage and self.coverage.share is not None:
            lines.append(f"coverage: {self.coverage.share:.1%} of matmul FLOPs fused ({self.coverage.reference})")
        lines += self._precision_summary()
        if self.output_check:
            lines.append(f"output check on {self.output_check.inputs} inputs, largest error per output "
                         f"(bound {self.output_check.bound:g} of its largest row norm):")
            lines += [f"  {e.signature}.{e.output}: " + (f"{e.error:.2g}" if e.checked else
                                                          f"{e.error:.1%} of its elements differ (not float)")
                      for e in self.output_check.errors]
        if self.output_dir:
            lines.append(f"written to {self.output_dir}, with {self.warmup_requests} TF Serving warm-up requests "
                         f"in {serving_warmup.WARMUP_FILE}")
        return "\n".join(lines)

    def _precision_summary(self) -> list[str]:
        """The precision asked for, and each layer's, grouped by precision and why (dense layers
        named by node)."""
        if self.precision == "float32":
            return ["precision: float32 (precision='float32'): every fused op"]
        lines = [f"precision: {self.precision} for dense layers, on {self.kernel_path} kernels the op chooses (not "
                 f"tuned); max_error {self.max_error:g}" + ("" if self.output_check else
                                                            " not enforced (validate=False)")]
        groups: dict[str, dict[str, None]] = {}  # how a layer's precision is described -> its dense layers
        for layer in self.layers:
            precision = layer["precision"]
            # a layer put back in another reduced precision runs other kernels than the line above names
            kernels = self.kernel_paths[precision] if precision not in (self.precision, "float32") else ""
            nodes = groups.setdefault(LayerPrecision(precision, layer["precision_why"]).describe(kernels), {})
            if layer["kind"] == "dense":
                nodes[layer["node"]] = None
        lines += [f"  {described}" + (f": {', '.join(nodes)}" if nodes else "")
                  for described, nodes in groups.items()]
        lines += self.accuracy_gate.summary() if self.accuracy_gate else []
        return lines

    @property
    def kernel_path(self) -> str:
        """The kernels the dense layers in the precision asked for run."""
        return self.kernel_paths.get(self.precision, "")

    def to_json(self) -> str:
        """The report as JSON: what summary() says, plus each fused layer (its node, kind, forms,
        precision and why, workload and the kernels its tree may dispatch to), the coverage, the
        accuracy gate's rounds, the output check's error per output and the seconds each step took."""
        return json.dumps({
            "signatures": self.signatures, "ranges": self.ranges, "notes": self.notes,
            "patterns": {form: {"found": n, "fused": self.fused[form]} for form, n in sorted(self.found.items())},
            "left_alone": [dataclasses.asdict(p) for p in dict.fromkeys(self.left_alone)],
            "layers": self.layers,
            "workloads": [{"workload": w.describe(), "fields": json.loads(w.key()), "dims": self.dims.get(w),
                           **(dataclasses.asdict(self.tuning_times[w]) if w in self.tuning_times else {})}
                          for w in self.workloads],
            "coverage": self.coverage.to_json() if self.coverage else None,
            "precision": {"precision": self.precision, "max_error": self.max_error, "kernel_path": self.kernel_path,
                          "kernel_paths": self.kernel_paths,
                          "accuracy_gate": self.accuracy_gate.to_json() if self.accuracy_gate else None},
            "output_check": self.output_check.to_json() if self.output_check else None,
            "timings": {**self.timings, "total": sum(self.timings.values()),
                        "output_check": self.output_check.seconds if self.output_check else None},
            "output_dir": self.output_dir, "warmup_requests": self.warmup_requests}, indent=1)

    @property
    def merged(self) -> tuple[int, int]:
        """Patterns merged into shared ops, and into how many ops, of every kind."""
        counts = self.merged_by_kind.values()
        return sum(patterns for patterns, _ in counts), sum(shared for _, shared in counts)


def _computation(graph: signature_graph.SignatureGraph) -> tuple:
    """What a signature computes: its graph without the `_user_specified_name` attrs (which
    differ between the signatures of one Keras export), its inputs and the variables it captures."""
    graph_def = tf.compat.v1.GraphDef()
    graph_def.CopyFrom(graph.graph_def)
    for node in graph_def.node:
        node.attr.pop("_user_specified_name", None)
    return (graph_def.SerializeToString(deterministic=True), repr(graph.input_specs), repr(graph.input_tensors),
            tuple((name, id(t)) for name, t in sorted(graph.captures.items())))


def _left_running_note(call: signature_graph.CallLeftRunning) -> str:
    """Where a call keeps products no fused op replaces, and which ops in which functions."""
    held = "; ".join(f"{function}: " + ", ".join(f"{count} {op}" for op, count in ops.items())
                     for function, ops in call.ops.items())
    if call.xla:
        return (f"the products in {call.node} are left to XLA (jit_compile=True), which compiles them for each new "
                f"input shape: export the model without jit_compile to have them fused ({held})")
    return (f"the products in {call.node} ({call.op}) that no fusion kind matches are left to TF, as the original "
            f"model runs them ({held})")


class Converter:
    """Finds fusable patterns, tunes them for the model's shape ranges, writes the optimized model."""

    def __init__(self, input_saved_model_dir: str | pathlib.Path, *, tags=("serve",),
                 signature_keys: list[str] | None = None, shape_ranges: dict | None = None,
                 tuning: search.SearchOptions | str = search.SearchOptions(), database=None,
                 horizontal_fusion: bool = False, layer_norm_fusion: bool = True, validate: bool = True,
                 precision: str = "float32", max_error: float | None = None):
        self.tuning, self.database, self.validate = search.budget(tuning), database, validate
        self.precision = modes.get(precision)
        if max_error is not None and not (isinstance(max_error, numbers.Real) and max_error > 0):
            raise ValueError(f"max_error must be a positive number (an output's largest row error relative "
                             f"to its largest row norm), got {max_error!r}")
        self.max_error = self.precision.max_error if max_error is None else float(max_error)
        self._put_back: dict[tuple, LayerPrecision] = {}  # (computation, core) -> where the accuracy gate put it
        self.input_dir = pathlib.Path(input_saved_model_dir)
        if not tf.saved_model.contains_saved_model(str(self.input_dir)):
            raise ValueError(f"{self.input_dir} is not a SavedModel directory")
        self.tags, self.signature_keys, self.shape_ranges = list(tags), signature_keys, shape_ranges
        self.switches = Switches(horizontal_fusion=horizontal_fusion, layer_norm_fusion=layer_norm_fusion)
        self._converted = self._built = False
        self._bundle_manifest: pathlib.Path | None = None

    def convert(self) -> "Converter":
        """Loads the model, matches patterns in every signature and sizes them from the shape ranges."""
        started = time.perf_counter()
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
        hoisted = [loop_invariants.hoist(graph, signature_graph.captured_values(graph, resources)) for graph in
                   (signature_graph.from_signature(k, self.loaded.signatures[k]) for k in keys)]
        self.graphs = [graph for graph, _ in hoisted]
        self._computations = {graph.key: _computation(graph) for graph in self.graphs}
        self.found: dict[str, dict[str, Found]] = {}  # signature -> fusion kind -> what it found there
        self.ranges, self._indexes, self._range_notes, self._bodies = {}, {}, [], {}
        notes = [f"{graph.key} in {note}" for graph, loop_notes in hoisted for note in loop_notes]
        left, found, labels = [], collections.Counter(), {}
        in_bodies = set().union(*(fusion.ops_in_bodies for fusion in fusions.FUSIONS))
        for graph in self.graphs:
            captured = signature_graph.captured_values(graph, resources)
            index = self._indexes[graph.key] = GraphIndex(graph.graph_def, captured)
            provisional, _ = shape_ranges.resolve(graph.input_specs, self.shape_ranges)
            shapes = SymbolicShapes(index, graph.input_tensors, provisional)
            self.found[graph.key] = {fusion.name: fusion.find(index, shapes, self.switches)
                                     for fusion in fusions.FUSIONS}
            bodies = self._bodies[graph.key] = control_flow.SignatureBodies.find(graph.key, graph.graph_def, index,
                                                                                self.switches)
            self.found.update(bodies.found)
            for key in [graph.key, *bodies.found]:
                for fusion, match in self._matches(key):
                    found.update(fusion.forms(match))
                    labels.update((form, fusion.label(form)) for form in fusion.forms(match))
                left += [p for result in self.found[key].values() for p in result.left_alone]
            maxima = shapes.declared_maxima()
            self.ranges[graph.key], graph_notes = shape_ranges.resolve(graph.input_specs, self.shape_ranges, maxima)
            self._range_notes += [f"{graph.key}: {note}" for note in graph_notes]
            notes += [f"{graph.key}: {_left_running_note(call)}"
                      for call in signature_graph.calls_left_running(graph.graph_def, in_bodies, bodies.fused_nodes())]
        self._resources = resources
        self.report = Report(keys, self.ranges, self._range_notes + notes, found, collections.Counter(), left, [],
                             labels, self._merged(), self.switches, precision=self.precision.name,
                             max_error=self.max_error, kernel_paths=self._kernel_paths())
        self._converted = True
        self.report.timings["convert"] = time.perf_counter() - started
        _log.info("%s: %d signature(s), %d pattern(s) found", self.input_dir, len(keys), sum(found.values()))
        return self

    def _matches(self, key: str, kinds: type = object) -> list[tuple]:
        """(fusion, match) for every match in a signature, the kinds in the registry's order;
        only those of fusions of type `kinds`."""
        return [(fusion, match) for fusion in fusions.FUSIONS if isinstance(fusion, kinds)
                for match in self.found[key][fusion.name].matches]

    def _merged(self) -> dict[str, tuple[int, int]]:
        """Per kind: how many of its patterns were merged into shared ops, and into how many."""
        merged = {fusion.name: (0, 0) for fusion in fusions.FUSIONS}
        for key in self.found:
            for fusion, match in self._matches(key):
                forms = fusion.forms(match)
                if len(forms) > 1:
                    patterns, shared = merged[fusion.name]
                    merged[fusion.name] = (patterns + len(forms), shared + 1)
        return merged

    def _tuned(self, key: str) -> list[tuple[TunedFusion, object]]:
        """(fusion, match) for the matches of a signature whose ops run tuned kernels (float32 ones)."""
        return [(fusion, match) for fusion, match in self._matches(key, TunedFusion)
                if fusion.tuned(match) and self._precision(key, fusion, match).precision == "float32"]

    def _kernel_paths(self) -> dict[str, str]:
        """The kernels of each precision a layer may run in: the one asked for, and those the accuracy
        gate may put layers back in."""
        names = [self.precision.name, *self.precision.put_back_in()]
        return {name: modes.get(name).kernel_path() for name in dict.fromkeys(names)}

    def _precision(self, key: str, fusion, match, where: str | None = None) -> LayerPrecision:
        """The precision a match of a signature (or of a body of its, `where`) runs in, and why where it
        is not the one asked for."""
        if self.precision is modes.FLOAT32:
            return LayerPrecision("float32", "precision='float32'")
        if where is not None:
            return LayerPrecision("float32", control_flow.BODY_PRECISION)
        why = fusion.kept_float32(match)
        if why:
            return LayerPrecision("float32", why)
        return self._put_back.get((self._computations[key], match.core), LayerPrecision(self.precision.name))

    def _reduced(self, key: str) -> list[tuple]:
        """(fusion, match) for the matches of a signature that run in a reduced precision (before the
        accuracy gate: those it may put back)."""
        return [(fusion, match) for fusion, match in self._matches(key)
                if self._precision(key, fusion, match).precision != "float32"]

    def build(self, input_fn=None) -> "Converter":
        """Tunes every distinct workload; with `input_fn` (yielding dicts of inputs), the shape
        ranges span the inputs it yields instead, and layers the graph's shapes do not size are
        also run on them (dims that follow the inputs' values, such as words split from text)."""
        if not self._converted:
            self.convert()
        started = time.perf_counter()
        self._examples = [] if input_fn is None else list(input_fn())
        if input_fn is not None:
            self.ranges = {g.key: shape_ranges.from_examples(g.input_specs, self._examples) for g in self.graphs}
            self.report.ranges = self.ranges
            self.report.notes = [note for note in self.report.notes if note not in self._range_notes]
        self._built = True
        self._size_and_tune()
        self.report.timings["build"] = time.perf_counter() - started
        return self

    def _size_and_tune(self) -> None:
        """Sizes the workloads of the matches that run tuned kernels and tunes them into one bundle
        (the tuning database resumes workloads tuned before)."""
        self._workloads, self._kernels = {}, {}
        cold_weights = self._cold_weights()
        corners_seen = {}  # Keras exports "serve" and "serving_default" alike: run the model at its corners once
        for graph in self.graphs:
            tuned = self._tuned(graph.key)
            if tuned:
                self._workloads.update(self._sized_by_graph(graph, tuned, cold_weights)
                                       or self._sized_at_corners(graph, tuned, cold_weights, corners_seen))
            self._size_bodies(graph, cold_weights, corners_seen)
        workloads = list(dict.fromkeys(self._workloads.values()))
        self.report.workloads = workloads
        if workloads:
            self._tuning_dir = tempfile.TemporaryDirectory(prefix="tf_dietcode-")  # removed with the converter
            # Named by content in the output's assets/ (bundle_store's docstring says why).
            bundle = tune_and_install(workloads, pathlib.Path(self._tuning_dir.name) / "bundle", options=self.tuning,
                                      database=self.database)
            self._bundle_manifest, self._kernels = bundle.manifest, bundle.kernels
            self.report.tuning_times = bundle.times
        self.report.notes = list(dict.fromkeys(self.report.notes))  # sized again after the accuracy gate

    def _sized_by_graph(self, graph, tuned: list, cold_weights: bool) -> dict | None:
        """Workloads sized from the graph's symbolic shapes (graph_rewrite.analysis.symbolic_shapes),
        or None where some dim does not follow from them."""
        shapes = SymbolicShapes(self._indexes[graph.key], graph.input_tensors, self.ranges[graph.key],
                                loop_ranges.signature_loops(self._bodies[graph.key].bodies))
        sized, described = {}, {}
        for fusion, match in tuned:
            result = fusion.sized_by_graph(match, shapes, cold_weights)
            if result is None:
                return self._not_sized_by_graph(graph, match.core)
            workload, text = result
            sized[(graph.key, match.core)] = workload
            described.setdefault(workload, text)
        for workload, text in described.items():
            self.report.dims.setdefault(workload, text)
        return sized

    def _size_bodies(self, graph, cold_weights: bool, corners_seen: dict) -> None:
        """Workloads of the products in the signature's loops and conds, from what the loops prove
        of their shapes and from the shapes they run with at the corners of the ranges and on
        input_fn's inputs (control_flow)."""
        bodies = self._bodies[graph.key]
        if not any(bodies.tuned(key) for key in bodies.found):
            return
        ranges = self.ranges[graph.key]
        seen = ("bodies", self._computations[graph.key], repr(ranges))
        if seen not in corners_seen:
            runs = shape_ranges.corner_inputs(graph.input_specs, ranges) + \
                [[tf.constant(example[name], spec.dtype) for name, spec in graph.input_specs.items()]
                 for example in self._examples]
            outer = SymbolicShapes(self._indexes[graph.key], graph.input_tensors, ranges,
                                   loop_ranges.signature_loops(bodies.bodies))
            corners_seen[seen] = (control_flow.observe(graph, bodies, runs), loop_ranges.derive(bodies.bodies, outer))
        unranged = [name for name, spec in graph.input_specs.items()
                    if spec.shape.rank == 0 and spec.dtype.is_integer and not ranges[name]]
        workloads, described, notes = control_flow.sized(bodies, *corners_seen[seen], cold_weights, unranged)
        self._workloads.update(workloads)
        for workload, text in described.items():
            self.report.dims.setdefault(workload, text)
        self.report.notes += notes

    def _not_sized_by_graph(self, graph, core: str) -> None:
        self.report.notes.append(f"{graph.key}: the dims of {core} do not follow from the graph's shapes; "
                                 "its layers are sized by running the model at the corners of the ranges")

    def _sized_at_corners(self, graph, tuned: list, cold_weights: bool, corners_seen: dict) -> dict:
        """Workloads sized by running the model on zero inputs at the lowest and highest corner of
        the ranges, and on input_fn's inputs (once per computation: `corners_seen`)."""
        tensors = {f"{name}_{i}": tensor for i, (fusion, match) in enumerate(tuned)
                   for name, tensor in fusion.operands(match).items()}
        seen = (self._computations[graph.key], repr(tensors), repr(self.ranges[graph.key]))
        first_run = seen not in corners_seen
        if first_run:
            operands = signature_graph.SignatureGraph(graph.key, graph.input_specs, graph.input_tensors,
                                                      tensors, graph.captures, graph.graph_def).function()
            corners_seen[seen] = shape_ranges.observed_shapes(operands, graph.input_specs, self.ranges[graph.key],
                                                              self._examples)
        observed, sized, fixed = corners_seen[seen], {}, []
        for i, (fusion, match) in enumerate(tuned):
            shapes = {name: observed[f"{name}_{i}"] for name in fusion.operands(match)}
            sized[(graph.key, match.core)], one_size = fusion.sized_at_corners(match, shapes, cold_weights)
            fixed += [match.core] if one_size else []
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
        weight_bytes = max((sum(fusion.weight_bytes(match) for fusion, match in self._tuned(key))
                            for key in self.found), default=0)
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
        signatures = {g.key: (g.input_specs, self.ranges[g.key]) for g in self.graphs}
        if self.validate and any(self._reduced(g.key) for g in self.graphs):
            self._gate(signatures)
        started = time.perf_counter()
        module = self._module()
        self.report.layers, self.report.coverage = self._layers(), self._coverage()
        with atomic_directory(output) as staging:
            _save(module, staging, self._signatures, self.report.notes)
            self.report.warmup_requests = serving_warmup.write(staging / serving_warmup.WARMUP_FILE,
                                                               self._runnable(serving_warmup.requests(signatures)))
            if self.validate:
                self._check_outputs(staging, signatures)
        self.report.output_dir = str(output)
        self.report.timings["save"] = time.perf_counter() - started
        _log.info("wrote %s", output)
        return self.report

    def _check_outputs(self, staging: pathlib.Path, signatures: dict) -> None:
        """The written model against the original (output_check); raises OutputMismatch beyond its bound."""
        check = output_check.check(self.loaded, tf.saved_model.load(str(staging)), signatures, self._examples,
                                   self._computations, self.max_error)
        self.report.output_check = check
        self.report.notes += check.notes
        _log.info("output check: %d inputs, %.1f s", check.inputs, check.seconds)
        if check.beyond_bound:
            raise output_check.OutputMismatch(check)

    def _gate(self, signatures: dict) -> None:
        """The accuracy gate (precision.accuracy_gate): converted dense layers put back (in the
        cheapest of the mode's put_back_in precisions that meets the bound), most sensitive first
        (ranked where the model misses max_error with all of them converted), until the outputs meet
        max_error on the output check's inputs; layers back in float32 are then tuned. Raises
        BoundUnreachable where not even all of them in float32 meet it."""
        started, self._put_back = time.perf_counter(), {}
        reference = output_check.reference(self.loaded, signatures, self._examples, self._computations)
        layers = [(self._computations[g.key], match.core) for g in self.graphs if reference.keys[g.key] == g.key
                  for _, match in self._reduced(g.key)]  # once per computation, under its first key
        put_back_in = self.precision.put_back_in()
        ranked: list[tuple[tuple, float]] = []

        def put_back(kept: list[tuple], precision: str, why: str = "put back by the accuracy gate") -> None:
            self._put_back = {layer: LayerPrecision(precision, why) for layer in kept}

        def run(kept: list[tuple], precision: str) -> OutputCheck:
            put_back(kept, precision)
            self._module(pack_weights=False)
            return output_check.compare(reference, self._run_rewritten, self.max_error)

        def evaluate(count: int, precision: str) -> OutputCheck:
            if count and not ranked:
                ranked.extend(accuracy_gate.rank(layers, lambda kept: run(kept, put_back_in[0])))
            return run([layer for layer, _ in ranked[:count]], precision)

        count, precision, rounds = accuracy_gate.settle(len(layers), put_back_in, evaluate)
        while count and modes.get(precision).tuned:
            # the layers back in float32 now get tuned kernels, whose rounding differs from the generic
            # kernel's the gate ran them on; a model at the bound can cross it (the int8 layers after
            # them quantize other values), so it is checked as tuned, and the next ranked layer goes
            # back while it misses
            kept = [layer for layer, _ in ranked[:count]]
            put_back(kept, precision)
            self._size_and_tune()
            tuned = run(kept, precision)
            rounds.append(accuracy_gate.Round.of(count, precision, tuned))
            if not tuned.beyond_bound or count == len(ranked):
                break
            count += 1
        gate = GateResult(self.precision.name, self.max_error, len(layers),
                          [(core, error) for (_, core), error in ranked], rounds, count, precision)
        self._put_back = {layer: LayerPrecision(precision, gate.why_put_back(rank))
                          for rank, (layer, _) in enumerate(ranked[:count])}
        gate.seconds = self.report.timings["accuracy_gate"] = time.perf_counter() - started
        self.report.accuracy_gate = gate
        _log.info("accuracy gate: %d of %d dense layers put back in %s, %d rounds, %.1f s", count, len(layers),
                  precision, len(rounds), gate.seconds)

    def _run_rewritten(self, key: str, feed: dict[str, tf.Tensor]) -> dict:
        """The rewritten signature (as _module last made it) on inputs by name."""
        return self._signatures[key](*[feed[name] for name in self._graph(key).input_specs])

    def _graph(self, key: str) -> signature_graph.SignatureGraph:
        return next(graph for graph in self.graphs if graph.key == key)

    def _layers(self) -> list[dict]:
        """Per fused match of every signature (Report.to_json): its node, kind, forms, fused ops,
        precision and why, and the workload and kernels of a tuned one."""
        layers = []
        for graph in self.graphs:
            for where, fusion, match, node, ops in self._spliced[self._computations[graph.key]]:
                workload = self._workloads.get((control_flow.scope(graph.key, where), node))
                entry = self._kernels.get(workload, {})
                precision = self._precision(graph.key, fusion, match, where)
                layers.append({"signature": graph.key, "where": where, "node": node, "kind": fusion.name,
                               "forms": list(fusion.forms(match)), "ops": ops, "precision": precision.precision,
                               "precision_why": precision.why,
                               "workload": workload.describe() if workload else None,
                               "kernels": [kernel["name"] for kernel in entry.get("kernels", [])],
                               "weight_layout": entry.get("weight_layout")})
        return layers

    def _coverage(self) -> Coverage:
        """Coverage of product FLOPs, once per computation, on input_fn's inputs or else on zero inputs
        at the middle of the ranges."""
        coverage = Coverage("input_fn's inputs" if self._examples else "zero inputs at the middle of the shape ranges")
        counted = set()
        for graph in self.graphs:
            computation = self._computations[graph.key]
            if computation in counted:
                continue
            counted.add(computation)
            shapes = shape_ranges.middle(self.ranges[graph.key])
            inputs = [[tf.constant(example[name], spec.dtype) for name, spec in graph.input_specs.items()]
                      for example in self._examples] or \
                     [[shape_ranges.tensor_at(spec, shapes[name], tf.zeros)
                       for name, spec in graph.input_specs.items()]]
            coverage.add(graph, self._rewritten[computation], inputs)
            control_flow.count_bodies(coverage, graph, self._bodies[graph.key], inputs)
        return coverage

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

    def _module(self, pack_weights: bool = True) -> tf.Module:
        """A module tracking the variables, tables, packed weights and bundle the rewritten signatures
        capture, and the input's assets; it has the input's own functions that are signatures too.
        pack_weights: the weights they only read go into one variable per dtype (weight_arena; the
        accuracy gate's trial modules skip it: it changes no value)."""
        module = tf.Module()
        module.resources_kept, module.dense_weights, self._signatures = [], [], {}
        module.assets_kept = signature_graph.assets_of(self.loaded)
        module.tf1_initializer = signature_graph.tf1_initializer(self.loaded)
        self._weights_by_content: dict[tuple, tf.Variable] = {}  # signatures share layers
        self.report.fused = collections.Counter()  # counted afresh by every save()
        if self._bundle_manifest is not None:  # set only when there were workloads to tune
            manifest, library = bundle_store.files(self._bundle_manifest)
            module.bundle_manifest = tf.saved_model.Asset(str(manifest))
            module.bundle_library = tf.saved_model.Asset(str(library))
        rewritten_functions = {}  # signatures that compute alike (Keras' serve, serving_default) share one
        self._rewritten, self._spliced = {}, {}
        for graph in self.graphs:
            if self._computations[graph.key] not in self._rewritten:
                self._rewritten[self._computations[graph.key]] = self._rewrite(graph, module)
        self._weights_by_content.clear()  # the module holds them; once packed, their memory goes with it
        if pack_weights and module.tf1_initializer is None:  # a TF1 initializer assigns its variables
            self._pack_weights(module)
        for graph in self.graphs:
            computation = self._computations[graph.key]
            if computation not in rewritten_functions:
                rewritten = self._rewritten[computation]
                # a TF1 model's initializer captures its variables too: they stay, read or not
                read = rewritten.captures if module.tf1_initializer is None else graph.captures
                module.resources_kept += [self._resources[id(t)] for t in read.values() if id(t) in self._resources]
                function = rewritten.function()
                specs = [tf.TensorSpec(spec.shape, spec.dtype, name=name) for name, spec in graph.input_specs.items()]
                rewritten_functions[computation] = tf.function(lambda *args, f=function: f(*args),
                                                               input_signature=specs).get_concrete_function()
            self._signatures[graph.key] = rewritten_functions[computation]
            own = endpoints.endpoint(self.loaded, graph.key, rewritten_functions[computation], list(graph.input_specs))
            if own is not None and not hasattr(module, graph.key):  # Keras' `serve`, called as loaded.serve(x)
                setattr(module, graph.key, own)
            self.report.fused.update(form for _, fusion, match, _, _ in self._spliced[computation]
                                     for form in fusion.forms(match))
        return module

    def _pack_weights(self, module: tf.Module) -> None:
        """The rewritten signatures reading the weights they only read from one variable per dtype;
        the packed variables leave the module."""
        variables = {id(v.handle): v for v in module.dense_weights}
        variables.update((key, r) for key, r in self._resources.items() if isinstance(r, tf.Variable))

        def variable_of(tensor: tf.Tensor) -> tf.Variable | None:
            return variables.get(id(tensor))

        arena = weight_arena.Arena(weight_arena.packable(self._rewritten.values(), variable_of))
        self._rewritten = {computation: weight_arena.pack(graph, arena, variable_of)
                           for computation, graph in self._rewritten.items()}
        captured = {id(t) for graph in self._rewritten.values() for t in graph.captures.values()}
        module.dense_weights = [v for v in module.dense_weights if id(v.handle) in captured] + \
            list(arena.variables.values())

    def _rewrite(self, graph: signature_graph.SignatureGraph, module: tf.Module) -> signature_graph.SignatureGraph:
        """The signature with every match spliced in as a fused op, capturing only what it reads (the
        original weights of fused layers no longer)."""
        graph_def, captures, outputs = tf.compat.v1.GraphDef(), dict(graph.captures), dict(graph.output_tensors)
        graph_def.CopyFrom(graph.graph_def)
        if hasattr(module, "bundle_manifest"):
            splice.add_placeholder(graph_def, splice.BUNDLE_PLACEHOLDER, tf.string)
            captures[splice.BUNDLE_PLACEHOLDER] = module.bundle_manifest.asset_path
        else:  # nothing tuned: every op runs the generic kernel
            splice.add_constant(graph_def, splice.BUNDLE_PLACEHOLDER, "")
        kernels = {core: self._kernels[workload] for (key, core), workload in self._workloads.items()
                   if key == graph.key}
        precisions = {id(match): modes.get(self._precision(graph.key, fusion, match).precision)
                      for fusion, match in self._matches(graph.key)}
        binding = _Binding(graph_def, captures, kernels, lambda match: precisions[id(match)],
                           lambda value: self._variable(value, module))
        done, replaced = splice.splice_matches(graph_def, fusions.FUSIONS, self.found[graph.key], lambda _: binding)
        outputs = {name: splice.resolve(replaced, tensor) for name, tensor in outputs.items()}
        # (where, fusion, match, its node, its fused ops); where: None, or the body it is in
        spliced = self._spliced[self._computations[graph.key]] = [
            (None, fusion, match, match.core if isinstance(fusion, TunedFusion) else node_name(old[0]), ops)
            for fusion, match, old, ops in done]
        body_kernels = {(key, core): self._kernels[workload] for (key, core), workload in self._workloads.items()
                        if key in self._bodies[graph.key].found}
        moved = slice_sinking.sink(graph_def, self._indexes[graph.key].captured_values, set(outputs.values()))
        body_spliced, row_notes = control_flow.rewrite(graph_def, self._bodies[graph.key], binding, body_kernels)
        spliced += body_spliced
        row_notes = ([slice_sinking.note(graph.key, moved)] if moved else []) + row_notes + [
            f"{graph.key} in {note}" for note in cache_reorder.defer(graph_def, self._indexes[graph.key].captured_values)]
        self.report.notes += [note for note in row_notes if note not in self.report.notes]  # the gate rewrites again
        return signature_graph.SignatureGraph(graph.key, graph.input_specs, graph.input_tensors, outputs,
                                              captures, graph_def).read_captures()

    def _variable(self, value: np.ndarray, module: tf.Module) -> tf.Variable:
        """A variable holding `value` (a layer's weight in its kernels' layout), made once however
        many signatures and layers read it."""
        key = (hashlib.sha1(value.tobytes()).hexdigest(), value.shape, value.dtype.str)
        if key not in self._weights_by_content:
            variable = tf.Variable(value, trainable=False, name=f"dietcode_weight_{len(self._weights_by_content)}")
            module.dense_weights.append(variable)
            self._weights_by_content[key] = variable
        return self._weights_by_content[key]


@dataclasses.dataclass
class _Binding:
    """contract.Binding for the rewrite of one signature (_rewrite adds the bundle's node)."""
    graph_def: tf.compat.v1.GraphDef
    captures: dict[str, tf.Tensor]
    kernels_by_core: dict[str, dict]                   # the manifest's entry of each tuned match's workload
    precision_of: Callable[[object], Precision]        # the precision each match runs in
    variable_of: Callable[[np.ndarray], tf.Variable]  # the output's variable holding a value
    bundle: str = f"{splice.BUNDLE_PLACEHOLDER}:0"
    bound: int = 0                                     # variables bound so far

    def kernels(self, match) -> dict:
        return self.kernels_by_core.get(match.core, {})

    def precision(self, match) -> Precision:
        return self.precision_of(match)

    def variable(self, value: np.ndarray) -> str:
        placeholder = f"dietcode/packed_{self.bound}"
        self.bound += 1
        splice.add_placeholder(self.graph_def, placeholder, tf.resource)
        self.captures[placeholder] = self.variable_of(value).handle
        return f"{placeholder}:0"


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
             input_fn=None, tuning: search.SearchOptions | str = search.SearchOptions(), database=None,
             horizontal_fusion: bool = False, layer_norm_fusion: bool = True, overwrite: bool = False,
             validate: bool = True, precision: str = "float32", max_error: float | None = None) -> Report:
    """Optimizes a SavedModel for the given shape ranges (or representative inputs); returns the report.

    tuning: a SearchOptions, or a budget by name: "quick" (search.QUICK) or "default".
    database: a tuning.database.Database; by default the user's (user_cache), so a model
    optimized again tunes only what is new (Database() tunes from scratch, in memory).

    validate: run the written model against the original (output_check) and write nothing
    where an output differs beyond the bound (max_error). With validate=False no bound is
    enforced: neither the check nor the accuracy gate runs.

    precision: "float32" (the default: DietCode-tuned kernels), "bfloat16" or "int8": dense
    layers run that precision's op (kernels it chooses, not tuned) over weights converted here
    and stored as the output's variables; attention products, layer norms and softmax stay
    float32. max_error: the bound on each output's largest row error (rows along the last
    axis) relative to its largest row norm, output_check.row_error: for unit-norm embeddings
    sqrt(2 (1 - cos)), 0.1 a cosine of 0.995 (default: the precision's, precision.modes). In a
    reduced precision the accuracy gate puts the layers the outputs are most sensitive to back
    until it holds (int8's in bfloat16 where the CPU multiplies it natively, else in float32),
    and raises accuracy_gate.BoundUnreachable (an OutputMismatch) where not even float32 meets it.

    horizontal_fusion: dense layers that read the same input (attention's query, key and value
    projections) run as one GEMM over their concatenated weights. Off by default: on BERT-base,
    timed paired against the model without it, it was slower beyond noise at batch 1, T = 1-24
    (3-5%) since small calls join TF's pool, and faster at T = 43-62 (docs/decisions.md).

    layer_norm_fusion: each layer norm TF runs as a dozen ops (Keras' LayerNormalization,
    tf.nn.batch_normalization over tf.nn.moments) runs as one DietcodeLayerNorm.
    """
    converter = Converter(input_saved_model_dir, tags=tags, signature_keys=signature_keys,
                          shape_ranges=shape_ranges, tuning=tuning, database=database,
                          horizontal_fusion=horizontal_fusion, layer_norm_fusion=layer_norm_fusion,
                          validate=validate, precision=precision, max_error=max_error)
    _checked_output(output_saved_model_dir, converter.input_dir, overwrite)  # before the tuning, not after it
    converter.convert().build(input_fn)
    return converter.save(output_saved_model_dir, overwrite=overwrite)
