// How a fused op's parallel work runs on TF's intra-op pool: the tasks of one
// call, and whether the calling (inter-op) thread runs them, waits asleep, or
// runs them alone. The TVM-compiled kernels' parallel loops (tvm_bridge.h)
// and the int8 / bfloat16 dense ops share it, so one model's calls follow one
// policy whatever their precision (decisions.md, "Threads").
#ifndef TF_DIETCODE_OPS_INTRA_OP_TASKS_H_
#define TF_DIETCODE_OPS_INTRA_OP_TASKS_H_

#include <algorithm>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "tensorflow/core/framework/device_base.h"

namespace tf_dietcode {

// How a call's tasks use the intra-op pool (intra_op_tasks.cc, RunTasks,
// says what each costs).
enum class PoolUse {
  kPoolOnly,           // every task on the pool, the launcher asleep meanwhile
  kLauncherJoins,      // the launcher runs tasks too, one pool thread fewer woken
  kCallingThreadOnly,  // one task on the launcher: too small to share
};

// The pool use for a call of `flops` that reads and writes `bytes`, judged by
// a rough one-core time (flops at 100 GFLOP/s, bytes at 25 GB/s); remembers
// the largest recent call (process-wide), so that one model's calls take one
// path.
PoolUse ChoosePoolUse(double flops, double bytes);

// Tasks a call splits into: one per pool thread, or one on the calling thread.
int TaskCount(const tensorflow::DeviceBase::CpuWorkerThreads& workers,
              PoolUse use);

// Runs task(i) for every i < tasks as `use` says, returning once all are
// done: false if any returned false. A launcher that is itself a pool thread
// always runs tasks too (it must not wait on its own pool).
bool RunTasks(const tensorflow::DeviceBase::CpuWorkerThreads& workers,
              PoolUse use, int tasks, absl::FunctionRef<bool(int)> task);

// Runs fn(begin, end) over rows [0, rows) in contiguous runs, one per task,
// the pool used as ChoosePoolUse judges a call of `flops` reading and writing
// `bytes` in all (never more tasks than rows): the low-precision tiles and
// the row-wise ops (softmax, layer norm, the low-precision ops' activation
// rows) follow the products' policy. TF's Shard woke a pool thread
// for any call past a few microseconds of work, which cost more than it saved:
// a [1, 12, 43, 43] softmax took 25 us on the calling thread and 40-50 us
// split in two (2-vCPU AMD EPYC Zen 4).
template <class Fn>
void ForRowRuns(const tensorflow::DeviceBase::CpuWorkerThreads& workers,
                int64_t rows, double flops, double bytes, const Fn& fn) {
  const PoolUse use = ChoosePoolUse(flops, bytes);
  const int tasks =
      static_cast<int>(std::min<int64_t>(TaskCount(workers, use), rows));
  RunTasks(workers, use, tasks, [&](int task) {
    const int64_t begin = rows * task / tasks;
    const int64_t end = rows * (task + 1) / tasks;
    if (begin < end) fn(begin, end);
    return true;
  });
}

}  // namespace tf_dietcode

#endif  // TF_DIETCODE_OPS_INTRA_OP_TASKS_H_
