/* The machine's float32 FMA peak: independent vector FMA chains per thread,
 * enough of them to cover FMA latency. Prints GFLOP/s for the given thread
 * count. Built and run by bench/peak.py with -O3 -march=native -fopenmp.
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

static void run_chains(vec* acc, long iterations) {
  const vec a = SET1(1.0000001f), b = SET1(0.9999999f);
  for (long i = 0; i < iterations; ++i) {
    for (int c = 0; c < CHAINS; ++c) acc[c] = FMA(acc[c], a, b);
  }
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 1;
  const long iterations = 200000000L / LANES;
  float sink = 0.0f;
  double start = 0.0, stop = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    vec acc[CHAINS];
    for (int c = 0; c < CHAINS; ++c) acc[c] = SET1((float)c);
    run_chains(acc, iterations / 4);  /* warm-up: the threads settle on their own cores */
#pragma omp barrier
#pragma omp single
    start = omp_get_wtime();  /* single's own barrier follows: all start together */
    run_chains(acc, iterations);
#pragma omp barrier
#pragma omp single
    stop = omp_get_wtime();
    for (int c = 0; c < CHAINS; ++c) sink += SUM(acc[c]);
  }
  printf("%.1f\n", 2.0 * LANES * CHAINS * iterations * threads / (stop - start) / 1e9 + 0.0 * sink);
  return 0;
}
