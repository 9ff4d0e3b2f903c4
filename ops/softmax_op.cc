// Op registration and shape function of DietcodeSoftmax: softmax (or log
// softmax) over the last axis. Its CPU kernel is in softmax_kernel.cc.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_dietcode {
namespace {

using tensorflow::Status;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("DietcodeSoftmax")
    .Input("logits: float")
    .Input("mask: num_masks * bool")
    .Output("softmax: float")
    .Attr("log: bool = false")
    .Attr("num_masks: int >= 0 = 0")
    .Attr("fill: float = 0")
    .SetShapeFn([](InferenceContext* c) -> Status {
      int num_masks;
      TF_RETURN_IF_ERROR(c->GetAttr("num_masks", &num_masks));
      if (num_masks > 1) {
        return tensorflow::errors::InvalidArgument(
            "DietcodeSoftmax takes at most one mask, got ", num_masks);
      }
      ShapeHandle logits = c->input(0);
      if (num_masks == 1) {
        TF_RETURN_IF_ERROR(
            tensorflow::shape_inference::BroadcastBinaryOpOutputShapeFnHelper(
                c, c->input(0), c->input(1), true, &logits));
      }
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(logits, 1, &logits));
      c->set_output(0, logits);
      return Status();
    })
    .Doc(R"doc(
exp(logits - max) / sum(exp(logits - max)) along the last axis, as Softmax;
with log, (logits - max) - log(sum(exp(logits - max))), as LogSoftmax.
With a mask (bool, broadcast with logits as numpy does), of
where(mask, logits, fill) instead: the output has the broadcast shape, as
SelectV2 followed by Softmax.
)doc");

}  // namespace
}  // namespace tf_dietcode
