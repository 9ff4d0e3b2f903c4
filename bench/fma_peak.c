/* The machine's float32 FMA peak: independent vector FMA chains per thread,
 * enough of them to cover FMA latency. Prints GFLOP/s for the given thread
 * count. Built and run by bench/peak.py with -O3 -march=native -fopenmp. */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(__AVX512F__)
typedef __m512 vec;
#define LANES 16
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define SET1(x) _mm512_set1_ps(x)
#define SUM(v) _mm512_reduce_add_ps(v)
#else
typedef __m256 vec;
#define LANES 8
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define SET1(x) _mm256_set1_ps(x)
static float SUM(__m256 v) { float f[8]; _mm256_storeu_ps(f, v); return f[0] + f[7]; }
#endif
#define CHAINS 12  /* covers FMA latency x 2 ports; more spills AVX2 registers */

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 1;
  const long iterations = 200000000L / LANES;
  float sink = 0.0f;
  const double start = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    vec acc[CHAINS];
    const vec a = SET1(1.0000001f), b = SET1(0.9999999f);
    for (int c = 0; c < CHAINS; ++c) acc[c] = SET1((float)c);
    for (long i = 0; i < iterations; ++i) {
      for (int c = 0; c < CHAINS; ++c) acc[c] = FMA(acc[c], a, b);
    }
    for (int c = 0; c < CHAINS; ++c) sink += SUM(acc[c]);
  }
  const double seconds = omp_get_wtime() - start;
  printf("%.1f\n", 2.0 * LANES * CHAINS * iterations * threads / seconds / 1e9 + 0.0 * sink);
  return 0;
}
