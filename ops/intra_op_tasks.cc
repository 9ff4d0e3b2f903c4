#include "intra_op_tasks.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>

#include "absl/synchronization/notification.h"

namespace tf_dietcode {
namespace {

// A call whose work would take one core less than this runs on the calling
// thread alone: waking a sleeping pool thread and then the launcher costs
// about as much as splitting saves (tens of microseconds, see decisions.md,
// "Threads").
constexpr double kOnCallingThreadBelowMicros = 20;

// Calls below this, while no recent call was larger, have the launcher run
// tasks beside one woken pool thread (PoolUse::kLauncherJoins): two wake-ups
// per call fewer, which BERT-base at batch 1 gained 10-17% from at T <= 24
// (its dense calls up to ~1500 us by this estimate). Larger calls run on the
// pool alone: joined, T = 43-128 ran 6-15% slower (a third thread, the idle
// pool thread still spinning after TF's last op, shares the two cores with
// the kernel's tasks). Switching between the two costs a wake-up of its own
// (T = 24 lost 12% with only its largest calls on the pool), so the choice
// follows the largest recent call, decaying by kRecentDecay per call: a
// model's calls of one request take the same path.
constexpr double kLauncherJoinsBelowMicros = 1600;
constexpr double kRecentDecay = 0.97;

// How long a launcher that ran tasks itself spins for the pool's last one
// before it blocks: a blocked launcher takes tens of microseconds to wake on
// the 2-core machines measured, about what a pool thread that woke late lags behind.
constexpr int64_t kJoinedSpinMicros = 200;

// Shared by every op of the process: a racy update only shifts when the
// threshold is crossed.
std::atomic<double> recent_call_micros{0};

// A spin-wait hint to the core (and to its hyperthread sibling).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// One call's tasks, shared by the pool closures that run them (and a
// launcher that runs tasks too): whoever comes first claims the next task. A
// closure that wakes after every task is claimed finds nothing to do and only
// drops its reference (it never touches `task`, which lives with the
// launcher until the last task is done).
struct Launch {
  Launch(absl::FunctionRef<bool(int)> task, int tasks)
      : task(task), tasks(tasks), unfinished(tasks) {}

  // Runs unclaimed tasks until none is left.
  void Drain() {
    for (int i; (i = next.fetch_add(1)) < tasks;) {
      if (!task(i)) failed = true;
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

  const absl::FunctionRef<bool(int)> task;
  const int tasks;
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  std::atomic<int> unfinished;
  absl::Notification done;
};

}  // namespace

PoolUse ChoosePoolUse(double flops, double bytes) {
  const double one_core_micros = flops / 1e5 + bytes / 2.5e4;
  const double recent =
      std::max(one_core_micros,
               recent_call_micros.load(std::memory_order_relaxed) * kRecentDecay);
  recent_call_micros.store(recent, std::memory_order_relaxed);
  if (one_core_micros < kOnCallingThreadBelowMicros) {
    return PoolUse::kCallingThreadOnly;
  }
  return recent < kLauncherJoinsBelowMicros ? PoolUse::kLauncherJoins
                                            : PoolUse::kPoolOnly;
}

int TaskCount(const tensorflow::DeviceBase::CpuWorkerThreads& workers,
              PoolUse use) {
  return use == PoolUse::kCallingThreadOnly ? 1
                                            : std::max(workers.num_threads, 1);
}

// One task per intra-op thread, as the kernels were tuned (TVM's pool also
// splits a parallel loop into one chunk per thread). How the launching
// (inter-op) thread takes part:
// - kPoolOnly: every task on the pool while the launcher waits asleep, as
//   TF's own ops run; both pool threads stay awake for the elementwise ops
//   TF runs on them next (with task 0 on the launcher, one pool thread slept
//   through every large kernel and BERT-base ran about 10% slower).
// - kLauncherJoins: one pool thread woken, the launcher running tasks too and
//   spinning briefly for the last: one wake-up instead of two per call.
// - kCallingThreadOnly: the tasks on the launcher, nothing woken.
bool RunTasks(const tensorflow::DeviceBase::CpuWorkerThreads& workers,
              PoolUse use, int tasks, absl::FunctionRef<bool(int)> task) {
  if (tasks <= 0) return true;
  if (tasks == 1 || use == PoolUse::kCallingThreadOnly) {  // nothing to wake or wait for
    bool ok = true;
    for (int i = 0; i < tasks; ++i) ok = task(i) && ok;
    return ok;
  }
  auto launch = std::make_shared<Launch>(task, tasks);
  const bool joins = use == PoolUse::kLauncherJoins;
  const bool runs_tasks = joins || workers.workers->CurrentThreadId() >= 0;
  for (int closure = runs_tasks ? 1 : 0; closure < tasks; ++closure) {
    workers.workers->Schedule([launch] { launch->Drain(); });
  }
  if (runs_tasks) launch->Drain();
  launch->Wait(joins ? kJoinedSpinMicros : 0);
  return !launch->failed;
}

}  // namespace tf_dietcode
