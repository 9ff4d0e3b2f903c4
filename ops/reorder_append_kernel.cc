// The CPU kernel of DietcodeReorderAppend (registered in reorder_append_op.cc).
//
// A beam search with a key/value cache appends each step's keys and values
// (concat) and, once the step's beams are chosen, reorders the cache by the
// beams' parents (gather): two copies of every layer's cache per step. The
// rewrite graph_rewrite/cache_reorder.py carries the cache unreordered with the
// parents' rows and does both here, in one copy.
#include <cstring>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tf_dietcode {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;

class ReorderAppendOp : public OpKernel {
 public:
  explicit ReorderAppendOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("axis", &axis_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& cache = ctx->input(0);
    const Tensor& rows = ctx->input(1);
    const Tensor& entries = ctx->input(2);
    const int rank = cache.dims();
    OP_REQUIRES(ctx, rank > axis_ && entries.dims() == rank,
                InvalidArgument("cache and new_entries must have the same rank, above axis ", axis_,
                                "; got shapes ", cache.shape().DebugString(), " and ",
                                entries.shape().DebugString()));
    OP_REQUIRES(ctx, rows.dims() == 1 && rows.dim_size(0) == entries.dim_size(0),
                InvalidArgument("rows must be a vector of new_entries' ", entries.dim_size(0),
                                " rows; got shape ", rows.shape().DebugString()));
    TensorShape shape = entries.shape();
    for (int d = 1; d < rank; ++d) {
      OP_REQUIRES(ctx, d == axis_ || cache.dim_size(d) == entries.dim_size(d),
                  InvalidArgument("cache ", cache.shape().DebugString(), " and new_entries ",
                                  entries.shape().DebugString(), " differ in dim ", d));
    }
    shape.set_dim(axis_, cache.dim_size(axis_) + entries.dim_size(axis_));
    const int64_t source_rows = cache.dim_size(0);
    const auto row_of = rows.flat<int32_t>();
    for (int64_t r = 0; r < rows.NumElements(); ++r) {
      OP_REQUIRES(ctx, row_of(r) >= 0 && row_of(r) < source_rows,
                  InvalidArgument("rows[", r, "] = ", row_of(r), " is not a row of the cache's ",
                                  source_rows));
    }
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out));
    if (out->NumElements() == 0) return;

    // Per row: `outer` blocks (the dims between 0 and axis), each the cache's
    // block then the entries' block (axis and every dim after it).
    int64_t outer = 1, inner = 1;
    for (int d = 1; d < axis_; ++d) outer *= cache.dim_size(d);
    for (int d = axis_ + 1; d < rank; ++d) inner *= cache.dim_size(d);
    const int64_t cache_block = cache.dim_size(axis_) * inner;
    const int64_t entry_block = entries.dim_size(axis_) * inner;
    const int64_t out_block = cache_block + entry_block;
    const float* from_cache = cache.flat<float>().data();
    const float* from_entries = entries.flat<float>().data();
    float* to = out->flat<float>().data();
    const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    tensorflow::Shard(
        workers->num_threads, workers->workers, rows.NumElements(), outer * out_block,
        [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            const float* cache_row = from_cache + row_of(r) * outer * cache_block;
            const float* entry_row = from_entries + r * outer * entry_block;
            float* out_row = to + r * outer * out_block;
            for (int64_t o = 0; o < outer; ++o) {
              std::memcpy(out_row + o * out_block, cache_row + o * cache_block,
                          cache_block * sizeof(float));
              std::memcpy(out_row + o * out_block + cache_block, entry_row + o * entry_block,
                          entry_block * sizeof(float));
            }
          }
        });
  }

 private:
  int64_t axis_ = 1;
};

REGISTER_KERNEL_BUILDER(Name("DietcodeReorderAppend").Device(tensorflow::DEVICE_CPU),
                        ReorderAppendOp);

}  // namespace
}  // namespace tf_dietcode
