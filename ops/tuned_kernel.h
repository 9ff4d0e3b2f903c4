// Runs a fused op's call on a bundle's tuned micro-kernel when one covers it.
#ifndef TF_DIETCODE_OPS_TUNED_KERNEL_H_
#define TF_DIETCODE_OPS_TUNED_KERNEL_H_

#include "contraction_plan.h"
#include "kernel_bundle.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_dietcode {

// Runs the call on the micro-kernel the bundle's tree picks for its shape.
// Returns false, having written nothing, when no tuned kernel covers the call
// (its shape, layout or epilogue): the caller runs the generic kernel. A
// failing kernel sets an error status on `ctx` (and returns true).
bool RunTunedContraction(tensorflow::OpKernelContext* ctx,
                         const KernelBundle& bundle,
                         const ContractionPlan& plan,
                         const tensorflow::Tensor& a,
                         const tensorflow::Tensor& b,
                         const tensorflow::Tensor* addend,
                         tensorflow::Tensor* out);

}  // namespace tf_dietcode

#endif  // TF_DIETCODE_OPS_TUNED_KERNEL_H_
