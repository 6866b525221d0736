/* Attention for the cpu backend's native weight mode (see cpu_attention_fast.h): the
 * reference's algorithm (two passes, max-subtracted softmax) with float accumulation:
 * q.k in eight lanes added in a fixed tree, the weighted sum of values elementwise. A
 * portable copy and an AVX2+FMA copy (chosen at run time); each is a fixed function of
 * its inputs. */
#include "cpu_attention_fast.h"

#include <math.h>

#include "cpu_ops.h"
#include "cpu_quant.h"

__attribute__((always_inline)) static inline float mk_dot8(const float *a, const float *b, size_t n) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) lane[j] += a[i + j] * b[i + j];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])) + tail;
}

__attribute__((always_inline)) static inline void mk_attention_fast_core(float *out, const float *q, const float *k_cache, const float *v_cache,
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
#include <immintrin.h>

#define MK_AVX2_FMA __attribute__((target("avx2,fma")))

/* The same algorithm with explicit 8-wide FMA (the compiler at -O2 leaves it scalar). */
MK_AVX2_FMA static inline float mk_dot8_avx2(const float *a, const float *b, size_t n) {
    __m256 acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float sum = _mm_cvtss_f32(s);
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

MK_AVX2_FMA static void mk_attention_fast_avx2(float *out, const float *q, const float *k_cache, const float *v_cache,
                                               size_t begin, size_t end, size_t past, size_t n_heads,
                                               size_t n_kv_heads, size_t head_dim) {
    const size_t group = n_heads / n_kv_heads;
    const size_t kv_stride = n_kv_heads * head_dim;
    const float scale = (float)(1.0 / sqrt((double)head_dim));
    enum { MK_SCORE_CACHE = 4096 };
    float cached[MK_SCORE_CACHE];
    for (size_t item = begin; item < end; item++) {
        const size_t r = item / n_heads, h = item % n_heads;
        const size_t n_keys = past + r + 1;
        const float *qh = q + (r * n_heads + h) * head_dim;
        const float *kh = k_cache + (h / group) * head_dim, *vh = v_cache + (h / group) * head_dim;
        float max_score = -INFINITY;
        for (size_t t = 0; t < n_keys; t++) {
            const float sc = mk_dot8_avx2(qh, kh + t * kv_stride, head_dim) * scale;
            if (t < MK_SCORE_CACHE) cached[t] = sc;
            if (sc > max_score) max_score = sc;
        }
        float acc[MK_MAX_HEAD_DIM];
        for (size_t d = 0; d < head_dim; d++) acc[d] = 0.0f;
        float denom = 0.0f;
        for (size_t t = 0; t < n_keys; t++) {
            const float sc = t < MK_SCORE_CACHE ? cached[t] : mk_dot8_avx2(qh, kh + t * kv_stride, head_dim) * scale;
            const float p = expf(sc - max_score);
            denom += p;
            const float *vt = vh + t * kv_stride;
            const __m256 pv = _mm256_set1_ps(p);
            size_t d = 0;
            for (; d + 8 <= head_dim; d += 8)
                _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(pv, _mm256_loadu_ps(vt + d), _mm256_loadu_ps(acc + d)));
            for (; d < head_dim; d++) acc[d] += p * vt[d];
        }
        float *oh = out + (r * n_heads + h) * head_dim;
        for (size_t d = 0; d < head_dim; d++) oh[d] = acc[d] / denom;
    }
}
#endif

mk_attention_fast_fn mk_cpu_attention_fast_for(const mk_cpu_quant *kernels) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (kernels && kernels == mk_cpu_quant_avx2()) return mk_attention_fast_avx2;
#endif
    return mk_attention_fast_portable;
}
