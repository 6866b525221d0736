/* The cpu backend: the reference ops over host memory.
 *
 * Weight modes. F32 (parity): weights stored as F32 and multiplied by OpenBLAS SGEMM.
 * F16/BF16: stored as F32 values rounded through that dtype, so the backend computes
 * exactly what that dtype can represent. NATIVE: every matrix stays in the format its
 * GGUF file stores (cpu_native.h) and is multiplied by the SIMD kernels of cpu_quant.h on
 * the backend's thread pool. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/cpu_attention_fast.h"
#include "backend/cpu/cpu_native.h"
#include "backend/cpu/cpu_ops.h"
#include "mk_error.h"
#include "model/gguf.h"
#include "core/cores.h"
#include "core/options.h"

typedef struct mk_cpu_backend {
    mk_backend base;
    mk_cpu_native native; /* pool, kernels, activation scratch (native mode) */
    mk_attention_fast_fn attention_fast; /* native mode, F32 cache: float accumulation */
    /* RoPE cos/sin of every position of the reserved context, for the model's head_dim and
     * theta (the values mk_cpu_rope computes, computed once): [rope_positions, hd/2, 2]. */
    float *rope_table;
    size_t rope_positions, rope_head_dim;
    float rope_theta;
    /* Floats of the per-thread weight tiles the reserved forward would use (0 when it has
     * fewer than MK_NATIVE_GEMM_MIN_ROWS rows), and whether a stored weight takes them: the
     * tiles (threads x 256 x the widest input, 235 MB for an 8B model on 16 threads) are
     * allocated only then, so a model whose every format has an n-row dot never holds them. */
    size_t wtile_plan;
    bool tiles_wanted;
} mk_cpu_backend;

static mk_cpu_backend *cpu_of(mk_backend *b) { return (mk_cpu_backend *)b; }
static bool cpu_native_mode(const mk_backend *b) { return b->config.weight_dtype == MK_DTYPE_NATIVE; }

static void cpu_destroy(mk_backend *b) {
    mk_cpu_backend *cb = cpu_of(b);
    mk_cpu_pool_free(cb->native.pool);
    free(cb->native.xq);
    free(cb->native.xk);
    free(cb->native.wtile);
    free(cb->rope_table);
    free(cb);
}

static mk_status cpu_alloc(mk_backend *b, size_t bytes, void **out) {
    /* 64-byte aligned for BLAS; aligned_alloc wants a multiple of the alignment. */
    const size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes) return mk_fail(MK_ERR_OUT_OF_MEMORY, "cpu backend: allocation of %zu bytes overflows", bytes);
    *out = aligned_alloc(64, rounded ? rounded : 64);
    if (!*out) return mk_fail(MK_ERR_OUT_OF_MEMORY, "cpu backend: out of memory allocating %zu bytes", bytes);
    return MK_OK;
}

static void cpu_release(mk_backend *b, void *ptr) { free(ptr); }

static mk_status cpu_memcpy(mk_backend *b, void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
    return MK_OK;
}

static mk_status cpu_synchronize(mk_backend *b) { return MK_OK; }

static mk_status cpu_host_alloc(mk_backend *b, size_t bytes, void **out) { return cpu_alloc(b, bytes, out); }

static mk_status cpu_copy_from_peer(mk_backend *b, void *dst, mk_backend *peer, const void *src, size_t bytes) {
    if (peer->ops != b->ops) return mk_fail(MK_ERR_INVALID_ARGUMENT, "cpu backend: peer copy from a %s backend", peer->ops->name);
    return cpu_memcpy(b, dst, src, bytes);
}

/* The planned weight tiles, once a weight wants them (a no-op before or after). */
static mk_status cpu_reserve_tiles(mk_cpu_backend *cb) {
    if (!cb->tiles_wanted || !cb->wtile_plan || cb->native.wtile) return MK_OK;
    cb->native.wtile = aligned_alloc(64, cb->wtile_plan * sizeof(float));
    if (!cb->native.wtile) return mk_fail(MK_ERR_OUT_OF_MEMORY, "cpu backend: out of memory for the weight tiles");
    cb->native.wtile_elems = cb->wtile_plan;
    return MK_OK;
}

static mk_status cpu_reserve(mk_backend *b, size_t max_rows, size_t max_decode_rows, size_t max_context,
                           const mk_hparams *hp) {
    mk_cpu_backend *cb = cpu_of(b);
    free(cb->rope_table);
    cb->rope_table = malloc(max_context * (hp->head_dim / 2) * 2 * sizeof(float) + 1);
    if (!cb->rope_table) return mk_fail(MK_ERR_OUT_OF_MEMORY, "cpu backend: out of memory for the RoPE table");
    mk_cpu_rope_table(cb->rope_table, max_context, hp->head_dim, hp->rope_theta);
    cb->rope_positions = max_context;
    cb->rope_head_dim = hp->head_dim;
    cb->rope_theta = hp->rope_theta;
    if (!cpu_native_mode(b)) return MK_OK;
    /* Quantized activations of the widest product input, for the largest forward. */
    size_t width = hp->hidden;
    if (hp->intermediate > width) width = hp->intermediate;
    if (hp->n_heads * hp->head_dim > width) width = hp->n_heads * hp->head_dim;
    const size_t blocks = max_rows * (width / MK_Q8_BLOCK);
    free(cb->native.xq);
    cb->native.xq = malloc((blocks ? blocks : 1) * sizeof(mk_q8_block));
    cb->native.xq_blocks = cb->native.xq ? blocks : 0;
    if (!cb->native.xq) return mk_fail(MK_ERR_OUT_OF_MEMORY, "cpu backend: out of memory for %zu activation blocks", blocks);
    const size_t k_blocks = max_rows * (width / MK_Q8K_BLOCK);
    free(cb->native.xk);
    cb->native.xk = malloc((k_blocks ? k_blocks : 1) * sizeof(mk_q8k_block));
    cb->native.xk_blocks = cb->native.xk ? k_blocks : 0;
    if (!cb->native.xk)
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "cpu backend: out of memory for %zu activation blocks of 256", k_blocks);
    /* One dequantized weight tile per thread for products of many rows (prefill) over a
     * format without an n-row dot: planned here, allocated when such a weight is stored. */
    free(cb->native.wtile);
    cb->native.wtile = NULL;
    cb->native.wtile_elems = 0;
    cb->wtile_plan = max_rows >= MK_NATIVE_GEMM_MIN_ROWS
                         ? (size_t)MK_NATIVE_GEMM_TILE * width * mk_cpu_pool_threads(cb->native.pool)
                         : 0;
    return cpu_reserve_tiles(cb);
}

size_t mk_cpu_backend_scratch_bytes(mk_backend *b) {
    const mk_cpu_backend *cb = cpu_of(b);
    return cb->native.xq_blocks * sizeof(mk_q8_block) +
           cb->native.xk_blocks * sizeof(mk_q8k_block) + cb->native.wtile_elems * sizeof(float);
}

static mk_status cpu_upload_weight(mk_backend *b, mk_weight *w, const float *src) {
    /* Every dense mode keeps F32 storage here (F16 / BF16 values rounded, then widened). */
    float *out = (float *)(uintptr_t)w->data; /* the weight's memory, handed over to be filled */
    const size_t n = w->rows * w->cols;
    w->format = MK_GGML_TYPE_F32;
    switch (b->config.weight_dtype) {
        case MK_DTYPE_F32: memcpy(out, src, n * sizeof(float)); break;
        case MK_DTYPE_F16:
            for (size_t i = 0; i < n; i++) out[i] = mk_f16_to_f32(mk_f32_to_f16(src[i]));
            break;
        case MK_DTYPE_BF16:
            for (size_t i = 0; i < n; i++) out[i] = mk_bf16_to_f32(mk_f32_to_bf16(src[i]));
            break;
        default: return mk_fail(MK_ERR_DTYPE, "cpu backend: unsupported weight dtype %s", mk_dtype_name(b->config.weight_dtype));
    }
    return MK_OK;
}

static size_t cpu_native_weight_bytes(mk_backend *b, uint32_t ggml_type, size_t rows, size_t cols) {
    return mk_cpu_native_weight_bytes(ggml_type, rows, cols);
}

static mk_status cpu_upload_native_weight(mk_backend *b, mk_weight *w, uint32_t ggml_type, const void *src,
                                          size_t src_bytes) {
    MK_TRY(mk_cpu_native_store(w, ggml_type, src, src_bytes));
    mk_cpu_backend *cb = cpu_of(b);
    if (!cpu_native_mode(b)) return MK_OK; /* products of its weights take no tiles */
    if (mk_cpu_native_takes_tiles(&cb->native, w->format)) cb->tiles_wanted = true;
    return cpu_reserve_tiles(cb);
}

static mk_status cpu_embed(mk_backend *b, float *out, const mk_weight *table, const int32_t *ids, size_t n) {
    if (cpu_native_mode(b)) return mk_cpu_native_embed(out, table, ids, n);
    mk_cpu_embed(out, table->data, ids, n, table->cols);
    return MK_OK;
}

/* Products take F32 activations: the norms never write a 16-bit copy (gemm_input is NULL). */
static mk_status cpu_rmsnorm(mk_backend *b, float *out, void *out_lowp, const float *x, const float *w, size_t rows,
                             size_t cols, float eps) {
    mk_cpu_rmsnorm(out, x, w, rows, cols, eps);
    return MK_OK;
}

static mk_status cpu_add_rmsnorm(mk_backend *b, float *residual, float *out, void *out_lowp, const float *delta,
                                 const float *w, size_t rows, size_t cols, float eps) {
    mk_cpu_add_rmsnorm(residual, out, delta, w, rows, cols, eps);
    return MK_OK;
}

static mk_status cpu_matmul(mk_backend *b, float *y, const mk_gemm_input *x, const mk_weight *w, size_t rows) {
    if (cpu_native_mode(b)) return mk_cpu_native_matmul(&cpu_of(b)->native, y, x->x, w, rows, x->alone);
    mk_cpu_matmul(y, x->x, w->data, rows, w->cols, w->rows);
    return MK_OK;
}

/* Native quantized or 16-bit weights: the dot path computes each row alone, at any count
 * when the input asks for it (mk_gemm_input.alone); F32 weights go to SGEMM, whose kernel
 * depends on the rows: one at a time. */
static size_t cpu_gemm_rows_alone(mk_backend *b, const mk_weight *w) {
    if (!cpu_native_mode(b) || w->format == MK_GGML_TYPE_F32) return 1;
    return mk_cpu_native_rows_alone(&cpu_of(b)->native);
}

static mk_status cpu_matmul_shared(mk_backend *b, size_t n, float *const *y, const mk_weight *const *w,
                                   const mk_gemm_input *x, size_t rows) {
    if (cpu_native_mode(b)) return mk_cpu_native_matmul_shared(&cpu_of(b)->native, n, y, w, x->x, rows, x->alone);
    for (size_t i = 0; i < n; i++) mk_cpu_matmul(y[i], x->x, w[i]->data, rows, w[i]->cols, w[i]->rows);
    return MK_OK;
}

static mk_status cpu_matmul_swiglu(mk_backend *b, float *gate, float *up, const mk_gemm_input *x,
                                   const mk_weight *w_gate, const mk_weight *w_up, size_t rows) {
    if (cpu_native_mode(b))
        return mk_cpu_native_matmul_swiglu(&cpu_of(b)->native, gate, up, x->x, w_gate, w_up, rows, x->alone);
    mk_cpu_matmul(gate, x->x, w_gate->data, rows, w_gate->cols, w_gate->rows);
    mk_cpu_matmul(up, x->x, w_up->data, rows, w_up->cols, w_up->rows);
    mk_cpu_swiglu(gate, gate, up, rows * w_gate->rows);
    return MK_OK;
}

static mk_status cpu_rope(mk_backend *b, float *x, const int32_t *positions, size_t rows, size_t heads,
                          size_t head_dim, float theta, mk_rope_layout layout) {
    const mk_cpu_backend *cb = cpu_of(b);
    const bool table = cb->rope_table && head_dim == cb->rope_head_dim && theta == cb->rope_theta;
    mk_cpu_rope_cached(x, positions, rows, heads, head_dim, theta, layout, table ? cb->rope_table : NULL,
                       table ? cb->rope_positions : 0);
    return MK_OK;
}

typedef struct mk_attention_job {
    float *out;
    const float *q;
    const void *k_cache, *v_cache;
    mk_kv_pages pages;
    size_t past, n_heads, n_kv_heads, head_dim;
    bool f16;
    mk_attention_fast_fn fast;
} mk_attention_job;

static void cpu_attention_part(void *arg, size_t begin, size_t end, size_t thread) {
    const mk_attention_job *j = arg;
    if (j->fast)
        j->fast(j->out, j->q, j->k_cache, j->v_cache, j->pages, begin, end, j->past, j->n_heads, j->n_kv_heads, j->head_dim);
    else if (j->f16)
        mk_cpu_attention_heads_f16(j->out, j->q, j->k_cache, j->v_cache, j->pages, begin, end, j->past, j->n_heads,
                                   j->n_kv_heads, j->head_dim);
    else
        mk_cpu_attention_heads(j->out, j->q, j->k_cache, j->v_cache, j->pages, begin, end, j->past, j->n_heads, j->n_kv_heads,
                               j->head_dim);
}

static mk_status cpu_attention(mk_backend *b, float *out, const float *q, const void *k_cache, const void *v_cache,
                               mk_kv_pages pages, const int32_t *positions, size_t rows, size_t past, size_t n_heads, size_t n_kv_heads,
                               size_t head_dim) {
    (void)positions; /* == past + r: the host knows it */
    /* Every (row, head) pair is computed alone: native mode spreads them over the pool and,
     * over an F32 cache, accumulates in float (the parity mode keeps the double reference). */
    const bool f16 = mk_backend_kv_dtype(b) == MK_DTYPE_F16;
    mk_attention_job job = {out, q, k_cache, v_cache, pages, past, n_heads, n_kv_heads, head_dim, f16,
                            f16 ? NULL : cpu_of(b)->attention_fast};
    mk_cpu_pool *pool = cpu_of(b)->native.pool;
    if (pool) mk_cpu_pool_run(pool, rows * n_heads, 1, cpu_attention_part, &job);
    else cpu_attention_part(&job, 0, rows * n_heads, 0);
    return MK_OK;
}

static mk_status cpu_kv_store(mk_backend *b, void *cache, mk_kv_pages pages, size_t pos, const float *src, size_t rows,
                              size_t width) {
    const bool f16 = mk_backend_kv_dtype(b) == MK_DTYPE_F16;
    for (size_t r = 0; r < rows; r++) { /* row by row: consecutive positions may sit in different blocks */
        const size_t row = mk_kv_row(pages, pos + r);
        const float *s = src + r * width;
        if (f16) {
            uint16_t *dst = (uint16_t *)cache + row * width;
            for (size_t i = 0; i < width; i++) dst[i] = mk_f32_to_f16(s[i]);
        } else {
            memcpy((float *)cache + row * width, s, width * sizeof(float));
        }
    }
    return MK_OK;
}

static mk_status cpu_swiglu(mk_backend *b, float *out, const float *gate, const float *up, size_t n) {
    mk_cpu_swiglu(out, gate, up, n);
    return MK_OK;
}

static mk_status cpu_add(mk_backend *b, float *y, const float *x, size_t n) {
    mk_cpu_add(y, x, n);
    return MK_OK;
}

static mk_status cpu_argmax(mk_backend *b, int32_t *out, const float *x, size_t rows, size_t n) {
    mk_cpu_argmax(out, x, rows, n);
    return MK_OK;
}

static const mk_backend_ops mk_cpu_ops = {
    .name = "cpu",
    .host_addressable = true,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .copy = cpu_memcpy,
    .synchronize = cpu_synchronize,
    .reserve = cpu_reserve,
    .upload_weight = cpu_upload_weight,
    .host_alloc = cpu_host_alloc,
    .host_release = cpu_release,
    .download_async = cpu_memcpy,
    .upload_async = cpu_memcpy,
    .copy_from_peer = cpu_copy_from_peer,
    .native_weight_bytes = cpu_native_weight_bytes,
    .upload_native_weight = cpu_upload_native_weight,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add_rmsnorm = cpu_add_rmsnorm,
    .matmul = cpu_matmul,
    .gemm_rows_alone = cpu_gemm_rows_alone,
    .matmul_shared = cpu_matmul_shared,
    .matmul_swiglu = cpu_matmul_swiglu,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .kv_store = cpu_kv_store,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .argmax = cpu_argmax,
};

mk_status mk_backend_cpu_create(const mk_backend_config *config, mk_backend **out) {
    if (config->weight_dtype != MK_DTYPE_F32 && config->weight_dtype != MK_DTYPE_F16 &&
        config->weight_dtype != MK_DTYPE_BF16 && config->weight_dtype != MK_DTYPE_NATIVE)
        return mk_fail(MK_ERR_DTYPE, "cpu backend: weight dtype %s is not one of f32, f16, bf16, native",
                       mk_dtype_name(config->weight_dtype));
    if (config->kv_dtype != 0 && config->kv_dtype != MK_DTYPE_F32 && config->kv_dtype != MK_DTYPE_F16)
        return mk_fail(MK_ERR_DTYPE, "cpu backend: KV cache dtype %s is not f32 or f16", mk_dtype_name(config->kv_dtype));
    if (config->threads > 1024)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "cpu backend: %zu threads (at most 1024)", config->threads);
    mk_cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return mk_fail(MK_ERR_OUT_OF_MEMORY, "cpu backend: out of memory");
    cb->base.ops = &mk_cpu_ops;
    cb->base.config = *config;
    if (config->weight_dtype == MK_DTYPE_NATIVE) {
        /* Threads only where the native kernels use them; F32 products thread in OpenBLAS. */
        const size_t threads = config->threads ? config->threads : mk_core_count();
        cb->base.config.threads = threads;
        cb->native.kernels = mk_cpu_quant_best();
        cb->attention_fast = mk_cpu_attention_fast_for(cb->native.kernels);
        const mk_status s = mk_cpu_pool_create(threads, &cb->native.pool);
        if (s != MK_OK) {
            free(cb);
            return s;
        }
    }
    *out = &cb->base;
    return MK_OK;
}
