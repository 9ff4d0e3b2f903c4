#include "tvm_bridge.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>

#include "absl/synchronization/notification.h"
#include "tensorflow/core/platform/logging.h"
#include "tvm/ffi/c_api.h"
#include "tvm/runtime/c_backend_api.h"
#include "workspace_arena.h"

namespace tf_dietcode {
namespace {

thread_local const tensorflow::DeviceBase::CpuWorkerThreads* intra_op_pool =
    nullptr;
thread_local PoolUse pool_use = PoolUse::kPoolOnly;

// How long a launcher that ran tasks itself spins for the pool's last one
// before it blocks: a blocked launcher takes tens of microseconds to wake on
// the 2-core machines measured, about what a pool thread that woke late lags behind.
constexpr int64_t kJoinedSpinMicros = 200;

// A spin-wait hint to the core (and to its hyperthread sibling).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

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
      if (unfinished.fetch_sub(1) == 1) done.Notify();
    }
  }

  // Waits for the last task, spinning first for up to `spin_micros`.
  void Wait(int64_t spin_micros) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::microseconds(spin_micros);
    for (int i = 0; spin_micros > 0 && !done.HasBeenNotified(); ++i) {
      if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
      CpuRelax();
    }
    done.WaitForNotification();
  }

  const FTVMParallelLambda flambda;
  void* const cdata;
  TVMParallelGroupEnv env;
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  std::atomic<int> unfinished;  // tasks, not closures
  absl::Notification done;
};

// TVM's parallel-launch contract: run flambda(task, env, cdata) for every
// task < env.num_task, return when all are done: 0, or -1 if any failed.
// One task per intra-op thread, as the kernels were tuned (TVM's pool also
// splits a parallel loop into one chunk per thread). How the launching
// (inter-op) thread takes part is the op's choice (PoolUse, tvm_bridge.h):
// - kPoolOnly: every task on the pool while the launcher waits asleep, as
//   TF's own ops run; both pool threads stay awake for the elementwise ops
//   TF runs on them next (with task 0 on the launcher, one pool thread slept
//   through every large kernel and BERT-base ran about 10% slower).
// - kLauncherJoins: one pool thread woken, the launcher running tasks too and
//   spinning briefly for the last: one wake-up instead of two per call.
// - kCallingThreadOnly: one task on the launcher, nothing woken.
// A launcher that is itself a pool thread always runs tasks too (it must not
// wait on its own pool).
int LaunchOnIntraOpPool(FTVMParallelLambda flambda, void* cdata,
                        int num_task) {
  const auto* pool = intra_op_pool;
  if (pool == nullptr) return TVMBackendParallelLaunch(flambda, cdata, num_task);
  const int tasks = num_task > 0 ? num_task
                    : pool_use == PoolUse::kCallingThreadOnly
                        ? 1
                        : std::max(pool->num_threads, 1);
  if (tasks == 1) {  // nothing to share, wake or wait for
    TVMParallelGroupEnv env{nullptr, 1};
    return flambda(0, &env, cdata) == 0 ? 0 : -1;
  }
  auto launch = std::make_shared<Launch>(flambda, cdata, tasks);
  const bool joins = pool_use == PoolUse::kLauncherJoins;
  const bool runs_tasks = joins || pool->workers->CurrentThreadId() >= 0;
  for (int closure = runs_tasks ? 1 : 0; closure < tasks; ++closure) {
    pool->workers->Schedule([launch] { launch->Drain(); });
  }
  if (runs_tasks) launch->Drain();
  launch->Wait(joins ? kJoinedSpinMicros : 0);
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
