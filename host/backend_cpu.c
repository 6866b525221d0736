/* The cpu backend: the reference ops over host memory. Weights are stored as F32; a
 * range whose weight dtype is F16/BF16 stores the values rounded through that dtype, so
 * it computes exactly what that dtype can represent. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu_ops.h"
#include "mk_error.h"
#include "options.h"

static void cpu_destroy(mk_backend *b) { free(b); }

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

static mk_status cpu_reserve(mk_backend *b, size_t max_rows, size_t max_context, const mk_hparams *hp) { return MK_OK; }

static mk_status cpu_upload_weight(mk_backend *b, void *dst, const float *src, size_t n) {
    float *out = dst;
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

static mk_status cpu_embed(mk_backend *b, float *out, const void *table, const int32_t *ids, size_t n, size_t hidden,
                           size_t vocab) {
    mk_cpu_embed(out, table, ids, n, hidden);
    return MK_OK;
}

static mk_status cpu_rmsnorm(mk_backend *b, float *out, const float *x, const float *w, size_t rows, size_t cols,
                             float eps) {
    mk_cpu_rmsnorm(out, x, w, rows, cols, eps);
    return MK_OK;
}

static mk_status cpu_add_rmsnorm(mk_backend *b, float *residual, float *out, const float *delta, const float *w,
                                 size_t rows, size_t cols, float eps) {
    mk_cpu_add_rmsnorm(residual, out, delta, w, rows, cols, eps);
    return MK_OK;
}

static mk_status cpu_matmul(mk_backend *b, float *y, const float *x, const void *w, size_t rows, size_t in_dim,
                            size_t out_dim) {
    mk_cpu_matmul(y, x, w, rows, in_dim, out_dim);
    return MK_OK;
}

static mk_status cpu_rope(mk_backend *b, float *x, const int32_t *positions, size_t rows, size_t heads,
                          size_t head_dim, float theta, mk_rope_layout layout) {
    mk_cpu_rope(x, positions, rows, heads, head_dim, theta, layout);
    return MK_OK;
}

static mk_status cpu_attention(mk_backend *b, float *out, const float *q, const float *k_cache, const float *v_cache,
                               size_t rows, size_t past, size_t n_heads, size_t n_kv_heads, size_t head_dim) {
    mk_cpu_attention(out, q, k_cache, v_cache, rows, past, n_heads, n_kv_heads, head_dim);
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
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add_rmsnorm = cpu_add_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .argmax = cpu_argmax,
};

mk_status mk_backend_cpu_create(const mk_backend_config *config, mk_backend **out) {
    if (config->weight_dtype != MK_DTYPE_F32 && config->weight_dtype != MK_DTYPE_F16 &&
        config->weight_dtype != MK_DTYPE_BF16)
        return mk_fail(MK_ERR_DTYPE, "cpu backend: weight dtype %s is not one of f32, f16, bf16",
                       mk_dtype_name(config->weight_dtype));
    mk_backend *b = calloc(1, sizeof *b);
    if (!b) return mk_fail(MK_ERR_OUT_OF_MEMORY, "cpu backend: out of memory");
    b->ops = &mk_cpu_ops;
    b->config = *config;
    *out = b;
    return MK_OK;
}

/* ============================================================ dispatching == */

size_t mk_backend_weight_elem_size(const mk_backend *b) {
    /* The cpu backend keeps F32 storage whatever the dtype (see above). */
    if (b->config.kind == MK_BACKEND_CPU) return sizeof(float);
    return mk_dtype_size(b->config.weight_dtype);
}

mk_status mk_backend_create(const mk_backend_config *config, mk_backend **out) {
    if (out) *out = NULL;
    if (!config || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_backend_create: NULL argument");
    mk_backend_config taken = mk_backend_config_default(MK_BACKEND_CPU);
    MK_TRY(mk_options_take(&taken, sizeof taken, MK_BACKEND_CONFIG_V1_SIZE, config, "mk_backend_config"));
    config = &taken;
    switch (config->kind) {
        case MK_BACKEND_CPU: return mk_backend_cpu_create(config, out);
        case MK_BACKEND_CUDA: return mk_backend_cuda_create(config, out);
    }
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "unknown backend kind %d", (int)config->kind);
}

void mk_backend_destroy(mk_backend *b) {
    if (b) b->ops->destroy(b);
}
