/* The machine's streaming-read bandwidth from DRAM: each thread sums its own
 * part of an array far larger than the last-level cache, with enough vector
 * accumulators to keep loads in flight. Prints GB/s for the given thread
 * count. Built and run by bench/peak.py with -O3 -march=native -fopenmp.
 *
 * This is the limit of a dense layer at small T, whose call reads every weight
 * once and does two flops per weight: weight bytes / time can at best reach it.
 * Pages are first touched by the thread that later reads them. */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#define BYTES (1L << 30)  /* 1 GiB: many times any last-level cache here */
#define REPEATS 5

static float sum_part(const __m256* v, long count) {
  __m256 acc[8];
  for (int c = 0; c < 8; ++c) acc[c] = _mm256_setzero_ps();
  for (long i = 0; i + 8 <= count; i += 8) {
    for (int c = 0; c < 8; ++c) acc[c] = _mm256_add_ps(acc[c], v[i + c]);
  }
  for (int c = 1; c < 8; ++c) acc[0] = _mm256_add_ps(acc[0], acc[c]);
  float f[8];
  _mm256_storeu_ps(f, acc[0]);
  return f[0] + f[7];
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 1;
  const long vectors = BYTES / sizeof(__m256);
  __m256* data = aligned_alloc(64, BYTES);
  if (data == NULL) return 1;
  double best = 1e30, start = 0.0;
  float sink = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    const int t = omp_get_thread_num();
    const long begin = vectors * t / threads, end = vectors * (t + 1) / threads;
    for (long i = begin; i < end; ++i) data[i] = _mm256_set1_ps(1.0f);
    for (int r = 0; r < REPEATS; ++r) {
#pragma omp barrier
#pragma omp single
      start = omp_get_wtime();
      sink += sum_part(data + begin, end - begin);
#pragma omp barrier
#pragma omp single
      {
        const double seconds = omp_get_wtime() - start;
        if (seconds < best) best = seconds;
      }
    }
  }
  printf("%.2f\n", BYTES / best / 1e9);
  free(data);
  return sink == 0.0f ? 2 : 0;  /* keeps the sums from being optimized away */
}
