// Op registrations and shape functions of the Dietcode fused ops.
//
// Every op takes a scalar string `bundle`: the path of a tuned kernel bundle,
// fed from a SavedModel asset so the loader resolves it wherever the model is
// copied; "" means "no bundle". Shape functions keep unknown dims unknown.
#include <vector>

#include "contraction_plan.h"
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

// a[M, K] (or [K, M]) times a packed b[blocks, K, tile_n] -> [M, packed_n].
Status PackedMatMulShape(InferenceContext* c, int64_t packed_n) {
  bool transpose_a, transpose_b;
  TF_RETURN_IF_ERROR(c->GetAttr("transpose_a", &transpose_a));
  TF_RETURN_IF_ERROR(c->GetAttr("transpose_b", &transpose_b));
  if (transpose_b) {
    return tensorflow::errors::InvalidArgument(
        "a packed b (packed_n > 0) has its own layout; transpose_b must be "
        "false");
  }
  ShapeHandle a, b;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &a));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &b));
  DimensionHandle k;
  TF_RETURN_IF_ERROR(
      c->Merge(c->Dim(a, transpose_a ? 0 : 1), c->Dim(b, 1), &k));
  c->set_output(0, c->Matrix(c->Dim(a, transpose_a ? 1 : 0), packed_n));
  return Status();
}

Status FusedMatMulShape(InferenceContext* c) {
  int num_bias;
  TF_RETURN_IF_ERROR(c->GetAttr("num_bias", &num_bias));
  if (num_bias > 1) {
    return tensorflow::errors::InvalidArgument(
        "DietcodeFusedMatMul takes at most one bias, got ", num_bias);
  }
  int64_t packed_n;
  TF_RETURN_IF_ERROR(c->GetAttr("packed_n", &packed_n));
  if (packed_n == 0) {
    TF_RETURN_IF_ERROR(tensorflow::shape_inference::MatMulShape(c));
  } else {
    TF_RETURN_IF_ERROR(PackedMatMulShape(c, packed_n));
  }
  if (num_bias == 1) {
    ShapeHandle bias;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &bias));
    DimensionHandle n;
    TF_RETURN_IF_ERROR(c->Merge(c->Dim(c->output(0), 1), c->Dim(bias, 0), &n));
    c->set_output(0, c->Matrix(c->Dim(c->output(0), 0), n));
  }
  return BundleIsScalar(c);
}

Status FusedBatchMatMulAddShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(tensorflow::shape_inference::BatchMatMulV2Shape(c));
  return BundleIsScalar(c);
}

Status FusedBatchMatMulTransposeShape(InferenceContext* c) {
  std::vector<int32_t> perm;
  TF_RETURN_IF_ERROR(c->GetAttr("perm", &perm));
  TF_RETURN_IF_ERROR(tensorflow::shape_inference::BatchMatMulV2Shape(c));
  const ShapeHandle product = c->output(0);
  const int rank = c->RankKnown(product) ? c->Rank(product) : -1;
  TF_RETURN_IF_ERROR(ValidatePermutation(perm, rank));
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
    .Attr("activation: {'none', 'relu', 'tanh', 'sigmoid', 'gelu', "
          "'gelu_tanh'} = 'none'")
    .Attr("packed_n: int >= 0 = 0")
    .SetShapeFn(FusedMatMulShape)
    .Doc(R"doc(
act(op(a) @ op(b) + bias): a dense layer in one op.

a: [M, K], or [K, M] with transpose_a.
b: [K, N], or [N, K] with transpose_b; with packed_n > 0 a pre-packed weight
  [blocks, K, tile_n] (tuned dense kernels read this layout) holding
  N = packed_n columns, zero padded.
bias: zero or one vector of shape [N].
bundle: scalar path of a tuned kernel bundle, "" for none.
activation: 'gelu' is the exact (erf) form, 'gelu_tanh' the tanh approximation.
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
    .Attr("alpha: float = 1.0")
    .SetShapeFn(FusedBatchMatMulAddShape)
    .Doc(R"doc(
alpha * BatchMatMulV2(x, y) + addend, e.g. attention scores plus a mask.

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
    .Attr("alpha: float = 1.0")
    .Attr("perm: list(int)")
    .SetShapeFn(FusedBatchMatMulTransposeShape)
    .Doc(R"doc(
transpose(alpha * BatchMatMulV2(x, y), perm), e.g. the attention context back
to [batch, time, heads, depth] with perm [0, 2, 1, 3].

bundle: scalar path of a tuned kernel bundle, "" for none.
)doc");

}  // namespace tf_dietcode
