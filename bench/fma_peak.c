/* The machine's multiply-add peak: independent vector chains per thread,
 * enough of them to cover the instruction's latency. Prints G(FL)OP/s for the
 * given thread count and instruction, each multiply-add counted as two:
 *   fma   float32 FMA (the float32 kernels' instruction)
 *   bf16  bfloat16 pair dot products into float32 (vdpbf16ps, AVX-512 BF16)
 *   int8  u8 x s8 quad dot products into int32 (vpdpbusd with AVX-512 VNNI or
 *         AVX-VNNI; else AVX2's vpmaddubsw, vpmaddwd and vpaddd, as the AVX2
 *         int8 kernel multiplies)
 * and exits 2 without a figure where the CPU (as -march=native sees it) lacks
 * the instruction. Built and run by bench/peak.py with -O3 -march=native
 * -fopenmp.
 *
 * The threads run a warm-up before a barrier, and only the loop after it is
 * timed: on a 2-core Zen 3 a new OpenMP thread often started on its parent's
 * vCPU and moved only milliseconds later, so a run timed from the parallel
 * region's start read 158-171 GFLOP/s on 2 threads where the settled threads
 * reach ~200 (two 1-thread processes side by side: 98-102 each). */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
typedef __m512 vec;
typedef __m512i ivec;
#define LANES 16
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define SET1(x) _mm512_set1_ps(x)
#define ISET1(x) _mm512_set1_epi32(x)
#define SUM(v) _mm512_reduce_add_ps(v)
#define ISUM(v) _mm512_reduce_add_epi32(v)
#else
typedef __m256 vec;
typedef __m256i ivec;
#define LANES 8
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define SET1(x) _mm256_set1_ps(x)
#define ISET1(x) _mm256_set1_epi32(x)
static float SUM(__m256 v) { float f[8]; _mm256_storeu_ps(f, v); return f[0] + f[7]; }
static int ISUM(__m256i v) { int f[8]; _mm256_storeu_si256((__m256i*)f, v); return f[0] + f[7]; }
#endif
#define CHAINS 12  /* covers FMA latency x 2 ports; more spills AVX2 registers */

/* One instruction's loop: `step` applied to every chain per iteration, and
 * the multiply-adds one step does per lane. */
#define DEFINE_LOOP(name, type, set1, sum, a_value, b_value, step, per_lane)    \
  static double name(long iterations, float* sink) {                           \
    const type a = set1(a_value), b = set1(b_value);                           \
    type acc[CHAINS];                                                          \
    for (int c = 0; c < CHAINS; ++c) acc[c] = set1(c);                         \
    for (long i = 0; i < iterations; ++i) {                                    \
      for (int c = 0; c < CHAINS; ++c) acc[c] = step(acc[c], a, b);            \
    }                                                                          \
    for (int c = 0; c < CHAINS; ++c) *sink += (float)sum(acc[c]);              \
    return (double)per_lane * LANES * CHAINS * iterations;                     \
  }

DEFINE_LOOP(fma_loop, vec, SET1, SUM, 1.0000001f, 0.9999999f, FMA, 1)

#if defined(__AVX512BF16__)
static __m512 Bf16Step(__m512 acc, __m512 a, __m512 b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_castps_si512(a), (__m512bh)_mm512_castps_si512(b));
}
DEFINE_LOOP(bf16_loop, vec, SET1, SUM, 1.0f, 1.0f, Bf16Step, 2)
#define HAS_BF16 1
#endif

#if defined(__AVX512VNNI__)
#define Int8Step(acc, a, b) _mm512_dpbusd_epi32(acc, a, b)
#define HAS_INT8 1
#elif defined(__AVXVNNI__) && !defined(__AVX512F__)
#define Int8Step(acc, a, b) _mm256_dpbusd_avx_epi32(acc, a, b)
#define HAS_INT8 1
#elif !defined(__AVX512F__)
#define HAS_INT8 1
/* The products read the chain (its bytes as the unsigned operand), or the
 * compiler would hoist them out of the loop as constants. */
static __m256i Int8Step(__m256i acc, __m256i a, __m256i b) {
  const __m256i pairs = _mm256_maddubs_epi16(acc, b);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, a));
}
#endif
#if defined(HAS_INT8)
DEFINE_LOOP(int8_loop, ivec, ISET1, ISUM, 0x00010001, 0x01010101, Int8Step, 4)
#endif

typedef double (*Loop)(long, float*);

static Loop loop_named(const char* name) {
  if (strcmp(name, "fma") == 0) return fma_loop;
#if defined(HAS_BF16)
  if (strcmp(name, "bf16") == 0) return bf16_loop;
#endif
#if defined(HAS_INT8)
  if (strcmp(name, "int8") == 0) return int8_loop;
#endif
  return NULL;
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 1;
  const Loop loop = loop_named(argc > 2 ? argv[2] : "fma");
  if (loop == NULL) {
    fprintf(stderr, "%s: not on this CPU\n", argc > 2 ? argv[2] : "fma");
    return 2;
  }
  const long iterations = 200000000L / LANES;
  float sink = 0.0f;
  double start = 0.0, stop = 0.0, multiply_adds = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : sink, multiply_adds)
  {
    loop(iterations / 4, &sink);  /* warm-up: the threads settle on their own cores */
#pragma omp barrier
#pragma omp single
    start = omp_get_wtime();  /* single's own barrier follows: all start together */
    multiply_adds += loop(iterations, &sink);
#pragma omp barrier
#pragma omp single
    stop = omp_get_wtime();
  }
  printf("%.1f\n", 2.0 * multiply_adds / (stop - start) / 1e9 + 0.0 * sink);
  return 0;
}
