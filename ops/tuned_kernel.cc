#include "tuned_kernel.h"

#include <cstdint>
#include <cstring>
#include <optional>

#include "tvm/ffi/any.h"
#include "tvm/ffi/container/tensor.h"
#include "tvm_bridge.h"

namespace tf_dietcode {
namespace {

using tensorflow::Tensor;

// TVM kernels assume their buffers are this aligned (and may use aligned
// vector loads), but TF slices can start anywhere.
constexpr uintptr_t kKernelAlignment = 64;

// The call as tuned workloads see it, or nothing when no workload kind
// computes it as planned: dense needs a packed weight; a batch matmul needs
// whole (not broadcast) batches, no epilogue and the product's own layout.
std::optional<TunedCall> Describe(const ContractionPlan& p, const Tensor& a,
                                  const Tensor& b) {
  if (p.transpose_a) return std::nullopt;
  TunedCall call;
  call.dims[kB] = p.batch();
  call.dims[kM] = p.m;
  call.dims[kN] = p.n;
  call.dims[kK] = p.k;
  if (p.b_block_cols > 0) {
    call.kind = TunedKind::kDense;
    call.bias = p.has_addend;
    call.activation = p.activation;
    call.packed_blocks = b.dim_size(0);
    call.packed_tile_n = b.dim_size(2);
    return call;
  }
  call.kind = TunedKind::kBatchMatMul;
  call.transpose_b = p.transpose_b;
  const int64_t batch = p.batch();
  if (p.alpha != 1.0f || p.has_addend || p.activation != Activation::kNone ||
      a.NumElements() != batch * p.m * p.k ||
      b.NumElements() != batch * p.k * p.n || p.out_col_stride != 1 ||
      p.out_row_stride != p.n) {
    return std::nullopt;
  }
  for (int64_t i = 0; i < batch; ++i) {
    if (p.out_offsets[i] != i * p.m * p.n) return std::nullopt;
  }
  return call;
}

// The tensor's data, copied into `copy` only when misaligned.
tensorflow::Status AlignedData(tensorflow::OpKernelContext* ctx,
                               const Tensor& tensor, Tensor* copy,
                               const float** data) {
  *data = tensor.flat<float>().data();
  if (reinterpret_cast<uintptr_t>(*data) % kKernelAlignment == 0) {
    return tensorflow::Status();
  }
  TF_RETURN_IF_ERROR(
      ctx->allocate_temp(tensorflow::DT_FLOAT, tensor.shape(), copy));
  std::memcpy(copy->flat<float>().data(), *data,
              tensor.NumElements() * sizeof(float));
  *data = copy->flat<float>().data();
  return tensorflow::Status();
}

// Calls the chosen kernel on the op's buffers.
tensorflow::Status CallKernel(tensorflow::OpKernelContext* ctx,
                              const KernelBundle& bundle,
                              const KernelBundle::Choice& choice,
                              const TunedCall& call, const Tensor& a,
                              const Tensor& b, const Tensor* addend,
                              Tensor* out) {
  const float *a_data, *b_data, *addend_data = nullptr;
  Tensor copies[3];  // aligned copies of misaligned inputs, alive until the call ends
  TF_RETURN_IF_ERROR(AlignedData(ctx, a, &copies[0], &a_data));
  TF_RETURN_IF_ERROR(AlignedData(ctx, b, &copies[1], &b_data));
  if (addend != nullptr) {
    TF_RETURN_IF_ERROR(AlignedData(ctx, *addend, &copies[2], &addend_data));
  }
  const int64_t batch = call.dims[kB], m = call.dims[kM], n = call.dims[kN],
                k = call.dims[kK];
  float* out_data = out->flat<float>().data();
  std::optional<FloatTensorView> x, w, bias, result;
  if (call.kind == TunedKind::kDense) {
    x.emplace(a_data, std::initializer_list<int64_t>{m, k});
    w.emplace(b_data, std::initializer_list<int64_t>{b.dim_size(0), k, b.dim_size(2)});
    if (addend_data != nullptr) bias.emplace(addend_data, std::initializer_list<int64_t>{n});
    result.emplace(out_data, std::initializer_list<int64_t>{m, n});
  } else {
    x.emplace(a_data, std::initializer_list<int64_t>{batch, m, k});
    w.emplace(b_data, call.transpose_b ? std::initializer_list<int64_t>{batch, n, k}
                                       : std::initializer_list<int64_t>{batch, k, n});
    result.emplace(out_data, std::initializer_list<int64_t>{batch, m, n});
  }
  tvm::ffi::AnyView args[4];
  int num_args = 0;
  for (auto* view : {&x, &w, &bias, &result}) {
    if (view->has_value()) args[num_args++] = tvm::ffi::AnyView((*view)->get());
  }

  RouteParallelLaunch(bundle.parallel_launch_hook());
  ScopedIntraOpPool pool(ctx->device()->tensorflow_cpu_worker_threads());
  try {
    tvm::ffi::Any unused;
    choice.workload->kernels[choice.kernel].CallPacked(args, num_args, &unused);
  } catch (const std::exception& e) {
    return tensorflow::errors::Internal(
        "tuned kernel ", choice.workload->kernel_names[choice.kernel],
        " failed: ", e.what());
  }
  return tensorflow::Status();
}

}  // namespace

bool RunTunedContraction(tensorflow::OpKernelContext* ctx,
                         const KernelBundle& bundle,
                         const ContractionPlan& plan, const Tensor& a,
                         const Tensor& b, const Tensor* addend, Tensor* out) {
  const std::optional<TunedCall> call = Describe(plan, a, b);
  if (!call.has_value()) {
    bundle.CountGenericCall();
    return false;
  }
  const KernelBundle::Choice choice = bundle.Choose(*call);
  if (choice.workload == nullptr) return false;
  ctx->SetStatus(CallKernel(ctx, bundle, choice, *call, a, b, addend, out));
  return true;
}

}  // namespace tf_dietcode
