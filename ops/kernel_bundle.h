// Tuned kernel bundles (written by tf_dietcode.tuning.bundle) inside the op
// library: found by path, checked, loaded once per process, then immutable.
// So a path names one bundle for the life of the process: tf_dietcode writes
// bundles under names derived from their content (bundle_store.py).
//
// A bundle is a manifest.json beside a kernels.so. Before the library is
// loaded the manifest must parse, have the known format, target this CPU
// (target kind and every SIMD feature it was compiled for), name a TVM with
// this runtime's major.minor version, and carry the library's SHA-256. A
// bundle that fails any check is kept as "rejected" with the reason, logged
// once, and every call that names it runs the generic kernel.
#ifndef TF_DIETCODE_OPS_KERNEL_BUNDLE_H_
#define TF_DIETCODE_OPS_KERNEL_BUNDLE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "contraction_plan.h"
#include "tvm/ffi/function.h"
#include "tvm_bridge.h"

namespace tf_dietcode {

enum class TunedKind { kDense, kBatchMatMul };
enum Dim { kB = 0, kM, kN, kK, kNumDims };

// A call as tuned workloads see it, derived from the op's plan: a product
// with a pre-packed b (DietcodeFusedMatMul with packed_n), or one of strided
// matrices (every other call).
struct TunedCall {
  int64_t dims[kNumDims] = {0, 0, 0, 0};  // b: all batch matrices
  bool transpose_b = false;
  bool bias = false;  // a bias, or a broadcast addend
  Activation activation = Activation::kNone;
  bool packed = false;
  int64_t packed_blocks = 0, packed_tile_n = 0;  // packed: b's layout
  int64_t groups = 1;  // packed: layers side by side in b, output group-major

  // Strided: the batch as [batches, heads] and the element strides of x, y,
  // the output and the addend over (batch, head, row, column).
  int64_t batches = 1, heads = 1;
  int64_t x_strides[4] = {}, y_strides[4] = {}, out_strides[4] = {},
          addend_strides[4] = {};
  float alpha = 1.0f;

  // One unscaled product of compact x[M, K] and b[K, N] into a compact
  // out[M, N], plus a bias vector if any: what an in-place dense kernel reads.
  bool IsCompactMatrixProduct() const;
};

// One tuned workload of a bundle: what it computes, its micro-kernels, and
// its compiled decision tree.
struct TunedWorkload {
  using DispatchFn = int64_t (*)(int64_t, int64_t, int64_t, int64_t);

  TunedKind kind = TunedKind::kDense;
  bool transpose_b = false;
  bool bias = false;
  Activation activation = Activation::kNone;
  bool packed = false;  // dense: weight pre-packed (else read in place, [K, N])
  int64_t packed_blocks = 0, packed_tile_n = 0;
  int64_t groups = 1;  // dense: layers side by side, output [groups, M, N / groups]
  double shapes = 1;  // how many (b, m, n, k) its tuned ranges hold
  DispatchFn dispatch = nullptr;  // -1 outside the tuned ranges
  std::vector<tvm::ffi::Function> kernels;
  std::vector<std::string> kernel_names;
  std::unique_ptr<std::atomic<int64_t>[]> calls;  // per kernel, for stats

  // Same computation and operand layout (ranges are the dispatch's job).
  bool Computes(const TunedCall& call) const;
};

class KernelBundle {
 public:
  // The bundle at `path` (its manifest.json, or the directory holding it),
  // loaded and checked on first use; never null.
  static std::shared_ptr<const KernelBundle> Get(const std::string& path);

  // Why the bundle cannot be used; empty when it can.
  const std::string& problem() const { return problem_; }

  struct Choice {
    const TunedWorkload* workload = nullptr;  // null: use the generic kernel
    int64_t kernel = -1;
  };
  // The workload tuned for the narrowest range (fewest shapes) among those
  // that compute `call` and whose tree covers its dims: a loop's products
  // tuned for M = 4..32 are not served by a model's M = 1..512 workload of
  // the same layer shape. Counts the choice (a generic call when none fits).
  Choice Choose(const TunedCall& call) const;

  // Counts a call that no tuned workload could compute as planned.
  void CountGenericCall() const {
    generic_calls_.fetch_add(1, std::memory_order_relaxed);
  }

  // Counts a tuned call by how it used the intra-op pool (tvm_bridge.h).
  void CountCall(PoolUse use) const {
    pool_use_calls_[static_cast<int>(use)].fetch_add(
        1, std::memory_order_relaxed);
  }

  const BackendHooks& backend_hooks() const { return hooks_; }

  // Calls per kernel, generic calls and tuned calls by their use of the pool,
  // as JSON, for tests and debugging.
  std::string StatsJson() const;

 private:
  explicit KernelBundle(std::string path) : path_(std::move(path)) {}
  void Load();

  std::string path_;
  std::string problem_;
  std::vector<std::unique_ptr<TunedWorkload>> workloads_;  // manifest order
  std::vector<const TunedWorkload*> narrowest_first_;
  BackendHooks hooks_;
  mutable std::atomic<int64_t> generic_calls_{0};
  mutable std::atomic<int64_t> pool_use_calls_[3] = {};  // by PoolUse
};

}  // namespace tf_dietcode

#endif  // TF_DIETCODE_OPS_KERNEL_BUNDLE_H_
