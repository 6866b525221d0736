/* Attention for the cpu backend's native weight mode (see cpu_attention_fast.h): the
 * reference's algorithm (two passes, max-subtracted softmax) with float accumulation:
 * q.k in eight lanes added in a fixed tree, the weighted sum of values elementwise. A
 * portable copy and an AVX2+FMA copy (chosen at run time); each is a fixed function of
 * its inputs. */
#include "backend/cpu/cpu_attention_fast.h"

#include <math.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_quant.h"

__attribute__((always_inline)) static inline float mk_dot8(const float *a, const float *b, size_t n) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) lane[j] += a[i + j] * b[i + j];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])) + tail;
}

static inline void mk_axpy(float *acc, float p, const float *v, size_t n) {
    for (size_t d = 0; d < n; d++) acc[d] += p * v[d];
}

/* The two-pass attention of items [begin, end) (an item is one row's head), NAME compiled
 * for TARGET with DOT for q.k and AXPY for acc += p v: the portable copy and the AVX2 one
 * for any head_dim differ in those two alone. */
#define MK_ATTENTION_TWO_PASS(TARGET, NAME, DOT, AXPY)                                                         \
    TARGET static void NAME(float *out, const float *q, const float *k_cache, const float *v_cache,             \
                            mk_kv_pages pages, size_t begin, size_t end, size_t past, size_t n_heads,           \
                            size_t n_kv_heads, size_t head_dim) {                                               \
        const size_t group = n_heads / n_kv_heads;                                                              \
        const size_t kv_stride = n_kv_heads * head_dim;                                                         \
        const float scale = (float)(1.0 / sqrt((double)head_dim));                                              \
        enum { MK_SCORE_CACHE = 4096 }; /* longer rows recompute the rest, as the reference */                 \
        float cached[MK_SCORE_CACHE];                                                                           \
        for (size_t item = begin; item < end; item++) {                                                         \
            const size_t r = item / n_heads, h = item % n_heads;                                                \
            const size_t n_keys = past + r + 1;                                                                 \
            const float *qh = q + (r * n_heads + h) * head_dim;                                                 \
            const float *kh = k_cache + (h / group) * head_dim, *vh = v_cache + (h / group) * head_dim;         \
            float max_score = -INFINITY;                                                                        \
            for (size_t t = 0; t < n_keys; t++) {                                                               \
                const float s = DOT(qh, kh + mk_kv_row(pages, t) * kv_stride, head_dim) * scale;                \
                if (t < MK_SCORE_CACHE) cached[t] = s;                                                          \
                if (s > max_score) max_score = s;                                                               \
            }                                                                                                   \
            float acc[MK_MAX_HEAD_DIM];                                                                         \
            for (size_t d = 0; d < head_dim; d++) acc[d] = 0.0f;                                                \
            float denom = 0.0f;                                                                                 \
            for (size_t t = 0; t < n_keys; t++) {                                                               \
                const float s =                                                                                 \
                    t < MK_SCORE_CACHE ? cached[t] : DOT(qh, kh + mk_kv_row(pages, t) * kv_stride, head_dim) * scale; \
                const float p = expf(s - max_score);                                                            \
                denom += p;                                                                                     \
                AXPY(acc, p, vh + mk_kv_row(pages, t) * kv_stride, head_dim);                                   \
            }                                                                                                   \
            float *oh = out + (r * n_heads + h) * head_dim;                                                     \
            for (size_t d = 0; d < head_dim; d++) oh[d] = acc[d] / denom;                                       \
        }                                                                                                       \
    }

MK_ATTENTION_TWO_PASS(, mk_attention_fast_portable, mk_dot8, mk_axpy)

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

MK_AVX2_FMA static inline void mk_axpy_avx2(float *acc, float p, const float *v, size_t n) {
    const __m256 pv = _mm256_set1_ps(p);
    size_t d = 0;
    for (; d + 8 <= n; d += 8)
        _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + d), _mm256_loadu_ps(acc + d)));
    for (; d < n; d++) acc[d] += p * v[d];
}

MK_ATTENTION_TWO_PASS(MK_AVX2_FMA, mk_attention_fast_avx2_any, mk_dot8_avx2, mk_axpy_avx2)

/* ------------------------------------------------- head_dim a multiple of 8 -- */

/* e^x for eight lanes: x = n ln2 + r (|r| <= ln2 / 2, ln2 in two parts so n ln2 is exact),
 * e^r by the degree-7 Cephes polynomial, times 2^n built in the exponent bits; about one
 * ulp from expf over the softmax's range (x <= 0). Clamped to [-87.3, 88.7] so 2^n stays a
 * normal float; the clamps keep a NaN input (max/min return their second operand for a
 * NaN), so NaN scores still give a NaN output as with expf. */
MK_AVX2_FMA static inline __m256 mk_exp8_avx2(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(88.7f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* Lanes 0..n-1 set (n <= 8): the valid part of the last vector of scores. */
MK_AVX2_FMA static inline __m256 mk_lanes_below(size_t n) {
    return _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

/* One (row, head) pair, head_dim = 8 * NV (a constant at each call site, so q and the
 * output accumulators live in registers). Scores four keys at a time (four independent
 * FMA chains, summed across lanes together), the softmax's exponentials eight at a
 * time, then the value rows weighted in. s: scratch for n_keys scores, rounded up to 8. */
MK_AVX2_FMA __attribute__((always_inline)) static inline void mk_attention_head_avx2(
    float *oh, const float *qh, const float *kh, const float *vh, mk_kv_pages pages, size_t n_keys, size_t kv_stride,
    float scale,
    float *s, size_t NV) {
    __m256 q[MK_MAX_HEAD_DIM / 8];
    for (size_t i = 0; i < NV; i++) q[i] = _mm256_loadu_ps(qh + 8 * i);
    const __m256 vscale = _mm256_set1_ps(scale);
    size_t t = 0;
    for (; t + 4 <= n_keys; t += 4) {
        /* four keys, each found through the block table (they may sit in different blocks) */
        const float *k0 = kh + mk_kv_row(pages, t) * kv_stride, *k1 = kh + mk_kv_row(pages, t + 1) * kv_stride;
        const float *k2 = kh + mk_kv_row(pages, t + 2) * kv_stride, *k3 = kh + mk_kv_row(pages, t + 3) * kv_stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t i = 0; i < NV; i++) {
            a0 = _mm256_fmadd_ps(q[i], _mm256_loadu_ps(k0 + 8 * i), a0);
            a1 = _mm256_fmadd_ps(q[i], _mm256_loadu_ps(k1 + 8 * i), a1);
            a2 = _mm256_fmadd_ps(q[i], _mm256_loadu_ps(k2 + 8 * i), a2);
            a3 = _mm256_fmadd_ps(q[i], _mm256_loadu_ps(k3 + 8 * i), a3);
        }
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        const __m128 sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        _mm_storeu_ps(s + t, _mm_mul_ps(sum, _mm256_castps256_ps128(vscale)));
    }
    for (; t < n_keys; t++) {
        const float *k0 = kh + mk_kv_row(pages, t) * kv_stride;
        __m256 a0 = _mm256_setzero_ps();
        for (size_t i = 0; i < NV; i++) a0 = _mm256_fmadd_ps(q[i], _mm256_loadu_ps(k0 + 8 * i), a0);
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a0), _mm256_hadd_ps(a0, a0));
        s[t] = _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1))) * scale;
    }
    /* Softmax: the max (the padding past n_keys is masked out), e^(s - max) in place. */
    const size_t full = n_keys & ~(size_t)7, rest = n_keys - full;
    const __m256 tail = mk_lanes_below(rest);
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (t = 0; t < full; t += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + t));
    if (rest) m = _mm256_max_ps(m, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(s + full), tail));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const __m256 vmax = _mm256_broadcastss_ps(m4);
    __m256 dsum = _mm256_setzero_ps();
    for (t = 0; t < full; t += 8) {
        const __m256 p = mk_exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + t), vmax));
        _mm256_storeu_ps(s + t, p);
        dsum = _mm256_add_ps(dsum, p);
    }
    if (rest) {
        const __m256 p = _mm256_and_ps(mk_exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + full), vmax)), tail);
        _mm256_storeu_ps(s + full, p);
        dsum = _mm256_add_ps(dsum, p);
    }
    __m128 d4 = _mm_add_ps(_mm256_castps256_ps128(dsum), _mm256_extractf128_ps(dsum, 1));
    d4 = _mm_add_ps(d4, _mm_movehl_ps(d4, d4));
    d4 = _mm_add_ss(d4, _mm_movehdup_ps(d4));
    /* Weighted values: each output lane one FMA chain over the keys. */
    __m256 acc[MK_MAX_HEAD_DIM / 8];
    for (size_t i = 0; i < NV; i++) acc[i] = _mm256_setzero_ps();
    for (t = 0; t < n_keys; t++) {
        const __m256 p = _mm256_broadcast_ss(s + t);
        const float *vt = vh + mk_kv_row(pages, t) * kv_stride;
        for (size_t i = 0; i < NV; i++) acc[i] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vt + 8 * i), acc[i]);
    }
    const __m256 denom = _mm256_broadcastss_ps(d4);
    for (size_t i = 0; i < NV; i++) _mm256_storeu_ps(oh + 8 * i, _mm256_div_ps(acc[i], denom));
}

MK_AVX2_FMA static void mk_attention_fast_avx2(float *out, const float *q, const float *k_cache, const float *v_cache,
                                               mk_kv_pages pages, size_t begin, size_t end, size_t past, size_t n_heads,
                                               size_t n_kv_heads, size_t head_dim) {
    enum { MK_SCORE_CACHE = 4096 };
    const size_t max_keys = past + (end ? (end - 1) / n_heads : 0) + 1;
    if (head_dim % 8 != 0 || max_keys > MK_SCORE_CACHE) {
        mk_attention_fast_avx2_any(out, q, k_cache, v_cache, pages, begin, end, past, n_heads, n_kv_heads, head_dim);
        return;
    }
    const size_t group = n_heads / n_kv_heads;
    const size_t kv_stride = n_kv_heads * head_dim;
    const float scale = (float)(1.0 / sqrt((double)head_dim));
    float scores[MK_SCORE_CACHE + 8];
    for (size_t item = begin; item < end; item++) {
        const size_t r = item / n_heads, h = item % n_heads;
        const float *qh = q + (r * n_heads + h) * head_dim;
        const float *kh = k_cache + (h / group) * head_dim, *vh = v_cache + (h / group) * head_dim;
        float *oh = out + (r * n_heads + h) * head_dim;
        const size_t n_keys = past + r + 1;
        /* The common widths get their own copy with the loop bounds constant. */
        if (head_dim == 64) mk_attention_head_avx2(oh, qh, kh, vh, pages, n_keys, kv_stride, scale, scores, 8);
        else if (head_dim == 128) mk_attention_head_avx2(oh, qh, kh, vh, pages, n_keys, kv_stride, scale, scores, 16);
        else mk_attention_head_avx2(oh, qh, kh, vh, pages, n_keys, kv_stride, scale, scores, head_dim / 8);
    }
}
#endif

mk_attention_fast_fn mk_cpu_attention_fast_for(const mk_cpu_quant *kernels) {
#if defined(__x86_64__) && defined(__GNUC__)
    /* Every table but the portable one means a CPU with AVX2 + FMA (the VNNI ones are AVX2
     * and more). */
    if (kernels && kernels != mk_cpu_quant_portable()) return mk_attention_fast_avx2;
#endif
    return mk_attention_fast_portable;
}
