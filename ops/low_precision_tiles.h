// Micro-kernels of the int8 and bfloat16 dense ops, one per instruction set,
// and the once-per-call preparation of their activations. Each kernel names
// its instruction set in a target attribute, so the library compiles for any
// x86-64 baseline (Bazel builds without setup.py's x86-64-v3); the AVX2 ones
// are the floor these ops need.
//
// Both ops read the packed weight of op_contract.h: blocks of
// kLowPrecisionBlockColumns (16) columns, each block K in groups of
// kLowPrecisionGroupBytes (4) bytes, one 64-byte row per group (16 columns x 4
// int8 or 2 bfloat16 values). A tile call computes the dot products of up to
// `rows` prepared activation rows with up to kTileBlocks consecutive blocks
// over all of K, into a small buffer that the op's epilogue reads.
#ifndef TF_DIETCODE_OPS_LOW_PRECISION_TILES_H_
#define TF_DIETCODE_OPS_LOW_PRECISION_TILES_H_

#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "cpu_isa.h"
#include "op_contract.h"

namespace tf_dietcode {

inline constexpr int64_t kBlockColumns = kLowPrecisionBlockColumns;
inline constexpr int64_t kGroupBytes = kLowPrecisionGroupBytes;
inline constexpr int64_t kWeightRowBytes = kBlockColumns * kGroupBytes;
// A tile call covers at most kTileBlocks blocks and kMaxTileRows rows; its
// results land in c[row * kTileColumns + column].
inline constexpr int kTileBlocks = 2;
inline constexpr int64_t kTileColumns = kTileBlocks * kBlockColumns;
inline constexpr int kMaxTileRows = 16;
// Prepared activation rows start kRowAlignment bytes apart (AMX loads 64-byte
// tile rows).
inline constexpr int64_t kRowAlignment = 64;

// c = act[rows, groups] . w[groups, blocks * 16]: `act` points at the first
// prepared row (rows act_stride bytes apart), `w` at the first block (blocks
// groups * kWeightRowBytes bytes apart).
template <class Acc>
using TileFn = void (*)(const uint8_t* act, int64_t act_stride, int rows,
                        const uint8_t* w, int64_t groups, int blocks, Acc* c);

template <class Acc>
struct TileKernel {
  const char* path;    // the instruction set, as DietcodeLowPrecisionIsa names it
  int rows;            // rows per tile call, at most kMaxTileRows
  int row_padding;     // prepared rows exist up to a multiple of this (AMX: 16)
  TileFn<Acc> tile;
};

// The int8 kernel: q * w in int32. `biased` kernels read the activations as
// u8 = q + 128 (vpdpbusd multiplies unsigned by signed), so their sums hold
// 128 * column_sums[j] more.
struct Int8Kernel {
  TileKernel<int32_t> tile;
  bool biased;
};

// The bfloat16 kernel: products summed in float32. `widened` kernels read the
// activations as float32 (the bfloat16 values widened), 8 bytes per group.
struct Bf16Kernel {
  TileKernel<float> tile;
  bool widened;
};

// The fastest kernel `isa` allows.
Int8Kernel ChooseInt8Kernel(const CpuIsa& isa);
Bf16Kernel ChooseBf16Kernel(const CpuIsa& isa);

// Quantizes rows of a[rows, k] (as the int8 op's doc says) into q (row i at
// q + i * stride, zero padded to stride bytes, each byte q or q + 128 when
// biased) and scale[i]: s_i, NaN for a row holding NaN or Inf (then q = 0).
void QuantizeRows(const float* a, int64_t rows, int64_t k, bool biased,
                  uint8_t* q, int64_t stride, float* scale);

// Rounds rows of a[rows, k] to bfloat16 (to nearest even, NaN kept) into
// out (row i at out + i * stride, zero padded), as bfloat16 or, widened, as
// float32.
void RoundRowsToBf16(const float* a, int64_t rows, int64_t k, bool widened,
                     uint8_t* out, int64_t stride);

// The AMX kernels (amx_tiles.cc): 16 rows per call, the activations padded to
// a multiple of 16 rows.
extern const TileKernel<int32_t> kAmxInt8Kernel;
extern const TileKernel<float> kAmxBf16Kernel;

inline int32_t LoadGroup(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// A TileFn over a family of register-blocked tiles K::Tile<R, NB> (R rows, NB
// blocks, NB = K::kBlocks or 1 for the last odd block), picked by the call's
// rows: one instantiation per row count up to kRows.
template <class K, int R, class Acc>
void TileRows(const uint8_t* act, int64_t act_stride, const uint8_t* w,
              int64_t groups, int blocks, Acc* c) {
  const int64_t block_bytes = groups * kWeightRowBytes;
  int b = 0;
  for (; b + K::kBlocks <= blocks; b += K::kBlocks) {
    K::template Tile<R, K::kBlocks>(act, act_stride, w + b * block_bytes,
                                    groups, c + b * kBlockColumns);
  }
  for (; b < blocks; ++b) {
    K::template Tile<R, 1>(act, act_stride, w + b * block_bytes, groups,
                           c + b * kBlockColumns);
  }
}

template <class K, class Acc, size_t... I>
constexpr auto TileRowsTable(std::index_sequence<I...>) {
  using Fn = void (*)(const uint8_t*, int64_t, const uint8_t*, int64_t, int,
                      Acc*);
  return std::array<Fn, sizeof...(I)>{&TileRows<K, I + 1, Acc>...};
}

template <class K, class Acc>
void TileByRows(const uint8_t* act, int64_t act_stride, int rows,
                const uint8_t* w, int64_t groups, int blocks, Acc* c) {
  static constexpr auto kTable =
      TileRowsTable<K, Acc>(std::make_index_sequence<K::kRows>());
  kTable[rows - 1](act, act_stride, w, groups, blocks, c);
}

}  // namespace tf_dietcode

#endif  // TF_DIETCODE_OPS_LOW_PRECISION_TILES_H_
