/* The op interface every backend implements (cpu, cuda). The range executor is the only
 * caller; backends compute and never enforce the contract.
 *
 * Pointers marked "dev" live in the backend's memory (host memory for cpu, device memory
 * for cuda) and come from alloc(). Every op is enqueued in order on the backend's one
 * stream; download() into host memory and synchronize() are the only points where the
 * host waits. Ownership: the backend owns what alloc() returned until release(). */
#ifndef MK_BACKEND_H
#define MK_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv_pages.h"
#include "meshkern.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mk_backend mk_backend;

/* A weight matrix as its backend stores it: [rows, cols] = [output features, input
 * features], at `data` (dev) in `format`, the ggml type of its stored elements or blocks
 * (F32, F16, BF16 in the dense weight modes; in native mode whatever the source stores and
 * the backend keeps: Q8_0, Q4_1, Q4_K ... or F32 / BF16 for a source it converts). The
 * backend fills it when it uploads the weight and reads it on every product: it keeps no
 * table of its own. */
typedef struct mk_weight {
    const void *data;
    uint32_t format;
    size_t rows, cols;
} mk_weight;

/* A matrix product's activations: x [rows, in] in F32 and, where the backend multiplies in
 * a 16-bit dtype (gemm_input(rows) is not F32), `lowp`, a buffer of the same shape in that
 * dtype: `ready` when it already holds x converted (the norm that wrote x wrote it too),
 * else the backend converts x into it first. The forward pass chooses; a reader sees the
 * fusion there. */
typedef struct mk_gemm_input {
    const float *x;
    void *lowp;
    bool ready;
    /* Rows of different sequences (a batch's decode rows, at most gemm_rows_alone(w)): each
     * must come out as it would alone, whatever the count (the backend keeps its row-by-row
     * path instead of switching to a many-row kernel). */
    bool alone;
} mk_gemm_input;

typedef struct mk_backend_ops {
    const char *name;
    /* dev memory is ordinary host memory (cpu): seams read it in place, no staging copy */
    bool host_addressable;
    /* rope_kv and attention take a batch's decode rows of many sequences in one call each
     * (mk_kv_pages.row_stride): one launch per layer whatever the mix (cuda). Without it the
     * range calls them once per sequence (cpu: no launch to save). */
    bool decode_rows;
    void (*destroy)(mk_backend *b);
    /* memory */
    mk_status (*alloc)(mk_backend *b, size_t bytes, void **out /* dev */);
    void (*release)(mk_backend *b, void *ptr /* dev */);
    mk_status (*upload)(mk_backend *b, void *dst /* dev */, const void *src /* host */, size_t bytes);
    mk_status (*download)(mk_backend *b, void *dst /* host */, const void *src /* dev */, size_t bytes);
    mk_status (*copy)(mk_backend *b, void *dst /* dev */, const void *src /* dev */, size_t bytes);
    mk_status (*synchronize)(mk_backend *b);
    /* Size per-backend scratch once, at range creation: the largest forward (rows), the
     * longest KV cache, and the model's widths. Nothing is allocated in the forward path. */
    mk_status (*reserve)(mk_backend *b, size_t max_rows, size_t max_decode_rows, size_t max_context, const mk_hparams *hp);
    /* Convert host F32 weights [w->rows, w->cols] into the backend's weight dtype at w->data
     * (dev; the caller placed it) and set w->format. */
    mk_status (*upload_weight)(mk_backend *b, mk_weight *w, const float *src /* host */);
    /* seams: host staging (pinned on cuda) and copies enqueued on the backend's stream,
     * complete at the next synchronize(). The host buffer of an async copy must stay
     * untouched until then. */
    mk_status (*host_alloc)(mk_backend *b, size_t bytes, void **out /* host */);
    void (*host_release)(mk_backend *b, void *ptr /* host */);
    mk_status (*download_async)(mk_backend *b, void *dst /* host staging */, const void *src /* dev */, size_t bytes);
    mk_status (*upload_async)(mk_backend *b, void *dst /* dev */, const void *src /* host staging */, size_t bytes);
    /* dst (this backend's memory) <- src (memory of `peer`, a backend of the same kind,
     * possibly another device): ordered after the peer's queued work, and the peer's later
     * work waits for the copy (no host wait, no host staging). */
    mk_status (*copy_from_peer)(mk_backend *b, void *dst /* dev */, mk_backend *peer, const void *src /* peer dev */,
                                size_t bytes);
    /* The native stream every op is enqueued on (cuda: the cudaStream_t), for transports
     * that post their own device work in stream order (NCCL); NULL: no such stream (cpu). */
    void *(*native_stream)(mk_backend *b);
    /* Native weight mode (weight_dtype MK_DTYPE_NATIVE); NULL on a backend without it.
     * Bytes a weight matrix [rows, cols] whose source stores ggml `type` occupies (0: it
     * cannot be kept), and storing it at w->data from the source's bytes (F32 for a source
     * without a stored format), setting w->format to what it keeps. */
    size_t (*native_weight_bytes)(mk_backend *b, uint32_t ggml_type, size_t rows, size_t cols);
    mk_status (*upload_native_weight)(mk_backend *b, mk_weight *w, uint32_t ggml_type, const void *src /* host */,
                                      size_t src_bytes);
    /* compute */
    /* out[i] = row ids[i] of table [vocab, hidden] (table->rows, table->cols), as F32. */
    mk_status (*embed)(mk_backend *b, float *out /* [n, hidden] */, const mk_weight *table,
                       const int32_t *ids /* dev [n] */, size_t n);
    /* The dtype a product of `rows` rows takes its activations in: F32 (x itself), or F16 /
     * BF16 (a converted copy in mk_gemm_input.lowp). NULL: always F32. */
    mk_dtype (*gemm_input)(mk_backend *b, size_t rows);
    /* out = rmsnorm(x) and, when out_lowp is not NULL, the same values in gemm_input(rows)
     * into out_lowp (the next product's input, converted in the same pass). */
    mk_status (*rmsnorm)(mk_backend *b, float *out /* [rows, cols] */, void *out_lowp, const float *x /* [rows, cols] */,
                         const float *w /* [cols] f32 */, size_t rows, size_t cols, float eps);
    /* residual += delta; out = rmsnorm(residual): the residual add fused into the next norm. */
    mk_status (*add_rmsnorm)(mk_backend *b, float *residual /* [rows, cols] in/out */, float *out /* [rows, cols] */,
                             void *out_lowp, const float *delta /* [rows, cols] */, const float *w /* [cols] f32 */,
                             size_t rows, size_t cols, float eps);
    /* y [rows, w->rows] = x [rows, w->cols] @ w^T. */
    mk_status (*matmul)(mk_backend *b, float *y, const mk_gemm_input *x, const mk_weight *w, size_t rows);
    /* The most rows one product of w (matmul, matmul_shared, matmul_swiglu) with
     * mk_gemm_input.alone computes each exactly as a product of that row alone: a batch
     * forward multiplies decode rows of different sequences together up to it, so a batch
     * never changes a row. NULL: 1. */
    size_t (*gemm_rows_alone)(mk_backend *b, const mk_weight *w);
    /* Optional (NULL: the executor calls matmul once per weight). y[i] = x @ w[i]^T for n
     * (1..3) weights sharing x: Q, K and V in one launch. */
    mk_status (*matmul_shared)(mk_backend *b, size_t n, float *const *y, const mk_weight *const *w,
                               const mk_gemm_input *x, size_t rows);
    /* Optional (NULL: matmul gate, matmul up, swiglu). gate = silu(x @ w_gate^T) * (x @ w_up^T),
     * [rows, w_gate->rows]; up of that shape is scratch. */
    mk_status (*matmul_swiglu)(mk_backend *b, float *gate, float *up, const mk_gemm_input *x, const mk_weight *w_gate,
                               const mk_weight *w_up, size_t rows);
    /* The KV caches (k_cache, v_cache, cache) are one layer's pools of the range, read and
     * written through the sequence's block table: position t at pool row
     * mk_kv_row(pages, t) (kv_pages.h; pages.table is dev memory). */
    /* Optional (NULL: rope q, rope k, then kv_store or copy k and v into the caches). RoPE of
     * q and k in place and the KV-cache write of rows [past, past + rows) in the KV dtype in
     * one step (cuda reads each row's slot from positions on the device and ignores past). */
    mk_status (*rope_kv)(mk_backend *b, float *q /* [rows, n_heads, head_dim] */,
                         float *k /* [rows, n_kv_heads, head_dim] */, const float *v /* [rows, kv_dim] */,
                         void *k_cache /* [pool rows, kv_dim] KV dtype */, void *v_cache /* [pool rows, kv_dim] */,
                         mk_kv_pages pages, const int32_t *positions /* dev [rows] */, size_t past, size_t rows, size_t n_heads,
                         size_t n_kv_heads, size_t head_dim, float theta, mk_rope_layout layout);
    mk_status (*rope)(mk_backend *b, float *x /* [rows, heads, head_dim] */, const int32_t *positions /* dev [rows] */,
                      size_t rows, size_t heads, size_t head_dim, float theta, mk_rope_layout layout);
    /* The caches hold the KV dtype (config.kv_dtype: F32; F16 on cpu; F16 or BF16 on cuda).
     * positions (positions[r] == past + r) let a backend read the key count on the device, so
     * a decode step's work does not depend on `past` (cuda; the cpu backend uses `past`).
     * With pages.row_stride (backends with decode_rows only) the rows are decode rows of
     * different sequences, each through its own table at positions[r]; `past` is then their
     * past keys summed (the bytes-read model only). */
    mk_status (*attention)(mk_backend *b, float *out /* [rows, n_heads, head_dim] */,
                           const float *q /* [rows, n_heads, head_dim] */, const void *k_cache /* [pool rows, kv, hd] */,
                           const void *v_cache /* [pool rows, kv, hd] */, mk_kv_pages pages, const int32_t *positions /* dev [rows] */,
                           size_t rows, size_t past, size_t n_heads, size_t n_kv_heads, size_t head_dim);
    /* cache[row of pos + r, :] = src[r, :] converted to the KV dtype. NULL: the backend keeps
     * an F32 cache only, written with copy() row by row, unless rope_kv writes its caches. */
    mk_status (*kv_store)(mk_backend *b, void *cache /* dev [pool rows, width] KV dtype */, mk_kv_pages pages, size_t pos,
                          const float *src /* [rows, width] */, size_t rows, size_t width);
    mk_status (*swiglu)(mk_backend *b, float *out /* [n] */, const float *gate /* [n] */, const float *up /* [n] */,
                        size_t n);
    mk_status (*add)(mk_backend *b, float *y /* [n] */, const float *x /* [n] */, size_t n);
    mk_status (*argmax)(mk_backend *b, int32_t *out /* dev [rows] */, const float *x /* [rows, n] */, size_t rows,
                        size_t n);
    /* Optional (NULL: no graphs, cpu). A decode step captured once and replayed per token:
     * step_begin starts recording the ops issued on the backend's stream (nothing runs);
     * step_end stops and, when every op could be recorded, instantiates them (*out; NULL
     * and an error when the capture failed: the stream is usable again either way);
     * step_launch replays an instantiated step on the stream; step_destroy frees it. The
     * backend's ops for a 1-row forward read everything that changes per token (positions,
     * token id, key count) from device memory, so a replay is the step of that token.
     * `keys`: the keys attention reads in that step (past + 1), for the counters' model of
     * bytes read. */
    mk_status (*step_begin)(mk_backend *b, size_t keys);
    mk_status (*step_end)(mk_backend *b, void **out /* instantiated step */);
    mk_status (*step_launch)(mk_backend *b, void *step, size_t keys);
    void (*step_destroy)(mk_backend *b, void *step);
} mk_backend_ops;

/* Structural counts of the work a backend was asked for (kept by the cuda backend; the cpu
 * backend leaves them zero). Tests and benchmarks read differences across a forward
 * (mk_range_backend_counters) to assert launches per layer, host waits and bytes moved per
 * token without a GPU. */
typedef struct mk_backend_counters {
    uint64_t launches;         /* kernels, cuBLAS calls and device-to-device copies executed (a
                                * replayed step adds the ones it recorded) */
    uint64_t graph_launches;   /* replays of a captured step (step_launch) */
    uint64_t host_syncs;       /* times the host waited for the stream (debug per-op checks excluded) */
    uint64_t bytes_downloaded; /* device -> host */
    uint64_t bytes_uploaded;   /* host -> device, weights excluded */
    /* Device bytes the enqueued kernels must read, from a model of each kernel (cuda): weights
     * at their stored size, KV-cache rows read by attention (2 * keys * kv_dim * element size),
     * activations, ids, positions and scratch; and the weight and KV parts of it. */
    uint64_t bytes_read;
    uint64_t weight_bytes_read;
    uint64_t kv_bytes_read;
    /* Decode steps recorded: step_end calls that instantiated a step (one the range then
     * discards, because an op failed while it was recorded, counts too; a capture the
     * runtime invalidated counts nothing). One per range for a sequence's decode, one more
     * at each change of what a step bakes in (the sequence's KV cache, a boundary buffer);
     * none when eager. */
    uint64_t graph_captures;
} mk_backend_counters;

struct mk_backend {
    const mk_backend_ops *ops;
    mk_backend_config config;
    mk_backend_counters counters;
};

/* Bytes one weight element occupies in this backend (its weight dtype). */
size_t mk_backend_weight_elem_size(const mk_backend *b);
/* The KV cache dtype (F32 unless config.kv_dtype asks for F16 or BF16). */
mk_dtype mk_backend_kv_dtype(const mk_backend *b);

mk_status mk_backend_create(const mk_backend_config *config, mk_backend **out);
void mk_backend_destroy(mk_backend *b);

/* Per-kind constructors (backend_cpu.c, backend_cuda.c). */
mk_status mk_backend_cpu_create(const mk_backend_config *config, mk_backend **out);
mk_status mk_backend_cuda_create(const mk_backend_config *config, mk_backend **out);

#ifdef __cplusplus
}
#endif

#endif
