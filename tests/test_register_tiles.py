"""RegisterTiles: a loop partition that writes a merged stack tile whole
before reading it gets a tile of its own; one that reads what another left
keeps the shared one; NT kernels built so give every partition its own
accumulator and compute the product at every shape; and a register tile over
TVM's 1 KiB stack limit stays on the stack."""

import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import assert_computes_the_product, build_seen_after
from tf_dietcode.tuning import templates
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.tir_passes import register_tiles
from tf_dietcode.tuning.workload import Workload

BUFFER_DATA = tvm.ir.Op.get("tirx.buffer_data")


def _alias(tile: tirx.Buffer, name: str) -> tir_stmt.DeclBuffer:
    """A view of `tile`'s storage, as StorageRewrite declares one."""
    view = tirx.decl_buffer(tile.shape, tile.dtype, name)
    return tir_stmt.DeclBuffer(view, data=tirx.call_intrin("handle", BUFFER_DATA, tile))


def _partition(tile: tirx.Buffer, name: str, first_stored: int) -> tir_stmt.Stmt:
    """A partition whose view of `tile` starts by zeroing its first `first_stored` elements, then
    reads it and writes it out."""
    out = tirx.decl_buffer((4,), "float32", "out")
    alias = _alias(tile, name)
    view = alias.buffer
    i = tirx.Var("i", "int64")
    return tir_stmt.SeqStmt([
        alias,
        tir_stmt.BufferStore(view, tirx.Broadcast(tirx.const(0, "float32"), first_stored),
                             [tirx.Ramp(tirx.const(0, "int64"), tirx.const(1, "int64"), first_stored)]),
        tir_stmt.For(i, tirx.const(0, "int64"), tirx.Var("n", "int64"), tir_stmt.ForKind.SERIAL,
                     tir_stmt.BufferStore(out, view[i] + tirx.const(1, "float32"), [i])),
    ])


def _partitions(*first_stored: int) -> tuple[tir_stmt.Stmt, tirx.Buffer]:
    """A 4-element stack tile, zeroed whole, and a partition per entry of `first_stored` (see _partition)."""
    tile = tirx.decl_buffer((4,), "float32", "acc")
    body = tir_stmt.SeqStmt([tir_stmt.AllocBuffer(tile),
                             tir_stmt.BufferStore(tile, tirx.Broadcast(tirx.const(0, "float32"), 4),
                                                  [tirx.Ramp(tirx.const(0, "int64"), tirx.const(1, "int64"), 4)]),
                             *(_partition(tile, f"acc_{n + 1}", stored) for n, stored in enumerate(first_stored))])
    return body, tile


def _declared_aliases(stmt) -> list:
    found = []
    tvm_ffi.structural_walk(stmt, (tir_stmt.DeclBuffer, found.append))
    return found


def _allocated(stmt) -> list[str]:
    found = []
    tvm_ffi.structural_walk(stmt, (tir_stmt.AllocBuffer, found.append))
    return [allocation.buffer.name for allocation in found]


def test_a_partition_writing_the_whole_tile_first_gets_its_own():
    body, _ = _partitions(4)
    private = register_tiles.private_register_tiles(body)
    assert not _declared_aliases(private)
    assert _allocated(private) == ["acc", "acc_1"]
    loads = []
    tvm_ffi.structural_walk(private, (tvm.ir.TensorLoad, loads.append))
    assert [load.source.name for load in loads] == ["acc_1"]  # the read goes to the partition's own tile


def test_a_partition_reading_what_another_left_keeps_the_shared_tile():
    body, _ = _partitions(2)  # half written first
    kept = register_tiles.private_register_tiles(body)
    assert len(_declared_aliases(kept)) == 1
    assert _allocated(kept) == ["acc"]


def test_one_partition_reading_what_another_left_keeps_every_copy_shared():
    """The first partition's writes must stay where the second reads them."""
    body, _ = _partitions(4, 2)
    kept = register_tiles.private_register_tiles(body)
    assert len(_declared_aliases(kept)) == 2
    assert _allocated(kept) == ["acc"]


# BERT's attention scores, symbolic in T: a full tile, a remainder row tile and a remainder column block.
NT = Workload("batch_matmul", (1, 40), (1, 40), 64, b=3, ties=("m", "n"))


@pytest.mark.parametrize("kernel", [MicroKernel(4, 16, 32, 1, True, whole_batch=True),
                                    MicroKernel(3, 32, 64, 1, False)], ids=lambda kernel: kernel.name)
def test_nt_kernels_give_every_partition_its_own_accumulator(kernel):
    executable, main = build_seen_after("tf_dietcode.RegisterTiles", NT, kernel)
    accumulator = templates.batch_matmul.COMPUTE_BLOCK
    allocated = [name for name in _allocated(main.body) if name.startswith(accumulator)]
    assert len(allocated) >= 2, allocated  # the full row tiles' and the remainder's (and a column remainder's)
    assert not [alias for alias in _declared_aliases(main.body) if alias.buffer.name.startswith(accumulator)]
    assert_computes_the_product(executable, NT, kernel, (1, 3, 4, 16, 17, 37, 40))


# A cold dense workload: its one-panel kernels prefetch the next panel (prefetch_panel).
COLD_DENSE = Workload("dense", (1, 40), 96, 64, bias=True, weight_layout="packed", cold_weight=True)


def test_a_register_tile_over_tvms_stack_limit_stays_on_the_stack():
    """An AVX-512 register tile, 8 x 48 floats (1.5 KiB), in a prefetching kernel. As a workspace
    LLVM would store it every few k steps, since the prefetch may read any memory it cannot rule out."""
    kernel = MicroKernel(8, 48, 32, 1, False, packed=True, task_m=0)
    executable, main = build_seen_after("tirx.LowerTVMBuiltin", COLD_DENSE, kernel)
    accumulator = templates.dense.COMPUTE_BLOCK
    tiles = []
    tvm_ffi.structural_walk(main.body, (tir_stmt.AllocBuffer, tiles.append))
    on_the_stack = [tile.buffer for tile in tiles if tile.buffer.name.startswith(accumulator)]
    assert on_the_stack and all(register_tiles._elements(tile) * 4 >= 1024 for tile in on_the_stack)
    calls = []
    tvm_ffi.structural_walk(main.body, (tvm.ir.Call, calls.append))
    assert not [call for call in calls if "AllocWorkspace" in str(call.op)]
    assert_computes_the_product(executable, COLD_DENSE, kernel, (1, 7, 8, 9, 17, 40))
