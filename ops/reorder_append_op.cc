// Op registration and shape function of DietcodeReorderAppend: a beam
// search's per-step cache update, the reorder of the previous step's rows and
// the new entries' append, in one pass. Its CPU kernel is in
// reorder_append_kernel.cc.
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_dietcode {
namespace {

using tensorflow::Status;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("DietcodeReorderAppend")
    .Input("cache: float")
    .Input("rows: int32")
    .Input("new_entries: float")
    .Output("output: float")
    .Attr("axis: int >= 1")
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t axis;
      TF_RETURN_IF_ERROR(c->GetAttr("axis", &axis));
      ShapeHandle cache, rows, entries;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), axis + 1, &cache));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &rows));
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(2), axis + 1, &entries));
      if (!c->RankKnown(c->input(0)) || !c->RankKnown(c->input(2))) {
        c->set_output(0, c->UnknownShape());
        return Status();
      }
      const int rank = c->Rank(c->input(0));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), rank, &entries));
      std::vector<DimensionHandle> dims(rank);
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(rows, 0), c->Dim(entries, 0), &dims[0]));
      for (int d = 1; d < rank; ++d) {
        if (d == axis) {
          TF_RETURN_IF_ERROR(c->Add(c->Dim(c->input(0), d), c->Dim(entries, d), &dims[d]));
        } else {
          TF_RETURN_IF_ERROR(c->Merge(c->Dim(c->input(0), d), c->Dim(entries, d), &dims[d]));
        }
      }
      c->set_output(0, c->MakeShape(dims));
      return Status();
    })
    .Doc(R"doc(
concat([gather(cache, rows, axis=0), new_entries], axis): each output row r is
cache row rows[r] with new_entries row r appended along axis. cache and
new_entries have the same rank and agree on every dim but 0 and axis;
new_entries has len(rows) rows; every rows value is in [0, cache rows).
)doc");

}  // namespace
}  // namespace tf_dietcode
