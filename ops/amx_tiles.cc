// The AMX tiles of the int8 (tdpbssd) and bfloat16 (tdpbf16ps) dense ops.
//
// The packed weight is AMX's B layout as it is: one block's 16 consecutive
// 64-byte group rows are one B tile (16 groups x 16 columns). A tile is 16
// prepared activation rows x 16 groups (64 bytes); the prepared rows are
// padded to a multiple of 16 with zeros, so every call computes 16 rows. K's
// last groups (fewer than 16) use tiles configured with that many groups.
#include <immintrin.h>

#include "low_precision_tiles.h"

namespace tf_dietcode {
namespace {

constexpr int kAmxRows = 16;
constexpr int kGroupsPerTile = 16;

// The tile registers' use (the intrinsics take them as literal numbers): C
// for each of two blocks (tmm0, tmm1), A and B for whole 16-group steps (tmm2;
// tmm3, tmm4), A and B for the last part-step (tmm5; tmm6, tmm7).
enum Tmm { kC0 = 0, kC1 = 1, kA = 2, kB0 = 3, kB1 = 4, kTailA = 5, kTailB0 = 6, kTailB1 = 7 };

// LDTILECFG's 64-byte operand, palette 1.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void Configure(TileConfig* config, int tmm, int rows, int colsb) {
  config->rows[tmm] = static_cast<uint8_t>(rows);
  config->colsb[tmm] = static_cast<uint16_t>(colsb);
}

template <bool kInt8, class Acc>
__attribute__((target("amx-tile,amx-int8,amx-bf16"))) void AmxTile(
    const uint8_t* act, int64_t act_stride, int /*rows: always 16*/,
    const uint8_t* w, int64_t groups, int blocks, Acc* c) {
  const int64_t steps = groups / kGroupsPerTile;
  const int tail = static_cast<int>(groups % kGroupsPerTile);
  const int64_t block_bytes = groups * kWeightRowBytes;
  const int64_t step_bytes = kGroupsPerTile * kWeightRowBytes;
  TileConfig config;
  for (int tmm : {kC0, kC1, kA, kB0, kB1}) {
    Configure(&config, tmm, kAmxRows, kWeightRowBytes);
  }
  if (tail > 0) {
    Configure(&config, kTailA, kAmxRows, tail * kGroupBytes);
    Configure(&config, kTailB0, tail, kWeightRowBytes);
    Configure(&config, kTailB1, tail, kWeightRowBytes);
  }
  // GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes of the
  // configuration; the barrier keeps all 64 stored before it runs.
  __asm__ volatile("" ::: "memory");
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(2, act + s * kGroupsPerTile * kGroupBytes, act_stride);
    _tile_loadd(3, w + s * step_bytes, kWeightRowBytes);
    if constexpr (kInt8) {
      _tile_dpbssd(0, 2, 3);
    } else {
      _tile_dpbf16ps(0, 2, 3);
    }
    if (blocks == 2) {
      _tile_loadd(4, w + block_bytes + s * step_bytes, kWeightRowBytes);
      if constexpr (kInt8) {
        _tile_dpbssd(1, 2, 4);
      } else {
        _tile_dpbf16ps(1, 2, 4);
      }
    }
  }
  if (tail > 0) {
    _tile_loadd(5, act + steps * kGroupsPerTile * kGroupBytes, act_stride);
    _tile_loadd(6, w + steps * step_bytes, kWeightRowBytes);
    if constexpr (kInt8) {
      _tile_dpbssd(0, 5, 6);
    } else {
      _tile_dpbf16ps(0, 5, 6);
    }
    if (blocks == 2) {
      _tile_loadd(7, w + block_bytes + steps * step_bytes, kWeightRowBytes);
      if constexpr (kInt8) {
        _tile_dpbssd(1, 5, 7);
      } else {
        _tile_dpbf16ps(1, 5, 7);
      }
    }
  }
  constexpr int64_t kCStride = kTileColumns * sizeof(Acc);
  _tile_stored(0, c, kCStride);
  if (blocks == 2) _tile_stored(1, c + kBlockColumns, kCStride);
  _tile_release();
}

}  // namespace

const TileKernel<int32_t> kAmxInt8Kernel{"amx_int8", kAmxRows, kAmxRows,
                                         &AmxTile<true, int32_t>};
const TileKernel<float> kAmxBf16Kernel{"amx_bf16", kAmxRows, kAmxRows,
                                       &AmxTile<false, float>};

}  // namespace tf_dietcode
