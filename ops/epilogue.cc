#include "epilogue.h"

#include "Eigen/Core"
#include "unsupported/Eigen/SpecialFunctions"

namespace tf_dietcode {

bool HasEpilogue(const ContractionPlan& plan) {
  return plan.alpha != 1.0f || plan.has_addend ||
         plan.activation != Activation::kNone;
}

void ApplyEpilogue(const ContractionPlan& plan, float* row, int64_t cols,
                   const float* addend) {
  Eigen::Map<Eigen::ArrayXf> r(row, cols);
  if (plan.alpha != 1.0f) r *= plan.alpha;
  if (addend != nullptr) {
    if (plan.addend_col_stride == 0) {
      r += *addend;
    } else {
      r += Eigen::Map<const Eigen::ArrayXf>(addend, cols);
    }
  }
  // The same Eigen expressions TF's own CPU kernels use, so results agree to
  // float32 rounding.
  switch (plan.activation) {
    case Activation::kNone:
      break;
    case Activation::kRelu:
      r = r.cwiseMax(0.0f);
      break;
    case Activation::kTanh:
      r = r.tanh();
      break;
    case Activation::kSigmoid:
      r = r.logistic();
      break;
    case Activation::kGelu:  // the exact (erf) form
      r = 0.5f * r * (1.0f + (r * static_cast<float>(M_SQRT1_2)).erf());
      break;
    case Activation::kGeluTanh:
      r = 0.5f * r *
          (1.0f + (0.7978845608028654f * (r + 0.044715f * r.cube())).tanh());
      break;
    case Activation::kSilu:  // tf.nn.silu: x * sigmoid(x)
      r = r * r.logistic();
      break;
  }
}

}  // namespace tf_dietcode
