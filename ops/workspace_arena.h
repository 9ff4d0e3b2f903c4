// Workspace memory for TVM kernels run by the ops: a LIFO arena per thread.
//
// Every local tile of a generated kernel (zero-padded fetches, accumulators)
// is a TVMBackendAllocWorkspace call made inside the kernel's loops, so a
// small batch-matmul call makes about a thousand of them. TVM's WorkspacePool
// spends ~20 ns on each alloc/free pair (a thread-local lookup, a free-list
// search): 45% of a [192,1,1]x[192,1,64] product. Kernels allocate and free
// in nested scopes, so a bump pointer per thread serves them in a few ns.
// Signatures are TVM's backend API, so a kernel library's workspace hooks can
// point here (tvm_bridge.h).
#ifndef TF_DIETCODE_OPS_WORKSPACE_ARENA_H_
#define TF_DIETCODE_OPS_WORKSPACE_ARENA_H_

#include <cstdint>

namespace tf_dietcode {

// 64-byte aligned, as TVM's pool guarantees. CPU workspace comes from the
// calling thread's arena (TVM's pool when it does not fit: the arena then
// grows once the thread's workspaces are all freed); other devices' from TVM.
void* ArenaAllocWorkspace(int device_type, int device_id, uint64_t nbytes,
                          int dtype_code_hint, int dtype_bits_hint);

// Frees what ArenaAllocWorkspace returned (also TVM-pool fallbacks): 0, or
// -1 with TVM's error set when TVM's pool rejects the pointer.
int ArenaFreeWorkspace(int device_type, int device_id, void* ptr);

}  // namespace tf_dietcode

#endif  // TF_DIETCODE_OPS_WORKSPACE_ARENA_H_
