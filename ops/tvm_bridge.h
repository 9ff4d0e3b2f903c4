// How TVM-compiled kernels run inside a TF op.
//
// - A kernel library calls TVM's runtime through pointers of its own, which
//   TVM's loader sets and RouteBackendCalls re-points:
//   - parallel loops run on the op's TF intra-op pool, never on TVM's own
//     pool (which pins the calling thread to a core and, with two ops at
//     once, oversubscribes the cores): LaunchOnIntraOpPool uses the pool the
//     calling op set with ScopedIntraOpPool (TVM's own launcher when none is
//     set, e.g. for Python callers of the same library), with the calling
//     thread running tasks too, or alone, as the op chooses (PoolUse,
//     intra_op_tasks.h);
//   - workspace comes from a per-thread arena (workspace_arena.h).
// - libtvm_ffi's symbols are made global, so a kernel that raises finds
//   TVMFFIErrorSetRaisedFromCStrParts although tf.load_op_library loaded us
//   with RTLD_LOCAL (without this the process dies on the first error).
// - TF buffers reach kernels as DLTensors, without copying.
#ifndef TF_DIETCODE_OPS_TVM_BRIDGE_H_
#define TF_DIETCODE_OPS_TVM_BRIDGE_H_

#include <cstdint>
#include <initializer_list>

#include "dlpack/dlpack.h"
#include "intra_op_tasks.h"
#include "tensorflow/core/framework/device_base.h"

namespace tf_dietcode {

// Makes libtvm_ffi's symbols visible to libraries dlopen'ed later.
// Idempotent and thread-safe.
void ExposeTvmFfiSymbols();

// A loaded kernel library's runtime hooks (found with dlsym on its handle);
// each is null when its kernels never make that call.
struct BackendHooks {
  void** parallel_launch = nullptr;
  void** alloc_workspace = nullptr;
  void** free_workspace = nullptr;
};
BackendHooks FindBackendHooks(void* library_handle);

// Points the hooks at LaunchOnIntraOpPool and the workspace arena. Cheap;
// called before every kernel call because loading the same library again
// (e.g. from Python) resets them.
void RouteBackendCalls(const BackendHooks& hooks);

// While alive, TVM parallel loops started on this thread run on `workers`,
// as `use` says.
class ScopedIntraOpPool {
 public:
  ScopedIntraOpPool(const tensorflow::DeviceBase::CpuWorkerThreads* workers,
                    PoolUse use);
  ~ScopedIntraOpPool();
  ScopedIntraOpPool(const ScopedIntraOpPool&) = delete;
  ScopedIntraOpPool& operator=(const ScopedIntraOpPool&) = delete;

 private:
  const tensorflow::DeviceBase::CpuWorkerThreads* previous_;
  PoolUse previous_use_;
};

// A float32 CPU DLTensor over `data`, row-major and contiguous, or with
// element strides (up to 4 dims); owns its shape and strides.
class FloatTensorView {
 public:
  FloatTensorView(const float* data, std::initializer_list<int64_t> shape,
                  std::initializer_list<int64_t> strides = {});
  FloatTensorView(const FloatTensorView&) = delete;
  FloatTensorView& operator=(const FloatTensorView&) = delete;
  DLTensor* get() { return &tensor_; }

 private:
  int64_t shape_[4];
  int64_t strides_[4];
  DLTensor tensor_;
};

}  // namespace tf_dietcode

#endif  // TF_DIETCODE_OPS_TVM_BRIDGE_H_
