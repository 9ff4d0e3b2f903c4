"""A TIR pass that splits a parallel task's index by symbolic divisors once per task, with a
multiply and a shift: `v // H` in `for v in parallel(E)` becomes a quotient bound at the top of
the task, `(v * R) >> 32` with R = ceil(2^32 / H) worked out once before the loop, and `v % H`
becomes `v - H * quotient` (whose own divisions, e.g. by a symbolic count of column tasks, are
split the same way). Where the product could lose exactness (E * H >= 2^31, far past any
model's batch dims) each task divides as before.

Why: a batch matmul's tasks are its batch dims fused, [B, H] (attention's batch and heads), and
the index expressions of every operand repeat the 64-bit division by H (some 15 cycles on Zen
3), which at T = 1-2 is a tenth of a task's work. LLVM replaces a division by a constant with a
multiply, not one by a value known only at run time. Measured (Zen 3 VM, 2 threads,
interleaved; NN kernels with copies for a small K, small_reductions): symbolic over static
1.10-1.16 at T = 1 and 1.05-1.15 at T = 2 before, 1.03-1.05 and 1.03-1.08 after, and
0.98-1.05 with H the constant 1 of the static build; nothing changed from T = 17.

Exactness: with n = q * H + r (0 <= n < E) and R = (2^32 + e) / H, 0 <= e < H,
n * R / 2^32 = q + r / H + n * e / (H * 2^32) < q + (H - 1) / H + n / 2^32, which is below
q + 1 while n * H < 2^32; E * H < 2^31 also keeps n * R below 2^63.
"""

import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning.guarded_loops import defined_vars, loops, rebuild_loops, sequence, uses, with_body

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
    reciprocal and of whether it is exact for this loop."""
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
    per_task = [tir_stmt.Bind(var, value) for _, _, var, value in quotients]
    return sequence([*bindings, with_body(loop, sequence([*per_task, body]))])


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.DivideTaskIndexByReciprocal")
def DivideTaskIndexByReciprocal(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    return func.with_body(rebuild_loops(func.body, lambda loop, enclosing: _divide_by_reciprocal(loop)
                                        if loop.kind == tir_stmt.ForKind.PARALLEL and not loops(enclosing)
                                        and isinstance(loop.min, tirx.IntImm) and int(loop.min) == 0 else loop))
