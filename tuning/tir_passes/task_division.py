"""A TIR pass that splits a parallel task's index by symbolic divisors once per task, with a
multiply and a shift: `v // H` in `for v in parallel(E)` becomes a quotient bound at the top of
the task, `(v * R) >> 32` with R = ceil(2^32 / H) worked out once before the loop, and `v % H`
becomes `v - H * quotient` (whose own divisions, e.g. by a symbolic count of column tasks, are
split the same way). Where the product could lose exactness (E * H >= 2^31, far past any
model's batch dims) each task divides as before.

Why: a batch matmul's tasks are its batch dims fused, [B, H] (attention's batch and heads), and
the index expressions of every operand repeat the 64-bit division by H (some 15 cycles on Zen
3), which at T = 1-2 is a tenth of a task's work. LLVM replaces a division by a constant with a
multiply, not one by a value known only at run time. Measured (2-core Zen 3, 2 threads,
interleaved; NN kernels with copies for a small K, small_reductions): symbolic over static
1.10-1.16 at T = 1 and 1.05-1.15 at T = 2 before, 1.03-1.05 and 1.03-1.08 after, and
0.98-1.05 with H the constant 1 of the static build; nothing changed from T = 17.

Exactness: with n = q * H + r (0 <= n < E) and R = (2^32 + e) / H, 0 <= e < H,
n * R / 2^32 = q + r / H + n * e / (H * 2^32) < q + (H - 1) / H + n / 2^32, which is below
q + 1 while n * H < 2^32; E * H < 2^31 also keeps n * R below 2^63.

In tasks of a fixed amount of work (every loop's trip count constant: small_reductions' copies
for M, K <= 5), each operand's offset is also rewritten as one linear form in the index and its
quotients, bound once per task: q * s0 + (v - H * q) * s1 becomes v * s1 + q * (s0 - H * s1), with
s0 - H * s1 worked out before the loop. LLVM steps v * s1 as a pointer, which leaves one multiply
per operand and task instead of two (exact in wrapping 64-bit arithmetic, like the original).
Measured (2-core Zen 3, 2 threads, interleaved, 10 NN kernels the tuner picks, each against itself
without it): 0.94-0.96 of the time at T = 1 for six of the seven whole-batch kernels (0.98 for
the seventh), 0.96-1.0 at T = 2-3. Tasks that also split the columns compute the head index by a
constant divisor ((v - 4 H q) // 4), which is not linear in v and q, and stay as they were.
Tasks over the dynamic sizes keep their offsets as written: there LLVM's loop strength reduction
chose other registers for the K loop of the linear form (`m1_n16_k128_t1_ki_b`, T = 17: up to 1.1x
as slow in some runs), and a task's offsets are a negligible share of its work.
"""

import functools
import operator

import tvm
import tvm_ffi
from tvm import sym, tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning.tir_passes.ir import defined_vars, loops, rebuild_loops, sequence, uses, with_body

_SHIFT = 32


def _at_most(numerator, bounded: list) -> bool:
    """Whether numerator is one of `bounded` (values in [0, the task index]), or one of them divided
    by positive constants."""
    while isinstance(numerator, tirx.FloorDiv) and isinstance(numerator.b, tirx.IntImm) and int(numerator.b) > 0:
        numerator = numerator.a
    return any(numerator.same_as(value) for value in bounded)


def _divide_by_reciprocal(loop: tir_stmt.For) -> tir_stmt.Stmt:
    """The parallel loop with each division of its index by an invariant divisor done once per task,
    at the top of its body, as a multiply where exact, after the bindings of each divisor's
    reciprocal and of whether it is exact for this loop; in tasks of fixed work, also the operands'
    offsets as linear forms in the index and the quotients (_linear_in_the_task)."""
    inner = defined_vars(loop)
    bounded = [loop.loop_var]  # the index, and the remainders of it made below
    divisors: list = []  # [(divisor, reciprocal, exact)], one per distinct divisor
    quotients: list = []  # [(numerator, divisor, quotient var, its value)], one per distinct division

    def quotient_of(numerator, divisor):
        found = next((entry for entry in quotients if tvm_ffi.structural_equal(entry[0], numerator)
                      and tvm_ffi.structural_equal(entry[1], divisor)), None)
        if found is None:
            reciprocals = next((entry for entry in divisors if tvm_ffi.structural_equal(entry[0], divisor)), None)
            if reciprocals is None:
                reciprocals = (divisor, tirx.Var("reciprocal", "int64"), tirx.Var("exact", "bool"))
                divisors.append(reciprocals)
            _, reciprocal, exact = reciprocals
            value = tirx.if_then_else(exact, tirx.shift_right(numerator * reciprocal, tirx.const(_SHIFT, "int64")),
                                      tirx.floordiv(numerator, divisor))
            found = (numerator, divisor, tirx.Var("task_quotient", "int64"), value)
            quotients.append(found)
        return found[2]

    def divided(node):
        if (isinstance(node.b, tirx.IntImm) or uses(node.b, inner) or not _at_most(node.a, bounded)
                or node.a.ty.dtype != "int64" or node.b.ty.dtype != "int64"):
            return node
        quotient = quotient_of(node.a, node.b)
        if isinstance(node, tirx.FloorDiv):
            return quotient
        bounded.append(node.a - node.b * quotient)  # a remainder: in [0, its numerator]
        return bounded[-1]

    body = tvm_ffi.structural_map(loop.body, [(tirx.FloorDiv, divided), (tirx.FloorMod, divided)])
    if not divisors:
        return loop
    one, limit = tirx.const(1, "int64"), tirx.const(1 << 31, "int64")
    bindings = [binding for divisor, reciprocal, exact in divisors for binding in (
        tir_stmt.Bind(reciprocal, tirx.floordiv(tirx.const(1 << _SHIFT, "int64") + divisor - one,
                                                tirx.max(divisor, one))),
        tir_stmt.Bind(exact, tirx.all(one <= divisor, divisor < limit, loop.extent < limit,
                                      loop.extent * divisor < limit)))]
    strides, offsets = [], []
    if _fixed_work(loop):
        strides, offsets, body = _linear_in_the_task(body, [loop.loop_var, *(var for _, _, var, _ in quotients)],
                                                     inner)
    per_task = [tir_stmt.Bind(var, value) for _, _, var, value in quotients]
    return sequence([*bindings, *strides, with_body(loop, sequence([*per_task, *offsets, body]))])


def _naming(values: list, name: str):
    """A function giving the variable for a value in `values` ([(var, value)]), adding a new one
    called `name` for a value not seen before."""
    def named(value):
        found = next((var for var, known in values if tvm_ffi.structural_equal(known, value)), None)
        if found is None:
            found = tirx.Var(name, value.ty.dtype)
            values.append((found, value))
        return found
    return named


def _substituting(bindings: list):
    """A function that writes an expression with the variables of `bindings` ([(var, value)], each
    value already free of the earlier ones) replaced by their values."""
    def substituted(expr):
        return tvm_ffi.structural_map(expr, (tirx.Var, lambda var: next(
            (value for bound, value in bindings if bound.same_as(var)), var)))
    return substituted


def _fixed_work(loop: tir_stmt.For) -> bool:
    """Whether every loop in a task has a constant trip count (its bindings substituted): a copy
    for small sizes (small_reductions), whose tasks are a few dozen instructions each at T = 1."""
    bindings: list = []
    substituted = _substituting(bindings)
    tvm_ffi.structural_walk(loop.body, (tir_stmt.Bind, lambda binding: bindings.append(
        (binding.var, substituted(binding.value)))))
    extents: list = []
    tvm_ffi.structural_walk(loop.body, (tir_stmt.For, lambda nested: extents.append(nested.extent)))
    analyzer = sym.Analyzer()
    return all(isinstance(analyzer.simplify(substituted(extent)), tirx.IntImm) for extent in extents)


def _multiplies(expr, variables: list) -> bool:
    """Whether expr has a product with a factor that reads any of `variables`."""
    found = []
    tvm_ffi.structural_walk(expr, (tirx.Mul, lambda node: found.append(node) if uses(node, variables) else None))
    return bool(found)


def _linear_in_the_task(body: tir_stmt.Stmt, index: list, inner: list) -> tuple[list, list, tir_stmt.Stmt]:
    """(the bindings of strides, for before the loop; the bindings of offsets, for the top of the
    task; the task's body) where each index expression that multiplies a value computed from the
    task index (`index`: the index, then its quotients) is written as offset + base: the offset
    is the linear form sum(index[i] * stride[i]), bound once per task, and the base is the rest
    (what the loops inside the task vary). Strides that are not plain variables or constants are
    bound once; they must not read anything the loop defines (`inner`). Expressions that are not
    linear in the index stay as they were."""
    dependent = list(index)  # the index, its quotients, and the bindings computed from them
    inlined: list = []  # [(binding, its value in terms of `index`)]
    strides: list = []  # [(stride var, its value)]
    offsets: list = []  # [(offset var, its value)]
    analyzer = sym.Analyzer()
    in_index_terms, stride_named, offset_named = (_substituting(inlined), _naming(strides, "task_stride"),
                                                  _naming(offsets, "task_offset"))

    def collect(binding):
        if uses(binding.value, dependent):
            inlined.append((binding.var, in_index_terms(binding.value)))
            dependent.append(binding.var)

    tvm_ffi.structural_walk(body, (tir_stmt.Bind, collect))

    def stride(value):
        return value if isinstance(value, (tirx.IntImm, tirx.Var)) else stride_named(value)

    def linear(expr):
        if expr.ty.dtype != "int64" or not _multiplies(expr, dependent):
            return expr
        *scales, base = sym.detect_linear_equation(in_index_terms(expr), index) or [None]
        if base is None or any(uses(scale, inner) for scale in scales):
            return expr
        terms = [var * stride(scale) for var, scale in zip(index, map(analyzer.simplify, scales))
                 if not (isinstance(scale, tirx.IntImm) and int(scale) == 0)]
        if not terms:
            return base
        offset = offset_named(functools.reduce(operator.add, terms))
        return offset if isinstance(base, tirx.IntImm) and int(base) == 0 else offset + base

    body = tvm_ffi.structural_map(body, [
        (tirx.Ramp, lambda ramp: tirx.Ramp(linear(ramp.base), ramp.stride, ramp.lanes)),
        (tvm.ir.TensorLoad, lambda load: tirx.BufferLoad(load.source, [linear(i) for i in load.indices])),
        (tir_stmt.BufferStore, lambda store: tir_stmt.BufferStore(store.buffer, store.value,
                                                                  [linear(i) for i in store.indices])),
        (tir_stmt.Bind, lambda binding: tir_stmt.Bind(binding.var, linear(binding.value)))])
    return ([tir_stmt.Bind(var, value) for var, value in strides],
            [tir_stmt.Bind(var, value) for var, value in offsets], body)


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.DivideTaskIndexByReciprocal")
def DivideTaskIndexByReciprocal(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    return func.with_body(rebuild_loops(func.body, lambda loop, enclosing: _divide_by_reciprocal(loop)
                                        if loop.kind == tir_stmt.ForKind.PARALLEL and not loops(enclosing)
                                        and isinstance(loop.min, tirx.IntImm) and int(loop.min) == 0 else loop))
