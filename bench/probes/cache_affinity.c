/* Does a repeated pass over a buffer find its data in cache only when each core reads the same part as last time?
 *
 * Sums one buffer of BUFFER_FLOATS float32 again and again on two threads, four ways, interleaved in rounds (a seeded
 * new order each round, a block of BLOCK calls each, the block's median kept), and prints GB/s as the median over
 * rounds:
 *   halves   thread t sums half t, one stream
 *   affine   thread t sums pieces PIECES/2·t .. PIECES/2·(t+1) - 1 in order (tgrad's core pool: runtime/llvm/cores.py)
 *   swapped  halves, with the threads' halves exchanged on every call
 *   dynamic  PIECES pieces handed out one at a time (OpenMP schedule(dynamic, 1))
 * With `rotate` as the first argument each call sums the next of three buffers instead (every pass from memory).
 * Build and run: gcc -O3 -march=native -fopenmp bench/probes/cache_affinity.c -o /tmp/affinity && /tmp/affinity
 * (docs/benchmarks.md, "CPU, eleventh session"). */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define BUFFER_FLOATS (16L << 20)   /* 64 MB: twice the 32 MB L3 this VM reports */
#define PIECES 32
#define ROUNDS 10
#define BLOCK 7
#define WAYS 4

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static float sum_run(const float *p, long n) {   /* n a multiple of 64: four 16-lane accumulators */
  __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
  for (long i = 0; i < n; i += 64) {
    a = _mm512_add_ps(a, _mm512_loadu_ps(p + i));      b = _mm512_add_ps(b, _mm512_loadu_ps(p + i + 16));
    c = _mm512_add_ps(c, _mm512_loadu_ps(p + i + 32)); d = _mm512_add_ps(d, _mm512_loadu_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
}

static float sum_way(int way, const float *p, long n) {
  static int flip = 0;
  float total = 0;
  long piece = n / PIECES;
  if (way == 0 || way == 2) {
    if (way == 2) flip ^= 1;
    #pragma omp parallel num_threads(2) reduction(+:total)
    { int half = omp_get_thread_num() ^ (way == 2 ? flip : 0); total += sum_run(p + half * (n / 2), n / 2); }
  } else if (way == 1) {
    #pragma omp parallel num_threads(2) reduction(+:total)
    { int t = omp_get_thread_num();
      for (int k = t * PIECES / 2; k < (t + 1) * PIECES / 2; k++) total += sum_run(p + k * piece, piece); }
  } else {
    #pragma omp parallel for num_threads(2) schedule(dynamic, 1) reduction(+:total)
    for (int k = 0; k < PIECES; k++) total += sum_run(p + k * piece, piece);
  }
  return total;
}

static int by_value(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

int main(int argc, char **argv) {
  int rotate = argc > 1 && strcmp(argv[1], "rotate") == 0, buffers = rotate ? 3 : 1;
  const char *names[WAYS] = {"halves", "affine", "swapped", "dynamic"};
  float *data[WAYS][3];
  for (int w = 0; w < WAYS; w++)
    for (int k = 0; k < buffers; k++) {   /* 2 MB aligned, huge pages asked for, as numpy's big arrays have them */
      data[w][k] = aligned_alloc(2 << 20, BUFFER_FLOATS * sizeof(float));
      madvise(data[w][k], BUFFER_FLOATS * sizeof(float), MADV_HUGEPAGE);
      for (long i = 0; i < BUFFER_FLOATS; i++) data[w][k][i] = (float)(i % 7) * 0.25f;
    }
  double per_round[WAYS][ROUNDS];
  int order[WAYS] = {0, 1, 2, 3}, next[WAYS] = {0};
  volatile float sink = 0;
  srand(0);
  for (int r = 0; r < ROUNDS; r++) {
    for (int i = WAYS - 1; i > 0; i--) { int j = rand() % (i + 1), t = order[i]; order[i] = order[j]; order[j] = t; }
    for (int o = 0; o < WAYS; o++) {
      int w = order[o];
      double times[BLOCK];
      sink += sum_way(w, data[w][next[w]++ % buffers], BUFFER_FLOATS);   /* untimed: the threads awake */
      for (int b = 0; b < BLOCK; b++) {
        double start = now();
        sink += sum_way(w, data[w][next[w]++ % buffers], BUFFER_FLOATS);
        times[b] = now() - start;
      }
      qsort(times, BLOCK, sizeof(double), by_value);
      per_round[w][r] = times[BLOCK / 2];
    }
  }
  printf("%s buffer%s, GB/s (median of %d rounds):", rotate ? "three rotating" : "one", rotate ? "s" : "", ROUNDS);
  for (int w = 0; w < WAYS; w++) {
    qsort(per_round[w], ROUNDS, sizeof(double), by_value);
    printf("  %s %.1f", names[w], BUFFER_FLOATS * sizeof(float) / per_round[w][ROUNDS / 2] / 1e9);
  }
  printf("\n");
  return sink == 12345.0f;   /* keeps the sums */
}
