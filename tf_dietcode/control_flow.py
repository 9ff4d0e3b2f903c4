"""The Converter's work inside control flow's bodies (loops and conds, graph_rewrite.bodies).

Per signature: every body is matched by the registered fusion kinds like the
signature's own graph (each body a scope of its own, "<signature> in <where>").
The products of tuned kinds are sized from what the loops prove of their
bodies' shapes without running them (graph_rewrite.analysis.loop_ranges: dims
unchanged across iterations keep the signature's symbols; a dim growing per
iteration, a decoder's prefix or KV cache, has the range the loop's bound
gives it, from a constant or an integer scalar input given a range of values).
Products whose dims do not follow from that are sized from the shapes their
operands are seen with when the original model runs (at the corners of the
shape ranges, and on input_fn's inputs): recorders added to each body keep
each operand's smallest and largest dims over all iterations; where both
exist, the derived range is kept and the runs are checked to lie inside it. A
product neither sizes (a loop whose length is a scalar input given no range, 0
on zero inputs) runs the generic kernel (bundle ""). Notes say per body which
products were sized which way. The same recorders count the products' FLOPs
for the coverage.
"""

import dataclasses
import hashlib

import numpy as np
import tensorflow as tf

from tf_dietcode.coverage import PRODUCTS, Coverage
from tf_dietcode.graph_rewrite import bodies as body_graphs
from tf_dietcode.graph_rewrite import fusions, slice_sinking, splice
from tf_dietcode.graph_rewrite.analysis import loop_ranges, signature_graph
from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex, node_name
from tf_dietcode.graph_rewrite.analysis.symbolic_shapes import SymbolicShapes
from tf_dietcode.graph_rewrite.bodies import Body, Edited, Get, Threaded
from tf_dietcode.graph_rewrite.fusions.contract import Found, LeftAlone, Switches, TunedFusion
from tf_dietcode.precision import modes
from tf_dietcode.precision.contract import Precision
from tf_dietcode.tuning.workload import DIMS, DimRange, Workload

# What an unsized product's op is bound to: the generic kernel, reading the weight as stored.
GENERIC_KERNELS = {"weight_layout": {"packed": False}}
# Layers in bodies run in float32 whatever precision is asked: the accuracy gate ranks and reverts the
# signature's own layers, whose inputs it records from the original model.
BODY_PRECISION = "inside a loop or cond body (reduced precision applies to the signature's own graph)"
_UNSEEN = np.iinfo(np.int32).max


@dataclasses.dataclass
class SignatureBodies:
    """The bodies of one signature's control flow and what the fusion kinds found in each."""
    key: str
    bodies: list[Body]
    found: dict[str, dict[str, Found]]      # scope -> kind -> its matches there

    @classmethod
    def find(cls, key: str, graph_def: tf.compat.v1.GraphDef, index: GraphIndex,
             switches: Switches) -> "SignatureBodies":
        found_bodies = body_graphs.find(graph_def, index)
        found = {}
        for body in found_bodies:
            shapes = SymbolicShapes(body.index, {}, {})
            by_kind = {fusion.name: fusion.find(body.index, shapes, switches) for fusion in fusions.FUSIONS}
            for result in by_kind.values():
                result.left_alone = [LeftAlone(p.form, f"{p.node} ({body.where})", p.reason)
                                     for p in result.left_alone]
            by_kind[fusions.FUSIONS[0].name].left_alone += body.left_alone  # the dense kind's: reported alike
            found[scope(key, body.where)] = by_kind
        return cls(key, found_bodies, found)

    def scopes(self) -> list[tuple[str, Body]]:
        return [(scope(self.key, body.where), body) for body in self.bodies]

    def tuned(self, scope_key: str) -> list[tuple[TunedFusion, object]]:
        return [(fusion, match) for fusion in fusions.FUSIONS if isinstance(fusion, TunedFusion)
                for match in self.found[scope_key][fusion.name].matches if fusion.tuned(match)]

    def fused_nodes(self) -> set[tuple[str, str]]:
        """(function, node) of every product a match replaces."""
        return {(body.function, core) for scope_key, body in self.scopes()
                for fusion, match in self.matches(scope_key) for core in _cores(fusion, match)}

    def matches(self, scope_key: str) -> list[tuple]:
        """(fusion, match) for every match in a body, the kinds in the registry's order."""
        return [(fusion, match) for fusion in fusions.FUSIONS for match in self.found[scope_key][fusion.name].matches]


def scope(key: str, where: str | None) -> str:
    """How the Converter keys the matches of a signature (where = None) or of a body in it."""
    return key if where is None else f"{key} in {where}"


def _cores(fusion, match) -> list[str]:
    """The product nodes a match of a tuned kind replaces (a horizontal group's core joins its
    members' with "+")."""
    return match.core.split("+") if isinstance(fusion, TunedFusion) else []


# ---- sizing ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Observed:
    """What recorders saw in the bodies over all runs: per (body's where, match core, operand name) the
    smallest and largest dims (absent where the body never ran), and per (function, product
    node) its FLOPs summed over the runs."""
    shapes: dict[tuple[str, str, str], tuple[list[int], list[int]]]
    flops: dict[tuple[str, str], int]
    failures: list[str]


def observe(graph: signature_graph.SignatureGraph, found: SignatureBodies, runs: list[list[tf.Tensor]]) -> Observed:
    """Runs the original signature with recorders in its bodies on each input list of `runs`."""
    graph_def = tf.compat.v1.GraphDef()
    graph_def.CopyFrom(graph.graph_def)
    captures = dict(graph.captures)
    variables: dict[str, tf.Variable] = {}

    def recorder(key: str, initial: np.ndarray) -> Threaded:
        def outer() -> str:
            variables[key] = tf.Variable(initial, trainable=False)
            splice.add_placeholder(graph_def, f"dietcode/{key}", tf.resource)
            captures[f"dietcode/{key}"] = variables[key].handle
            return f"dietcode/{key}:0"
        return Threaded(key, tf.resource, outer, read_only=False)

    shape_keys: dict[str, tuple[str, str, str]] = {}
    flop_keys: dict[str, tuple[str, str]] = {}

    def edit(body: Body, body_def: tf.compat.v1.GraphDef, get: Get) -> Edited | None:
        key = scope(found.key, body.where)
        controls = []
        for fusion, match in found.tuned(key):
            for name, tensor in fusion.operands(match).items():
                rank = body.index.shape(tensor)
                if rank is None:
                    continue
                base = f"dietcode_shape_{len(shape_keys)}"
                shape_keys[base] = (body.where, match.core, name)
                lo = get(recorder(f"{base}_lo", np.full(len(rank), _UNSEEN, np.int32)))
                hi = get(recorder(f"{base}_hi", np.full(len(rank), -1, np.int32)))
                controls += _record_shape(body_def, tensor, lo, hi, len(rank), base)
        for node in body.index.nodes.values():
            if node.op in PRODUCTS:
                base = f"dietcode_flops_{len(flop_keys)}"
                flop_keys[base] = (body.function, node.name)
                controls += _record_flops(body_def, node, get(recorder(base, np.int64(0))), base)
        return Edited(control_outputs=controls) if controls else None

    body_graphs.rewrite(graph_def, found.bodies, edit, "dietcode_recorded")
    _stateful_calls(graph_def)
    function = dataclasses.replace(graph, graph_def=graph_def, captures=captures).function()
    failures = []
    for inputs in runs:
        try:
            function(*inputs)
        except tf.errors.OpError as error:
            failures.append(error.message.splitlines()[0])
    shapes = {}
    for base, where in shape_keys.items():
        lo, hi = variables[f"{base}_lo"].numpy().tolist(), variables[f"{base}_hi"].numpy().tolist()
        if all(d >= 0 for d in hi):
            shapes[where] = (lo, hi)
    flops = {where: int(variables[base].numpy()) for base, where in flop_keys.items()}
    return Observed(shapes, flops, failures)


def _record_shape(body_def, tensor: str, lo: str, hi: str, rank: int, prefix: str) -> list[str]:
    """Nodes keeping the smallest and largest dims `tensor` is seen with (atomic scatter min/max:
    a loop's iterations may run at once); returns the nodes that must run."""
    def build():
        shape = tf.shape(tf.compat.v1.placeholder(tf.float32, name="t"), out_type=tf.int32)
        axes = tf.range(rank)
        tf.raw_ops.ResourceScatterMin(resource=tf.compat.v1.placeholder(tf.resource, name="lo"), indices=axes,
                                      updates=shape, name="min")
        tf.raw_ops.ResourceScatterMax(resource=tf.compat.v1.placeholder(tf.resource, name="hi"), indices=axes,
                                      updates=shape, name="max")
    splice.splice(body_def, splice.scratch_graph(build), {"t": tensor, "lo": lo, "hi": hi}, prefix, {}, {})
    return [f"{prefix}/min", f"{prefix}/max"]


def _record_flops(body_def, node, total: str, prefix: str) -> list[str]:
    """Nodes adding a product's FLOPs (2 x its output's elements x its contracted size) to `total`."""
    contracted = _contracted_axes(node)
    if contracted is None:
        return []
    operands = [i for i in node.input if not i.startswith("^")]

    def build():
        inputs = [tf.compat.v1.placeholder(tf.float32, name=f"in_{j}") for j in range(len(operands))]
        out = tf.compat.v1.placeholder(tf.float32, name="out")
        terms = tf.constant(1, tf.int64)
        for operand, axis in contracted:
            terms *= tf.cast(tf.shape(inputs[operand])[axis], tf.int64)
        flops = 2 * tf.size(out, out_type=tf.int64) * terms
        tf.raw_ops.AssignAddVariableOp(resource=tf.compat.v1.placeholder(tf.resource, name="total"), value=flops,
                                       name="add")
    bound = {f"in_{j}": t for j, t in enumerate(operands)}
    splice.splice(body_def, splice.scratch_graph(build), {**bound, "out": f"{node.name}:0", "total": total},
                  prefix, {}, {})
    return [f"{prefix}/add"]


def _contracted_axes(node) -> list[tuple[int, int]] | None:
    """(operand, axis) of the sizes each output element of a product sums over."""
    if node.op == "MatMul":
        return [(0, 0 if node.attr["transpose_a"].b else 1)]
    if node.op != "Einsum":
        return [(0, -2 if node.attr["adj_x"].b else -1)]
    terms, _, output = node.attr["equation"].s.decode().replace(" ", "").partition("->")
    if "." in terms:
        return None
    seen, axes = set(), []
    for operand, term in enumerate(terms.split(",")):
        for axis, label in enumerate(term):
            if label not in output and label not in seen:
                seen.add(label)
                axes.append((operand, axis))
    return axes


def _stateful_calls(graph_def: tf.compat.v1.GraphDef) -> None:
    """Stateless control-flow ops made stateful, once their functions record (TF may prune or
    merge a stateless call's work)."""
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    for node in nodes:
        if node.op.startswith("Stateless") and node.op[len("Stateless"):] in ("While", "If", "Case"):
            node.op = node.op[len("Stateless"):]


def sized(found: SignatureBodies, observed: Observed, derived: dict[str, loop_ranges.DerivedBody],
          cold_weights: bool, unranged_scalars: list[str]) -> tuple[dict, dict, list[str]]:
    """Workloads of the bodies' tuned matches ((scope, core) -> Workload): from the shapes their
    loops prove (loop_ranges: `derived`, by body) where those size them, else from the shapes
    seen running; how the report describes their dims; notes per body on how its products were
    sized, and on those left to the generic kernel (`unranged_scalars`: the integer scalar inputs
    given no range of values, which may bound a loop)."""
    workloads, described, notes = {}, {}, []
    for scope_key, body in found.scopes():
        proof, by_proof, by_runs, unseen = derived.get(body.where), [], [], []
        for fusion, match in found.tuned(scope_key):
            seen = _seen_workload(fusion, match, body, observed, cold_weights)
            proved = None if proof is None else fusion.sized_by_graph(match, proof.shapes, cold_weights)
            if proved is not None:
                workload, text = proved
                if seen is not None and not _within(seen, workload):
                    notes.append(f"{found.key}: {match.core} in {body.where} ran at {seen.describe()} at the corners "
                                 f"of the shape ranges or on input_fn's inputs, outside the {workload.describe()} "
                                 f"derived from the loop ({proof.how}): it is tuned for both")
                    workload = _spanning(workload, seen)
                described.setdefault(workload, f"derived in {body.where}: {text}; {proof.how}")
                by_proof.append(match.core)
            elif seen is not None:
                workload = seen
                described.setdefault(workload, f"seen running in {body.where}")
                by_runs.append(match.core)
            else:
                unseen.append(match.core)
                continue
            workloads[(scope_key, match.core)] = workload
        notes += _body_notes(found.key, body.where, proof, by_proof, by_runs, unseen, unranged_scalars)
    notes += [f"{found.key}: the model failed while optimize() ran it to size the products in its loops and "
              f"conds ({failure})" for failure in dict.fromkeys(observed.failures)]
    return workloads, described, notes


def _seen_workload(fusion: TunedFusion, match, body: Body, observed: Observed, cold_weights: bool) -> Workload | None:
    """The match's workload from the shapes its operands were seen with, None where it never ran."""
    operands = fusion.operands(match)
    seen = [observed.shapes.get((body.where, match.core, name)) for name in operands]
    if any(s is None for s in seen):
        return None
    return fusion.sized_at_corners(match, {name: [lo, hi] for name, (lo, hi) in zip(operands, seen)},
                                   cold_weights)[0]


def _within(inner: Workload, outer: Workload) -> bool:
    return all(getattr(outer, d).lo <= getattr(inner, d).lo and getattr(inner, d).hi <= getattr(outer, d).hi
               for d in DIMS)


def _spanning(a: Workload, b: Workload) -> Workload:
    """a with each dim's range spanning b's too (untied: the ranges need not agree any more)."""
    return dataclasses.replace(a, ties=(), **{d: DimRange(min(getattr(a, d).lo, getattr(b, d).lo),
                                                          max(getattr(a, d).hi, getattr(b, d).hi)) for d in DIMS})


def _body_notes(key: str, where: str, proof, by_proof: list[str], by_runs: list[str], unseen: list[str],
                unranged_scalars: list[str]) -> list[str]:
    """How one body's tuned products were sized: from the loop (its proof), from running the
    model, or not at all."""
    notes = []
    if by_proof:
        notes.append(f"{key}: {len(by_proof)} products in {where} sized from what the loop proves, without "
                     f"running it ({proof.how})")
    if by_runs:
        notes.append(f"{key}: {', '.join(by_runs)} in {where} sized from the shapes seen when optimize() ran the "
                     "model (at the corners of the shape ranges, and on input_fn's inputs if any): their dims do not "
                     "follow from the loop's bound and arguments")
    if unseen:
        scalars = f" (here {', '.join(unranged_scalars)})" if unranged_scalars else ""
        notes.append(f"{key}: {', '.join(unseen)} in {where} did not run when optimize() ran the model (on zero inputs "
                     "at the corners of the shape ranges, where a loop's length read from a scalar input given no "
                     "range is 0, and on input_fn's inputs if any), and their dims do not follow from the loop: their "
                     "sizes are unknown, so they are fused with the generic kernel; a range of values for the "
                     f"integer scalars that bound the loop{scalars} in shape_ranges (shape_ranges={{'max_len': (1, "
                     "64)}}, --shape_range max_len=1:64), or build(input_fn) / optimize(input_fn=...) with "
                     "representative inputs, tunes them")
    return notes


# ---- rewriting ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class _BodyBinding:
    """contract.Binding inside a body: the bundle and packed weights threaded in from the signature's
    graph (`outer`, the signature's Binding); unsized matches get the generic kernel."""
    get: Get
    outer: object
    kernels_by_core: dict[str, dict]
    body_def: tf.compat.v1.GraphDef
    bundle: str = ""

    def kernels(self, match) -> dict:
        return self.kernels_by_core.get(match.core, GENERIC_KERNELS)

    def precision(self, match) -> Precision:
        return modes.FLOAT32  # BODY_PRECISION says why

    def variable(self, value: np.ndarray) -> str:
        digest = hashlib.sha1(value.tobytes() + str((value.shape, value.dtype.str)).encode()).hexdigest()[:16]
        return self.get(Threaded(f"dietcode_packed_{digest}", tf.resource, lambda: self.outer.variable(value)))

    def bundle_for(self, match) -> str:
        """The threaded bundle for a sized match, else a "" constant (the generic kernel)."""
        if getattr(match, "core", None) in self.kernels_by_core:
            return self.get(Threaded("dietcode_bundle", tf.string, lambda: self.outer.bundle))
        if not any(n.name == "dietcode/generic_bundle" for n in self.body_def.node):
            splice.add_constant(self.body_def, "dietcode/generic_bundle", "")
        return "dietcode/generic_bundle:0"


def rewrite(graph_def: tf.compat.v1.GraphDef, found: SignatureBodies, outer, kernels: dict[tuple[str, str], dict],
            ) -> tuple[list[tuple[str, object, object, str, list[str]]], list[str]]:
    """Every body's matches spliced in (graph_def's library gains the rewritten functions, its
    control-flow nodes point at them), row slices moved ahead of them (graph_rewrite.slice_sinking);
    returns (where, kind, match, its node, its Dietcode ops) per match, and notes on the slices moved."""
    spliced = []

    def edit(body: Body, body_def: tf.compat.v1.GraphDef, get: Get) -> Edited | None:
        key = scope(found.key, body.where)
        if not any(result.matches for result in found.found[key].values()):
            return None
        binding = _BodyBinding(get, outer, {core: entry for (s, core), entry in kernels.items() if s == key},
                               body_def)
        done, replaced = splice.splice_matches(body_def, fusions.FUSIONS, found.found[key],
                                               lambda match: dataclasses.replace(binding, bundle=binding.bundle_for(match)))
        spliced.extend((body.where, fusion, match, match.core if isinstance(fusion, TunedFusion) else node_name(outputs[0]),
                        ops) for fusion, match, outputs, ops in done)
        outputs = {t: splice.resolve(replaced, t) for t in body.outputs}
        moved = slice_sinking.sink(body_def, body.index.captured_values, set(outputs.values()))
        if moved:
            row_notes.append(slice_sinking.note(f"{found.key} in {body.where}", moved))
        return Edited(replaced=outputs)

    row_notes: list[str] = []
    body_graphs.rewrite(graph_def, found.bodies, edit, "dietcode")
    return spliced, row_notes


def count_bodies(coverage: Coverage, graph: signature_graph.SignatureGraph, found: SignatureBodies,
                 inputs: list[list[tf.Tensor]]) -> None:
    """Adds the FLOPs of the products in the signature's loops and conds, as they run on `inputs`,
    to the coverage; names the calls it cannot count (functions XLA compiles, not entered)."""
    if any(node.op in PRODUCTS for body in found.bodies for node in body.index.nodes.values()):
        observed = observe(graph, found, inputs)
        fused_nodes = found.fused_nodes()
        coverage.total_flops += sum(observed.flops.values())
        coverage.fused_flops += sum(f for node, f in observed.flops.items() if node in fused_nodes)
        coverage.not_counted += [f"{found.key}: the model fails on the reference inputs ({failure})"
                                 for failure in dict.fromkeys(observed.failures)]
    coverage.not_counted += [f"{found.key}: {call.node}"
                             for call in signature_graph.calls_left_running(graph.graph_def, PRODUCTS)
                             if call.op not in body_graphs.CALLS]

