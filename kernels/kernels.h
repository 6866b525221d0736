/* C entries of the hand-written CUDA kernels (the .cu files in kernels/). Each entry checks shapes and
 * dtypes, launches on the given stream, checks the launch, and returns a status (the
 * message is recorded through mk_fail). No allocation, no policy, no synchronisation.
 *
 * Every pointer is device memory. Shapes are in the comment beside each pointer; rows are
 * contiguous. The same sources compile with nvcc (real GPU) and with the host compiler
 * under tests/cudasim (CPU execution with CUDA semantics). The CPU reference of each op
 * is the function of the same name in host/backend/cpu/cpu_ops.h. */
#ifndef MK_KERNELS_H
#define MK_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kv_pages.h"
#include "meshkern.h"

/* The runtime's types (cudaStream_t); under cudasim the same header supplies them. */
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[i, :] = table[ids[i], :] converted to F32. table dtype F32, F16 or BF16. Ids outside
 * [0, vocab) produce a zero row (the executor validates ids before upload). */
mk_status mk_kernel_embed(float *out /* [n, hidden] */, const void *table /* [vocab, hidden] */, mk_dtype table_dtype,
                          const int32_t *ids /* [n] */, size_t n, size_t hidden, size_t vocab, cudaStream_t stream);

/* out = x * rsqrt(mean(x^2) + eps) * w per row. */
mk_status mk_kernel_rmsnorm(float *out /* [rows, cols] */, const float *x /* [rows, cols] */, const float *w /* [cols] */,
                            size_t rows, size_t cols, float eps, cudaStream_t stream);

/* residual += delta; out = rmsnorm(residual, w). */
mk_status mk_kernel_add_rmsnorm(float *residual /* [rows, cols] in/out */, float *out /* [rows, cols] */,
                                const float *delta /* [rows, cols] */, const float *w /* [cols] */, size_t rows,
                                size_t cols, float eps, cudaStream_t stream);

/* The same, also writing the output in lowp_dtype (F16 or BF16; lowp NULL: no copy) to lowp
 * [rows, cols]: the bits mk_kernel_convert gives the F32 output, in the same launch. */
mk_status mk_kernel_rmsnorm_lowp(float *out /* [rows, cols] */, void *lowp /* [rows, cols] or NULL */,
                                 mk_dtype lowp_dtype, const float *x /* [rows, cols] */, const float *w /* [cols] */,
                                 size_t rows, size_t cols, float eps, cudaStream_t stream);
mk_status mk_kernel_add_rmsnorm_lowp(float *residual /* [rows, cols] in/out */, float *out /* [rows, cols] */,
                                     void *lowp /* [rows, cols] or NULL */, mk_dtype lowp_dtype,
                                     const float *delta /* [rows, cols] */, const float *w /* [cols] */, size_t rows,
                                     size_t cols, float eps, cudaStream_t stream);

/* y += x. */
mk_status mk_kernel_add(float *y /* [n] */, const float *x /* [n] */, size_t n, cudaStream_t stream);

/* RoPE in place, per-row positions; angle = (float)pos * inv_freq(i) with inv_freq computed
 * as in mk_rope_inv_freq (double pow, rounded to float) and cos/sin in double. */
mk_status mk_kernel_rope(float *x /* [rows, heads, head_dim] */, const int32_t *positions /* [rows] */, size_t rows,
                         size_t heads, size_t head_dim, float theta, mk_rope_layout layout, cudaStream_t stream);

/* mk_kernel_rope on q (n_heads) and k (n_kv_heads), same bits, then k_cache[positions[r]] =
 * k[r] (rotated) and v_cache[positions[r]] = v[r] converted to kv_dtype (F32, or F16/BF16
 * rounded to nearest even, the bits of mk_f32_to_f16 / mk_f32_to_bf16): the four launches
 * after the Q/K/V product in one. A cache slot is the pool row of its position (pages,
 * kv_pages.h; every kernel below reads the caches the same way). The slot is read on the device (the executor's positions
 * are past + r), so a decode launch is the same every token; a position outside
 * [0, cache_rows) stores nothing. */
mk_status mk_kernel_rope_kv(float *q /* [rows, n_heads, head_dim] */, float *k /* [rows, n_kv_heads, head_dim] */,
                            const float *v /* [rows, n_kv_heads, head_dim] */, void *k_cache /* [pool rows, kv_dim] */,
                            void *v_cache /* [pool rows, kv_dim] */, mk_kv_pages pages, mk_dtype kv_dtype,
                            const int32_t *positions /* [rows] */, size_t cache_rows, size_t rows, size_t n_heads,
                            size_t n_kv_heads, size_t head_dim, float theta, mk_rope_layout layout, cudaStream_t stream);

/* k_cache[past + r] = k[r], v_cache[past + r] = v[r] for r < rows. */
mk_status mk_kernel_kv_append(float *k_cache /* [ctx, kv_dim] */, float *v_cache /* [ctx, kv_dim] */,
                              const float *k /* [rows, kv_dim] */, const float *v /* [rows, kv_dim] */, size_t past,
                              size_t rows, size_t kv_dim, cudaStream_t stream);

/* Causal GQA attention (semantics of mk_cpu_attention): query row r is at position past + r
 * and attends to positions [0, past + r], each read at its pool row through `pages`. Prefill:
 * tiled, online softmax in shared memory, over a KV cache in kv_dtype (F32, F16 or BF16;
 * each element widened exactly). */
mk_status mk_kernel_attention_prefill_kv(float *out /* [rows, n_heads, head_dim] */,
                                         const float *q /* [rows, n_heads, head_dim] */,
                                         const void *k_cache /* [pool rows, n_kv_heads, head_dim] kv_dtype */,
                                         const void *v_cache /* [pool rows, n_kv_heads, head_dim] kv_dtype */,
                                         mk_kv_pages pages, mk_dtype kv_dtype, size_t rows, size_t past, size_t n_heads,
                                         size_t n_kv_heads, size_t head_dim, cudaStream_t stream);

/* The same on the tensor cores (speed mode): BF16 inputs (Q, K, V and the softmax weights
 * rounded to BF16), F32 accumulation, online softmax. Caches F32, F16 or BF16 (kv_dtype).
 * head_dim a multiple of 16 up to MK_MAX_HEAD_DIM (mk_kernel_attention_prefill_tc_supports),
 * else MK_ERR_SHAPE. Reference: mk_cpu_attention on the caches widened to F32. */
bool mk_kernel_attention_prefill_tc_supports(size_t head_dim);
mk_status mk_kernel_attention_prefill_tc(float *out /* [rows, n_heads, head_dim] */,
                                         const float *q /* [rows, n_heads, head_dim] */,
                                         const void *k_cache /* [pool rows, n_kv_heads, head_dim] */,
                                         const void *v_cache /* [pool rows, n_kv_heads, head_dim] */,
                                         mk_kv_pages pages, mk_dtype kv_dtype, size_t rows, size_t past, size_t n_heads,
                                         size_t n_kv_heads, size_t head_dim, cudaStream_t stream);

/* Decode rows: row r is one query over positions[r] + 1 keys (read on the device) through
 * its block table (pages.table + r * pages.row_stride: decode rows of many sequences in one
 * launch; stride 0: rows of one sequence). The keys are split across blocks (one block per
 * split, KV head and row serves every query head of the group), each writes a partial (max,
 * sum, acc) per head to the row's workspace slice, then a second launch combines them in a
 * fixed order (bit-reproducible). The grid depends only on the SM count, max_keys (the cache
 * capacity), the rows and the shape, so the launch does not change from step to step, and a
 * row's arithmetic does not depend on the other rows. kv_dtype: F32, F16, BF16.
 * Workspace: rows * mk_kernel_attention_decode_workspace_bytes(max_keys, ...), a pure
 * function of its arguments (sized for the largest split count). mk_kernel_attention_decode_splits
 * gives the split count a launch on the current device uses. */
size_t mk_kernel_attention_decode_workspace_bytes(size_t max_keys, size_t n_heads, size_t head_dim);
mk_status mk_kernel_attention_decode_splits(size_t *splits, size_t max_keys, size_t n_heads, size_t n_kv_heads);
mk_status mk_kernel_attention_decode(float *out /* [rows, n_heads, head_dim] */, const float *q /* [rows, n_heads, head_dim] */,
                                     const void *k_cache /* [pool rows, n_kv_heads, head_dim] kv_dtype */,
                                     const void *v_cache /* [pool rows, n_kv_heads, head_dim] kv_dtype */,
                                     mk_kv_pages pages, mk_dtype kv_dtype, const int32_t *positions /* dev [rows] */,
                                     size_t rows, size_t max_keys, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                                     void *workspace, size_t workspace_bytes, cudaStream_t stream);

/* out = silu(gate) * up; gate/up in F32, F16 or BF16, out F32. */
mk_status mk_kernel_swiglu(float *out /* [n] */, const void *gate /* [n] */, const void *up /* [n] */, mk_dtype dtype,
                           size_t n, cudaStream_t stream);

/* out[r] = argmax_j x[r, j], lowest index on ties, NaN never wins. n up to 2^31 - 1. */
mk_status mk_kernel_argmax(int32_t *out /* [rows] */, const float *x /* [rows, n] */, size_t rows, size_t n,
                           cudaStream_t stream);

/* dst = src converted (F32 <-> F16 / BF16, round to nearest even). */
mk_status mk_kernel_convert(void *dst /* [n] */, mk_dtype dst_dtype, const void *src /* [n] */, mk_dtype src_dtype,
                            size_t n, cudaStream_t stream);

/* out = x[rows - 1, :]: the tail's last-row pruning. */
mk_status mk_kernel_last_row(float *out /* [cols] */, const float *x /* [rows, cols] */, size_t rows, size_t cols,
                             cudaStream_t stream);

/* ---- decode matrix products (1..MK_GEMV_MAX_ROWS rows; prefill goes through cuBLAS) ---- */
#define MK_GEMV_MAX_ROWS 8

/* y[r, o] = sum_k x[r, k] * w[o, k] for r < rows <= MK_GEMV_MAX_ROWS, F32 accumulation in a
 * fixed order (deterministic). w dtype F32, F16 or BF16; 16-byte vector loads when w and x
 * are 16-byte aligned and in_dim is a multiple of the vector width. Reference: mk_cpu_matmul
 * on the widened weights. */
mk_status mk_kernel_gemv(float *y /* [rows, out_dim] */, const float *x /* [rows, in_dim] */,
                         const void *w /* [out_dim, in_dim] */, mk_dtype w_dtype, size_t rows, size_t in_dim,
                         size_t out_dim, cudaStream_t stream);

/* The same for n (1..3) weights sharing x, in one launch: y[i] = x @ w[i]^T, [rows, out_dim[i]]
 * (Q, K and V). Each product has the bits mk_kernel_gemv gives it. */
mk_status mk_kernel_gemv_multi(size_t n, float *const *y, const void *const *w /* [out_dim[i], in_dim] */,
                               const size_t *out_dim, mk_dtype w_dtype, const float *x /* [rows, in_dim] */,
                               size_t rows, size_t in_dim, cudaStream_t stream);

/* out = silu(x @ w_gate^T) * (x @ w_up^T) in one launch: the bits of mk_kernel_gemv twice then
 * mk_kernel_swiglu. */
mk_status mk_kernel_gemv_swiglu(float *out /* [rows, out_dim] */, const float *x /* [rows, in_dim] */,
                                const void *w_gate /* [out_dim, in_dim] */, const void *w_up /* [out_dim, in_dim] */,
                                mk_dtype w_dtype, size_t rows, size_t in_dim, size_t out_dim, cudaStream_t stream);

/* The same with w in a GGUF block format (ggml type id: Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7,
 * Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, IQ4_NL = 20, IQ4_XS = 23),
 * each row in_dim / block_elements whole blocks, dequantized in registers. in_dim must be a
 * multiple of the block size; w aligned to 2 (Q4_0, Q5_0, Q8_0, Q3_K, Q6_K, IQ4_NL), 4 (Q4_1,
 * Q5_1, Q2_K) or 8 (Q4_K, Q5_K, IQ4_XS) bytes. Reference:
 * mk_gguf_dequantize then mk_cpu_matmul. */
bool mk_kernel_gemv_q_supports(uint32_t ggml_type);
mk_status mk_kernel_gemv_q(float *y /* [rows, out_dim] */, const float *x /* [rows, in_dim] */,
                           const void *w /* [out_dim, in_dim / block_elements * block_bytes] */, uint32_t ggml_type,
                           size_t rows, size_t in_dim, size_t out_dim, cudaStream_t stream);

/* Native weight sets in one launch: matrix i in ggml type[i], a format mk_kernel_gemv_q
 * supports or BF16 (30) (a native-mode matrix whose source format has no device GEMV is stored as
 * BF16), mixed freely. y[i] = x @ dequant(w[i])^T for n (1..3) matrices (Q, K and V), and
 * out = silu(x @ w_gate^T) * (x @ w_up^T). Each product has the bits of its separate launch
 * (mk_kernel_gemv_q, or mk_kernel_gemv for BF16), SwiGLU those of mk_kernel_swiglu. */
bool mk_kernel_gemv_q_set_supports(uint32_t ggml_type);
mk_status mk_kernel_gemv_q_multi(size_t n, float *const *y, const void *const *w, const uint32_t *ggml_type,
                                 const size_t *out_dim, const float *x /* [rows, in_dim] */, size_t rows,
                                 size_t in_dim, cudaStream_t stream);
mk_status mk_kernel_gemv_q_swiglu(float *out /* [rows, out_dim] */, const float *x /* [rows, in_dim] */,
                                  const void *w_gate, uint32_t gate_type, const void *w_up, uint32_t up_type,
                                  size_t rows, size_t in_dim, size_t out_dim, cudaStream_t stream);

/* Rows of a weight in a GGUF block format (a type mk_kernel_gemv_q supports) expanded to F32
 * or BF16: out row i = dequant(w)[ids ? ids[i] : row0 + i], [n_rows, cols]; an id outside
 * [0, n_src_rows) gives a zero row. The values are those mk_kernel_gemv_q multiplies
 * (reference: mk_gguf_dequantize). n_rows <= 65535. */
mk_status mk_kernel_dequant_q(void *out, mk_dtype out_dtype, const void *w, uint32_t ggml_type,
                              const int32_t *ids /* dev [n_rows] or NULL */, size_t row0, size_t n_rows,
                              size_t n_src_rows, size_t cols, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
