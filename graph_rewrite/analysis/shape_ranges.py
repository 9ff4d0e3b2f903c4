"""Which shapes a model will see: ranges per input dim, checked against the
signature, and the range of every matched layer's row count M they imply.

Ranges come from the user (`{"input_ids": (None, (1, 128))}`: per dim a
size, an inclusive (lo, hi) range, or None for "the signature's size, or the
default": the batch 1..16, any other dim 1..128 or up to what the model's own
graph allows) or from representative inputs. M = product of a layer input's
leading dims; it is found by running the original graph on zero inputs at the
lowest and the highest corner of the ranges (products grow with every dim).

An integer scalar input (a decoder's max_len) may be given a range of values
instead (`{"max_len": (1, 64)}`, or one int): DimRanges then holds that value
range as the scalar's one entry, and the inputs made at a point of the ranges
(`tensor_at`) hold that value, so a loop it bounds runs its full length at the
highest corner. A scalar without a range has no entry: it is 0 there.
"""

import math
import re
from collections.abc import Callable

import numpy as np
import tensorflow as tf

DEFAULT_BATCH = (1, 16)        # an unknown first dim
DEFAULT_OTHER = (1, 128)       # any other unknown dim (sequence lengths)

DimRanges = dict[str, list[tuple[int, int]]]  # per input, (lo, hi) per dim (a ranged scalar's: of its values)


def resolve(specs: dict[str, tf.TensorSpec], shape_ranges: dict | None,
            declared_maxima: dict[tuple[str, int], int] | None = None) -> tuple[DimRanges, list[str]]:
    """(lo, hi) per dim of every input, and notes on the defaults used.

    declared_maxima: (input, axis) -> the largest size the model itself allows (a
    position table it slices by that dim, graph_rewrite.analysis.symbolic_shapes); a dim
    that neither the signature nor shape_ranges sizes goes up to it.
    """
    shape_ranges = dict(shape_ranges or {})
    unknown = sorted(set(shape_ranges) - set(specs))
    if unknown:
        raise ValueError(f"shape_ranges names unknown input(s) {unknown}; the inputs are {sorted(specs)}")
    ranges, notes = {}, []
    for name, spec in specs.items():
        if spec.shape.rank is None and name not in shape_ranges:
            raise ValueError(f"input {name!r} has unknown rank in the signature: give its dims in shape_ranges")
        given = shape_ranges.get(name)
        if spec.shape.rank == 0:
            ranges[name] = _value_range(name, spec, given)
            continue
        if given is not None and not isinstance(given, (list, tuple)):
            raise ValueError(f"shape_ranges[{name!r}] wants one item per dim (a size, (lo, hi) or None), "
                             f"got {given!r}")
        declared_shape = spec.shape.as_list() if spec.shape.rank is not None else [None] * len(given)
        given = [None] * len(declared_shape) if given is None else given
        if len(given) != len(declared_shape):
            raise ValueError(f"shape_ranges[{name!r}] has {len(given)} dims, the input has rank {spec.shape.rank}")
        ranges[name] = []
        for axis, (declared, wanted) in enumerate(zip(declared_shape, given)):
            if wanted is None:
                maximum = (declared_maxima or {}).get((name, axis))
                lo_hi = (declared, declared) if declared is not None else _default_range(axis, maximum)
                if declared is None:
                    why = f" (the model slices a dim of {maximum} by it)" if lo_hi[1] == maximum else ""
                    notes.append(f"{name} dim {axis}: no range given, assumed {lo_hi[0]}..{lo_hi[1]}{why}")
            else:
                lo_hi = (wanted, wanted) if isinstance(wanted, int) else tuple(int(v) for v in wanted)
            lo, hi = lo_hi
            if not 0 <= lo <= hi:
                raise ValueError(f"shape_ranges[{name!r}] dim {axis}: need 0 <= min <= max, got {lo_hi}")
            if declared is not None and lo_hi != (declared, declared):
                raise ValueError(f"input {name!r} dim {axis} is {declared} in the signature, "
                                 f"shape_ranges asks for {lo}..{hi}")
            ranges[name].append((lo, hi))
    return ranges, notes


def _value_range(name: str, spec: tf.TensorSpec, given) -> list[tuple[int, int]]:
    """A scalar input's entry: [(lo, hi)] of its values where shape_ranges gives them (an int,
    (lo, hi), or either alone in a list, as the CLI's `max_len=1:64` writes it), else []."""
    if given is None or (isinstance(given, (list, tuple)) and not given):
        return []
    if isinstance(given, (list, tuple)) and len(given) == 1:
        given = given[0]
    if isinstance(given, (list, tuple)) and len(given) == 2:
        lo_hi = tuple(given)
    else:
        lo_hi = (given, given)
    if not spec.dtype.is_integer:
        raise ValueError(f"input {name!r} is a {spec.dtype.name} scalar: shape_ranges gives a scalar a range of "
                         "values only where it is an integer (a loop's length, say); leave it out of shape_ranges")
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in lo_hi):
        raise ValueError(f"shape_ranges[{name!r}]: input {name!r} is a scalar, so its entry is the range of its "
                         f"values: an int or (lo, hi), got {given!r}")
    lo, hi = (int(v) for v in lo_hi)
    if not 0 <= lo <= hi:
        raise ValueError(f"shape_ranges[{name!r}]: the range of the scalar's values needs 0 <= min <= max, "
                         f"got {(lo, hi)}")
    if spec.dtype.max < hi:
        raise ValueError(f"shape_ranges[{name!r}]: {hi} does not fit the input's dtype {spec.dtype.name}")
    return [(lo, hi)]


def _default_range(axis: int, maximum: int | None) -> tuple[int, int]:
    """The range of a dim that neither the signature nor shape_ranges sizes: the batch
    DEFAULT_BATCH, any other dim up to the model's own limit where it has one."""
    if axis == 0:
        return DEFAULT_BATCH
    if maximum is not None and maximum >= DEFAULT_OTHER[0]:
        return DEFAULT_OTHER[0], maximum
    return DEFAULT_OTHER


def from_examples(specs: dict[str, tf.TensorSpec], examples) -> DimRanges:
    """Ranges spanning the shapes of representative inputs (dicts by input name), and the values
    of their integer scalars."""
    seen: dict[str, list[tuple[int, int]]] = {}
    for example in examples:
        if set(example) != set(specs):
            raise ValueError(f"input_fn yielded inputs {sorted(example)}, the signature takes {sorted(specs)}")
        for name, value in example.items():
            shape = np.shape(value)
            rank = len(seen.get(name, shape)) if specs[name].shape.rank is None else specs[name].shape.rank
            if len(shape) != rank:
                raise ValueError(f"input_fn's {name!r} has rank {len(shape)}, expected {rank}")
            # an integer scalar's entry is the range of its values, as shape_ranges gives it (_value_range)
            point = (int(value),) if specs[name].shape.rank == 0 and specs[name].dtype.is_integer else shape
            seen[name] = [(min(lo, d), max(hi, d)) for (lo, hi), d in zip(seen.get(name, [(d, d) for d in point]),
                                                                          point)]
    if not seen:
        raise ValueError("input_fn yielded no inputs")
    return seen


def corners(ranges: DimRanges) -> list[dict[str, list[int]]]:
    """The input shapes at the lowest and at the highest corner of the ranges."""
    return [{name: [dims[end] for dims in dim_ranges] for name, dim_ranges in ranges.items()} for end in (0, 1)]


def corner_inputs(specs: dict[str, tf.TensorSpec], ranges: DimRanges) -> list[list[tf.Tensor]]:
    """Zero inputs (in specs' order) at the lowest and at the highest corner of the ranges (ranged
    scalars at their lowest and highest value)."""
    return [[tensor_at(spec, corner[name], tf.zeros) for name, spec in specs.items()] for corner in corners(ranges)]


def tensor_at(spec: tf.TensorSpec, point: list[int], fill: Callable[[list[int], tf.DType], tf.Tensor]) -> tf.Tensor:
    """An input at a point of the ranges (corners, middle): a ranged scalar's value there (its
    point is [value]), else fill(shape, dtype)."""
    if spec.shape.rank == 0 and point:
        return tf.constant(point[0], spec.dtype)
    return fill(point, spec.dtype)


def observed_shapes(function, specs: dict[str, tf.TensorSpec], ranges: DimRanges,
                    examples: list[dict] = ()) -> dict[str, list[list[int]]]:
    """Shapes of the tensors `function` returns (a dict) on zero inputs at the lowest and the
    highest corner of the ranges, then on each example (a dict of inputs by name: dims that
    follow the inputs' values rather than their shapes, such as words split from text, take
    their sizes from those): {name: [shape per run]}."""
    runs = [(f"zero inputs at the {end} corner of the shape ranges", inputs)
            for end, inputs in zip(("lowest", "highest"), corner_inputs(specs, ranges))]
    runs += [("an input of input_fn", [tf.constant(example[name], spec.dtype) for name, spec in specs.items()])
             for example in examples]
    observed = []
    for what, inputs in runs:
        try:
            observed.append({name: t.shape.as_list() for name, t in function(*inputs).items()})
        except tf.errors.OpError as error:
            shapes = shapes_text(dict(zip(specs, inputs)))
            raise ValueError(f"the model fails on {what} ({shapes}), which optimize() runs to size its layers: "
                             f"{op_error_summary(error)}.\n"
                             "Give shape_ranges (or input_fn) within the shapes the model accepts.") from None
    return {name: [run[name] for run in observed] for name in observed[0]}


def shapes_text(inputs: dict) -> str:
    """Inputs (tensors or arrays, by name) as messages name them: 'x [2, 60, 8], mask [2, 60]'."""
    return ", ".join(f"{name} {list(value.shape)}" for name, value in inputs.items())


def op_error_summary(error: tf.errors.OpError) -> str:
    """TF's message without its Python stack: what failed and at which node."""
    lines = [line.strip() for line in error.message.splitlines()]
    what = [line for line in lines if line and not line.startswith(("File ", "[[", "Detected at", "Graph execution"))]
    node = re.search(r"Detected at node (\S+)", error.message)
    return (what[-1] if what else lines[0]) + (f" (node {node.group(1)})" if node else "")


def row_range(shapes: list[list[int]], k: int) -> tuple[int, int]:
    """(lo, hi) of M = the number of K-element rows in a layer's input (however its trailing
    dims make up K), over the shapes it was seen with."""
    rows = [math.prod(shape) // k for shape in shapes]
    return min(rows), max(rows)


def middle(ranges: DimRanges) -> dict[str, list[int]]:
    """The input shapes halfway between the lowest and the highest corner of the ranges."""
    return {name: [lo + (hi - lo) // 2 for lo, hi in dims] for name, dims in ranges.items()}
