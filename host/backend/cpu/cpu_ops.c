/* CPU reference ops (see cpu_ops.h). Plain loops, except the matrix product (OpenBLAS). */
#include "backend/cpu/cpu_ops.h"

#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

/* ====================================================================== rows == */

void mk_cpu_embed(float *out, const float *table, const int32_t *ids, size_t n, size_t hidden) {
    for (size_t i = 0; i < n; i++)
        memcpy(out + i * hidden, table + (size_t)ids[i] * hidden, hidden * sizeof(float));
}

void mk_cpu_rmsnorm(float *out, const float *x, const float *w, size_t rows, size_t cols,
                    float eps) {
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        double sum_sq = 0.0;
        for (size_t c = 0; c < cols; c++) sum_sq += (double)xr[c] * (double)xr[c];
        const float scale = (float)(1.0 / sqrt(sum_sq / (double)cols + (double)eps));
        float *o = out + r * cols;
        for (size_t c = 0; c < cols; c++) o[c] = xr[c] * scale * w[c];
    }
}

void mk_cpu_add_rmsnorm(float *residual, float *out, const float *delta, const float *w,
                        size_t rows, size_t cols, float eps) {
    mk_cpu_add(residual, delta, rows * cols);
    mk_cpu_rmsnorm(out, residual, w, rows, cols, eps);
}

void mk_cpu_add(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

/* ====================================================================== rope == */

float mk_rope_inv_freq(size_t pair, size_t head_dim, float theta) {
    return (float)pow((double)theta, -(double)(2 * pair) / (double)head_dim);
}

/* The rotation of pair i at position p, exactly as mk_cpu_rope defines it. */
static void mk_rope_cos_sin(int32_t p, size_t i, size_t head_dim, float theta, float *c, float *s) {
    const float angle = (float)p * mk_rope_inv_freq(i, head_dim, theta);
    *c = (float)cos((double)angle);
    *s = (float)sin((double)angle);
}

void mk_cpu_rope_table(float *table, size_t n_positions, size_t head_dim, float theta) {
    const size_t half = head_dim / 2;
    for (size_t p = 0; p < n_positions; p++)
        for (size_t i = 0; i < half; i++)
            mk_rope_cos_sin((int32_t)p, i, head_dim, theta, &table[(p * half + i) * 2], &table[(p * half + i) * 2 + 1]);
}

void mk_cpu_rope(float *x, const int32_t *positions, size_t rows, size_t n_heads, size_t head_dim,
                 float theta, mk_rope_layout layout) {
    mk_cpu_rope_cached(x, positions, rows, n_heads, head_dim, theta, layout, NULL, 0);
}

void mk_cpu_rope_cached(float *x, const int32_t *positions, size_t rows, size_t n_heads, size_t head_dim,
                        float theta, mk_rope_layout layout, const float *table, size_t n_positions) {
    const size_t half = head_dim / 2;
    for (size_t r = 0; r < rows; r++) {
        const bool cached = table && positions[r] >= 0 && (size_t)positions[r] < n_positions;
        for (size_t i = 0; i < half; i++) {
            float c, s;
            if (cached) {
                c = table[((size_t)positions[r] * half + i) * 2];
                s = table[((size_t)positions[r] * half + i) * 2 + 1];
            } else {
                mk_rope_cos_sin(positions[r], i, head_dim, theta, &c, &s);
            }
            for (size_t h = 0; h < n_heads; h++) {
                float *head = x + (r * n_heads + h) * head_dim;
                const size_t a = layout == MK_ROPE_ROTATE_HALF ? i : 2 * i;
                const size_t b = layout == MK_ROPE_ROTATE_HALF ? i + half : 2 * i + 1;
                const float xa = head[a], xb = head[b];
                head[a] = xa * c - xb * s;
                head[b] = xb * c + xa * s;
            }
        }
    }
}

/* ================================================================= attention == */

void mk_cpu_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                      size_t rows, size_t past, size_t n_heads, size_t n_kv_heads,
                      size_t head_dim) {
    mk_cpu_attention_heads(out, q, k_cache, v_cache, (mk_kv_pages){NULL, 0, 0}, 0, rows * n_heads, past, n_heads, n_kv_heads, head_dim);
}

/* A cache element as float: F32 as stored, F16 widened exactly. */
static inline float mk_kv_at(const void *cache, size_t i, bool f16) {
    return f16 ? mk_f16_to_f32(((const uint16_t *)cache)[i]) : ((const float *)cache)[i];
}

/* The attention of pairs [begin, end); `f16` is a constant at each call site below, so
 * each caller gets its own specialised copy and the F32 path is the plain float loop. */
static inline void mk_attention_core(float *out, const float *q, const void *k_cache, const void *v_cache,
                                     mk_kv_pages pages, size_t begin, size_t end, size_t past, size_t n_heads, size_t n_kv_heads,
                                     size_t head_dim, bool f16) {
    const size_t group = n_heads / n_kv_heads;
    const size_t kv_stride = n_kv_heads * head_dim;
    const float scale = (float)(1.0 / sqrt((double)head_dim));
    /* Two passes over the keys: the max, then the weighted sum. The first MK_SCORE_CACHE
     * scores are kept from pass one; longer rows recompute the rest with the same float
     * operations, so the result does not depend on where the cache ends. */
    enum { MK_SCORE_CACHE = 4096 };
    float cached[MK_SCORE_CACHE];
    for (size_t item = begin; item < end; item++) {
        const size_t r = item / n_heads, h = item % n_heads;
        const size_t n_keys = past + r + 1;
        const float *qh = q + (r * n_heads + h) * head_dim;
        const size_t kvh = h / group;
        float max_score = -INFINITY;
        for (size_t t = 0; t < n_keys; t++) {
            const size_t kt = mk_kv_row(pages, t) * kv_stride + kvh * head_dim;
            float dot = 0.0f;
            for (size_t d = 0; d < head_dim; d++) dot += qh[d] * mk_kv_at(k_cache, kt + d, f16);
            dot *= scale;
            if (t < MK_SCORE_CACHE) cached[t] = dot;
            if (dot > max_score) max_score = dot;
        }
        float *oh = out + (r * n_heads + h) * head_dim;
        double accp[MK_MAX_HEAD_DIM]; /* head_dim <= MK_MAX_HEAD_DIM by hparams */
        double denom = 0.0;
        for (size_t d = 0; d < head_dim; d++) accp[d] = 0.0;
        for (size_t t = 0; t < n_keys; t++) {
            const size_t vt = mk_kv_row(pages, t) * kv_stride + kvh * head_dim;
            float dot;
            if (t < MK_SCORE_CACHE) {
                dot = cached[t];
            } else {
                const size_t kt = mk_kv_row(pages, t) * kv_stride + kvh * head_dim;
                dot = 0.0f;
                for (size_t d = 0; d < head_dim; d++) dot += qh[d] * mk_kv_at(k_cache, kt + d, f16);
                dot *= scale;
            }
            const float p = expf(dot - max_score);
            denom += p;
            for (size_t d = 0; d < head_dim; d++) accp[d] += (double)p * mk_kv_at(v_cache, vt + d, f16);
        }
        for (size_t d = 0; d < head_dim; d++) oh[d] = (float)(accp[d] / denom);
    }
}

void mk_cpu_attention_heads(float *out, const float *q, const float *k_cache, const float *v_cache,
                            mk_kv_pages pages, size_t begin, size_t end, size_t past, size_t n_heads, size_t n_kv_heads,
                            size_t head_dim) {
    mk_attention_core(out, q, k_cache, v_cache, pages, begin, end, past, n_heads, n_kv_heads, head_dim, false);
}

void mk_cpu_attention_heads_f16(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                mk_kv_pages pages, size_t begin, size_t end, size_t past, size_t n_heads, size_t n_kv_heads,
                                size_t head_dim) {
    mk_attention_core(out, q, k_cache, v_cache, pages, begin, end, past, n_heads, n_kv_heads, head_dim, true);
}

/* ===================================================================== swiglu == */

void mk_cpu_swiglu(float *out, const float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* ===================================================================== argmax == */

void mk_cpu_argmax(int32_t *out, const float *x, size_t rows, size_t n) {
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        size_t best = 0;
        float best_value = -INFINITY;
        bool found = false;
        for (size_t j = 0; j < n; j++) {
            if (isnan(xr[j])) continue;
            if (!found || xr[j] > best_value) {
                best = j;
                best_value = xr[j];
                found = true;
            }
        }
        out[r] = (int32_t)best;
    }
}

/* ===================================================================== matmul == */

void mk_cpu_matmul(float *y, const float *x, const float *w, size_t rows, size_t in_dim,
                   size_t out_dim) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)rows, (blasint)out_dim,
                (blasint)in_dim, 1.0f, x, (blasint)in_dim, w, (blasint)in_dim, 0.0f, y,
                (blasint)out_dim);
}

size_t mk_cpu_blas_threads(void) {
    const int n = openblas_get_num_threads();
    return n > 0 ? (size_t)n : 1;
}

void mk_cpu_sgemm_strided(float *y, size_t ldy, const float *x, const float *w, size_t rows, size_t in_dim,
                          size_t n) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)rows, (blasint)n, (blasint)in_dim, 1.0f, x,
                (blasint)in_dim, w, (blasint)in_dim, 0.0f, y, (blasint)ldy);
}
