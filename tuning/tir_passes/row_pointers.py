"""A TIR pass that gives each row of an operand an inner loop reads its own pointer where the rows are
a symbolic stride apart, so that LLVM does not derive their addresses from one another in the loop.

Batch matmul reads x in place, one element of each of the register tile's rows per K step,
at x + row * stride + k with a symbolic stride. For tiles of 5 and 6 rows, LLVM's loop strength
reduction (LSR) kept one induction variable and rebuilt the other rows' addresses from it with a
chain of 4-5 `lea`/`add` per two K steps (the static build reads through immediate offsets).
NN's symbolic `m6_n16_k128_t1_ki_b` ran 1.44 / 1.21 / 1.05 / 1.04 times its static build's
time at T = 9 / 17 / 43 / 128. LLVM's `-disable-lsr` removed the chain but slowed other
kernels by 3-14%.

Here each row's base address goes through `llvm.launder.invariant.group`, which LSR sees as
an opaque value and CodeGenPrepare (after LSR) removes, so the loop keeps one pointer per row and
one shared index: the same kernel ran 1.25-1.27 / 1.13-1.15 / 1.00-1.01 / 0.97-1.04 times its
static build's time (2-core Zen 3, 2 threads, 31 interleaved rounds, two runs). Only loops reading MIN_ROWS or more rows this way are
rewritten: with 4 rows LSR already kept a pointer per row (`m4_n16_k128_t1_ki_b`'s K loop
compiled to the same instructions either way). Rows a constant distance apart are left alone:
LLVM reads them at immediate offsets from one pointer, as in static builds.

Rows at one address share a pointer, and count once towards MIN_ROWS: in a small size's copy
(small_reductions) a tile's rows past M read row M - 1. Laundered one by one, LLVM could not merge
their loads: NN's `m8_n8_k128_t1_ko_b` read x 8 times per K step where its static build reads it
once, and ran 1.08-1.19 times the static build's time at T = 1-3; 0.98-1.06 times with one
pointer (21-31 interleaved rounds; two other m7/m8 kernels gained alike at T = 2-3).

Each row tile recomputed its rows' addresses as (first row + i) * stride, one `imul` per row, where a
static build uses immediate offsets. Where the rows lie a fixed distance from the first (whole tiles),
each is now laundered at that distance from the first row's laundered address: the first laundering
keeps LLVM's InstCombine from folding first * stride + i * stride back into one product, so the
i * stride are computed once, outside the tiles. NN's 6-row `m6_n16_k128_t1_ko` ran 1.13-1.14 of its
static build at T = 17, against 1.17 before; the 5- and 6-row kernels 0.98-0.99 against 1.00-1.03
at T = 43 and 1.23 / 1.34 against 1.30 / 1.37 at T = 9; T = 128 and NT within noise (21 rounds).

The write-back of such a tile (a loop over its rows around one over consecutive columns) stored each
row at (first row + i) * stride, an `imul` per row and tile again; it now stores through the first
row's laundered address, row i at i * stride from it.
"""

import tvm
import tvm_ffi
from tvm import sym, tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning.tir_passes.ir import defined_vars, in_scope, loops, rebuild_loops, sequence, uses, with_body

MIN_ROWS = 5
_POINTER = tvm.ir.PointerType(tvm.ir.PrimType("float32"), "global")


def _row_base(load, loop: tir_stmt.For, inner: list):
    """The base address b of a scalar load at b + k (k: the loop's variable; b: not defined in the
    loop), or None."""
    if len(load.indices) != 1 or isinstance(load.indices[0], tirx.Ramp) or load.source.dtype != "float32":
        return None
    index = load.indices[0]
    if index.ty.dtype != "int64" or not uses(index, [loop.loop_var]):
        return None
    scale, base = sym.detect_linear_equation(index, [loop.loop_var]) or (None, None)
    if not (isinstance(scale, tirx.IntImm) and int(scale) == 1) or uses(base, [*inner, loop.loop_var]):
        return None
    return base


def _own_row_pointers(loop: tir_stmt.For, enclosing) -> tir_stmt.Stmt:
    if loop.kind != tir_stmt.ForKind.SERIAL:
        return loop
    inner = defined_vars(loop.body)
    analyzer = in_scope(enclosing)
    rows: dict = {}  # buffer -> [(base, row buffer)]: bases at one address share a row buffer

    def collect(load):
        base = _row_base(load, loop, inner)
        if base is None:
            return
        known = rows.setdefault(load.source, [])
        if not any(tvm_ffi.structural_equal(base, b) for b, _ in known):
            # In a small size's copy (small_reductions) the tile's rows past M clamp to its last row.
            same = [row for b, row in known if analyzer.can_prove_equal(base, b)]
            known.append((base, same[0] if same else tirx.decl_buffer((loop.min + loop.extent,), "float32",
                                                                      f"{load.source.name}_row")))

    tvm_ffi.structural_walk(loop.body, (tvm.ir.TensorLoad, collect))
    addresses = {source: _distinct_rows(bases) for source, bases in rows.items()}
    # Each distinct row's distance from the first; some not a constant: rows a symbolic stride apart.
    distances = {source: [analyzer.simplify(base - found[0][0]) for base, _ in found[1:]]
                 for source, found in addresses.items()}
    rows = {source: bases for source, bases in rows.items() if len(addresses[source]) >= MIN_ROWS
            and not all(isinstance(distance, tirx.IntImm) for distance in distances[source])}
    if not rows:
        return loop

    def through_row(load):
        base = _row_base(load, loop, inner) if load.source in rows else None
        if base is None:
            return load
        row = next(row for b, row in rows[load.source] if tvm_ffi.structural_equal(base, b))
        return tirx.BufferLoad(row, [loop.loop_var])  # the index is base + the loop's variable

    body = tvm_ffi.structural_map(loop.body, [(tvm.ir.TensorLoad, through_row)])
    loop_vars = [outer.loop_var for outer in loops(enclosing)]
    declared = []
    for source in rows:
        (first, first_row), *others = addresses[source]
        declared.append(tir_stmt.DeclBuffer(first_row, data=_laundered(tirx.BufferLoad(source, [first]))))
        for (base, row), distance in zip(others, distances[source]):  # a fixed distance: from the first
            invariant = _invariant(distance, loop_vars, analyzer)
            address = tirx.BufferLoad(source, [base]) if invariant is None else tirx.BufferLoad(first_row, [invariant])
            declared.append(tir_stmt.DeclBuffer(row, data=_laundered(address)))
    return sequence([*declared, with_body(loop, body)])


def _laundered(element):
    """The element's address, opaque to LLVM's scalar evolution until CodeGenPrepare."""
    return tirx.reinterpret(_POINTER, tirx.call_llvm_pure_intrin(
        "handle", "llvm.launder.invariant.group", tirx.address_of(element)))


def _invariant(distance, loop_vars: list, analyzer: sym.Analyzer):
    """The distance as an expression free of the enclosing loops' variables, or None where they change
    it. (row + i) * stride - row * stride is i * stride once its terms in the loops' variables cancel."""
    terms = sym.detect_linear_equation(distance, loop_vars) if loop_vars else [distance]
    if not terms or not all(_is_zero(analyzer.simplify(term)) for term in terms[:-1]):
        return None
    constant = analyzer.simplify(terms[-1])
    return None if uses(constant, loop_vars) else constant


def _is_zero(expr) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr) == 0


def _distinct_rows(bases: list) -> list:
    """Each row buffer with the first base that reads through it."""
    distinct = []
    for base, row in bases:
        if not any(row.same_as(kept) for _, kept in distinct):
            distinct.append((base, row))
    return distinct


def _own_output_rows(loop: tir_stmt.For, _enclosing) -> tir_stmt.Stmt:
    """A loop over MIN_ROWS or more rows a symbolic stride apart around one store per column, at
    consecutive addresses: stored through the first row's laundered address."""
    columns = loop.body
    if not (loop.kind == tir_stmt.ForKind.SERIAL and _is_zero(loop.min) and isinstance(loop.extent, tirx.IntImm)
            and int(loop.extent) >= MIN_ROWS and isinstance(columns, tir_stmt.For)
            and isinstance(columns.body, tir_stmt.BufferStore)):
        return loop
    store = columns.body
    if len(store.indices) != 1 or isinstance(store.indices[0], tirx.Ramp) or store.buffer.dtype != "float32":
        return loop
    variables = [loop.loop_var, columns.loop_var]
    steps = sym.detect_linear_equation(store.indices[0], variables)
    if len(steps) != 3:
        return loop
    stride, step, first = steps
    if (isinstance(stride, tirx.IntImm) or not (isinstance(step, tirx.IntImm) and int(step) == 1)
            or uses(stride, variables) or uses(first, variables)):
        return loop
    row = tirx.decl_buffer((loop.extent * stride,), "float32", f"{store.buffer.name}_row")
    rows = with_body(loop, with_body(columns, tir_stmt.BufferStore(
        row, store.value, [loop.loop_var * stride + columns.loop_var])))
    return sequence([tir_stmt.DeclBuffer(row, data=_laundered(tirx.BufferLoad(store.buffer, [first]))), rows])


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.OwnRowPointers")
def OwnRowPointers(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    return func.with_body(rebuild_loops(rebuild_loops(func.body, _own_row_pointers), _own_output_rows))
