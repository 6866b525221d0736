/* Stand-in for <cblas.h> in the GPU check's standalone build (bench/standalone/build.sh, a
 * GPU machine without OpenBLAS): host/backend/cpu/cpu_ops.c compiles against it. cblas_sgemm is a plain
 * triple loop with double accumulation (row-major, either operand transposed): slow, but
 * right, so the op grid's CPU references (mk_cpu_matmul) hold there too. */
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
    if (o != CblasRowMajor) {
        fprintf(stderr, "standalone cblas_sgemm: only row-major is implemented\n");
        abort();
    }
    for (blasint i = 0; i < m; i++)
        for (blasint j = 0; j < n; j++) {
            double acc = 0.0;
            for (blasint p = 0; p < k; p++) {
                const float av = ta == CblasNoTrans ? a[(size_t)i * lda + p] : a[(size_t)p * lda + i];
                const float bv = tb == CblasNoTrans ? b[(size_t)p * ldb + j] : b[(size_t)j * ldb + p];
                acc += (double)av * bv;
            }
            float *cij = &c[(size_t)i * ldc + j];
            *cij = (float)(alpha * acc + (beta == 0.0f ? 0.0 : (double)beta * *cij));
        }
}
/* cpu_ops.c sizes its thread split by OpenBLAS's pool; the standalone build has none. */
static inline int openblas_get_num_threads(void) { return 1; }
#endif
