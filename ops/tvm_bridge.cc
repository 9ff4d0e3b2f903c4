#include "tvm_bridge.h"

#include <dlfcn.h>

#include <mutex>

#include "tensorflow/core/platform/logging.h"
#include "tvm/ffi/c_api.h"
#include "tvm/runtime/c_backend_api.h"
#include "workspace_arena.h"

namespace tf_dietcode {
namespace {

thread_local const tensorflow::DeviceBase::CpuWorkerThreads* intra_op_pool =
    nullptr;
thread_local PoolUse pool_use = PoolUse::kPoolOnly;

// TVM's parallel-launch contract: run flambda(task, env, cdata) for every
// task < env.num_task, return when all are done: 0, or -1 if any failed.
// num_task = 0 lets the launcher choose: one task per intra-op thread (as TVM's
// own pool does), run as the op chose (intra_op_tasks.h).
int LaunchOnIntraOpPool(FTVMParallelLambda flambda, void* cdata,
                        int num_task) {
  const auto* pool = intra_op_pool;
  if (pool == nullptr) return TVMBackendParallelLaunch(flambda, cdata, num_task);
  TVMParallelGroupEnv env{nullptr,
                          num_task > 0 ? num_task : TaskCount(*pool, pool_use)};
  const bool ok = RunTasks(*pool, pool_use, env.num_task, [&](int task) {
    return flambda(task, &env, cdata) == 0;
  });
  return ok ? 0 : -1;
}

void Point(void** hook, void* ours) {
  if (hook != nullptr && __atomic_load_n(hook, __ATOMIC_RELAXED) != ours) {
    __atomic_store_n(hook, ours, __ATOMIC_RELAXED);
  }
}

}  // namespace

void ExposeTvmFfiSymbols() {
  static std::once_flag once;
  std::call_once(once, [] {
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&TVMFFIErrorSetRaisedFromCStrParts),
               &info) == 0 ||
        dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL) ==
            nullptr) {
      LOG(WARNING) << "tf_dietcode: could not make libtvm_ffi global; a "
                      "failing tuned kernel may abort the process";
    }
  });
}

BackendHooks FindBackendHooks(void* library_handle) {
  auto find = [library_handle](const char* name) {
    return static_cast<void**>(dlsym(library_handle, name));
  };
  return {find("__TVMBackendParallelLaunch"),
          find("__TVMBackendAllocWorkspace"),
          find("__TVMBackendFreeWorkspace")};
}

void RouteBackendCalls(const BackendHooks& hooks) {
  Point(hooks.parallel_launch, reinterpret_cast<void*>(&LaunchOnIntraOpPool));
  Point(hooks.alloc_workspace, reinterpret_cast<void*>(&ArenaAllocWorkspace));
  Point(hooks.free_workspace, reinterpret_cast<void*>(&ArenaFreeWorkspace));
}

ScopedIntraOpPool::ScopedIntraOpPool(
    const tensorflow::DeviceBase::CpuWorkerThreads* workers, PoolUse use)
    : previous_(intra_op_pool), previous_use_(pool_use) {
  intra_op_pool = workers;
  pool_use = use;
}

ScopedIntraOpPool::~ScopedIntraOpPool() {
  intra_op_pool = previous_;
  pool_use = previous_use_;
}

FloatTensorView::FloatTensorView(const float* data,
                                 std::initializer_list<int64_t> shape,
                                 std::initializer_list<int64_t> strides) {
  std::copy(shape.begin(), shape.end(), shape_);
  std::copy(strides.begin(), strides.end(), strides_);
  tensor_.data = const_cast<float*>(data);  // kernels write only the output
  tensor_.device = DLDevice{kDLCPU, 0};
  tensor_.ndim = static_cast<int32_t>(shape.size());
  tensor_.dtype = DLDataType{kDLFloat, 32, 1};
  tensor_.shape = shape_;
  tensor_.strides = strides.size() == 0 ? nullptr : strides_;
  tensor_.byte_offset = 0;
}

}  // namespace tf_dietcode
