// The element-wise tail of every fused op, applied to one row of a result tile
// while it is still in cache: scale, add (bias or broadcast addend), activate.
#ifndef TF_DIETCODE_OPS_EPILOGUE_H_
#define TF_DIETCODE_OPS_EPILOGUE_H_

#include <cstdint>

#include "contraction_plan.h"

namespace tf_dietcode {

// True when the plan has any element-wise work after the product.
bool HasEpilogue(const ContractionPlan& plan);

// row[j] = act(alpha * row[j] + addend[j * plan.addend_col_stride]) for
// j < cols; `addend` is null when the plan has none.
void ApplyEpilogue(const ContractionPlan& plan, float* row, int64_t cols,
                   const float* addend);

}  // namespace tf_dietcode

#endif  // TF_DIETCODE_OPS_EPILOGUE_H_
