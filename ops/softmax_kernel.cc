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
// With a mask, each row is first gathered as where(mask, logits, fill)
// (broadcast as numpy does): Keras' attention masks its scores so with a
// SelectV2 pass of its own before every softmax.
#include <algorithm>
#include <cmath>

#include "tensorflow/core/framework/op_kernel.h"
#include "Eigen/Core"
#include "broadcast.h"
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

// Where row r of a masked softmax's logits and mask start, and the step along
// the row of each (1, or 0 where that operand is broadcast along it).
class MaskedRows {
 public:
  MaskedRows(const Dims& out, const Dims& logits_strides,
             const Dims& mask_strides)
      : out_(out), logits_(logits_strides), mask_(mask_strides) {}

  // dst[j] = mask[j] ? logits[j] : fill for row r.
  void Load(int64_t r, const float* logits, const bool* mask, float fill,
            float* dst) const {
    const int last = static_cast<int>(out_.size()) - 1;
    int64_t at_logits = 0, at_mask = 0;
    for (int d = last - 1; d >= 0; --d) {
      const int64_t i = r % out_[d];
      r /= out_[d];
      at_logits += i * logits_[d];
      at_mask += i * mask_[d];
    }
    const float* x = logits + at_logits;
    const bool* m = mask + at_mask;
    const int64_t depth = out_[last], dx = logits_[last], dm = mask_[last];
    if (dx == 1 && dm == 1) {
      for (int64_t j = 0; j < depth; ++j) dst[j] = m[j] ? x[j] : fill;
    } else {
      for (int64_t j = 0; j < depth; ++j) dst[j] = m[j * dm] ? x[j * dx] : fill;
    }
  }

 private:
  Dims out_, logits_, mask_;
};

class SoftmaxOp : public OpKernel {
 public:
  explicit SoftmaxOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("log", &log_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fill", &fill_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& logits = ctx->input(0);
    tensorflow::OpInputList masks;
    OP_REQUIRES_OK(ctx, ctx->input_list("mask", &masks));
    const float* in = logits.flat<float>().data();
    if (masks.size() == 0) {
      OP_REQUIRES(ctx, logits.dims() >= 1,
                  InvalidArgument("logits must have rank >= 1, got a scalar"));
      Run(ctx, logits.shape(), [in](int64_t r, int64_t depth, float* dst) {
        const Eigen::Map<const Eigen::ArrayXf> row(in + r * depth, depth);
        Row(dst, depth) = row - row.maxCoeff();
      });
      return;
    }
    const Tensor& mask = masks[0];
    const Dims logits_dims = DimsOf(logits.shape()), mask_dims = DimsOf(mask.shape());
    Dims out, logits_strides, mask_strides;
    OP_REQUIRES(ctx, BroadcastShapes(logits_dims, mask_dims, &out),
                InvalidArgument("mask of shape ", mask.shape().DebugString(),
                                " does not broadcast with logits of shape ",
                                logits.shape().DebugString()));
    OP_REQUIRES(ctx, !out.empty(),
                InvalidArgument("logits and mask must have rank >= 1, got scalars"));
    BroadcastStrides(logits_dims, DenseStrides(logits_dims), out, &logits_strides);
    BroadcastStrides(mask_dims, DenseStrides(mask_dims), out, &mask_strides);
    tensorflow::TensorShape shape;
    OP_REQUIRES_OK(ctx, tensorflow::TensorShape::BuildTensorShape(out, &shape));
    const MaskedRows rows(out, logits_strides, mask_strides);
    const bool* keep = mask.flat<bool>().data();
    const float fill = fill_;
    Run(ctx, shape, [&rows, in, keep, fill](int64_t r, int64_t depth, float* dst) {
      rows.Load(r, in, keep, fill, dst);
      Row row(dst, depth);
      row -= row.maxCoeff();
    });
  }

 private:
  using Row = Eigen::Map<Eigen::ArrayXf>;

  // Softmax rows of an output of `shape`, `shifted(r, depth, dst)` writing row
  // r of the logits less its maximum into dst. The output reuses the logits'
  // buffer where their shapes agree (a row then reads only itself).
  template <typename Shifted>
  void Run(OpKernelContext* ctx, const tensorflow::TensorShape& shape,
           Shifted shifted) {
    Tensor* y;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, shape, &y));
    if (y->NumElements() == 0) return;
    const int64_t depth = shape.dim_size(shape.dims() - 1);
    const int64_t rows = shape.num_elements() / depth;
    float* out = y->flat<float>().data();
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
            for (int64_t r = first; r < last; ++r) shifted(r, depth, out + r * depth);
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

  bool log_ = false;
  float fill_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("DietcodeSoftmax").Device(tensorflow::DEVICE_CPU),
                        SoftmaxOp);

}  // namespace
}  // namespace tf_dietcode
