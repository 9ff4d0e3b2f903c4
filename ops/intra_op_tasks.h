// How a fused op's parallel work runs on TF's intra-op pool: the tasks of one
// call, and whether the calling (inter-op) thread runs them, waits asleep, or
// runs them alone. The TVM-compiled kernels' parallel loops (tvm_bridge.h)
// and the int8 / bfloat16 dense ops share it, so one model's calls follow one
// policy whatever their precision (decisions.md, "Threads").
#ifndef TF_DIETCODE_OPS_INTRA_OP_TASKS_H_
#define TF_DIETCODE_OPS_INTRA_OP_TASKS_H_

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

}  // namespace tf_dietcode

#endif  // TF_DIETCODE_OPS_INTRA_OP_TASKS_H_
