// The CPU kernel of DietcodeLayerNorm (registered in layer_norm_op.cc): Keras'
// LayerNormalization over the last axis, optionally of x + residual.
//
// TF runs Keras' layer norm as about a dozen ops (two means, a squared
// difference, rsqrt, and a chain of muls and adds, each its own pass over the
// tensor and its own node in the executor), and the residual add before it as
// one more pass that writes the sum out and reads it back. This op makes one
// pass per row: the sum into the output row (still in L1 for the rest), the
// mean and variance (in double), then
// y = (s - mean) * rsqrt(variance + epsilon) * gamma + beta. Rows are spread
// over TF's intra-op pool by the work they carry, so small inputs run inline.
#include <cmath>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "Eigen/Core"
#include "broadcast.h"
#include "intra_op_tasks.h"

namespace tf_dietcode {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpInputList;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::TensorShapeUtils;
using tensorflow::errors::InvalidArgument;

// Operations per element, for ChoosePoolUse (intra_op_tasks.h): three passes
// in double (and the residual's add).
constexpr double kFlopsPerElement = 30;
constexpr double kResidualFlopsPerElement = 10;

// An operand's rows as read broadcast to the output's dims (numpy rules):
// where each output row's elements start, and 0 or 1 between them.
class RowReader {
 public:
  RowReader() = default;
  RowReader(const Tensor& operand, const Dims& out_dims)
      : data_(operand.flat<float>().data()), out_dims_(out_dims) {
    const Dims dims = DimsOf(operand.shape());
    BroadcastStrides(dims, DenseStrides(dims), out_dims, &strides_);
  }

  // Output row r's elements in this operand: r unravelled over the output's
  // leading dims, each step weighted by this operand's stride.
  const float* Row(int64_t r) const {
    int64_t offset = 0;
    for (int d = static_cast<int>(out_dims_.size()) - 2; d >= 0; --d) {
      offset += r % out_dims_[d] * strides_[d];
      r /= out_dims_[d];
    }
    return data_ + offset;
  }

  // out = this operand's row r + other's, elementwise.
  void Add(int64_t r, const RowReader& other, int64_t depth,
           float* out) const {
    const float* a = Row(r);
    const float* b = other.Row(r);
    const int64_t a_step = strides_.back(), b_step = other.strides_.back();
    if (a_step == 1 && b_step == 1) {
      using Elements = Eigen::Map<const Eigen::ArrayXf>;
      Eigen::Map<Eigen::ArrayXf>(out, depth) =
          Elements(a, depth) + Elements(b, depth);
    } else {
      for (int64_t j = 0; j < depth; ++j) out[j] = a[j * a_step] + b[j * b_step];
    }
  }

 private:
  const float* data_ = nullptr;
  Dims out_dims_;
  Dims strides_;
};

class LayerNormOp : public OpKernel {
 public:
  explicit LayerNormOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
    OP_REQUIRES(ctx, epsilon_ >= 0 && std::isfinite(epsilon_),
                InvalidArgument("epsilon must be finite and >= 0, got ",
                                epsilon_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& gamma = ctx->input(1);
    const Tensor& beta = ctx->input(2);
    OpInputList residuals;
    OP_REQUIRES_OK(ctx, ctx->input_list("residual", &residuals));
    OP_REQUIRES(ctx, residuals.size() <= 1,
                InvalidArgument("at most one residual, got ", residuals.size()));
    const Tensor* residual = residuals.size() == 1 ? &residuals[0] : nullptr;
    OP_REQUIRES(ctx, x.dims() >= 1,
                InvalidArgument("x must have rank >= 1, got a scalar"));
    const Dims x_dims = DimsOf(x.shape());
    Dims out_dims = x_dims;
    if (residual != nullptr) {
      OP_REQUIRES(ctx,
                  BroadcastShapes(x_dims, DimsOf(residual->shape()), &out_dims),
                  InvalidArgument("x ", x.shape().DebugString(),
                                  " and residual ",
                                  residual->shape().DebugString(),
                                  " do not broadcast"));
    }
    const int64_t depth = out_dims.back();
    for (const Tensor* vector : {&gamma, &beta}) {
      OP_REQUIRES(ctx,
                  TensorShapeUtils::IsVector(vector->shape()) &&
                      vector->dim_size(0) == depth,
                  InvalidArgument("gamma and beta must be [", depth,
                                  "] (the last dim of x",
                                  residual ? " + residual" : "", "), got ",
                                  vector->shape().DebugString()));
    }
    TensorShape out_shape;
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape(out_dims, &out_shape));
    Tensor* y;
    // an operand of the output's size is read row by row before the row is
    // written, so the output may take its buffer
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                            residual ? std::vector<int>{0, 3}
                                     : std::vector<int>{0},
                            0, out_shape, &y));
    if (y->NumElements() == 0) return;
    const int64_t rows = y->NumElements() / depth;
    const RowReader x_rows(x, out_dims);
    const RowReader residual_rows = residual ? RowReader(*residual, out_dims)
                                             : RowReader();
    float* out = y->flat<float>().data();
    using Row = Eigen::Map<const Eigen::ArrayXf>;
    const Row scale(gamma.flat<float>().data(), depth);
    const Row offset(beta.flat<float>().data(), depth);
    const double epsilon = epsilon_;
    const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    const double elements = static_cast<double>(rows) * depth;
    ForRowRuns(
        *workers, rows,
        (kFlopsPerElement + (residual ? kResidualFlopsPerElement : 0)) * elements,
        (residual ? 3 : 2) * sizeof(float) * elements,
        [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            float* out_row = out + r * depth;
            const float* in_row = x_rows.Row(r);
            if (residual != nullptr) {
              x_rows.Add(r, residual_rows, depth, out_row);
              in_row = out_row;
            }
            const Row row(in_row, depth);
            const double mean = row.cast<double>().mean();
            const double variance = (row.cast<double>() - mean).square().mean();
            const float inverse =
                static_cast<float>(1.0 / std::sqrt(variance + epsilon));
            // centred in double: a mean rounded to float would be off by
            // half an ulp of the row's offset, much of a narrow row's spread
            Eigen::Map<Eigen::ArrayXf>(out_row, depth) =
                (row.cast<double>() - mean).cast<float>() * (inverse * scale) +
                offset;
          }
        });
  }

 private:
  float epsilon_;
};

REGISTER_KERNEL_BUILDER(
    Name("DietcodeLayerNorm").Device(tensorflow::DEVICE_CPU), LayerNormOp);

}  // namespace
}  // namespace tf_dietcode
