// DietcodeLayerNorm: Keras' LayerNormalization over the last axis in one op.
//
// TF runs Keras' layer norm as about a dozen ops (two means, a squared
// difference, rsqrt, and a chain of muls and adds, each its own pass over the
// tensor and its own node in the executor). This op makes one pass per row:
// the mean and variance (in double), then
// y = (x - mean) * rsqrt(variance + epsilon) * gamma + beta. Rows are spread
// over TF's intra-op pool by the work they carry, so small inputs run inline.
#include <cmath>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"
#include "Eigen/Core"

namespace tf_dietcode {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShapeUtils;
using tensorflow::errors::InvalidArgument;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("DietcodeLayerNorm")
    .Input("x: float")
    .Input("gamma: float")
    .Input("beta: float")
    .Output("y: float")
    .Attr("epsilon: float = 0.001")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle x, vector;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &x));
      DimensionHandle depth = c->Dim(x, -1);
      for (int i : {1, 2}) {
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &vector));
        TF_RETURN_IF_ERROR(c->Merge(depth, c->Dim(vector, 0), &depth));
      }
      c->set_output(0, x);
      return Status();
    })
    .Doc(R"doc(
(x - mean) * rsqrt(variance + epsilon) * gamma + beta, with the mean and
(biased) variance of each row of x's last axis; gamma and beta are [depth].
)doc");

// Cycles per element of a row, for the intra-op sharder: three passes.
constexpr int64_t kCostPerElement = 8;

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
    OP_REQUIRES(ctx, x.dims() >= 1,
                InvalidArgument("x must have rank >= 1, got a scalar"));
    const int64_t depth = x.dim_size(x.dims() - 1);
    for (const Tensor* vector : {&gamma, &beta}) {
      OP_REQUIRES(ctx,
                  TensorShapeUtils::IsVector(vector->shape()) &&
                      vector->dim_size(0) == depth,
                  InvalidArgument("gamma and beta must be [", depth,
                                  "] (x's last dim), got ",
                                  vector->shape().DebugString()));
    }
    Tensor* y;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0,
                                                              x.shape(), &y));
    if (y->NumElements() == 0) return;
    const int64_t rows = x.NumElements() / depth;
    const float* in = x.flat<float>().data();
    float* out = y->flat<float>().data();
    using Row = Eigen::Map<const Eigen::ArrayXf>;
    const Row scale(gamma.flat<float>().data(), depth);
    const Row offset(beta.flat<float>().data(), depth);
    const double epsilon = epsilon_;
    const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    tensorflow::Shard(
        workers->num_threads, workers->workers, rows,
        kCostPerElement * depth, [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            const Row row(in + r * depth, depth);
            const double mean = row.cast<double>().mean();
            const double variance = (row.cast<double>() - mean).square().mean();
            const float inverse =
                static_cast<float>(1.0 / std::sqrt(variance + epsilon));
            // centred in double: a mean rounded to float would be off by
            // half an ulp of the row's offset, much of a narrow row's spread
            Eigen::Map<Eigen::ArrayXf>(out + r * depth, depth) =
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
