/* Timing helpers shared by the benchmark programs, and the memory-read loop behind their
 * read ceilings (header-only: ceilings.c stays a single self-contained translation unit
 * for bench/run.sh's plain-cc fallback). */
#ifndef MK_BENCH_TIME_H
#define MK_BENCH_TIME_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* Monotonic wall clock in seconds. */
static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* qsort order for doubles (ascending). */
static inline int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v in place and returns v[n / 2] (the upper middle for even n). */
static inline double median_in_place(double *v, size_t n) {
    qsort(v, n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* Sum of n 64-bit words in four independent chains (the loop is bound by the loads, not by
 * one dependency), asking for the line 4 KiB ahead as the cpu backend's weight dots do: a
 * read ceiling must be at least what the decode itself can stream, and on some machines
 * the hardware prefetcher alone reaches only part of it. */
static inline uint64_t sum_words(const uint64_t *p, size_t n) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __builtin_prefetch((const char *)(p + i) + 4096);
        s0 += p[i] + p[i + 4];
        s1 += p[i + 1] + p[i + 5];
        s2 += p[i + 2] + p[i + 6];
        s3 += p[i + 3] + p[i + 7];
    }
    for (; i < n; i++) s0 += p[i];
    return s0 + s1 + s2 + s3;
}

#endif
