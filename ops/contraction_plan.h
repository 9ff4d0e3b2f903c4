// The shape contract shared by every Dietcode fused op.
//
// All three ops compute  out = place(act(alpha * op(a) @ op(b) + addend))  over
// broadcast batch dims. A ContractionPlan is that computation with every shape
// question answered ahead of the arithmetic: per output matrix, where its
// operands start, where its addend starts and where its result lands. Kernels
// (generic or tuned) only walk the plan, so validation lives in one place.
#ifndef TF_DIETCODE_OPS_CONTRACTION_PLAN_H_
#define TF_DIETCODE_OPS_CONTRACTION_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "op_contract.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/status.h"

namespace tf_dietcode {

// Parses the `activation` attr value; the attr's allowed list keeps it valid.
Activation ParseActivation(const std::string& name);

struct ContractionPlan {
  int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = false;
  int64_t lda = 0, ldb = 0;  // row strides of a and b as stored (elements)

  // A pre-packed b (DietcodeFusedMatMul with packed_n > 0) is stored as
  // column blocks b_packed[NB, K, block_cols]: column j of op(b) starts at
  // (j / block_cols) * b_block_stride + j % block_cols, rows ldb apart.
  // b_block_cols == 0: b is one plain matrix.
  int64_t b_block_cols = 0, b_block_stride = 0;

  // The broadcast batch: product matrices numbered row-major over
  // batch_dims, each operand placed by element strides per batch dim (0 for
  // a broadcast dim). Strides, not per-matrix offsets, so planning a call
  // costs the same for any batch size.
  std::vector<int64_t> batch_dims;
  std::vector<int64_t> a_batch_strides, b_batch_strides, out_batch_strides,
      addend_batch_strides;
  int64_t batch_count = 0;  // product matrices; 0 when the output is empty

  // Where element (row, col) of one product matrix lands in the output.
  int64_t out_row_stride = 0, out_col_stride = 1;

  // Epilogue. An addend (bias or broadcast add) is read at its batch offset
  // + row * addend_row_stride + col * addend_col_stride;
  // a stride of 0 is a broadcast dimension.
  float alpha = 1.0f;
  bool has_addend = false;
  int64_t addend_row_stride = 0, addend_col_stride = 0;
  Activation activation = Activation::kNone;

  tensorflow::TensorShape out_shape;

  int64_t batch() const { return batch_count; }

  // Where product matrix `batch` starts in an operand with `batch_strides`.
  int64_t BatchOffset(const std::vector<int64_t>& batch_strides,
                      int64_t batch) const;
};

// DietcodeFusedMatMul: a[..., K] (its last num_k_dims dims contracted, K
// their product; or [K, M] with transpose_a), b[K, N] (or [N, K]), optional
// bias[N]; the output is [..., N], or [..., n_dims] when n_dims is not empty.
// packed_n > 0: b is pre-packed [NB, K, tile_n] holding N = packed_n columns
// (then transpose_b must be false). groups > 1: b holds that many layers side
// by side, and the plan is a batch of one product per layer (a broadcast),
// written group-major: [groups, ..., N / groups].
tensorflow::Status PlanMatMul(const tensorflow::TensorShape& a,
                              const tensorflow::TensorShape& b,
                              const tensorflow::TensorShape* bias,
                              bool transpose_a, bool transpose_b,
                              int64_t packed_n, int num_k_dims,
                              const std::vector<int64_t>& n_dims,
                              int64_t groups, Activation activation,
                              ContractionPlan* plan);

// Checks the `groups` attr: at least 1, and n_dims empty when above 1.
tensorflow::Status ValidateGroups(int64_t groups,
                                  const std::vector<int64_t>& n_dims);

// ValidateGroups for the int8 / bfloat16 ops, whose layers must also each
// hold a whole, positive number of the packed weight's column blocks
// (N / groups a multiple of kLowPrecisionBlockColumns).
tensorflow::Status ValidateLowPrecisionGroups(
    int64_t groups, int64_t n, const std::vector<int64_t>& n_dims);

// The product of the `n_dims` attr (the output's trailing dims), which must
// be non-negative and not overflow.
tensorflow::Status ColumnDimsProduct(const std::vector<int64_t>& n_dims,
                                     int64_t* product);

// DietcodeFusedBatchMatMul{Add,Transpose}: x[..., M, K], y[..., K, N] (each
// read through its operand permutation, empty for none) with BatchMatMulV2
// broadcasting and adjoints, an optional addend broadcastable to the product,
// and an optional permutation of the product's axes.
tensorflow::Status PlanBatchMatMul(const tensorflow::TensorShape& x,
                                   const tensorflow::TensorShape& y,
                                   const std::vector<int32_t>& x_perm,
                                   const std::vector<int32_t>& y_perm,
                                   bool adj_x, bool adj_y, float alpha,
                                   const tensorflow::TensorShape* addend,
                                   const std::vector<int32_t>& perm,
                                   ContractionPlan* plan);

// Checks that `perm` (the attr `name`) is a permutation of [0, rank)
// (rank < 0: unknown).
tensorflow::Status ValidatePermutation(const std::vector<int32_t>& perm,
                                       int rank, const char* name);

// An operand permutation: empty, or a permutation that keeps the last axis
// last (the operand's rows stay contiguous; adjoints swap the last two).
tensorflow::Status ValidateOperandPermutation(const std::vector<int32_t>& perm,
                                              int rank, const char* name);

}  // namespace tf_dietcode

#endif  // TF_DIETCODE_OPS_CONTRACTION_PLAN_H_
