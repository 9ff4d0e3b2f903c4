// The CPU kernel of DietcodeSoftmax (registered in softmax_op.cc): softmax,
// or log softmax, over the last axis.
//
// With oneDNN on, TF runs Softmax as _MklSoftmax, which costs 45-70 us a call
// in a loop and 80-170 us under step stats in BERT-base at batch 1 on a
// 2-core Emerald Rapids Xeon, even at [1, 12, 1, 1]: five percent of an inference at
// T = 1.
// Here each row's maximum is subtracted, exp applied, and the row scaled by
// 1 / sum, a block of rows at a time in cache. Rows are spread over
// TF's intra-op pool as the products' calls are (intra_op_tasks.h), so
// small inputs run inline.
// Log softmax keeps the shifted row and subtracts the log of its exp-sum: TF's
// LogSoftmax took 350 us a call on a beam search's [32, 8000] log
// probabilities (2-core AMD EPYC Zen 4).
#include <algorithm>
#include <cmath>

#include "tensorflow/core/framework/op_kernel.h"
#include "Eigen/Core"
#include "intra_op_tasks.h"

namespace tf_dietcode {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::errors::InvalidArgument;

// Operations per element, for ChoosePoolUse (one core: 100 per ns): exp and
// three passes ran about 0.5 ns an element on one core.
constexpr double kFlopsPerElement = 50;
constexpr int64_t kBlockElements = 4096;  // 16 KiB of rows at a time

class SoftmaxOp : public OpKernel {
 public:
  explicit SoftmaxOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("log", &log_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& logits = ctx->input(0);
    OP_REQUIRES(ctx, logits.dims() >= 1,
                InvalidArgument("logits must have rank >= 1, got a scalar"));
    Tensor* y;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                            {0}, 0, logits.shape(), &y));
    if (y->NumElements() == 0) return;
    const int64_t depth = logits.dim_size(logits.dims() - 1);
    const int64_t rows = logits.NumElements() / depth;
    const float* in = logits.flat<float>().data();
    float* out = y->flat<float>().data();
    using Row = Eigen::Map<Eigen::ArrayXf>;
    // Rows are taken in blocks of about kBlockElements (in L1): each row's
    // maximum subtracted, then exp over the whole block as one array, then each
    // row scaled by its sum. exp row by row left every row's tail (62 = 3 x 16
    // + 14) to scalar code; over a block only the block's tail is.
    const int64_t block_rows = std::max<int64_t>(1, kBlockElements / depth);
    const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    const double elements = static_cast<double>(rows) * depth;
    ForRowRuns(
        *workers, rows, kFlopsPerElement * elements, 2.0 * sizeof(float) * elements,
        [&](int64_t begin, int64_t end) {
          for (int64_t first = begin; first < end; first += block_rows) {
            const int64_t last = std::min(end, first + block_rows);
            for (int64_t r = first; r < last; ++r) {
              const Eigen::Map<const Eigen::ArrayXf> row(in + r * depth, depth);
              Row(out + r * depth, depth) = row - row.maxCoeff();
            }
            if (log_) {
              for (int64_t r = first; r < last; ++r) {
                Row row(out + r * depth, depth);
                row -= std::log(row.exp().sum());
              }
              continue;
            }
            Row block(out + first * depth, (last - first) * depth);
            block = block.exp();
            for (int64_t r = first; r < last; ++r) {
              Row row(out + r * depth, depth);
              row *= 1.0f / row.sum();
            }
          }
        });
  }

 private:
  bool log_ = false;
};

REGISTER_KERNEL_BUILDER(Name("DietcodeSoftmax").Device(tensorflow::DEVICE_CPU),
                        SoftmaxOp);

}  // namespace
}  // namespace tf_dietcode
