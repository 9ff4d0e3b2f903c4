"""A TIR pass that gives a symbolic kernel one copy of its parallel loop per small size of a
dynamic reduction: `for task in parallel(...)` becomes `if K == 1: <the loop with K = 1> elif
K == 2: ... else: <as before>`, for K up to SMALL_REDUCTIONS (5). Dims tied to K (attention's
[192,T,T]x[192,T,64] has M = K = T) are fixed with it. The template asks for the copies with the
kernel's VERSIONS attribute (versions_attribute), for the sizes that lie in the dims' range.

Why: a static build of a K of a few steps unrolls the whole reduction, so LLVM interleaves the
row tiles and keeps y's few rows in registers; a symbolic build runs K as a loop of unknown trip
count around every register tile, its chain of dependent FMAs exposed. That was most of batch
matmul NN's distance from its static builds at T = 1-8 (2-core Zen 3, 2 threads, interleaved;
`m5_n16_k128_t1_ko_b` symbolic over static 3.05 / 2.36 / 2.02 / 1.14 / 1.09 at T = 1 / 2 / 3 /
5 / 8, and with the copies 1.10 / 1.09 / 1.02 / 0.92 / 0.89). In each copy the sizes are
constants, so the passes after this one and LLVM treat it as they treat a static build.

The cost is compile time: 16 kernels sampled from NN's space took 12.5 s to compile without
copies, 27.4 s with copies for sizes 1-4 and 45.4 s for 1-8. With 1-8, CI's tests ran about 8
minutes longer (29 minutes in all, against a limit of 30), so the copies stop at 5, the
second smallest T that the AOT comparison samples; sizes 6-8 gained 0.99-1.59 -> 0.84-1.17 of
the static build. Only a dynamic reduction is versioned: a small dynamic M alone (dense at
M = 1-4) timed the same with and without copies, since its reduction keeps its static length.
"""

import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning.tir_passes.ir import fresh_vars, loops, rebuild_loops, substituted
from tf_dietcode.tuning.tir_passes.markers import VERSIONS

def _versions(loop: tir_stmt.For, dims: list[tirx.Var], sizes: list[int]) -> tir_stmt.Stmt:
    """The loop as a chain of copies with `dims` fixed to each of `sizes`, the loop itself last."""
    chain = loop
    for size in reversed(sizes):
        copy = loop
        for dim in dims:
            copy = substituted(copy, dim, tirx.const(size, dim.ty.dtype))
        condition = tvm.tirx.all(*[dim == tirx.const(size, dim.ty.dtype) for dim in dims])
        chain = tir_stmt.IfThenElse(condition, fresh_vars(copy), chain)
    return chain


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.VersionSmallReductions")
def VersionSmallReductions(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    if func.attrs is None or VERSIONS not in func.attrs:
        return func
    names, sizes = set(func.attrs[VERSIONS]["dims"]), [int(size) for size in func.attrs[VERSIONS]["sizes"]]
    bindings = []
    tvm_ffi.structural_walk(func.body, (tir_stmt.Bind, bindings.append))
    dims = [binding.var for binding in bindings if binding.var.name in names]
    if len(dims) != len(names):  # each dim named is bound once, from the arguments
        return func
    # no StmtSimplify after: the constants fold in LLVM, as a static build's do, and simplified, the
    # kernel loses the form the passes after this one recognise (docs/decisions.md)
    return func.with_body(rebuild_loops(func.body, lambda loop, enclosing: _versions(loop, dims, sizes)
                                        if loop.kind == tir_stmt.ForKind.PARALLEL and not loops(enclosing) else loop))
