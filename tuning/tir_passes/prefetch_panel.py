"""A TIR pass that prefetches a pre-packed weight's next panel, a little at a time,
while the current panel is computed.

Why: a model's dense weights come from DRAM (BERT-base's 340 MB outgrow every
cache). A task of a dense micro-kernel whose tasks split N only (task_m = 0,
one tile_n block each) walks all its row tiles over one contiguous [K, tile_n]
panel, and the panels lie in task order, so the panel a thread needs next is
the next one in memory. Without help, the task's first row tile waits on DRAM
for its panel and the other row tiles then run from the caches: the stream and
the compute take turns. The kernels here issue one prefetch of the next panel's
k rows every EVERY k steps of the compute, spread over the task's first EVERY row
tiles (which cover the panel's K rows), so the next panel arrives while this
one is computed. Cold, interleaved,
the same kernels with and without it: BERT-base's FFN-in `m6_n16_k256_t1_ki_p_rall`
ran 1.08-1.23x as fast at M = 1..128, `m4_n24_k768_t1_ko_p_rall` 1.02-1.37x and
the FFN-out's `m6_n16_k512_t1_ki_p_rall` 1.06-1.32x; at M = 512 within noise.
Issued at every k step instead (a check per step), only M <= 21 gained and from
M = 43 it lost up to 30%. Which kernels do it: templates.dense.prefetches_next_panel.

The template marks three loops (`markers.annotate`): the task's row tiles, its K
blocks and the compute's k loop split into blocks of EVERY steps; the pass
inserts the prefetch at the head of the last, after its bindings, and drops
the marks. A loop that lowering removed (one iteration) counts as 0.
"""

import functools

import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning.tir_passes.ir import loops, rebuild_loops, sequence, statements, with_body
from tf_dietcode.tuning.tir_passes.markers import BLOCKS, EVERY, ROWS, STEPS

_LINE_FLOATS = 16  # one 64-byte cache line


def _index(loop: tir_stmt.For | None, dtype: str) -> tvm.ir.Expr:
    """The iteration number of a loop, 0 where lowering removed it (it had one iteration)."""
    if loop is None:
        return tirx.const(0, dtype)
    return tirx.Cast(dtype, loop.loop_var - loop.min)


def _prefetches(loop: tir_stmt.For, enclosing: tuple, bound: dict) -> list[tir_stmt.Stmt]:
    """One prefetch per cache line of the next panel's k row that this block of steps covers,
    behind the condition on M (none where M is a constant below it). `bound`: the function's
    variables by name, where a symbolic M is found."""
    spec = loop.annotations[STEPS]
    k, tile_k, tile_n, size, min_m = (int(spec[key]) for key in ("k", "tile_k", "tile_n", "size", "min_m"))
    m = bound[str(spec["m"])] if isinstance(spec["m"], str) else int(spec["m"])
    if isinstance(m, int) and m < min_m:
        return []
    marked = {mark: next((outer for outer in loops(enclosing) if mark in outer.annotations), None) for mark in (ROWS, BLOCKS)}
    task = next((outer for outer in loops(enclosing) if outer.kind == tir_stmt.ForKind.PARALLEL), None)  # None: one task
    dtype = "int64"
    const = lambda value: tirx.const(value, dtype)  # noqa: E731
    # k rows of the next panel, in the order the task's steps reach them: row tile by row tile,
    # K block by K block; the first EVERY row tiles ask for the whole panel (k % EVERY == 0, so
    # `position` stays below k there) and the rest for none. The last task asks for its own panel
    # again. So every address is in bounds with no clamp per step: a symbolic build computed
    # min(position, k - 1) and a clamp per line every EVERY steps of every row tile, which a static
    # build of few row tiles proved away (dense `m6_n48_k384_t1_ki_p_rall` at M = 17: symbolic
    # 1.06-1.08x its static build, within 1% of it with no prefetches in either)
    position = (_index(marked[ROWS], dtype) * const(k // EVERY) + _index(marked[BLOCKS], dtype) * const(tile_k // EVERY)
                + _index(loop, dtype))
    next_panel = tirx.min(_index(task, dtype) + const(1), const(size // (k * tile_n) - 1)) * const(k * tile_n)
    buffer = _weight(loop, str(spec["buffer"]))
    prefetches = sequence([tir_stmt.Evaluate(tirx.call_llvm_intrin(
        "void", "llvm.prefetch.p0",
        tirx.address_of(tirx.BufferLoad(buffer, [next_panel + position * const(tile_n) + const(line)])),
        tirx.const(0, "int32"), tirx.const(3, "int32"), tirx.const(1, "int32")))  # read, all cache levels, data
        for line in range(0, tile_n, _LINE_FLOATS)])
    conditions = [] if marked[ROWS] is None else [_index(marked[ROWS], dtype) < const(EVERY)]
    if not isinstance(m, int) and min_m > 0:
        conditions.append(m >= tirx.const(min_m, m.ty.dtype))
    if not conditions:
        return [prefetches]
    return [tir_stmt.IfThenElse(functools.reduce(tirx.And, conditions), prefetches, None)]


def _weight(loop: tir_stmt.For, name: str) -> tirx.Buffer:
    """The (flattened) weight buffer the loop reads."""
    loads = []
    tvm_ffi.structural_walk(loop.body, (tvm.ir.TensorLoad, loads.append))
    return next(load.source for load in loads if load.source.name == name)


def prefetch_next_panel(loop: tir_stmt.For, enclosing: tuple, bound: dict) -> tir_stmt.For:
    """A marked loop without its mark; a block of steps with its prefetches after its bindings."""
    marks = [mark for mark in (ROWS, BLOCKS, STEPS) if mark in loop.annotations]
    if not marks:
        return loop
    annotations = {key: value for key, value in loop.annotations.items() if key not in marks}
    if STEPS not in marks:
        return with_body(loop, loop.body, annotations=annotations)
    body = statements(loop.body)
    bindings = next((i for i, statement in enumerate(body) if not isinstance(statement, tir_stmt.Bind)), len(body))
    with_prefetches = [*body[:bindings], *_prefetches(loop, enclosing, bound), *body[bindings:]]
    return with_body(loop, sequence(with_prefetches), annotations=annotations)


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.PrefetchNextPanel")
def PrefetchNextPanel(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    bindings = []  # the packed API binds each symbolic dim, M among them, once at the function's head
    tvm_ffi.structural_walk(func.body, (tir_stmt.Bind, bindings.append))
    bound = {binding.var.name: binding.var for binding in bindings}
    return func.with_body(rebuild_loops(func.body, lambda loop, enclosing: prefetch_next_panel(loop, enclosing, bound)))
