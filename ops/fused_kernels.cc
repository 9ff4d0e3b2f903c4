// CPU kernels of the Dietcode fused ops: read inputs and attrs into a
// ContractionPlan, then run it on the bundle's tuned micro-kernel for the
// shape, or on the generic kernel when none covers it. The only state is the
// dense op's huge-page backing of its weight (thread-safe): Compute is
// thread-safe.
#include <string>
#include <vector>

#include "contraction_plan.h"
#include "generic_kernel.h"
#include "huge_pages.h"
#include "kernel_bundle.h"
#include "tuned_kernel.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_dietcode {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::errors::InvalidArgument;

// Shared body: subclasses only say how their inputs form a plan.
class FusedContractionOp : public OpKernel {
 public:
  explicit FusedContractionOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor* bundle;
    OP_REQUIRES_OK(ctx, ctx->input("bundle", &bundle));
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(bundle->shape()),
                InvalidArgument("bundle must be a scalar string, got shape ",
                                bundle->shape().DebugString()));
    const std::string bundle_path(bundle->scalar<tensorflow::tstring>()());

    ContractionPlan plan;
    const Tensor *a, *b, *addend = nullptr;
    OP_REQUIRES_OK(ctx, Plan(ctx, &a, &b, &addend, &plan));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, plan.out_shape, &out));
    if (out->NumElements() == 0) return;
    if (!bundle_path.empty()) {
      const auto tuned = KernelBundle::Get(bundle_path);
      if (tuned->problem().empty() &&
          RunTunedContraction(ctx, *tuned, plan, *a, *b, addend, out)) {
        return;
      }
    }
    RunGenericContraction(ctx, plan, a->flat<float>().data(),
                          b->flat<float>().data(),
                          addend ? addend->flat<float>().data() : nullptr,
                          out->flat<float>().data());
  }

 protected:
  virtual Status Plan(OpKernelContext* ctx, const Tensor** a, const Tensor** b,
                      const Tensor** addend, ContractionPlan* plan) = 0;
};

class FusedMatMulOp : public FusedContractionOp {
 public:
  explicit FusedMatMulOp(OpKernelConstruction* ctx) : FusedContractionOp(ctx) {
    std::string activation;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose_a", &transpose_a_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose_b", &transpose_b_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("activation", &activation));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("packed_n", &packed_n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_k_dims", &num_k_dims_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n_dims", &n_dims_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("groups", &groups_));
    activation_ = ParseActivation(activation);
  }

 protected:
  Status Plan(OpKernelContext* ctx, const Tensor** a, const Tensor** b,
              const Tensor** addend, ContractionPlan* plan) override {
    tensorflow::OpInputList bias;
    TF_RETURN_IF_ERROR(ctx->input("a", a));
    TF_RETURN_IF_ERROR(ctx->input("b", b));
    TF_RETURN_IF_ERROR(ctx->input_list("bias", &bias));
    if (bias.size() > 1) {
      return InvalidArgument("at most one bias, got ", bias.size());
    }
    if (bias.size() == 1) *addend = &bias[0];
    TF_RETURN_IF_ERROR(PlanMatMul((*a)->shape(), (*b)->shape(),
                                  *addend ? &(*addend)->shape() : nullptr,
                                  transpose_a_, transpose_b_, packed_n_,
                                  num_k_dims_, n_dims_, groups_, activation_,
                                  plan));
    weight_pages_.Ensure(**b);
    return Status();
  }

 private:
  bool transpose_a_, transpose_b_;
  int64_t packed_n_, groups_;
  int num_k_dims_;
  std::vector<int64_t> n_dims_;
  Activation activation_;
  HugePageBacking weight_pages_;
};

// Both batch ops: `perm` is empty for the Add op, `addend` absent for the
// Transpose op.
class FusedBatchMatMulOp : public FusedContractionOp {
 public:
  explicit FusedBatchMatMulOp(OpKernelConstruction* ctx)
      : FusedContractionOp(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("adj_x", &adj_x_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("adj_y", &adj_y_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("alpha", &alpha_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("x_perm", &x_perm_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("y_perm", &y_perm_));
    OP_REQUIRES_OK(ctx, ValidateOperandPermutation(x_perm_, -1, "x_perm"));
    OP_REQUIRES_OK(ctx, ValidateOperandPermutation(y_perm_, -1, "y_perm"));
    has_addend_ = !ctx->HasAttr("perm");
    if (!has_addend_) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("perm", &perm_));
      OP_REQUIRES_OK(ctx, ValidatePermutation(perm_, -1, "perm"));
    }
  }

 protected:
  Status Plan(OpKernelContext* ctx, const Tensor** x, const Tensor** y,
              const Tensor** addend, ContractionPlan* plan) override {
    TF_RETURN_IF_ERROR(ctx->input("x", x));
    TF_RETURN_IF_ERROR(ctx->input("y", y));
    if (has_addend_) TF_RETURN_IF_ERROR(ctx->input("addend", addend));
    return PlanBatchMatMul((*x)->shape(), (*y)->shape(), x_perm_, y_perm_,
                           adj_x_, adj_y_, alpha_,
                           *addend ? &(*addend)->shape() : nullptr, perm_,
                           plan);
  }

 private:
  bool adj_x_, adj_y_, has_addend_;
  float alpha_;
  std::vector<int32_t> x_perm_, y_perm_, perm_;
};

// Calls per tuned kernel and generic calls of one bundle, as JSON.
class BundleStatsOp : public OpKernel {
 public:
  explicit BundleStatsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& bundle = ctx->input(0);
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(bundle.shape()),
                InvalidArgument("bundle must be a scalar string"));
    Tensor* stats;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {}, &stats));
    stats->scalar<tensorflow::tstring>()() =
        KernelBundle::Get(std::string(bundle.scalar<tensorflow::tstring>()()))
            ->StatsJson();
  }
};

REGISTER_KERNEL_BUILDER(
    Name("DietcodeBundleStats").Device(tensorflow::DEVICE_CPU), BundleStatsOp);
REGISTER_KERNEL_BUILDER(
    Name("DietcodeFusedMatMul").Device(tensorflow::DEVICE_CPU), FusedMatMulOp);
REGISTER_KERNEL_BUILDER(
    Name("DietcodeFusedBatchMatMulAdd").Device(tensorflow::DEVICE_CPU),
    FusedBatchMatMulOp);
REGISTER_KERNEL_BUILDER(
    Name("DietcodeFusedBatchMatMulTranspose").Device(tensorflow::DEVICE_CPU),
    FusedBatchMatMulOp);

}  // namespace
}  // namespace tf_dietcode
