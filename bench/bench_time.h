/* Timing helpers shared by the benchmark programs (header-only: ceilings.c stays a single
 * self-contained translation unit for bench/run.sh's plain-cc fallback). */
#ifndef MK_BENCH_TIME_H
#define MK_BENCH_TIME_H

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

#endif
