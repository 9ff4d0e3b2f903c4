#include "generic_kernel.h"

#include <algorithm>
#include <vector>

#include "Eigen/Core"
#include "epilogue.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tf_dietcode {
namespace {

using RowMajor =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstView =
    Eigen::Map<const RowMajor, Eigen::Unaligned, Eigen::OuterStride<>>;
using View = Eigen::Map<RowMajor, Eigen::Unaligned, Eigen::OuterStride<>>;

// Tiles small enough to give every thread several tasks, large enough that
// re-packing an operand per tile stays cheap next to the arithmetic.
constexpr int64_t kTasksPerThread = 4;
constexpr int64_t kMinTileRows = 16;
constexpr int64_t kMinTileCols = 64;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Tiling {
  int64_t rows = 0, cols = 0;            // tile size
  int64_t row_tiles = 0, col_tiles = 0;  // tiles per output matrix
};

Tiling ChooseTiling(const ContractionPlan& plan, int threads) {
  const int64_t wanted = CeilDiv(threads * kTasksPerThread, plan.batch());
  Tiling t;
  t.row_tiles = std::clamp<int64_t>(CeilDiv(plan.m, kMinTileRows), 1, wanted);
  t.col_tiles = std::clamp<int64_t>(CeilDiv(plan.n, kMinTileCols), 1,
                                    CeilDiv(wanted, t.row_tiles));
  t.rows = CeilDiv(plan.m, t.row_tiles);
  t.cols = CeilDiv(plan.n, t.col_tiles);
  return t;
}

// c[rows, cols] (row stride ldc) = op(a)[rows, k] @ op(b)[k, cols], where a
// and b point at the tile's first row of op(a) and first column of op(b).
template <bool kTransA, bool kTransB>
void GemmTile(const ContractionPlan& p, const float* a, const float* b,
              int64_t rows, int64_t cols, float* c, int64_t ldc) {
  View out(c, rows, cols, Eigen::OuterStride<>(ldc));
  const ConstView lhs(a, kTransA ? p.k : rows, kTransA ? rows : p.k,
                      Eigen::OuterStride<>(p.lda));
  const ConstView rhs(b, kTransB ? cols : p.k, kTransB ? p.k : cols,
                      Eigen::OuterStride<>(p.ldb));
  if constexpr (kTransA && kTransB) {
    out.noalias() = lhs.transpose() * rhs.transpose();
  } else if constexpr (kTransA) {
    out.noalias() = lhs.transpose() * rhs;
  } else if constexpr (kTransB) {
    out.noalias() = lhs * rhs.transpose();
  } else {
    out.noalias() = lhs * rhs;
  }
}

void Gemm(const ContractionPlan& p, const float* a, const float* b,
          int64_t rows, int64_t cols, float* c, int64_t ldc) {
  if (p.k == 0) {
    View(c, rows, cols, Eigen::OuterStride<>(ldc)).setZero();
  } else if (p.transpose_a) {
    p.transpose_b ? GemmTile<true, true>(p, a, b, rows, cols, c, ldc)
                  : GemmTile<true, false>(p, a, b, rows, cols, c, ldc);
  } else {
    p.transpose_b ? GemmTile<false, true>(p, a, b, rows, cols, c, ldc)
                  : GemmTile<false, false>(p, a, b, rows, cols, c, ldc);
  }
}

// c[rows, cols] = op(a)[rows, k] @ op(b)[k, col0:col0+cols]; `b` points at
// the batch's b. A packed b is walked block by block.
void GemmColumns(const ContractionPlan& p, const float* a, const float* b,
                 int64_t rows, int64_t col0, int64_t cols, float* c,
                 int64_t ldc) {
  if (p.b_block_cols == 0) {
    Gemm(p, a, b + col0 * (p.transpose_b ? p.ldb : 1), rows, cols, c, ldc);
    return;
  }
  for (int64_t j = col0; j < col0 + cols;) {
    const int64_t in_block = j % p.b_block_cols;
    const int64_t width = std::min(p.b_block_cols - in_block, col0 + cols - j);
    Gemm(p, a, b + (j / p.b_block_cols) * p.b_block_stride + in_block, rows,
         width, c + (j - col0), ldc);
    j += width;
  }
}

// Computes one tile: product, epilogue, and placement in the output. Tiles
// whose rows are contiguous in the output are computed in place; others (an
// output permutation that moves the last axis) go through `scratch`.
void RunTile(const ContractionPlan& p, const float* a, const float* b,
             const float* addend, float* out, int64_t batch, int64_t row0,
             int64_t col0, int64_t rows, int64_t cols,
             std::vector<float>* scratch) {
  const float* a_tile = a + p.BatchOffset(p.a_batch_strides, batch) +
                       row0 * (p.transpose_a ? 1 : p.lda);
  float* out_tile = out + p.BatchOffset(p.out_batch_strides, batch) +
                    row0 * p.out_row_stride + col0 * p.out_col_stride;
  const bool in_place = p.out_col_stride == 1;
  float* c = out_tile;
  int64_t ldc = p.out_row_stride;
  if (!in_place) {
    scratch->resize(rows * cols);
    c = scratch->data();
    ldc = cols;
  }
  GemmColumns(p, a_tile, b + p.BatchOffset(p.b_batch_strides, batch), rows,
              col0, cols, c, ldc);

  if (HasEpilogue(p)) {
    const float* addend_tile =
        p.has_addend ? addend + p.BatchOffset(p.addend_batch_strides, batch) +
                           row0 * p.addend_row_stride +
                           col0 * p.addend_col_stride
                     : nullptr;
    for (int64_t i = 0; i < rows; ++i) {
      ApplyEpilogue(p, c + i * ldc, cols,
                    p.has_addend ? addend_tile + i * p.addend_row_stride
                                 : nullptr);
    }
  }
  if (!in_place) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        out_tile[i * p.out_row_stride + j * p.out_col_stride] = c[i * ldc + j];
      }
    }
  }
}

}  // namespace

void RunGenericContraction(tensorflow::OpKernelContext* ctx,
                           const ContractionPlan& plan, const float* a,
                           const float* b, const float* addend, float* out) {
  if (plan.batch() == 0 || plan.m == 0 || plan.n == 0) return;
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const Tiling t = ChooseTiling(plan, workers->num_threads);
  const int64_t tiles_per_batch = t.row_tiles * t.col_tiles;
  const int64_t cost_per_tile = 2 * t.rows * t.cols * std::max<int64_t>(plan.k, 1);
  tensorflow::Shard(
      workers->num_threads, workers->workers, plan.batch() * tiles_per_batch,
      cost_per_tile, [&](int64_t begin, int64_t end) {
        std::vector<float> scratch;
        for (int64_t task = begin; task < end; ++task) {
          const int64_t batch = task / tiles_per_batch;
          const int64_t tile = task % tiles_per_batch;
          const int64_t row0 = (tile / t.col_tiles) * t.rows;
          const int64_t col0 = (tile % t.col_tiles) * t.cols;
          const int64_t rows = std::min(t.rows, plan.m - row0);
          const int64_t cols = std::min(t.cols, plan.n - col0);
          if (rows <= 0 || cols <= 0) continue;
          RunTile(plan, a, b, addend, out, batch, row0, col0, rows, cols,
                  &scratch);
        }
      });
}

}  // namespace tf_dietcode
