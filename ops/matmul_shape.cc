#include "matmul_shape.h"

#include "contraction_plan.h"

namespace tf_dietcode {

using tensorflow::Status;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

Status MatMulInputDims(InferenceContext* c, int num_k_dims, bool transpose_a,
                       ShapeHandle* rows, DimensionHandle* k) {
  ShapeHandle a, contracted;
  if (transpose_a) {
    if (num_k_dims != 1) {
      return tensorflow::errors::InvalidArgument(
          "transpose_a needs num_k_dims = 1, got ", num_k_dims);
    }
    TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &a));
    *k = c->Dim(a, 0);
    *rows = c->Vector(c->Dim(a, 1));
    return Status();
  }
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), num_k_dims, &a));
  if (!c->RankKnown(a)) {
    *rows = c->UnknownShape();
    *k = c->UnknownDim();
    return Status();
  }
  TF_RETURN_IF_ERROR(c->Subshape(a, 0, c->Rank(a) - num_k_dims, rows));
  TF_RETURN_IF_ERROR(c->Subshape(a, c->Rank(a) - num_k_dims, &contracted));
  *k = c->MakeDim(1);
  for (int i = 0; i < num_k_dims; ++i) {
    TF_RETURN_IF_ERROR(c->Multiply(*k, c->Dim(contracted, i), k));
  }
  return Status();
}

Status MatMulColumns(InferenceContext* c, DimensionHandle n,
                     const std::vector<int64_t>& n_dims, ShapeHandle* columns) {
  if (n_dims.empty()) {
    *columns = c->Vector(n);
    return Status();
  }
  int64_t product;
  TF_RETURN_IF_ERROR(ColumnDimsProduct(n_dims, &product));
  DimensionHandle unused;
  TF_RETURN_IF_ERROR(c->Merge(n, c->MakeDim(product), &unused));
  std::vector<DimensionHandle> dims;
  for (int64_t d : n_dims) dims.push_back(c->MakeDim(d));
  *columns = c->MakeShape(dims);
  return Status();
}

Status GroupMajorDims(InferenceContext* c, int64_t groups, DimensionHandle n,
                      ShapeHandle* rows, ShapeHandle* columns) {
  if (groups == 1) return Status();
  DimensionHandle group_n;
  TF_RETURN_IF_ERROR(c->Divide(n, groups, /*evenly_divisible=*/true, &group_n));
  TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(groups), *rows, rows));
  *columns = c->Vector(group_n);
  return Status();
}

}  // namespace tf_dietcode
