#include "tuned_kernel.h"

#include <algorithm>
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

// The (batch, head) strides of an operand placed by `strides` over
// `batch_dims`: the head is the last batch dim and every earlier dim folds
// into one batch dim, or false when they do not fold (e.g. three batch dims
// whose strides are not row-major). Dims of size 1 place nothing.
bool FoldBatchStrides(const std::vector<int64_t>& batch_dims,
                      const std::vector<int64_t>& strides, int64_t folded[2]) {
  const int heads_dim = static_cast<int>(batch_dims.size()) - 1;
  folded[0] = folded[1] = 0;
  if (heads_dim < 0) return true;
  if (batch_dims[heads_dim] > 1) folded[1] = strides[heads_dim];
  int64_t inner = 0;  // matrices per step of the dim, in folded batches
  for (int i = heads_dim - 1; i >= 0; --i) {
    if (batch_dims[i] == 1) continue;
    if (inner == 0) {
      folded[0] = strides[i];
      inner = 1;
    } else if (strides[i] != folded[0] * inner) {
      return false;
    }
    inner *= batch_dims[i];
  }
  return true;
}

// The call as tuned workloads see it, or nothing when no workload kind
// computes it as planned: a packed b is read as packed (its plan's batch being
// its groups, one [M, N / groups] product each, as one dense product of all N
// columns written group-major); otherwise rows of x, and output rows, must be
// contiguous and the batch at most two strided dims (broadcast batch dims have
// stride 0).
std::optional<TunedCall> Describe(const ContractionPlan& p, const Tensor& b) {
  if (p.transpose_a) return std::nullopt;
  TunedCall call;
  call.dims[kB] = p.batch();
  call.dims[kM] = p.m;
  call.dims[kN] = p.n;
  call.dims[kK] = p.k;
  call.bias = p.has_addend;
  call.activation = p.activation;
  if (p.b_block_cols > 0) {
    call.groups = p.batch();
    call.dims[kB] = 1;
    call.dims[kN] = p.n * p.batch();
    call.packed = true;
    call.packed_blocks = b.dim_size(0);
    call.packed_tile_n = b.dim_size(2);
    return call;
  }
  call.transpose_b = p.transpose_b;
  call.alpha = p.alpha;
  if (p.out_col_stride != 1) return std::nullopt;
  call.heads = p.batch_dims.empty() ? 1 : p.batch_dims.back();
  call.batches = p.batch() / call.heads;
  if (!FoldBatchStrides(p.batch_dims, p.a_batch_strides, call.x_strides) ||
      !FoldBatchStrides(p.batch_dims, p.b_batch_strides, call.y_strides) ||
      !FoldBatchStrides(p.batch_dims, p.out_batch_strides, call.out_strides) ||
      (p.has_addend && !FoldBatchStrides(p.batch_dims, p.addend_batch_strides,
                                         call.addend_strides))) {
    return std::nullopt;
  }
  call.x_strides[2] = p.lda;
  call.y_strides[2] = p.ldb;
  call.out_strides[2] = p.out_row_stride;
  call.x_strides[3] = call.y_strides[3] = call.out_strides[3] = 1;
  call.addend_strides[2] = p.addend_row_stride;
  call.addend_strides[3] = p.addend_col_stride;
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
  const int64_t m = call.dims[kM], n = call.dims[kN], k = call.dims[kK];
  float* out_data = out->flat<float>().data();
  tvm::ffi::AnyView args[5];
  int num_args = 0;
  std::optional<FloatTensorView> views[4];
  auto pass = [&](FloatTensorView& view) {
    args[num_args++] = tvm::ffi::AnyView(view.get());
  };
  if (choice.workload->kind == TunedKind::kDense) {  // x, w, [bias], out
    pass(views[0].emplace(a_data, std::initializer_list<int64_t>{m, k}));
    pass(views[1].emplace(
        b_data, call.packed ? std::initializer_list<int64_t>{b.dim_size(0), k,
                                                             b.dim_size(2)}
                            : std::initializer_list<int64_t>{k, n}));
    if (addend_data != nullptr) {
      pass(views[2].emplace(addend_data, std::initializer_list<int64_t>{n}));
    }
    const int64_t groups = call.groups;
    if (groups == 1) {
      pass(views[3].emplace(out_data, std::initializer_list<int64_t>{m, n}));
    } else {
      pass(views[3].emplace(
          out_data, std::initializer_list<int64_t>{groups, m, n / groups}));
    }
  } else {  // x, y, [addend], alpha, out: [batches, heads, rows, cols], strided
    const int64_t bs = call.batches, hs = call.heads;
    const int64_t* xs = call.x_strides;
    const int64_t* ys = call.y_strides;
    const int64_t* os = call.out_strides;
    const int64_t* as = call.addend_strides;
    pass(views[0].emplace(a_data, std::initializer_list<int64_t>{bs, hs, m, k},
                          std::initializer_list<int64_t>{xs[0], xs[1], xs[2], xs[3]}));
    pass(views[1].emplace(
        b_data,
        call.transpose_b ? std::initializer_list<int64_t>{bs, hs, n, k}
                         : std::initializer_list<int64_t>{bs, hs, k, n},
        std::initializer_list<int64_t>{ys[0], ys[1], ys[2], ys[3]}));
    if (addend_data != nullptr) {
      pass(views[2].emplace(addend_data, std::initializer_list<int64_t>{bs, hs, m, n},
                            std::initializer_list<int64_t>{as[0], as[1], as[2], as[3]}));
    }
    args[num_args++] = tvm::ffi::AnyView(static_cast<double>(call.alpha));
    pass(views[3].emplace(out_data, std::initializer_list<int64_t>{bs, hs, m, n},
                          std::initializer_list<int64_t>{os[0], os[1], os[2], os[3]}));
  }

  RouteBackendCalls(bundle.backend_hooks());
  const double batches = call.dims[kB];
  const PoolUse use = ChoosePoolUse(
      2 * batches * m * n * k, 4 * batches * (m * k + k * n + m * n));
  bundle.CountCall(use);
  ScopedIntraOpPool pool(ctx->device()->tensorflow_cpu_worker_threads(), use);
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
  const std::optional<TunedCall> call = Describe(plan, b);
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
