// Shape-function pieces shared by the dense ops (DietcodeFusedMatMul and the
// int8 / bfloat16 ones): a's rows and K, and the output's columns.
#ifndef TF_DIETCODE_OPS_MATMUL_SHAPE_H_
#define TF_DIETCODE_OPS_MATMUL_SHAPE_H_

#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/shape_inference.h"

namespace tf_dietcode {

// a's rows (M, as dims: a's leading dims) and K (the product of its last
// num_k_dims dims, or a's first dim with transpose_a); input 0 is a.
tensorflow::Status MatMulInputDims(
    tensorflow::shape_inference::InferenceContext* c, int num_k_dims,
    bool transpose_a, tensorflow::shape_inference::ShapeHandle* rows,
    tensorflow::shape_inference::DimensionHandle* k);

// The output's trailing dims: [n], or n_dims (whose product must be n).
tensorflow::Status MatMulColumns(
    tensorflow::shape_inference::InferenceContext* c,
    tensorflow::shape_inference::DimensionHandle n,
    const std::vector<int64_t>& n_dims,
    tensorflow::shape_inference::ShapeHandle* columns);

// The output's dims of `groups` layers side by side written group-major
// (groups > 1): rows become [groups, rows...] and columns [n / groups]; with
// groups = 1, both stay as they are.
tensorflow::Status GroupMajorDims(
    tensorflow::shape_inference::InferenceContext* c, int64_t groups,
    tensorflow::shape_inference::DimensionHandle n,
    tensorflow::shape_inference::ShapeHandle* rows,
    tensorflow::shape_inference::ShapeHandle* columns);

}  // namespace tf_dietcode

#endif  // TF_DIETCODE_OPS_MATMUL_SHAPE_H_
