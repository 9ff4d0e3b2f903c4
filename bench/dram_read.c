/* The machine's DRAM read bandwidth: threads sum a 512 MiB float32 buffer (16x a 32 MiB
 * last-level cache) with vector loads, each its own contiguous part. Prints GB/s for the given
 * thread count (the best of a few passes: a bandwidth is a maximum). Built and run by
 * bench/peak.py with -O3 -march=native -fopenmp.
 *
 * Four independent accumulators per thread keep the adds off the critical path, so the loop
 * waits on memory alone. The threads first touch their own part (pages land where they read) and
 * run an untimed pass before a barrier, as fma_peak.c does. */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#if defined(__AVX512F__)
typedef __m512 vec;
#define LANES 16
#define LOAD(p) _mm512_load_ps(p)
#define ADD(a, b) _mm512_add_ps(a, b)
#define ZERO() _mm512_setzero_ps()
#define SUM(v) _mm512_reduce_add_ps(v)
#else
typedef __m256 vec;
#define LANES 8
#define LOAD(p) _mm256_load_ps(p)
#define ADD(a, b) _mm256_add_ps(a, b)
#define ZERO() _mm256_setzero_ps()
static float SUM(__m256 v) { float f[8]; _mm256_storeu_ps(f, v); return f[0] + f[7]; }
#endif
#define BYTES (512L << 20)
#define PASSES 5

static float sum_part(const float* p, long n) {
  vec a0 = ZERO(), a1 = ZERO(), a2 = ZERO(), a3 = ZERO();
  for (long i = 0; i < n; i += 4 * LANES) {
    a0 = ADD(a0, LOAD(p + i));
    a1 = ADD(a1, LOAD(p + i + LANES));
    a2 = ADD(a2, LOAD(p + i + 2 * LANES));
    a3 = ADD(a3, LOAD(p + i + 3 * LANES));
  }
  return SUM(ADD(ADD(a0, a1), ADD(a2, a3)));
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 1;
  const long n = BYTES / sizeof(float), part = n / threads / (4 * LANES) * (4 * LANES);
  float* data = aligned_alloc(2L << 20, BYTES);
  double best = 0.0, start = 0.0;
  float sink = 0.0f;
  if (data == NULL) return 1;
  madvise(data, BYTES, MADV_HUGEPAGE);  /* as numpy's large arrays: on a VM, 4 KiB pages' walks cost bandwidth */
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    float* mine = data + omp_get_thread_num() * part;
    for (long i = 0; i < part; ++i) mine[i] = (float)(i & 7);
    sink += sum_part(mine, part);  /* warm-up */
    for (int pass = 0; pass < PASSES; ++pass) {
#pragma omp barrier
#pragma omp single
      start = omp_get_wtime();  /* single's own barrier follows: all start together */
      sink += sum_part(mine, part);
#pragma omp barrier
#pragma omp single
      {
        double seconds = omp_get_wtime() - start;
        if (part * threads * sizeof(float) / seconds > best) best = part * threads * sizeof(float) / seconds;
      }
    }
  }
  printf("%.1f\n", best / 1e9 + 0.0 * sink);
  free(data);
  return 0;
}
