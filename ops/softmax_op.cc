// Op registration and shape function of DietcodeSoftmax: softmax (or log
// softmax) over the last axis. Its CPU kernel is in softmax_kernel.cc.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_dietcode {
namespace {

using tensorflow::Status;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("DietcodeSoftmax")
    .Input("logits: float")
    .Output("softmax: float")
    .Attr("log: bool = false")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle logits;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &logits));
      c->set_output(0, logits);
      return Status();
    })
    .Doc(R"doc(
exp(logits - max) / sum(exp(logits - max)) along the last axis, as Softmax;
with log, (logits - max) - log(sum(exp(logits - max))), as LogSoftmax.
)doc");

}  // namespace
}  // namespace tf_dietcode
