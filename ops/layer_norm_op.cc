// Op registration and shape function of DietcodeLayerNorm: Keras'
// LayerNormalization over the last axis in one op, optionally over the sum of
// x and a residual (a Transformer's `x + sublayer`). Its CPU kernel is in
// layer_norm_kernel.cc.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_dietcode {
namespace {

using tensorflow::Status;
using tensorflow::errors::InvalidArgument;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("DietcodeLayerNorm")
    .Input("x: float")
    .Input("gamma: float")
    .Input("beta: float")
    .Input("residual: num_residual * float")
    .Output("y: float")
    .Attr("epsilon: float = 0.001")
    .Attr("num_residual: int >= 0 = 0")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle x, vector;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &x));
      if (c->num_inputs() > 4) {
        return InvalidArgument("DietcodeLayerNorm takes at most one residual, got ",
                               c->num_inputs() - 3);
      }
      if (c->num_inputs() == 4) {
        TF_RETURN_IF_ERROR(
            tensorflow::shape_inference::BroadcastBinaryOpOutputShapeFnHelper(
                c, x, c->input(3), true, &x));
      }
      DimensionHandle depth = c->Dim(x, -1);
      for (int i : {1, 2}) {
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &vector));
        TF_RETURN_IF_ERROR(c->Merge(depth, c->Dim(vector, 0), &depth));
      }
      c->set_output(0, x);
      return Status();
    })
    .Doc(R"doc(
(s - mean) * rsqrt(variance + epsilon) * gamma + beta, with s = x, or x +
residual broadcast as AddV2 does, and the mean and (biased) variance of each
row of s's last axis; gamma and beta are [depth].
)doc");

}  // namespace
}  // namespace tf_dietcode
