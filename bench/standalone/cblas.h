/* Stand-in for <cblas.h> in bench/gpu_check.sh's standalone build (a GPU machine without
 * OpenBLAS): host/cpu_ops.c compiles against it; mk_cpu_matmul is not used by the kernel
 * checks and aborts if called. */
#ifndef MK_STANDALONE_CBLAS_H
#define MK_STANDALONE_CBLAS_H
#include <stdio.h>
#include <stdlib.h>
typedef int blasint;
enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 };
static inline void cblas_sgemm(enum CBLAS_ORDER o, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, blasint m,
                               blasint n, blasint k, float alpha, const float *a, blasint lda, const float *b,
                               blasint ldb, float beta, float *c, blasint ldc) {
    (void)o, (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb;
    (void)beta, (void)c, (void)ldc;
    fprintf(stderr, "standalone build: cblas_sgemm is not available\n");
    abort();
}
/* cpu_ops.c sizes its thread split by OpenBLAS's pool; the standalone build has none. */
static inline int openblas_get_num_threads(void) { return 1; }
#endif
