#include "tvm_bridge.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>

#include "absl/synchronization/blocking_counter.h"
#include "tensorflow/core/platform/logging.h"
#include "tvm/ffi/c_api.h"
#include "tvm/runtime/c_backend_api.h"
#include "workspace_arena.h"

namespace tf_dietcode {
namespace {

thread_local const tensorflow::DeviceBase::CpuWorkerThreads* intra_op_pool =
    nullptr;
thread_local bool on_calling_thread = false;

// One parallel launch, shared by the pool closures that run it (and a
// launcher that runs tasks too): whoever comes first claims the next task. A
// closure that wakes after every task is claimed finds nothing to do and only
// drops its reference.
struct Launch {
  Launch(FTVMParallelLambda flambda, void* cdata, int tasks)
      : flambda(flambda), cdata(cdata), env{nullptr, tasks}, unfinished(tasks) {}

  // Runs unclaimed tasks until none is left.
  void Drain() {
    for (int task; (task = next.fetch_add(1)) < env.num_task;) {
      if (flambda(task, &env, cdata) != 0) failed = true;
      unfinished.DecrementCount();
    }
  }

  const FTVMParallelLambda flambda;
  void* const cdata;
  TVMParallelGroupEnv env;
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  absl::BlockingCounter unfinished;  // tasks, not closures
};

// TVM's parallel-launch contract: run flambda(task, env, cdata) for every
// task < env.num_task, return when all are done: 0, or -1 if any failed.
// One task per intra-op thread, as the kernels were tuned (TVM's pool also
// splits a parallel loop into one chunk per thread). The tasks run on the
// pool's threads while the launching (inter-op) thread waits, as TF's own
// ops ran in a profile of BERT-base (its inter-op thread did 6% of the work):
// the pool threads then stay awake for the elementwise ops TF runs on them
// next. With task 0 on the launching thread, one pool thread slept through
// every kernel and TF's next op waited for it to wake: BERT-base ran about 10%
// slower (decisions.md, "Threads"). A launcher that is itself a pool thread
// runs tasks too (it must not wait on its own pool). A single task, such as
// a call the op marked small (waking a pool thread and then the launcher
// costs more than half of it), runs directly on the launcher.
int LaunchOnIntraOpPool(FTVMParallelLambda flambda, void* cdata,
                        int num_task) {
  const auto* pool = intra_op_pool;
  if (pool == nullptr) return TVMBackendParallelLaunch(flambda, cdata, num_task);
  const int tasks = num_task > 0            ? num_task
                    : on_calling_thread     ? 1
                                            : std::max(pool->num_threads, 1);
  if (tasks == 1) {  // nothing to share, wake or wait for
    TVMParallelGroupEnv env{nullptr, 1};
    return flambda(0, &env, cdata) == 0 ? 0 : -1;
  }
  auto launch = std::make_shared<Launch>(flambda, cdata, tasks);
  const bool runs_tasks = pool->workers->CurrentThreadId() >= 0;
  for (int closure = runs_tasks ? 1 : 0; closure < tasks; ++closure) {
    pool->workers->Schedule([launch] { launch->Drain(); });
  }
  if (runs_tasks) launch->Drain();
  launch->unfinished.Wait();
  return launch->failed ? -1 : 0;
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
    const tensorflow::DeviceBase::CpuWorkerThreads* workers,
    bool on_calling_thread_now)
    : previous_(intra_op_pool), previous_on_calling_thread_(on_calling_thread) {
  intra_op_pool = workers;
  on_calling_thread = on_calling_thread_now;
}

ScopedIntraOpPool::~ScopedIntraOpPool() {
  intra_op_pool = previous_;
  on_calling_thread = previous_on_calling_thread_;
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
