/* Weights in their stored GGUF format on the cpu backend ("native" weight mode): the
 * in-memory layout of such a weight, and the matrix product and embedding over it.
 *
 * A native weight (an mk_weight: data, format, shape) holds the rows exactly as the GGUF
 * file stores them (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q3_K, Q4_K, Q5_K, Q6_K, F16, BF16), or as F32 for a source in any
 * other format (dequantized once at load); its format says which.
 *
 * Matrix products of few rows (decode): the activation rows are quantized to 8-bit blocks
 * (cpu_quant.h), then output features are split across the pool's threads in chunks;
 * every output element is one dot product of one weight row with one activation row,
 * computed by one thread, so results are identical for any thread count.
 * The formats with an n-row dot in the kernel table (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q3_K-Q6_K
 * in the SIMD tables) take the dots at any row count: each weight row (eight at a time for
 * the blocks of 32) meets up to dotn_rows activation rows per call, and a prompt's rows have the bits
 * they have alone.
 * Products of many rows (prefill, >= MK_NATIVE_GEMM_MIN_ROWS) of the other formats: the
 * weight is cut into tiles of MK_NATIVE_GEMM_TILE output features; the pool's threads take
 * whole tiles, each dequantized exactly into that thread's F32 scratch and multiplied by one
 * OpenBLAS SGEMM call. The tiling depends only on the shape and a tile's result not on the thread that
 * computes it, so this too is independent of the pool's thread count (OpenBLAS's own
 * thread count, OPENBLAS_NUM_THREADS, is the same for every range of a process).
 * F32 weights go to OpenBLAS SGEMM, the same call as the F32 weight mode. */
#ifndef MK_CPU_NATIVE_H
#define MK_CPU_NATIVE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_pool.h"
#include "backend/cpu/cpu_quant.h"
#include "meshkern.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MK_NATIVE_GEMM_MIN_ROWS = 32, MK_NATIVE_GEMM_TILE = 256 };

/* What a native matrix product needs: the threads, the kernels, scratch for the quantized
 * activations (xq_blocks blocks of 32, xk_blocks blocks of 256 for the K-quants) and one dequantized weight tile per thread
 * (wtile_elems floats in all, at least threads x MK_NATIVE_GEMM_TILE x the widest input;
 * NULL = products of many rows use the dot kernels too). Owned by the backend. */
typedef struct mk_cpu_native {
    mk_cpu_pool *pool;
    const mk_cpu_quant *kernels;
    mk_q8_block *xq;
    size_t xq_blocks;
    mk_q8k_block *xk; /* the rows quantized for the K-quants */
    size_t xk_blocks;
    float *wtile;
    size_t wtile_elems;
} mk_cpu_native;

/* Bytes of a native weight [rows, cols] whose source is in ggml `type`:
 * the stored bytes for a kept format, F32 otherwise. 0 for an unknown type or a row
 * length that is not whole blocks. */
size_t mk_cpu_native_weight_bytes(uint32_t type, size_t rows, size_t cols);

/* Write weight w (its data: mk_cpu_native_weight_bytes(type, w->rows, w->cols) bytes) from
 * src in ggml `type` (src_bytes must be exactly the tensor's size); sets w->format. */
mk_status mk_cpu_native_store(mk_weight *w, uint32_t type, const void *src, size_t src_bytes);

/* True when products of MK_NATIVE_GEMM_MIN_ROWS rows or more over a weight stored in
 * `format` take dequantized tiles and SGEMM (wtile): a kept format without an n-row dot in
 * ctx->kernels (F16, BF16; every format in the portable table), from the table alone;
 * false without one (a backend outside native mode). The backend reserves the tiles only
 * once a weight needs them. */
bool mk_cpu_native_takes_tiles(const mk_cpu_native *ctx, uint32_t format);

/* Rows a product of a quantized or 16-bit weight computes each alone (the dot path): any
 * number when the caller asks for it (`alone`, below), for a format with an n-row dot, or
 * where no tiles were reserved. */
size_t mk_cpu_native_rows_alone(const mk_cpu_native *ctx);
/* y[rows, w->rows] = x[rows, w->cols] @ w^T for a native weight w. alone: every row as it
 * would come out alone (the dot path whatever the count: a batch's decode rows, each weight
 * row read once for all of them); else rows >= MK_NATIVE_GEMM_MIN_ROWS of a format without an
 * n-row dot take the tiles. */
mk_status mk_cpu_native_matmul(const mk_cpu_native *ctx, float *y, const float *x, const mk_weight *w, size_t rows,
                               bool alone);

/* y[i] = x @ w[i]^T for n weights [out_dim[i], in] sharing x (Q, K and V): for products of
 * few rows the activations are quantized once and every weight's rows are one job of the
 * pool; otherwise one mk_cpu_native_matmul each. Either way every output has the bits
 * mk_cpu_native_matmul gives it. */
mk_status mk_cpu_native_matmul_shared(const mk_cpu_native *ctx, size_t n, float *const *y, const mk_weight *const *w,
                                      const float *x, size_t rows, bool alone);

/* gate[rows, out] = silu(x @ w_gate^T) * (x @ w_up^T), up [rows, out] scratch: for products of
 * few rows one job in which each thread applies mk_cpu_swiglu to the features it computed;
 * the bits of two mk_cpu_native_matmul and mk_cpu_swiglu either way. */
mk_status mk_cpu_native_matmul_swiglu(const mk_cpu_native *ctx, float *gate, float *up, const float *x,
                                      const mk_weight *w_gate, const mk_weight *w_up, size_t rows, bool alone);

/* out[i, :] = row ids[i] of the native table w [vocab, hidden], as F32. */
mk_status mk_cpu_native_embed(float *out, const mk_weight *w, const int32_t *ids, size_t n);

#ifdef __cplusplus
}
#endif
#endif
