// Op registrations and shape functions of the reduced-precision dense ops,
// DietcodeFusedMatMulInt8 and DietcodeFusedMatMulBf16, and of
// DietcodeLowPrecisionIsa. Their CPU kernels are in
// low_precision_matmul_kernel.cc. The weight layout (blocks of
// kLowPrecisionBlockColumns columns, K in groups of kLowPrecisionGroupBytes
// bytes) comes from op_contract.h.
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

// The shape function of both ops: a[..., K], b packed [ceil(N / 16),
// ceil(K / per_group), 16, per_group], then `vectors` inputs of shape [N]
// (int8's scale and column_sums) and the optional bias [N].
template <int kPerGroup, int kVectors>
Status LowPrecisionMatMulShape(InferenceContext* c) {
  int num_k_dims;
  int64_t n_attr, groups;
  std::vector<int64_t> n_dims;
  TF_RETURN_IF_ERROR(c->GetAttr("num_k_dims", &num_k_dims));
  TF_RETURN_IF_ERROR(c->GetAttr("n", &n_attr));
  TF_RETURN_IF_ERROR(c->GetAttr("n_dims", &n_dims));
  TF_RETURN_IF_ERROR(c->GetAttr("groups", &groups));
  TF_RETURN_IF_ERROR(ValidateLowPrecisionGroups(groups, n_attr, n_dims));
  if (c->num_inputs() > 3 + kVectors) {
    return tensorflow::errors::InvalidArgument("at most one bias, got ",
                                               c->num_inputs() - 2 - kVectors);
  }
  ShapeHandle rows, b, vector;
  DimensionHandle k, unused;
  TF_RETURN_IF_ERROR(MatMulInputDims(c, num_k_dims, false, &rows, &k));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 4, &b));
  const int64_t blocks =
      (n_attr + kLowPrecisionBlockColumns - 1) / kLowPrecisionBlockColumns;
  TF_RETURN_IF_ERROR(c->WithValue(c->Dim(b, 0), blocks, &unused));
  TF_RETURN_IF_ERROR(
      c->WithValue(c->Dim(b, 2), kLowPrecisionBlockColumns, &unused));
  TF_RETURN_IF_ERROR(c->WithValue(c->Dim(b, 3), kPerGroup, &unused));
  if (c->ValueKnown(k)) {
    TF_RETURN_IF_ERROR(c->WithValue(
        c->Dim(b, 1), (c->Value(k) + kPerGroup - 1) / kPerGroup, &unused));
  }
  const DimensionHandle n = c->MakeDim(n_attr);
  for (int i = 2; i < c->num_inputs(); ++i) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &vector));
    TF_RETURN_IF_ERROR(c->Merge(n, c->Dim(vector, 0), &unused));
  }
  ShapeHandle columns, out;
  TF_RETURN_IF_ERROR(MatMulColumns(c, n, n_dims, &columns));
  TF_RETURN_IF_ERROR(GroupMajorDims(c, groups, n, &rows, &columns));
  TF_RETURN_IF_ERROR(c->Concatenate(rows, columns, &out));
  c->set_output(0, out);
  return Status();
}

constexpr int kInt8PerGroup = kLowPrecisionGroupBytes;
constexpr int kBf16PerGroup = kLowPrecisionGroupBytes / 2;

}  // namespace

REGISTER_OP("DietcodeFusedMatMulInt8")
    .Input("a: float")
    .Input("b: int8")
    .Input("scale: float")
    .Input("column_sums: int32")
    .Input("bias: num_bias * float")
    .Output("product: float")
    .Attr("num_bias: int >= 0")
    .Attr("n: int >= 0")
    .Attr(kActivationAttr)
    .Attr("num_k_dims: int >= 1 = 1")
    .Attr("n_dims: list(int) = []")
    .Attr("groups: int >= 1 = 1")
    .SetShapeFn(LowPrecisionMatMulShape<kInt8PerGroup, 2>)
    .Doc(R"doc(
act(a @ w + bias) with w an int8 weight with per-column scales, a quantized
per row at run time; exactly:

  s_i = max_k |a[i, k]| / 127                                   (float32)
  q[i, k] = clamp(rint(a[i, k] / s_i), -127, 127)   (half to even; 0 if s_i = 0)
  acc[i, j] = sum_k q[i, k] * b_q[k, j]                          (int32, exact)
  product[i, j] = act(float(acc[i, j]) * s_i * scale[j] + bias[j])  (float32,
    multiplied left to right, then the bias added)

A row of a holding NaN or +-Inf gives NaN in every output of that row.

a: [..., K]: its leading dims are the rows; its last num_k_dims dims are
  contracted (K is their product, at most 131072 so that acc is exact).
b: the weight b_q [K, N] packed [ceil(N / 16), ceil(K / 4), 16, 4]: column j,
  row k at [j / 16, k / 4, j % 16, k % 4], zero padded.
scale: [N], w[k, j] ~ b_q[k, j] * scale[j].
column_sums: [N], sum over k of b_q[k, j]; must be exact (kernels that
  multiply unsigned activations by signed weights use it).
bias: zero or one vector [N].
n: N (b is padded to whole blocks).
groups: how many layers b, scale, column_sums and bias hold side by side (each
  N / groups columns, a whole number of 16-column blocks).
product: [..., N], or [..., *n_dims] when n_dims (whose product is N) is given,
  or group-major [groups, ..., N / groups] when groups > 1.
)doc");

REGISTER_OP("DietcodeFusedMatMulBf16")
    .Input("a: float")
    .Input("b: bfloat16")
    .Input("bias: num_bias * float")
    .Output("product: float")
    .Attr("num_bias: int >= 0")
    .Attr("n: int >= 0")
    .Attr(kActivationAttr)
    .Attr("num_k_dims: int >= 1 = 1")
    .Attr("n_dims: list(int) = []")
    .Attr("groups: int >= 1 = 1")
    .SetShapeFn(LowPrecisionMatMulShape<kBf16PerGroup, 0>)
    .Doc(R"doc(
act(bf16(a) @ b + bias) with b a bfloat16 weight: a rounded to bfloat16 (to
nearest even; NaN stays NaN, Inf stays Inf), the products summed in float32
(order unspecified; AVX-512 BF16 and AMX read denormals as zero), bias and
activation in float32.

a: [..., K]: its leading dims are the rows; its last num_k_dims dims are
  contracted (K is their product).
b: the weight [K, N] packed [ceil(N / 16), ceil(K / 2), 16, 2]: column j, row
  k at [j / 16, k / 2, j % 16, k % 2], zero padded.
bias: zero or one vector [N].
n: N (b is padded to whole blocks).
groups: how many layers b and bias hold side by side (each N / groups
  columns, a whole number of 16-column blocks).
product: [..., N], or [..., *n_dims] when n_dims (whose product is N) is given,
  or group-major [groups, ..., N / groups] when groups > 1.
)doc");

REGISTER_OP("DietcodeLowPrecisionIsa")
    .Output("paths: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
The kernel path each reduced-precision op runs on this machine now, as JSON,
e.g. {"int8": "avx512_vnni", "bfloat16": "avx512_bf16"}; it follows
TF_DIETCODE_DISABLE_ISA.
)doc");

}  // namespace tf_dietcode
