/* CPU reference ops: plain C, output first (llm.c style). These are the CPU backend's
 * compute and the reference every CUDA kernel is checked against.
 *
 * Layouts are row-major; shapes are in the comment beside each pointer. All sizes are
 * size_t. Nothing here allocates except mk_cpu_matmul's internal BLAS workspace. */
#ifndef MK_CPU_OPS_H
#define MK_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "core/half.h"
#include "kv_pages.h"
#include "meshkern.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[i, :] = table[ids[i], :]. Caller guarantees ids are < vocab. */
void mk_cpu_embed(float *out /* [n, hidden] */, const float *table /* [vocab, hidden] */,
                  const int32_t *ids /* [n] */, size_t n, size_t hidden);

/* out = x / sqrt(mean(x^2) + eps) * w, per row. Accumulates in double. */
void mk_cpu_rmsnorm(float *out /* [rows, cols] */, const float *x /* [rows, cols] */,
                    const float *w /* [cols] */, size_t rows, size_t cols, float eps);

/* residual += delta; out = rmsnorm(residual, w). */
void mk_cpu_add_rmsnorm(float *residual /* [rows, cols] in/out */, float *out /* [rows, cols] */,
                        const float *delta /* [rows, cols] */, const float *w /* [cols] */,
                        size_t rows, size_t cols, float eps);

/* y += x elementwise. */
void mk_cpu_add(float *y /* [n] */, const float *x /* [n] */, size_t n);

/* Inverse frequency of pair i of a head of size head_dim: theta^(-2i/head_dim), computed in
 * double and rounded to float. The rotation angle of pair i at position p is the float
 * product (float)p * inv_freq(i); cos/sin are taken in double and rounded to float.
 * Kernels must compute the angle the same way. */
float mk_rope_inv_freq(size_t pair, size_t head_dim, float theta);

/* Rotate x in place. Rotate-half pairs (i, i + head_dim/2); adjacent pairs (2i, 2i+1). */
void mk_cpu_rope(float *x /* [rows, n_heads, head_dim] */, const int32_t *positions /* [rows] */,
                 size_t rows, size_t n_heads, size_t head_dim, float theta, mk_rope_layout layout);

/* The same rotation with cos/sin of positions [0, n_positions) read from a table built by
 * mk_cpu_rope_table(table, n_positions, head_dim, theta) (the same values, computed once);
 * positions outside the table are computed. table NULL = mk_cpu_rope. */
void mk_cpu_rope_table(float *table /* [n_positions, head_dim / 2, 2] */, size_t n_positions, size_t head_dim,
                       float theta);
void mk_cpu_rope_cached(float *x /* [rows, n_heads, head_dim] */, const int32_t *positions /* [rows] */,
                        size_t rows, size_t n_heads, size_t head_dim, float theta, mk_rope_layout layout,
                        const float *table, size_t n_positions);

/* Causal grouped-query attention of `rows` new queries against a KV cache.
 * Query row r sits at cache index past + r and attends to cache entries [0, past + r].
 * Query head h reads kv head h / (n_heads / n_kv_heads). Scale 1/sqrt(head_dim).
 * Softmax subtracts the row max, exponentiates in float, sums in double. */
void mk_cpu_attention(float *out /* [rows, n_heads, head_dim] */,
                      const float *q /* [rows, n_heads, head_dim] */,
                      const float *k_cache /* [>= past + rows, n_kv_heads, head_dim] */,
                      const float *v_cache /* [>= past + rows, n_kv_heads, head_dim] */,
                      size_t rows, size_t past, size_t n_heads, size_t n_kv_heads,
                      size_t head_dim);

/* The same for the (row, head) pairs item in [begin, end), item = row * n_heads + head:
 * each pair is computed alone, so any partition of the pairs gives the same bits. The
 * caches are pools read through `pages` (kv_pages.h): key t is at pool row
 * mk_kv_row(pages, t). */
void mk_cpu_attention_heads(float *out, const float *q, const float *k_cache, const float *v_cache,
                            mk_kv_pages pages, size_t begin, size_t end, size_t past, size_t n_heads, size_t n_kv_heads,
                            size_t head_dim);
/* The same over an F16 cache: each element widened to float exactly, then the F32 math. */
void mk_cpu_attention_heads_f16(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                mk_kv_pages pages, size_t begin, size_t end, size_t past, size_t n_heads, size_t n_kv_heads,
                                size_t head_dim);

/* out = silu(gate) * up, silu(g) = g / (1 + exp(-g)). */
void mk_cpu_swiglu(float *out /* [n] */, const float *gate /* [n] */, const float *up /* [n] */,
                   size_t n);

/* out[r] = argmax_j x[r, j]; the lowest index wins ties; NaN never wins. */
void mk_cpu_argmax(int32_t *out /* [rows] */, const float *x /* [rows, n] */, size_t rows,
                   size_t n);

/* y = x @ w^T with w stored row-major [out, in] (the checkpoint layout). F32 SGEMM. */
void mk_cpu_matmul(float *y /* [rows, out_dim] */, const float *x /* [rows, in_dim] */,
                   const float *w /* [out_dim, in_dim] */, size_t rows, size_t in_dim,
                   size_t out_dim);

/* y[r, j] (row stride ldy) = x[r, :] . w[j, :] for w [n, in_dim]: one SGEMM into a column
 * block of a wider output. */
void mk_cpu_sgemm_strided(float *y /* [rows, ldy] */, size_t ldy, const float *x /* [rows, in_dim] */,
                          const float *w /* [n, in_dim] */, size_t rows, size_t in_dim, size_t n);

/* Threads OpenBLAS itself uses per call (OPENBLAS_NUM_THREADS). */
size_t mk_cpu_blas_threads(void);


#ifdef __cplusplus
}
#endif
#endif
