// The bfloat16 dense op's activation rounding and its AVX2 and AVX-512 BF16
// tiles (AMX: amx_tiles.cc).
#include <immintrin.h>

#include <algorithm>

#include "low_precision_tiles.h"

namespace tf_dietcode {
namespace {

// AVX2 (and AVX-512 without BF16): a weight group's two bfloat16 values per
// column widen to float32 by a 16-bit shift (even k) and a mask (odd k), then
// FMAs with the widened activations.
struct Avx2Bf16 {
  static constexpr int kRows = 4;
  static constexpr int kBlocks = 1;

  template <int R, int NB>
  __attribute__((target("avx2,fma"))) static void Tile(
      const uint8_t* act, int64_t act_stride, const uint8_t* w, int64_t groups,
      float* c) {
    static_assert(NB == 1);
    const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    __m256 acc[R][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* row = w + g * kWeightRowBytes;
      __m256 even[2], odd[2];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256i pairs =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * h));
        even[h] = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
        odd[h] = _mm256_castsi256_ps(_mm256_and_si256(pairs, high));
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const float* x = reinterpret_cast<const float*>(act + r * act_stride) + 2 * g;
        const __m256 xe = _mm256_broadcast_ss(x), xo = _mm256_broadcast_ss(x + 1);
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          acc[r][h] = _mm256_fmadd_ps(even[h], xe, acc[r][h]);
          acc[r][h] = _mm256_fmadd_ps(odd[h], xo, acc[r][h]);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(c + r * kTileColumns, acc[r][0]);
      _mm256_storeu_ps(c + r * kTileColumns + 8, acc[r][1]);
    }
  }
};

// AVX-512 BF16: vdpbf16ps adds a group's two products into each float32 lane.
struct Avx512Bf16 {
  static constexpr int kRows = 8;
  static constexpr int kBlocks = 2;

  template <int R, int NB>
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void
  Tile(const uint8_t* act, int64_t act_stride, const uint8_t* w,
       int64_t groups, float* c) {
    const int64_t block_bytes = groups * kWeightRowBytes;
    if constexpr (R == 1) {
      OneRow<NB>(act, w, block_bytes, groups, c);
      return;
    }
    __m512 acc[R][NB];
#pragma GCC unroll 16
    for (int i = 0; i < R * NB; ++i) acc[i / NB][i % NB] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m512bh wv[NB];
#pragma GCC unroll 2
      for (int b = 0; b < NB; ++b) {
        wv[b] = (__m512bh)_mm512_loadu_si512(w + b * block_bytes +
                                             g * kWeightRowBytes);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512bh x = (__m512bh)_mm512_set1_epi32(
            LoadGroup(act + r * act_stride + g * kGroupBytes));
#pragma GCC unroll 2
        for (int b = 0; b < NB; ++b) {
          acc[r][b] = _mm512_dpbf16_ps(acc[r][b], x, wv[b]);
        }
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < R * NB; ++i) {
      _mm512_storeu_ps(c + (i / NB) * kTileColumns + (i % NB) * kBlockColumns,
                       acc[i / NB][i % NB]);
    }
  }

  // One row (a GEMV, M = 1): as the int8 VNNI tile, the blocks are read one
  // after the other, each a single sequential stream (two groups at a time
  // into two accumulators), instead of side by side (decisions.md,
  // "Precision").
  template <int NB>
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void
  OneRow(const uint8_t* act, const uint8_t* w, int64_t block_bytes,
         int64_t groups, float* c) {
    for (int b = 0; b < NB; ++b) {
      const uint8_t* block = w + b * block_bytes;
      __m512 even = _mm512_setzero_ps(), odd = _mm512_setzero_ps();
      int64_t g = 0;
      for (; g + 2 <= groups; g += 2) {
        even = _mm512_dpbf16_ps(
            even, (__m512bh)_mm512_set1_epi32(LoadGroup(act + g * kGroupBytes)),
            (__m512bh)_mm512_loadu_si512(block + g * kWeightRowBytes));
        odd = _mm512_dpbf16_ps(
            odd,
            (__m512bh)_mm512_set1_epi32(LoadGroup(act + (g + 1) * kGroupBytes)),
            (__m512bh)_mm512_loadu_si512(block + (g + 1) * kWeightRowBytes));
      }
      if (g < groups) {
        even = _mm512_dpbf16_ps(
            even, (__m512bh)_mm512_set1_epi32(LoadGroup(act + g * kGroupBytes)),
            (__m512bh)_mm512_loadu_si512(block + g * kWeightRowBytes));
      }
      _mm512_storeu_ps(c + b * kBlockColumns, _mm512_add_ps(even, odd));
    }
  }
};

constexpr Bf16Kernel kAvx2{{"avx2", Avx2Bf16::kRows, 1,
                            &TileByRows<Avx2Bf16, float>},
                           true};
constexpr Bf16Kernel kAvx512{{"avx512_bf16", Avx512Bf16::kRows, 1,
                              &TileByRows<Avx512Bf16, float>},
                             false};

// 8 floats rounded to bfloat16, in the high half of each lane: to nearest
// even, NaN kept NaN (quietened: rounding could carry its payload into Inf).
__attribute__((target("avx2,fma")))
__m256i RoundToBf16(const float* x) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16),
                                       _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_and_si256(
      _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))),
      high);
  const __m256i nan = _mm256_cmpgt_epi32(
      _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
      _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_and_si256(bits, high),
                                        _mm256_set1_epi32(0x00400000));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

}  // namespace

Bf16Kernel ChooseBf16Kernel(const CpuIsa& isa) {
  if (isa.amx_bf16) return {kAmxBf16Kernel, false};
  if (isa.avx512_bf16) return kAvx512;
  return kAvx2;
}

__attribute__((target("avx2,fma")))
void RoundRowsToBf16(const float* a, int64_t rows, int64_t k, bool widened,
                     uint8_t* out, int64_t stride) {
  alignas(32) float tail[8];
  for (int64_t i = 0; i < rows; ++i) {
    const float* x = a + i * k;
    uint8_t* row = out + i * stride;
    int64_t written = 0;  // bytes
    for (int64_t j = 0; j < k; j += 8) {
      const float* chunk = x + j;
      const int64_t n = std::min<int64_t>(8, k - j);
      if (n < 8) {  // the row's end, zero padded
        std::fill(tail, tail + 8, 0.0f);
        std::copy(chunk, chunk + n, tail);
        chunk = tail;
      }
      const __m256i r = RoundToBf16(chunk);
      if (widened) {
        std::memcpy(row + written, &r, n * 4);
        written += n * 4;
      } else {
        const __m256i h = _mm256_srli_epi32(r, 16);
        const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(h),
                                                _mm256_extracti128_si256(h, 1));
        std::memcpy(row + written, &packed, n * 2);
        written += n * 2;
      }
    }
    std::memset(row + written, 0, stride - written);
  }
}

}  // namespace tf_dietcode
