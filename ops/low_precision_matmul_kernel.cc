// CPU kernels of DietcodeFusedMatMulInt8 / DietcodeFusedMatMulBf16 (one op
// class, its two precisions differing in their inputs, activation preparation
// and tiles) and DietcodeLowPrecisionIsa.
//
// A call prepares its activations once (int8: quantized per row; bfloat16:
// rounded), then splits the output into units of one pair of 16-column
// blocks x one tile of rows, numbered block-major, over TF's intra-op pool
// (one task per thread, each a contiguous run of units, as the float32
// kernels' tasks run: intra_op_tasks.h). At M <= 8
// a unit holds every row, so each thread streams its own contiguous part of
// the weight once; at larger M a thread's consecutive units reuse one block
// pair from cache for all its row tiles. Each unit's sums go through the
// precision's write-back and the shared epilogue (bias, activation).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "contraction_plan.h"
#include "cpu_isa.h"
#include "epilogue.h"
#include "huge_pages.h"
#include "intra_op_tasks.h"
#include "low_precision_tiles.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/util/overflow.h"

namespace tf_dietcode {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;

// int32 sums of q * w stay exact: 127 * 127 * K < 2^31.
constexpr int64_t kMaxInt8K = 131072;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// Plans act(a @ w + bias) for a packed weight b of `per_group` values per
// group: checks b's layout against a's K and N, then the rest as
// DietcodeFusedMatMul does.
Status PlanLowPrecisionMatMul(const TensorShape& a, const TensorShape& b,
                              const TensorShape* bias, int64_t n,
                              int64_t per_group, int num_k_dims,
                              const std::vector<int64_t>& n_dims,
                              Activation activation, ContractionPlan* plan) {
  if (b.dims() != 4 || b.dim_size(2) != kBlockColumns ||
      b.dim_size(3) != per_group) {
    return InvalidArgument("b must be a packed weight [ceil(N / ",
                           kBlockColumns, "), ceil(K / ", per_group, "), ",
                           kBlockColumns, ", ", per_group, "], got ",
                           b.DebugString());
  }
  if (b.dim_size(0) != CeilDiv(n, kBlockColumns)) {
    return InvalidArgument("b ", b.DebugString(), " holds ", b.dim_size(0),
                           " blocks of ", kBlockColumns, " columns; n=", n,
                           " needs ", CeilDiv(n, kBlockColumns));
  }
  if (a.dims() < num_k_dims) {
    return InvalidArgument("a must be [..., K] with ", num_k_dims,
                           " contracted dim(s), got ", a.DebugString());
  }
  int64_t k = 1;
  for (int i = a.dims() - num_k_dims; i < a.dims(); ++i) {
    k = tensorflow::MultiplyWithoutOverflow(k, a.dim_size(i));
  }
  if (k < 0) return InvalidArgument("a ", a.DebugString(), " has too large a K");
  if (CeilDiv(k, per_group) != b.dim_size(1)) {
    return InvalidArgument("a ", a.DebugString(), " has K=", k, ", which b ",
                           "packs in ", CeilDiv(k, per_group), " groups of ",
                           per_group, ", but b ", b.DebugString(), " has ",
                           b.dim_size(1));
  }
  // b's element count bounds K * N, so the logical weight's shape is valid.
  return PlanMatMul(a, TensorShape({k, n}), bias, false, false, 0, num_k_dims,
                    n_dims, 1, activation, plan);
}

// Runs `tile` over the output's units (see the file comment) on TF's
// intra-op pool, each task a contiguous run of units, the pool used as the
// TVM kernels use it (intra_op_tasks.h); finish(row0, rows, col0, cols, c)
// writes each unit's sums, in pieces that stay within one layer of
// `layer_n` columns (a unit's two blocks may belong to two layers of a
// horizontally merged weight).
template <class Acc, class Finish>
void RunTiles(OpKernelContext* ctx, const TileKernel<Acc>& kernel,
              const uint8_t* act, int64_t act_stride, const uint8_t* w,
              int64_t groups, int64_t m, int64_t k, int64_t n, int64_t layer_n,
              const Finish& finish) {
  const int64_t blocks = CeilDiv(n, kBlockColumns);
  const int64_t pairs = CeilDiv(blocks, kTileBlocks);
  const int64_t row_tiles = CeilDiv(m, kernel.rows);
  const int64_t units = pairs * row_tiles;
  const int64_t block_bytes = groups * kWeightRowBytes;
  ForRowRuns(*ctx->device()->tensorflow_cpu_worker_threads(), units,
             2.0 * m * n * k, blocks * block_bytes + 4.0 * m * (k + n),
             [&](int64_t first, int64_t end) {
    alignas(64) Acc c[kMaxTileRows * kTileColumns];
    for (int64_t unit = first; unit < end; ++unit) {
      const int64_t block = (unit / row_tiles) * kTileBlocks;
      const int64_t row0 = (unit % row_tiles) * kernel.rows;
      const int rows = static_cast<int>(std::min<int64_t>(kernel.rows, m - row0));
      const int tile_blocks =
          static_cast<int>(std::min<int64_t>(kTileBlocks, blocks - block));
      kernel.tile(act + row0 * act_stride, act_stride, rows,
                  w + block * block_bytes, groups, tile_blocks, c);
      const int64_t col0 = block * kBlockColumns;
      const int64_t cols = std::min(kTileColumns, n - col0);
      const int64_t in_layer =
          layer_n == n ? cols : (col0 / layer_n + 1) * layer_n - col0;
      // One call where the unit lies in one layer: finish written as a loop
      // over pieces ran int8 at M = 2048 twice as slow (measured).
      if (in_layer >= cols) {
        finish(row0, rows, col0, cols, c);
      } else {  // the unit's two blocks belong to two layers
        finish(row0, rows, col0, in_layer, c);
        finish(row0, rows, col0 + in_layer, cols - in_layer, c + in_layer);
      }
    }
  });
}

// Runs fn(row0, row_end) over the rows [0, m) of k floats, prepared into
// `bytes_per_element` each, split on the intra-op pool as the tiles are.
template <class Fn>
void ForRows(OpKernelContext* ctx, int64_t m, int64_t k, double bytes_per_element,
             const Fn& fn) {
  const double elements = static_cast<double>(m) * k;
  ForRowRuns(*ctx->device()->tensorflow_cpu_worker_threads(), m, 4 * elements,
             (sizeof(float) + bytes_per_element) * elements, fn);
}

// The op: attrs, validation and planning shared by both precisions.
class LowPrecisionMatMulOp : public OpKernel {
 public:
  LowPrecisionMatMulOp(OpKernelConstruction* ctx, int64_t per_group)
      : OpKernel(ctx), per_group_(per_group) {
    std::string activation;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("activation", &activation));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_k_dims", &num_k_dims_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n_dims", &n_dims_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("groups", &groups_));
    OP_REQUIRES_OK(ctx, ValidateLowPrecisionGroups(groups_, n_, n_dims_));
    layer_n_ = n_ / groups_;
    activation_ = ParseActivation(activation);
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& a = ctx->input(0);
    const Tensor& b = ctx->input(1);
    tensorflow::OpInputList bias_list;
    OP_REQUIRES_OK(ctx, ctx->input_list("bias", &bias_list));
    OP_REQUIRES(ctx, bias_list.size() <= 1,
                InvalidArgument("at most one bias, got ", bias_list.size()));
    const Tensor* bias = bias_list.size() == 1 ? &bias_list[0] : nullptr;
    ContractionPlan plan;
    OP_REQUIRES_OK(ctx, PlanLowPrecisionMatMul(
                            a.shape(), b.shape(), bias ? &bias->shape() : nullptr,
                            n_, per_group_, num_k_dims_, n_dims_, activation_,
                            &plan));
    OP_REQUIRES_OK(ctx, ValidatePrecisionInputs(ctx, plan));
    TensorShape out_shape = plan.out_shape;
    if (groups_ > 1) {  // group-major: [groups, rows..., N / groups]
      out_shape.set_dim(out_shape.dims() - 1, layer_n_);
      out_shape.InsertDim(0, groups_);
    }
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out));
    if (out->NumElements() == 0) return;
    weight_pages_.Ensure(b);
    Run(ctx, plan, a.flat<float>().data(),
        reinterpret_cast<const uint8_t*>(b.tensor_data().data()),
        bias ? bias->flat<float>().data() : nullptr, out->flat<float>().data());
  }

 protected:
  // Checks the inputs only one precision has.
  virtual Status ValidatePrecisionInputs(OpKernelContext* ctx,
                                         const ContractionPlan& plan) = 0;
  // out = act(a[m, k] @ w + bias), [m, n] or group-major (OutputAt), the
  // plan valid and not empty.
  virtual void Run(OpKernelContext* ctx, const ContractionPlan& plan,
                   const float* a, const uint8_t* b, const float* bias,
                   float* out) = 0;

  // Prepared activation rows: `bytes` per row, padded to kRowAlignment, and
  // rows up to a multiple of `row_padding`.
  static Status AllocateRows(OpKernelContext* ctx, int64_t m, int64_t bytes,
                             int row_padding, Tensor* rows, int64_t* stride) {
    *stride = RoundUp(std::max<int64_t>(bytes, 1), kRowAlignment);
    const int64_t count = RoundUp(m, row_padding);
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_UINT8,
                                          TensorShape({count * *stride}), rows));
    // Rows past m are read (AMX computes whole 16-row tiles), never used.
    std::memset(rows->flat<uint8_t>().data() + m * *stride, 0,
                (count - m) * *stride);
    return Status();
  }

  // Where output (row, col) of the [m, N] product lands: row-major, or
  // group-major when the op computes several layers; the next row's is
  // layer_n() further (col within one layer).
  float* OutputAt(float* out, int64_t m, int64_t row, int64_t col) const {
    const int64_t layer = col / layer_n_;
    return out + (layer * m + row) * layer_n_ + (col - layer * layer_n_);
  }

  // Columns per layer (N unless the op computes several layers).
  int64_t layer_n() const { return layer_n_; }

  // Bias and activation on the written rows.
  static void Epilogue(const ContractionPlan& plan, float* row, int64_t cols,
                       const float* bias) {
    if (HasEpilogue(plan)) ApplyEpilogue(plan, row, cols, bias);
  }

 private:
  const int64_t per_group_;
  int64_t n_;
  int num_k_dims_;
  std::vector<int64_t> n_dims_;
  int64_t groups_, layer_n_;
  Activation activation_;
  HugePageBacking weight_pages_;
};

class Int8MatMulOp : public LowPrecisionMatMulOp {
 public:
  explicit Int8MatMulOp(OpKernelConstruction* ctx)
      : LowPrecisionMatMulOp(ctx, kGroupBytes) {}

 protected:
  Status ValidatePrecisionInputs(OpKernelContext* ctx,
                                 const ContractionPlan& plan) override {
    for (const char* name : {"scale", "column_sums"}) {
      const Tensor* vector;
      TF_RETURN_IF_ERROR(ctx->input(name, &vector));
      if (vector->dims() != 1 || vector->dim_size(0) != plan.n) {
        return InvalidArgument(name, " must have shape [", plan.n,
                               "] (N), got ", vector->shape().DebugString());
      }
    }
    if (plan.k > kMaxInt8K) {
      return InvalidArgument("K=", plan.k, " is above ", kMaxInt8K,
                             ", where int32 sums of int8 products stay exact");
    }
    return Status();
  }

  void Run(OpKernelContext* ctx, const ContractionPlan& plan, const float* a,
           const uint8_t* b, const float* bias, float* out) override {
    const Int8Kernel kernel = ChooseInt8Kernel(UsableIsa());
    const int64_t m = plan.m, k = plan.k, n = plan.n;
    const float* scale = ctx->input(2).flat<float>().data();
    const int32_t* column_sums = ctx->input(3).flat<int32_t>().data();
    Tensor rows, row_scales;
    int64_t stride;
    OP_REQUIRES_OK(ctx, AllocateRows(ctx, m, RoundUp(k, kGroupBytes),
                                     kernel.tile.row_padding, &rows, &stride));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_FLOAT,
                                           TensorShape({m}), &row_scales));
    uint8_t* q = rows.flat<uint8_t>().data();
    float* s = row_scales.flat<float>().data();
    ForRows(ctx, m, k, 1, [&](int64_t begin, int64_t end) {
      QuantizeRows(a + begin * k, end - begin, k, kernel.biased,
                   q + begin * stride, stride, s + begin);
    });
    // The biased sums hold 128 * column_sums more (modulo 2^32, as the
    // kernels add them).
    const uint32_t offset = kernel.biased ? 128 : 0;
    const int64_t layer_n = this->layer_n();
    RunTiles(ctx, kernel.tile, q, stride, b, CeilDiv(k, kGroupBytes), m, k, n,
             layer_n,
             [&](int64_t row0, int rows, int64_t col0, int64_t cols,
                 const int32_t* c) {
               float* const first = OutputAt(out, m, row0, col0);
               for (int i = 0; i < rows; ++i) {
                 float* row = first + i * layer_n;
                 const int32_t* sums = c + i * kTileColumns;
                 const float row_scale = s[row0 + i];
                 if (std::isnan(row_scale)) {  // a row holding NaN or Inf
                   std::fill(row, row + cols,
                             std::numeric_limits<float>::quiet_NaN());
                   continue;
                 }
                 for (int64_t j = 0; j < cols; ++j) {
                   const int32_t exact = static_cast<int32_t>(
                       static_cast<uint32_t>(sums[j]) -
                       offset * static_cast<uint32_t>(column_sums[col0 + j]));
                   row[j] = static_cast<float>(exact) * row_scale * scale[col0 + j];
                 }
                 Epilogue(plan, row, cols, bias ? bias + col0 : nullptr);
               }
             });
  }
};

class Bf16MatMulOp : public LowPrecisionMatMulOp {
 public:
  explicit Bf16MatMulOp(OpKernelConstruction* ctx)
      : LowPrecisionMatMulOp(ctx, kGroupBytes / 2) {}

 protected:
  Status ValidatePrecisionInputs(OpKernelContext*,
                                 const ContractionPlan&) override {
    return Status();
  }

  void Run(OpKernelContext* ctx, const ContractionPlan& plan, const float* a,
           const uint8_t* b, const float* bias, float* out) override {
    const Bf16Kernel kernel = ChooseBf16Kernel(UsableIsa());
    const int64_t m = plan.m, k = plan.k, n = plan.n;
    const int64_t even_k = RoundUp(k, 2);
    Tensor rows;
    int64_t stride;
    OP_REQUIRES_OK(ctx, AllocateRows(ctx, m, even_k * (kernel.widened ? 4 : 2),
                                     kernel.tile.row_padding, &rows, &stride));
    uint8_t* x = rows.flat<uint8_t>().data();
    ForRows(ctx, m, k, kernel.widened ? 4 : 2, [&](int64_t begin, int64_t end) {
      RoundRowsToBf16(a + begin * k, end - begin, k, kernel.widened,
                      x + begin * stride, stride);
    });
    const int64_t layer_n = this->layer_n();
    RunTiles(ctx, kernel.tile, x, stride, b, even_k / 2, m, k, n, layer_n,
             [&](int64_t row0, int rows, int64_t col0, int64_t cols,
                 const float* c) {
               float* const first = OutputAt(out, m, row0, col0);
               for (int i = 0; i < rows; ++i) {
                 float* row = first + i * layer_n;
                 std::copy(c + i * kTileColumns, c + i * kTileColumns + cols, row);
                 Epilogue(plan, row, cols, bias ? bias + col0 : nullptr);
               }
             });
  }
};

// The kernel path of each precision, as JSON.
class LowPrecisionIsaOp : public OpKernel {
 public:
  explicit LowPrecisionIsaOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const CpuIsa isa = UsableIsa();
    Tensor* paths;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {}, &paths));
    paths->scalar<tensorflow::tstring>()() =
        std::string("{\"int8\": \"") + ChooseInt8Kernel(isa).tile.path +
        "\", \"bfloat16\": \"" + ChooseBf16Kernel(isa).tile.path + "\"}";
  }
};

REGISTER_KERNEL_BUILDER(
    Name("DietcodeFusedMatMulInt8").Device(tensorflow::DEVICE_CPU), Int8MatMulOp);
REGISTER_KERNEL_BUILDER(
    Name("DietcodeFusedMatMulBf16").Device(tensorflow::DEVICE_CPU), Bf16MatMulOp);
REGISTER_KERNEL_BUILDER(
    Name("DietcodeLowPrecisionIsa").Device(tensorflow::DEVICE_CPU),
    LowPrecisionIsaOp);

}  // namespace
}  // namespace tf_dietcode
