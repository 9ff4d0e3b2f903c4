// The generic kernel: correct for every shape a plan admits, used whenever no
// tuned micro-kernel covers the call.
#ifndef TF_DIETCODE_OPS_GENERIC_KERNEL_H_
#define TF_DIETCODE_OPS_GENERIC_KERNEL_H_

#include "contraction_plan.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_dietcode {

// Runs `plan` as tiles of Eigen's blocked GEMM spread over TF's intra-op
// thread pool, with the epilogue applied to each tile before it is written.
// `addend` may be null when the plan has none; `out` holds plan.out_shape.
void RunGenericContraction(tensorflow::OpKernelContext* ctx,
                           const ContractionPlan& plan, const float* a,
                           const float* b, const float* addend, float* out);

}  // namespace tf_dietcode

#endif  // TF_DIETCODE_OPS_GENERIC_KERNEL_H_
