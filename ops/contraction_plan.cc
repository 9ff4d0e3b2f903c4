#include "contraction_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/util/overflow.h"
#include "broadcast.h"

namespace tf_dietcode {
namespace {

using tensorflow::Status;
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;

std::string Show(const Dims& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

Dims Head(const Dims& dims, size_t n) {
  return Dims(dims.begin(), dims.begin() + n);
}

// An operand read through `perm` (empty: as stored): its dims and the element
// strides of those dims in the stored tensor.
void PermuteOperand(const Dims& stored, const std::vector<int32_t>& perm,
                    Dims* dims, Dims* strides) {
  const Dims dense = DenseStrides(stored);
  *dims = stored;
  *strides = dense;
  for (size_t i = 0; i < perm.size(); ++i) {
    (*dims)[i] = stored[perm[i]];
    (*strides)[i] = dense[perm[i]];
  }
}

// The planned [M, N] product as `groups` products of N / groups columns, one
// per layer side by side in b, all reading the same a, written group-major
// into [groups, rows..., N / groups].
Status SplitIntoGroups(int64_t groups, Dims out_dims, ContractionPlan* plan) {
  if (plan->n % groups != 0) {
    return InvalidArgument("groups=", groups, " must divide N=", plan->n);
  }
  const int64_t group_n = plan->n / groups;
  if (plan->b_block_cols > 0 && group_n % plan->b_block_cols != 0) {
    return InvalidArgument("packed b's blocks of ", plan->b_block_cols,
                           " columns straddle its groups of ", group_n);
  }
  out_dims.back() = group_n;
  out_dims.insert(out_dims.begin(), groups);
  TF_RETURN_IF_ERROR(TensorShape::BuildTensorShape(out_dims, &plan->out_shape));
  plan->n = group_n;
  if (plan->out_shape.num_elements() == 0) return Status();
  plan->batch_dims = {groups};
  plan->batch_count = groups;
  plan->a_batch_strides = {0};
  plan->b_batch_strides = {
      plan->b_block_cols > 0
          ? group_n / plan->b_block_cols * plan->b_block_stride
          : group_n * (plan->transpose_b ? plan->ldb : 1)};
  plan->out_batch_strides = {plan->m * group_n};
  plan->out_row_stride = group_n;
  plan->addend_batch_strides = {plan->has_addend ? group_n : 0};
  return Status();
}

}  // namespace

int64_t ContractionPlan::BatchOffset(const std::vector<int64_t>& batch_strides,
                                     int64_t batch) const {
  int64_t offset = 0;
  for (int i = static_cast<int>(batch_dims.size()) - 1; i >= 0; --i) {
    offset += (batch % batch_dims[i]) * batch_strides[i];
    batch /= batch_dims[i];
  }
  return offset;
}

Activation ParseActivation(const std::string& name) {
  for (const ActivationName& known : kActivationNames) {
    if (name == known.name) return known.activation;
  }
  return Activation::kNone;
}

Status ValidatePermutation(const std::vector<int32_t>& perm, int rank,
                           const char* name) {
  if (perm.size() < 2) {
    return InvalidArgument(name, " must name every axis (at least 2), got ",
                           perm.size(), " entries");
  }
  if (rank >= 0 && static_cast<int>(perm.size()) != rank) {
    return InvalidArgument(name, " has ", perm.size(),
                           " entries but its tensor has rank ", rank);
  }
  std::vector<bool> seen(perm.size(), false);
  for (int32_t p : perm) {
    if (p < 0 || p >= static_cast<int32_t>(perm.size()) || seen[p]) {
      return InvalidArgument(name, " [", absl::StrJoin(perm, ","),
                             "] is not a permutation of 0..",
                             static_cast<int>(perm.size()) - 1);
    }
    seen[p] = true;
  }
  return Status();
}

Status ValidateOperandPermutation(const std::vector<int32_t>& perm, int rank,
                                  const char* name) {
  if (perm.empty()) return Status();
  TF_RETURN_IF_ERROR(ValidatePermutation(perm, rank, name));
  if (perm.back() != static_cast<int32_t>(perm.size()) - 1) {
    return InvalidArgument(name, " [", absl::StrJoin(perm, ","),
                           "] must keep the last axis last (use adj_x/adj_y ",
                           "to swap the last two)");
  }
  return Status();
}

Status PlanBatchMatMul(const TensorShape& x, const TensorShape& y,
                       const std::vector<int32_t>& x_perm,
                       const std::vector<int32_t>& y_perm, bool adj_x,
                       bool adj_y, float alpha, const TensorShape* addend,
                       const std::vector<int32_t>& perm,
                       ContractionPlan* plan) {
  if (x.dims() < 2 || y.dims() < 2) {
    return InvalidArgument("x and y need rank >= 2, got x ", x.DebugString(),
                           " and y ", y.DebugString());
  }
  TF_RETURN_IF_ERROR(ValidateOperandPermutation(x_perm, x.dims(), "x_perm"));
  TF_RETURN_IF_ERROR(ValidateOperandPermutation(y_perm, y.dims(), "y_perm"));
  Dims xd, xs, yd, ys;
  PermuteOperand(DimsOf(x), x_perm, &xd, &xs);
  PermuteOperand(DimsOf(y), y_perm, &yd, &ys);
  const size_t xr = xd.size(), yr = yd.size();
  plan->transpose_a = adj_x;
  plan->transpose_b = adj_y;
  plan->lda = xs[xr - 2];
  plan->ldb = ys[yr - 2];
  plan->m = adj_x ? xd[xr - 1] : xd[xr - 2];
  const int64_t kx = adj_x ? xd[xr - 2] : xd[xr - 1];
  const int64_t ky = adj_y ? yd[yr - 1] : yd[yr - 2];
  plan->n = adj_y ? yd[yr - 2] : yd[yr - 1];
  if (kx != ky) {
    return InvalidArgument("contraction dims differ: x ", Show(xd),
                           adj_x ? " (adjoint)" : "", " has K=", kx, ", y ",
                           Show(yd), adj_y ? " (adjoint)" : "", " has K=", ky);
  }
  plan->k = kx;

  const Dims xb = Head(xd, xr - 2), yb = Head(yd, yr - 2);
  Dims batch;
  if (!BroadcastShapes(xb, yb, &batch)) {
    return InvalidArgument("batch dims of x ", Show(xd), " and y ", Show(yd),
                           " do not broadcast");
  }
  plan->batch_dims = batch;
  Dims product = batch;
  product.push_back(plan->m);
  product.push_back(plan->n);
  const size_t nb = batch.size();

  // The output: the product's axes permuted by `perm` (identity if empty).
  Dims out_dims = product;
  if (!perm.empty()) {
    TF_RETURN_IF_ERROR(
        ValidatePermutation(perm, static_cast<int>(product.size()), "perm"));
    for (size_t i = 0; i < perm.size(); ++i) out_dims[i] = product[perm[i]];
  }
  // Empty operands may have dims whose product overflows: an error, as in TF.
  TF_RETURN_IF_ERROR(TensorShape::BuildTensorShape(out_dims, &plan->out_shape));

  Dims addend_strides;
  plan->alpha = alpha;
  plan->has_addend = addend != nullptr;
  if (addend != nullptr) {
    const Dims ad = DimsOf(*addend);
    if (!BroadcastStrides(ad, DenseStrides(ad), product, &addend_strides)) {
      return InvalidArgument("addend ", Show(ad),
                             " does not broadcast to the product ",
                             Show(product));
    }
  }
  // Nothing to place: an empty output's batch may still be huge.
  if (plan->out_shape.num_elements() == 0) return Status();

  plan->batch_count = 1;
  for (int64_t d : batch) plan->batch_count *= d;
  BroadcastStrides(xb, Head(xs, xr - 2), batch, &plan->a_batch_strides);
  BroadcastStrides(yb, Head(ys, yr - 2), batch, &plan->b_batch_strides);
  Dims product_strides = DenseStrides(product);  // [j]: product axis j's, in the output
  if (!perm.empty()) {
    const Dims out_strides = DenseStrides(out_dims);
    for (size_t i = 0; i < perm.size(); ++i) {
      product_strides[perm[i]] = out_strides[i];
    }
  }
  plan->out_batch_strides = Head(product_strides, nb);
  plan->out_row_stride = product_strides[nb];
  plan->out_col_stride = product_strides[nb + 1];
  if (addend != nullptr) {
    plan->addend_batch_strides = Head(addend_strides, nb);
    plan->addend_row_stride = addend_strides[nb];
    plan->addend_col_stride = addend_strides[nb + 1];
  }
  return Status();
}

Status ColumnDimsProduct(const std::vector<int64_t>& n_dims, int64_t* product) {
  *product = 1;
  for (int64_t d : n_dims) {
    if (d < 0) return InvalidArgument("n_dims must be >= 0, got ", Show(n_dims));
    *product = tensorflow::MultiplyWithoutOverflow(*product, d);
    if (*product < 0) return InvalidArgument("n_dims ", Show(n_dims), " overflow");
  }
  return Status();
}

Status ValidateGroups(int64_t groups, const Dims& n_dims) {
  if (groups < 1) return InvalidArgument("groups must be >= 1, got ", groups);
  if (groups > 1 && !n_dims.empty()) {
    return InvalidArgument("n_dims must be empty when groups > 1, got ",
                           Show(n_dims));
  }
  return Status();
}

Status ValidateLowPrecisionGroups(int64_t groups, int64_t n,
                                  const Dims& n_dims) {
  TF_RETURN_IF_ERROR(ValidateGroups(groups, n_dims));
  if (groups > 1 && (n % groups != 0 || n == 0 ||
                     (n / groups) % kLowPrecisionBlockColumns != 0)) {
    return InvalidArgument("n=", n, " must be ", groups, " layers of a whole ",
                           "positive number of ", kLowPrecisionBlockColumns,
                           "-column blocks each (groups=", groups, ")");
  }
  return Status();
}

Status PlanMatMul(const TensorShape& a, const TensorShape& b,
                  const TensorShape* bias, bool transpose_a, bool transpose_b,
                  int64_t packed_n, int num_k_dims, const Dims& n_dims,
                  int64_t groups, Activation activation,
                  ContractionPlan* plan) {
  TF_RETURN_IF_ERROR(ValidateGroups(groups, n_dims));
  const bool packed = packed_n > 0;
  const int rows_rank = a.dims() - num_k_dims;
  if ((transpose_a ? a.dims() != 2 || num_k_dims != 1 : rows_rank < 0) ||
      b.dims() != (packed ? 3 : 2)) {
    return InvalidArgument(
        "a must be ", transpose_a ? "a matrix [K, M]" : "[..., K]", " with ",
        num_k_dims, " contracted dim(s) and b a ",
        packed ? "packed weight [blocks, K, tile_n]" : "matrix", ", got a ",
        a.DebugString(), " and b ", b.DebugString());
  }
  // a as the matrix [M, K] (rows: a's leading dims) or [K, M].
  const Dims a_dims = DimsOf(a);
  Dims rows = transpose_a ? Dims{a_dims[1]} : Head(a_dims, rows_rank);
  TensorShape a_matrix = a;
  if (!transpose_a) {
    int64_t m = 1, k = 1;
    for (int i = 0; i < a.dims(); ++i) {
      int64_t& product = i < rows_rank ? m : k;
      product = tensorflow::MultiplyWithoutOverflow(product, a_dims[i]);
    }
    if (m < 0 || k < 0) {  // an empty a's other dims may multiply past int64
      return InvalidArgument("a ", a.DebugString(), " has too many rows or K");
    }
    a_matrix = TensorShape({m, k});
  }
  TensorShape logical_b = b;
  if (packed) {
    if (transpose_b) {
      return InvalidArgument("a packed b (packed_n > 0) has its own layout; ",
                             "transpose_b must be false");
    }
    const int64_t tile_n = b.dim_size(2);
    const int64_t columns = tensorflow::MultiplyWithoutOverflow(b.dim_size(0), tile_n);
    if (columns < packed_n) {  // -1 on overflow: an empty b of huge dims
      return InvalidArgument("packed b ", b.DebugString(), " holds ", columns,
                             " columns, fewer than packed_n=", packed_n);
    }
    logical_b = TensorShape({b.dim_size(1), packed_n});
  }
  const int64_t n = logical_b.dim_size(transpose_b ? 0 : 1);
  if (bias != nullptr && (bias->dims() != 1 || bias->dim_size(0) != n)) {
    return InvalidArgument("bias must have shape [", n, "] (N), got ",
                           bias->DebugString());
  }
  if (!n_dims.empty()) {
    int64_t columns;
    TF_RETURN_IF_ERROR(ColumnDimsProduct(n_dims, &columns));
    if (columns != n) {
      return InvalidArgument("n_dims ", Show(n_dims), " must multiply to N=", n);
    }
  }
  TF_RETURN_IF_ERROR(PlanBatchMatMul(a_matrix, logical_b, {}, {}, transpose_a,
                                     transpose_b, 1.0f, bias, {}, plan));
  if (packed) {
    plan->ldb = b.dim_size(2);
    plan->b_block_cols = b.dim_size(2);
    plan->b_block_stride = b.dim_size(1) * b.dim_size(2);
  }
  plan->activation = activation;
  // The [M, N] product is dense and row-major, so it is the output as is.
  const Dims& columns = n_dims.empty() ? Dims{n} : n_dims;
  rows.insert(rows.end(), columns.begin(), columns.end());
  if (groups > 1) return SplitIntoGroups(groups, rows, plan);
  return TensorShape::BuildTensorShape(rows, &plan->out_shape);
}

}  // namespace tf_dietcode
