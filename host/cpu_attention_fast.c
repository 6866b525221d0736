/* Attention for the cpu backend's native weight mode (see cpu_attention_fast.h): the
 * reference's algorithm (two passes, max-subtracted softmax) with float accumulation in
 * a form the compiler vectorizes: q.k in eight fixed lanes added in a fixed tree, the
 * weighted sum of values elementwise. Compiled twice, for baseline x86-64 and for
 * AVX2+FMA (chosen at run time); each copy is a fixed function of its inputs. */
#include "cpu_attention_fast.h"

#include <math.h>

#include "cpu_ops.h"
#include "cpu_quant.h"

static inline float mk_dot8(const float *a, const float *b, size_t n) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) lane[j] += a[i + j] * b[i + j];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])) + tail;
}

static inline void mk_attention_fast_core(float *out, const float *q, const float *k_cache, const float *v_cache,
                                          size_t begin, size_t end, size_t past, size_t n_heads, size_t n_kv_heads,
                                          size_t head_dim) {
    const size_t group = n_heads / n_kv_heads;
    const size_t kv_stride = n_kv_heads * head_dim;
    const float scale = (float)(1.0 / sqrt((double)head_dim));
    enum { MK_SCORE_CACHE = 4096 }; /* longer rows recompute the rest, as the reference */
    float cached[MK_SCORE_CACHE];
    for (size_t item = begin; item < end; item++) {
        const size_t r = item / n_heads, h = item % n_heads;
        const size_t n_keys = past + r + 1;
        const float *qh = q + (r * n_heads + h) * head_dim;
        const float *kh = k_cache + (h / group) * head_dim, *vh = v_cache + (h / group) * head_dim;
        float max_score = -INFINITY;
        for (size_t t = 0; t < n_keys; t++) {
            const float s = mk_dot8(qh, kh + t * kv_stride, head_dim) * scale;
            if (t < MK_SCORE_CACHE) cached[t] = s;
            if (s > max_score) max_score = s;
        }
        float acc[MK_MAX_HEAD_DIM];
        for (size_t d = 0; d < head_dim; d++) acc[d] = 0.0f;
        float denom = 0.0f;
        for (size_t t = 0; t < n_keys; t++) {
            const float s = t < MK_SCORE_CACHE ? cached[t] : mk_dot8(qh, kh + t * kv_stride, head_dim) * scale;
            const float p = expf(s - max_score);
            denom += p;
            const float *vt = vh + t * kv_stride;
            for (size_t d = 0; d < head_dim; d++) acc[d] += p * vt[d];
        }
        float *oh = out + (r * n_heads + h) * head_dim;
        for (size_t d = 0; d < head_dim; d++) oh[d] = acc[d] / denom;
    }
}

static void mk_attention_fast_portable(float *out, const float *q, const float *k_cache, const float *v_cache,
                                       size_t begin, size_t end, size_t past, size_t n_heads, size_t n_kv_heads,
                                       size_t head_dim) {
    mk_attention_fast_core(out, q, k_cache, v_cache, begin, end, past, n_heads, n_kv_heads, head_dim);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) static void mk_attention_fast_avx2(float *out, const float *q,
                                                                       const float *k_cache, const float *v_cache,
                                                                       size_t begin, size_t end, size_t past,
                                                                       size_t n_heads, size_t n_kv_heads,
                                                                       size_t head_dim) {
    mk_attention_fast_core(out, q, k_cache, v_cache, begin, end, past, n_heads, n_kv_heads, head_dim);
}
#endif

mk_attention_fast_fn mk_cpu_attention_fast_for(const mk_cpu_quant *kernels) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (kernels && kernels == mk_cpu_quant_avx2()) return mk_attention_fast_avx2;
#endif
    return mk_attention_fast_portable;
}
