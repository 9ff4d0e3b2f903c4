// The int8 dense op's activation quantization and its AVX2 and AVX-512 VNNI
// tiles (AMX: amx_tiles.cc). Both tiles are exact: int32 sums of q * w with
// no saturating step.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "low_precision_tiles.h"

namespace tf_dietcode {
namespace {

// AVX2: vpmaddubsw multiplies u8 by s8 and adds pairs into int16 with
// saturation; |w| (at most 128) times q (at most 127 in magnitude, carrying
// w's sign: vpsignb) keeps each pair within 2 * 128 * 127 = 32512, so
// nothing saturates. vpmaddwd by ones then sums pairs into int32.
struct Avx2Int8 {
  static constexpr int kRows = 4;
  static constexpr int kBlocks = 1;

  template <int R, int NB>
  __attribute__((target("avx2,fma"))) static void Tile(
      const uint8_t* act, int64_t act_stride, const uint8_t* w, int64_t groups,
      int32_t* c) {
    static_assert(NB == 1);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[R][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* row = w + g * kWeightRowBytes;
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
      const __m256i w1 =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32));
      const __m256i abs0 = _mm256_abs_epi8(w0), abs1 = _mm256_abs_epi8(w1);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i x =
            _mm256_set1_epi32(LoadGroup(act + r * act_stride + g * kGroupBytes));
        const __m256i p0 = _mm256_maddubs_epi16(abs0, _mm256_sign_epi8(x, w0));
        const __m256i p1 = _mm256_maddubs_epi16(abs1, _mm256_sign_epi8(x, w1));
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(p0, ones));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(p1, ones));
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      auto* out = reinterpret_cast<__m256i*>(c + r * kTileColumns);
      _mm256_storeu_si256(out, acc[r][0]);
      _mm256_storeu_si256(out + 1, acc[r][1]);
    }
  }
};

// AVX-512 VNNI: vpdpbusd adds four u8 * s8 products into each int32 lane
// without saturation; the activations come biased (q + 128).
struct Avx512VnniInt8 {
  static constexpr int kRows = 8;
  static constexpr int kBlocks = 2;

  template <int R, int NB>
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static void
  Tile(const uint8_t* act, int64_t act_stride, const uint8_t* w,
       int64_t groups, int32_t* c) {
    const int64_t block_bytes = groups * kWeightRowBytes;
    if constexpr (R == 1) {
      OneRow<NB>(act, w, block_bytes, groups, c);
      return;
    }
    __m512i acc[R][NB];
#pragma GCC unroll 16
    for (int i = 0; i < R * NB; ++i) acc[i / NB][i % NB] = _mm512_setzero_si512();
    for (int64_t g = 0; g < groups; ++g) {
      __m512i wv[NB];
#pragma GCC unroll 2
      for (int b = 0; b < NB; ++b) {
        wv[b] = _mm512_loadu_si512(w + b * block_bytes + g * kWeightRowBytes);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i x =
            _mm512_set1_epi32(LoadGroup(act + r * act_stride + g * kGroupBytes));
#pragma GCC unroll 2
        for (int b = 0; b < NB; ++b) {
          acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], x, wv[b]);
        }
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < R * NB; ++i) {
      _mm512_storeu_si512(c + (i / NB) * kTileColumns + (i % NB) * kBlockColumns,
                          acc[i / NB][i % NB]);
    }
  }

  // One row (a GEMV, M = 1): the weight streams from memory once with almost
  // no arithmetic per byte, so the blocks are read one after the other, each
  // as one sequential stream (two groups at a time into two accumulators),
  // instead of side by side as two. BERT-base's 72 layers at M = 1 ran 6-15%
  // faster (decisions.md, "Precision").
  template <int NB>
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static void
  OneRow(const uint8_t* act, const uint8_t* w, int64_t block_bytes,
         int64_t groups, int32_t* c) {
    for (int b = 0; b < NB; ++b) {
      const uint8_t* block = w + b * block_bytes;
      __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
      int64_t g = 0;
      for (; g + 2 <= groups; g += 2) {
        even = _mm512_dpbusd_epi32(
            even, _mm512_set1_epi32(LoadGroup(act + g * kGroupBytes)),
            _mm512_loadu_si512(block + g * kWeightRowBytes));
        odd = _mm512_dpbusd_epi32(
            odd, _mm512_set1_epi32(LoadGroup(act + (g + 1) * kGroupBytes)),
            _mm512_loadu_si512(block + (g + 1) * kWeightRowBytes));
      }
      if (g < groups) {
        even = _mm512_dpbusd_epi32(
            even, _mm512_set1_epi32(LoadGroup(act + g * kGroupBytes)),
            _mm512_loadu_si512(block + g * kWeightRowBytes));
      }
      _mm512_storeu_si512(c + b * kBlockColumns, _mm512_add_epi32(even, odd));
    }
  }
};

constexpr Int8Kernel kAvx2{{"avx2", Avx2Int8::kRows, 1,
                            &TileByRows<Avx2Int8, int32_t>},
                           false};
constexpr Int8Kernel kAvx512Vnni{{"avx512_vnni", Avx512VnniInt8::kRows, 1,
                                  &TileByRows<Avx512VnniInt8, int32_t>},
                                 true};

// max |x| over the row, and whether any element is NaN or Inf.
__attribute__((target("avx2,fma")))
float AbsMax(const float* x, int64_t k, bool* finite) {
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  const __m256i largest = _mm256_set1_epi32(0x7f7fffff);
  __m256i max = _mm256_setzero_si256(), bad = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    // |x| as int32 bits orders like the float |x|.
    const __m256i bits = _mm256_and_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), magnitude);
    max = _mm256_max_epi32(max, bits);
    bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(bits, largest));
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), max);
  int32_t m = *std::max_element(lanes, lanes + 8);
  bool nonfinite = !_mm256_testz_si256(bad, bad);
  for (; i < k; ++i) {
    int32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    bits &= 0x7fffffff;
    m = std::max(m, bits);
    nonfinite |= bits > 0x7f7fffff;
  }
  *finite = !nonfinite;
  float result;
  std::memcpy(&result, &m, sizeof(result));
  return result;
}

// clamp(rint(x / s), -127, 127) of 8 values, as 8 bytes (xor `bias`).
__attribute__((target("avx2,fma")))
int64_t Quantize8(const float* x, __m256 s, __m128i bias) {
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256 v = _mm256_div_ps(_mm256_loadu_ps(x), s);
  v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
  const __m256i q = _mm256_cvtps_epi32(v);
  const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q),
                                      _mm256_extracti128_si256(q, 1));
  return _mm_cvtsi128_si64(_mm_xor_si128(_mm_packs_epi16(q16, q16), bias));
}

}  // namespace

Int8Kernel ChooseInt8Kernel(const CpuIsa& isa) {
  if (isa.amx_int8) return {kAmxInt8Kernel, false};
  if (isa.avx512_vnni) return kAvx512Vnni;
  return kAvx2;
}

__attribute__((target("avx2,fma")))
void QuantizeRows(const float* a, int64_t rows, int64_t k, bool biased,
                  uint8_t* q, int64_t stride, float* scale) {
  const uint8_t zero = biased ? 0x80 : 0;
  const __m128i bias = _mm_set1_epi8(static_cast<char>(zero));
  for (int64_t i = 0; i < rows; ++i) {
    const float* x = a + i * k;
    uint8_t* out = q + i * stride;
    bool finite;
    const float amax = AbsMax(x, k, &finite);
    const float s = amax / 127.0f;
    scale[i] = finite ? s : std::numeric_limits<float>::quiet_NaN();
    int64_t j = 0;
    if (finite && amax > 0.0f) {
      const __m256 sv = _mm256_set1_ps(s);
      for (; j + 8 <= k; j += 8) {
        const int64_t bytes = Quantize8(x + j, sv, bias);
        std::memcpy(out + j, &bytes, sizeof(bytes));
      }
      for (; j < k; ++j) {
        const float v = std::clamp(std::nearbyint(x[j] / s), -127.0f, 127.0f);
        out[j] = static_cast<uint8_t>(static_cast<int8_t>(v)) ^ zero;
      }
    }
    std::memset(out + j, zero, stride - j);
  }
}

}  // namespace tf_dietcode
