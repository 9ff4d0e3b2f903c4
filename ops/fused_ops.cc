// Op registrations and shape functions of the Dietcode fused ops.
//
// Every op takes a scalar string `bundle`: the path of a tuned kernel bundle,
// fed from a SavedModel asset so the loader resolves it wherever the model is
// copied; "" means "no bundle". Shape functions keep unknown dims unknown.
#include <vector>

#include "contraction_plan.h"
#include "matmul_shape.h"
#include "op_contract.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_dietcode {
namespace {

using tensorflow::Status;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

Status BundleIsScalar(InferenceContext* c) {
  ShapeHandle unused;
  return c->WithRank(c->input(c->num_inputs() - 1), 0, &unused);
}

// b's K and N as the product reads it: [K, N], [N, K] with transpose_b, or
// packed [blocks, K, tile_n] holding packed_n columns.
Status WeightDims(InferenceContext* c, int64_t packed_n, bool transpose_b,
                  DimensionHandle* k, DimensionHandle* n) {
  ShapeHandle b;
  if (packed_n == 0) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &b));
    *k = c->Dim(b, transpose_b ? 1 : 0);
    *n = c->Dim(b, transpose_b ? 0 : 1);
    return Status();
  }
  if (transpose_b) {
    return tensorflow::errors::InvalidArgument(
        "a packed b (packed_n > 0) has its own layout; transpose_b must be "
        "false");
  }
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &b));
  *k = c->Dim(b, 1);
  *n = c->MakeDim(packed_n);
  return Status();
}

// act(a[..., K] @ b[K, N] + bias) -> [..., N], or [..., n_dims] (their
// product N), or [groups, ..., N / groups].
Status FusedMatMulShape(InferenceContext* c) {
  int num_bias, num_k_dims;
  int64_t packed_n, groups;
  bool transpose_a, transpose_b;
  std::vector<int64_t> n_dims;
  TF_RETURN_IF_ERROR(c->GetAttr("num_bias", &num_bias));
  TF_RETURN_IF_ERROR(c->GetAttr("packed_n", &packed_n));
  TF_RETURN_IF_ERROR(c->GetAttr("transpose_a", &transpose_a));
  TF_RETURN_IF_ERROR(c->GetAttr("transpose_b", &transpose_b));
  TF_RETURN_IF_ERROR(c->GetAttr("num_k_dims", &num_k_dims));
  TF_RETURN_IF_ERROR(c->GetAttr("n_dims", &n_dims));
  TF_RETURN_IF_ERROR(c->GetAttr("groups", &groups));
  TF_RETURN_IF_ERROR(ValidateGroups(groups, n_dims));
  if (num_bias > 1) {
    return tensorflow::errors::InvalidArgument(
        "DietcodeFusedMatMul takes at most one bias, got ", num_bias);
  }
  ShapeHandle rows;
  DimensionHandle k, weight_k, n;
  TF_RETURN_IF_ERROR(MatMulInputDims(c, num_k_dims, transpose_a, &rows, &k));
  TF_RETURN_IF_ERROR(WeightDims(c, packed_n, transpose_b, &weight_k, &n));
  TF_RETURN_IF_ERROR(c->Merge(k, weight_k, &k));
  if (num_bias == 1) {
    ShapeHandle bias;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &bias));
    TF_RETURN_IF_ERROR(c->Merge(n, c->Dim(bias, 0), &n));
  }
  ShapeHandle columns;
  TF_RETURN_IF_ERROR(MatMulColumns(c, n, n_dims, &columns));
  TF_RETURN_IF_ERROR(GroupMajorDims(c, groups, n, &rows, &columns));
  ShapeHandle out;
  TF_RETURN_IF_ERROR(c->Concatenate(rows, columns, &out));
  c->set_output(0, out);
  return BundleIsScalar(c);
}

// Operand `index` as the product reads it: through its permutation attr.
Status PermutedOperand(InferenceContext* c, int index, const char* attr,
                       ShapeHandle* operand) {
  std::vector<int32_t> perm;
  TF_RETURN_IF_ERROR(c->GetAttr(attr, &perm));
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(index), 2, operand));
  if (perm.empty()) return Status();
  const int rank = c->RankKnown(*operand) ? c->Rank(*operand) : -1;
  TF_RETURN_IF_ERROR(ValidateOperandPermutation(perm, rank, attr));
  if (rank < 0) {
    *operand = c->UnknownShapeOfRank(static_cast<int>(perm.size()));
    return Status();
  }
  std::vector<DimensionHandle> dims;
  for (int32_t p : perm) dims.push_back(c->Dim(*operand, p));
  *operand = c->MakeShape(dims);
  return Status();
}

// BatchMatMulV2's shape rules on the permuted operands.
Status BatchProductShape(InferenceContext* c, ShapeHandle* product) {
  bool adj_x, adj_y;
  TF_RETURN_IF_ERROR(c->GetAttr("adj_x", &adj_x));
  TF_RETURN_IF_ERROR(c->GetAttr("adj_y", &adj_y));
  ShapeHandle x, y;
  TF_RETURN_IF_ERROR(PermutedOperand(c, 0, "x_perm", &x));
  TF_RETURN_IF_ERROR(PermutedOperand(c, 1, "y_perm", &y));
  if (!c->RankKnown(x) || !c->RankKnown(y)) {
    *product = c->UnknownShape();
    return Status();
  }
  ShapeHandle x_batch, y_batch, batch;
  TF_RETURN_IF_ERROR(c->Subshape(x, 0, -2, &x_batch));
  TF_RETURN_IF_ERROR(c->Subshape(y, 0, -2, &y_batch));
  DimensionHandle k;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(x, adj_x ? -2 : -1),
                              c->Dim(y, adj_y ? -1 : -2), &k));
  TF_RETURN_IF_ERROR(tensorflow::shape_inference::
                         BroadcastBinaryOpOutputShapeFnHelper(
                             c, x_batch, y_batch, true, &batch));
  return c->Concatenate(batch,
                        c->Matrix(c->Dim(x, adj_x ? -1 : -2),
                                  c->Dim(y, adj_y ? -2 : -1)),
                        product);
}

Status FusedBatchMatMulAddShape(InferenceContext* c) {
  ShapeHandle product;
  TF_RETURN_IF_ERROR(BatchProductShape(c, &product));
  c->set_output(0, product);
  return BundleIsScalar(c);
}

Status FusedBatchMatMulTransposeShape(InferenceContext* c) {
  std::vector<int32_t> perm;
  TF_RETURN_IF_ERROR(c->GetAttr("perm", &perm));
  ShapeHandle product;
  TF_RETURN_IF_ERROR(BatchProductShape(c, &product));
  const int rank = c->RankKnown(product) ? c->Rank(product) : -1;
  TF_RETURN_IF_ERROR(ValidatePermutation(perm, rank, "perm"));
  if (rank < 0) {
    c->set_output(0, c->UnknownShapeOfRank(static_cast<int>(perm.size())));
  } else {
    std::vector<DimensionHandle> dims;
    for (int32_t p : perm) dims.push_back(c->Dim(product, p));
    c->set_output(0, c->MakeShape(dims));
  }
  return BundleIsScalar(c);
}

}  // namespace

REGISTER_OP("DietcodeFusedMatMul")
    .Input("a: T")
    .Input("b: T")
    .Input("bias: num_bias * T")
    .Input("bundle: string")
    .Output("product: T")
    .Attr("T: {float}")
    .Attr("num_bias: int >= 0")
    .Attr("transpose_a: bool = false")
    .Attr("transpose_b: bool = false")
    .Attr(kActivationAttr)
    .Attr("packed_n: int >= 0 = 0")
    .Attr("num_k_dims: int >= 1 = 1")
    .Attr("n_dims: list(int) = []")
    .Attr("groups: int >= 1 = 1")
    .SetShapeFn(FusedMatMulShape)
    .Doc(R"doc(
act(op(a) @ op(b) + bias): a dense layer in one op.

a: [..., K] (its leading dims are the product's rows), or [K, M] with
  transpose_a; with num_k_dims = c, its last c dims are contracted (K is their
  product), as in an Einsum 'abcd,cde->abe'.
b: [K, N], or [N, K] with transpose_b; with packed_n > 0 a pre-packed weight
  [blocks, K, tile_n] (tuned dense kernels read this layout) holding
  N = packed_n columns, zero padded.
bias: zero or one vector of shape [N].
product: [..., N], or [..., *n_dims] when n_dims (whose product is N) is given.
groups: > 1 for layers side by side in b (horizontal fusion): each of its
  groups of N / groups columns is one layer, and product is group-major,
  [groups, ..., N / groups], so that splitting it along its first axis (Split,
  Unpack) gives each layer's output without a copy. A packed b's blocks must
  not straddle groups; n_dims must be empty.
bundle: scalar path of a tuned kernel bundle, "" for none.
activation: 'gelu' is the exact (erf) form, 'gelu_tanh' the tanh approximation,
  'silu' x * sigmoid(x) (swish).
)doc");

REGISTER_OP("DietcodeBundleStats")
    .Input("bundle: string")
    .Output("stats: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
How a kernel bundle is used in this process, as JSON: its path, why it is
not used ("problem", empty when it is), calls per tuned kernel by workload,
and calls that ran the generic kernel. For tests and debugging.
)doc");

REGISTER_OP("DietcodeFusedBatchMatMulAdd")
    .Input("x: T")
    .Input("y: T")
    .Input("addend: T")
    .Input("bundle: string")
    .Output("output: T")
    .Attr("T: {float}")
    .Attr("adj_x: bool = false")
    .Attr("adj_y: bool = false")
    .Attr("x_perm: list(int) = []")
    .Attr("y_perm: list(int) = []")
    .Attr("alpha: float = 1.0")
    .SetShapeFn(FusedBatchMatMulAddShape)
    .Doc(R"doc(
alpha * BatchMatMulV2(x', y') + addend, e.g. attention scores plus a mask.

x', y': x and y read through x_perm and y_perm (empty: as stored), which must
  keep the last axis last, e.g. [0, 2, 1, 3] reads a [batch, time, heads,
  depth] projection as [batch, heads, time, depth] without a transpose.

addend: broadcastable to the product's shape (it never grows the output).
bundle: scalar path of a tuned kernel bundle, "" for none.
)doc");

REGISTER_OP("DietcodeFusedBatchMatMulTranspose")
    .Input("x: T")
    .Input("y: T")
    .Input("bundle: string")
    .Output("output: T")
    .Attr("T: {float}")
    .Attr("adj_x: bool = false")
    .Attr("adj_y: bool = false")
    .Attr("x_perm: list(int) = []")
    .Attr("y_perm: list(int) = []")
    .Attr("alpha: float = 1.0")
    .Attr("perm: list(int)")
    .SetShapeFn(FusedBatchMatMulTransposeShape)
    .Doc(R"doc(
transpose(alpha * BatchMatMulV2(x', y'), perm), e.g. the attention context
back to [batch, time, heads, depth] with perm [0, 2, 1, 3].

x', y': x and y read through x_perm and y_perm, as for
  DietcodeFusedBatchMatMulAdd.

bundle: scalar path of a tuned kernel bundle, "" for none.
)doc");

}  // namespace tf_dietcode
