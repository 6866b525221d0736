/* Native-format dot products with AVX2 + FMA + F16C (see cpu_quant.h). Each kernel is
 * compiled for those instructions through a function-level target attribute and only
 * reached after a run-time check, so the library stays portable.
 *
 * The integer part of every block is computed the way the format allows: unsigned 4/6-bit
 * weights times signed 8-bit activations with maddubs (u8 x s8 -> pairs of i16, no
 * saturation at these ranges), signed 8-bit weights through the sign trick
 * (|w| x sign(w)*x), then pairs summed to i32 with madd. Each block's i32 lanes are
 * converted to float and accumulated with its scale in eight float lanes; the lanes are
 * added once at the end of the row. */
#include "backend/cpu/cpu_quant.h"
#include "model/gguf.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

/* The Q4_1 kernels load (d, s) of an activation block as one 64-bit pair. */
_Static_assert(offsetof(mk_q8_block, s) == offsetof(mk_q8_block, d) + sizeof(float), "mk_q8_block: d, s adjacent");

#define MK_AVX2 __attribute__((target("avx2,fma,f16c")))

/* How far ahead of the block being multiplied the weight stream is prefetched. A decode
 * step reads every weight once (tens of MB, from DRAM), and the hardware prefetcher alone
 * keeps a dot at 5-7 GB/s on this project's 2-core Xeon, against 20 GB/s for a plain
 * streaming read; asking for the line 4 KiB ahead (into the rows that follow: a thread
 * takes consecutive rows) halves a DRAM-resident Q4_1/Q8_0 row's time and costs nothing
 * when the weights sit in cache (cpu_quant microbenchmark in the notes of #27). A prefetch
 * never faults, so running past the last row is harmless. */
#define CX_PREFETCH_AHEAD 4096
#define CX_PREFETCH(p) _mm_prefetch((const char *)(p) + CX_PREFETCH_AHEAD, _MM_HINT_T0)
/* A K-quant super-block spans several cache lines: one prefetch per 64 bytes of it. */
#define CX_PREFETCH_BLOCK(p, bytes) \
    for (size_t line_ = 0; line_ < (bytes); line_ += 64) CX_PREFETCH((const uint8_t *)(p) + line_)

MK_AVX2 static inline float cx_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

MK_AVX2 static inline float cx_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

MK_AVX2 static inline __m256i cx_loadu(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 16 bytes of packed nibbles -> 32 bytes: low nibbles (values 0..15) then high (16..31). */
MK_AVX2 static inline __m256i cx_nibbles(const uint8_t *qs) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

/* Unsigned bytes u times signed bytes s, summed in groups of four into eight i32 lanes. */
MK_AVX2 static inline __m256i cx_dot_us(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* Signed bytes a times signed bytes b, b in [-127, 127] (the activation range): |a| as
 * unsigned times sign(a)*b, so even a = -128 stays exact. */
MK_AVX2 static inline __m256i cx_dot_ss(__m256i a, __m256i b) {
    return cx_dot_us(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

/* ============================================================ activations == */

/* The bit pattern of the largest |x| over n floats (n a multiple of 32), the portable
 * kernel's integer max (mk_q8_scale_of_bits says why integers: NaN and Inf are seen in any
 * order). */
MK_AVX2 static uint32_t cx_absmax_bits(const float *x, size_t n) {
    const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
    __m256i m = _mm256_setzero_si256();
    for (size_t i = 0; i < n; i += 8)
        m = _mm256_max_epi32(m, _mm256_and_si256(magnitude, _mm256_loadu_si256((const __m256i *)(x + i))));
    __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm_max_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    return (uint32_t)_mm_cvtsi128_si32(h);
}

MK_AVX2 static inline int cx_hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* 32 values times id (1 / d), rounded to nearest even, as bytes at q; the sums of the
 * first and the last 16 in *lo and *hi. id 0 (mk_q8_scale_of_bits: NaN, Inf or too small)
 * gives zeros, as cq_round does: x * 0 has no integer value for a NaN or an Inf. */
MK_AVX2 static inline void cx_quantize32(int8_t *q, const float *xb, float id, int *lo, int *hi) {
    if (id == 0.0f) {
        memset(q, 0, 32);
        *lo = *hi = 0;
        return;
    }
    const __m256 mul = _mm256_set1_ps(id);
    __m256i v[4];
    for (int i = 0; i < 4; i++)
        v[i] = _mm256_cvtps_epi32(
            _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * i), mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    *lo = cx_hsum_epi32(_mm256_add_epi32(v[0], v[1]));
    *hi = cx_hsum_epi32(_mm256_add_epi32(v[2], v[3]));
    /* Pack 32 i32 to 32 i8; the in-lane packs interleave 128-bit halves, undone by the
     * final permute. */
    const __m256i p16a = _mm256_packs_epi32(v[0], v[1]), p16b = _mm256_packs_epi32(v[2], v[3]);
    const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    const __m256i ordered = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, ordered);
}

/* The portable kernels' scale rule per block of 32... */
MK_AVX2 static void cx_quantize_row(mk_q8_block *out, const float *x, size_t n) {
    for (size_t b = 0; b < n / MK_Q8_BLOCK; b++) {
        const float *xb = x + b * MK_Q8_BLOCK;
        float id;
        const float d = mk_q8_scale_of_bits(cx_absmax_bits(xb, MK_Q8_BLOCK), &id);
        int lo, hi;
        cx_quantize32(out[b].q, xb, id, &lo, &hi);
        out[b].d = d;
        out[b].s = d * (float)(lo + hi);
    }
}

/* ... and per 256 with the sums of each 16. */
MK_AVX2 static void cx_quantize_row_k(mk_q8k_block *out, const float *x, size_t n) {
    for (size_t b = 0; b < n / MK_Q8K_BLOCK; b++) {
        const float *xb = x + b * MK_Q8K_BLOCK;
        float id;
        const float d = mk_q8_scale_of_bits(cx_absmax_bits(xb, MK_Q8K_BLOCK), &id);
        for (int i = 0; i < MK_Q8K_BLOCK / 32; i++) {
            int lo, hi;
            cx_quantize32(out[b].q + 32 * i, xb + 32 * i, id, &lo, &hi);
            out[b].sums[2 * i] = (int16_t)lo;
            out[b].sums[2 * i + 1] = (int16_t)hi;
        }
        out[b].d = d;
    }
}

/* ========================================================= 32-wide blocks == */

/* A Q4_1 block's (d, m) as floats (one F16C conversion of the packed pair). */
MK_AVX2 static inline __m128 cx_q4_1_dm(const uint8_t *w) {
    uint32_t dm;
    memcpy(&dm, w, sizeof dm);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm));
}

/* A Q4_1 block's nibbles: low (elements 0-15) and high (16-31), each as 16 bytes. */
typedef struct cx_q4_1_nib {
    __m128i lo, hi;
} cx_q4_1_nib;
MK_AVX2 static inline cx_q4_1_nib cx_q4_1_unpack(const uint8_t *qs) {
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    return (cx_q4_1_nib){_mm_and_si128(raw, m4), _mm_and_si128(_mm_srli_epi16(raw, 4), m4)};
}

/* The integer part of one Q4_1 block (the odd last block of a row): low and high nibbles
 * each times their 16 activations as pair sums (<= 2 x 15 x 127), the two added as i16
 * (<= 7620, no overflow), then one madd to four i32; lane k holds the 8 products of
 * elements 4k..4k+3 and 16+4k..16+4k+3. */
MK_AVX2 static inline __m128 cx_q4_1_isum(cx_q4_1_nib q, const int8_t *ylo, const int8_t *yhi) {
    const __m128i p = _mm_add_epi16(_mm_maddubs_epi16(q.lo, _mm_loadu_si128((const __m128i *)ylo)),
                                    _mm_maddubs_epi16(q.hi, _mm_loadu_si128((const __m128i *)yhi)));
    return _mm_cvtepi32_ps(_mm_madd_epi16(p, _mm_set1_epi16(1)));
}

/* One row's accumulators over Q4_1 blocks: two FMA chains (even and odd blocks) and the
 * mins (lane 1 sums m * x.s). */
typedef struct cx_q4_1_acc {
    __m128 acc0, acc1, mins;
} cx_q4_1_acc;
/* One block: its activations' low and high 16 values and their (d, s) pair. */
MK_AVX2 static inline void cx_q4_1_one(cx_q4_1_acc *a, __m128 dm, cx_q4_1_nib q, const int8_t *ylo, const int8_t *yhi,
                                        const float *ds) {
    const __m128 s = _mm_mul_ps(dm, _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)ds)));
    a->acc0 = _mm_fmadd_ps(_mm_broadcastss_ps(s), cx_q4_1_isum(q, ylo, yhi), a->acc0);
    a->mins = _mm_add_ps(a->mins, s);
}
MK_AVX2 static inline float cx_q4_1_total(const cx_q4_1_acc *acc) {
    __m128 a = _mm_add_ps(acc->acc0, acc->acc1);
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a) + _mm_cvtss_f32(_mm_movehdup_ps(acc->mins));
}

/* Two blocks side by side in 256 bits (block b in the low half, b + 1 in the high): the
 * pair's low and high nibbles, its scales [d0 m0 d1 m1] as floats and the two blocks'
 * activation halves gathered the same way. Each half holds exactly the integers and floats
 * the 128-bit step (cx_q4_1_one) computes for its block, so the low half of the accumulator
 * is the even-block chain acc0 and the high half the odd-block chain acc1: the arithmetic
 * of two 128-bit chains in half the instructions (1.3x per row in cache with VNNI). */
typedef struct cx_q4_1_wide {
    __m256i lo, hi; /* nibbles 0-15 and 16-31 of both blocks */
    __m128 dm;      /* d0 m0 d1 m1 */
} cx_q4_1_wide;
MK_AVX2 static inline cx_q4_1_wide cx_q4_1_unpack2(const uint8_t *w) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i raw =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(w + 4))),
                                _mm_loadu_si128((const __m128i *)(w + 24)), 1);
    uint32_t dm0, dm1;
    memcpy(&dm0, w, sizeof dm0);
    memcpy(&dm1, w + 20, sizeof dm1);
    const __m128i dm = _mm_unpacklo_epi32(_mm_cvtsi32_si128((int)dm0), _mm_cvtsi32_si128((int)dm1));
    return (cx_q4_1_wide){_mm256_and_si256(raw, m4), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4),
                          _mm_cvtph_ps(dm)};
}
/* x[0].q[h..h+15] in the low half, x[1].q[h..h+15] in the high. */
MK_AVX2 static inline __m256i cx_q8_halves(const mk_q8_block *x, int h) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(x[0].q + h))),
                                   _mm_loadu_si128((const __m128i *)(x[1].q + h)), 1);
}
/* The integer sums of both blocks: lane k of each half = the 8 products of cx_q4_1_isum. */
MK_AVX2 static inline __m256i cx_q4_1_isum2_avx2(const cx_q4_1_wide *q, __m256i y0, __m256i y1) {
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(q->lo, y0), _mm256_maddubs_epi16(q->hi, y1));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
/* [x0.d, x0.s, x1.d, x1.s] of two blocks (a pair's ds). */
MK_AVX2 static inline __m128 cx_q8_ds2(const mk_q8_block *x) {
    return _mm_castsi128_ps(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)&x[0].d),
                                               _mm_loadl_epi64((const __m128i *)&x[1].d)));
}
/* The float part of a pair step: scales [d0*x0.d, m0*x0.s, d1*x1.d, m1*x1.s] (the products
 * cx_q4_1_one forms), the min terms added as (m0 x0.s + m1 x1.s), and each block's scale
 * broadcast over its half. */
MK_AVX2 static inline void cx_q4_1_step2(__m256 *acc, __m128 *mins, __m128 dm, __m256i isum, __m128 xs) {
    const __m128 s = _mm_mul_ps(dm, xs);
    *mins = _mm_add_ps(*mins, _mm_add_ps(s, _mm_movehl_ps(s, s)));
    const __m256 scale = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
    *acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), *acc);
}
/* The wide chains as the two 128-bit ones (for the odd last block and the total). */
MK_AVX2 static inline cx_q4_1_acc cx_q4_1_narrow(__m256 acc, __m128 mins) {
    return (cx_q4_1_acc){_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1), mins};
}

/* An n-row dot NAME(w, x, rows, n, out) for 1 to 4 (CX_BY_ROWS4) or 1 to 8 (CX_BY_ROWS8)
 * activation rows of type XTYPE: ROWS(TARGET, NAME_R, ARG, R) makes the kernel for a fixed R
 * (its accumulators stay in registers), and NAME picks one by rows. Eight rows need AVX-512's
 * 32 vector registers (EVEX encodes ymm16-31 too); with 16 they would spill. */
_Static_assert(MK_QDOTN_MAX_ROWS == 8, "CX_BY_ROWS8 makes kernels for up to MK_QDOTN_MAX_ROWS rows");
/* A fixed-row kernel's loop over its rows must be unrolled for the accumulators to stay in
 * registers (gcc -O2 otherwise keeps them in a stack array at 4 rows: 2x slower). */
#define CX_UNROLL _Pragma("GCC unroll 8")
#define CX_ROWS_1_TO_4(ROWS, TARGET, NAME, ARG) \
    ROWS(TARGET, NAME##_1, ARG, 1)              \
    ROWS(TARGET, NAME##_2, ARG, 2)              \
    ROWS(TARGET, NAME##_3, ARG, 3)              \
    ROWS(TARGET, NAME##_4, ARG, 4)
#define CX_BY_ROWS4(ROWS, TARGET, NAME, ARG, XTYPE)                                                        \
    CX_ROWS_1_TO_4(ROWS, TARGET, NAME, ARG)                                                               \
    TARGET static void NAME(const uint8_t *w, const XTYPE *const *x, size_t rows, size_t n, float *out) { \
        switch (rows) {                                                                                   \
            case 1: NAME##_1(w, x, n, out); break;                                                        \
            case 2: NAME##_2(w, x, n, out); break;                                                        \
            case 3: NAME##_3(w, x, n, out); break;                                                        \
            default: NAME##_4(w, x, n, out); break;                                                       \
        }                                                                                                 \
    }
#define CX_BY_ROWS8(ROWS, TARGET, NAME, ARG, XTYPE)                                                        \
    CX_ROWS_1_TO_4(ROWS, TARGET, NAME, ARG)                                                               \
    ROWS(TARGET, NAME##_5, ARG, 5)                                                                        \
    ROWS(TARGET, NAME##_6, ARG, 6)                                                                        \
    ROWS(TARGET, NAME##_7, ARG, 7)                                                                        \
    ROWS(TARGET, NAME##_8, ARG, 8)                                                                        \
    TARGET static void NAME(const uint8_t *w, const XTYPE *const *x, size_t rows, size_t n, float *out) { \
        switch (rows) {                                                                                   \
            case 1: NAME##_1(w, x, n, out); break;                                                        \
            case 2: NAME##_2(w, x, n, out); break;                                                        \
            case 3: NAME##_3(w, x, n, out); break;                                                        \
            case 4: NAME##_4(w, x, n, out); break;                                                        \
            case 5: NAME##_5(w, x, n, out); break;                                                        \
            case 6: NAME##_6(w, x, n, out); break;                                                        \
            case 7: NAME##_7(w, x, n, out); break;                                                        \
            default: NAME##_8(w, x, n, out); break;                                                       \
        }                                                                                                 \
    }

/* Q4_1 row dots built from a pair-sum function ISUM: one row over its blocks (DOT, the
 * table's dot_q4_1), and 1 to BY's rows over their pairs (DOTN: each weight pair unpacked once
 * for all the rows; the rows' activations come regrouped, so a step only loads them). Both
 * forms feed a row's step the same integers and floats in the same order, so DOTN's out[r]
 * has the bits of DOT on that row (tested), whoever else is in the batch. */
#define CX_Q4_1_DOTS(TARGET, DOT, DOTN, ISUM, BY)                                                          \
    TARGET static float DOT(const uint8_t *w, const mk_q8_block *x, size_t n) {                           \
        __m256 acc = _mm256_setzero_ps();                                                                 \
        __m128 mins = _mm_setzero_ps();                                                                   \
        const size_t nb = n / 32;                                                                         \
        size_t b = 0;                                                                                     \
        for (; b + 1 < nb; b += 2, w += 40) {                                                             \
            CX_PREFETCH(w);                                                                               \
            const cx_q4_1_wide q = cx_q4_1_unpack2(w);                                                    \
            cx_q4_1_step2(&acc, &mins, q.dm, ISUM(&q, cx_q8_halves(&x[b], 0), cx_q8_halves(&x[b], 16)),   \
                          cx_q8_ds2(&x[b]));                                                              \
        }                                                                                                 \
        cx_q4_1_acc a = cx_q4_1_narrow(acc, mins);                                                        \
        if (b < nb) cx_q4_1_one(&a, cx_q4_1_dm(w), cx_q4_1_unpack(w + 4), x[b].q, x[b].q + 16, &x[b].d);  \
        return cx_q4_1_total(&a);                                                                         \
    }                                                                                                     \
    BY(CX_Q4_1_ROWS, TARGET, DOTN, ISUM, mk_q8_pair)

/* DOTN for a fixed number of rows R (the accumulators stay in registers). A step's float
 * part for one row (cx_q4_1_step2: four scale products, the mins added, the scales spread)
 * sits in 128-bit halves, so rows go two at a time through one 256-bit register there: row
 * 2k in the low half, 2k + 1 in the high; the same operations on the same lanes, half the
 * instructions (a 4-row Q4_1 call 53 -> 41 ns per 576-wide row on a Zen 4 core). */
#define CX_Q4_1_ROWS(TARGET, NAME, ISUM, R)                                                                \
    TARGET static inline void NAME(const uint8_t *w, const mk_q8_pair *const *x, size_t n, float *out) {  \
        enum { PAIRS = R / 2 };                                                                           \
        __m256 acc[R];                                                                                    \
        __m256 mins2[PAIRS + 1]; /* rows 2k and 2k + 1 in its halves; the last for an odd row */          \
        for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                                         \
        for (int k = 0; k <= PAIRS; k++) mins2[k] = _mm256_setzero_ps();                                  \
        const __m256i lanes_lo = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2);                               \
        const __m256i lanes_hi = _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6);                               \
        const size_t nb = n / 32;                                                                         \
        size_t b = 0;                                                                                     \
        for (; b + 1 < nb; b += 2, w += 40) {                                                             \
            CX_PREFETCH(w);                                                                               \
            const cx_q4_1_wide q = cx_q4_1_unpack2(w);                                                    \
            const __m256 dm2 = _mm256_set_m128(q.dm, q.dm);                                               \
            CX_UNROLL for (int k = 0; k < PAIRS; k++) {                                                  \
                const mk_q8_pair *p0 = &x[2 * k][b / 2], *p1 = &x[2 * k + 1][b / 2];                      \
                /* cx_q4_1_step2's scale products and mins for both rows at once */                       \
                const __m256 s = _mm256_mul_ps(dm2, _mm256_set_m128(_mm_loadu_ps(p1->ds), _mm_loadu_ps(p0->ds))); \
                mins2[k] = _mm256_add_ps(mins2[k], _mm256_add_ps(s, _mm256_shuffle_ps(s, s, _MM_SHUFFLE(3, 2, 3, 2)))); \
                acc[2 * k] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(s, lanes_lo),                        \
                                             _mm256_cvtepi32_ps(ISUM(&q, cx_loadu(p0->lo), cx_loadu(p0->hi))), \
                                             acc[2 * k]);                                                 \
                acc[2 * k + 1] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(s, lanes_hi),                    \
                                                 _mm256_cvtepi32_ps(ISUM(&q, cx_loadu(p1->lo), cx_loadu(p1->hi))), \
                                                 acc[2 * k + 1]);                                         \
            }                                                                                             \
            if (R % 2) {                                                                                  \
                const mk_q8_pair *p = &x[R - 1][b / 2];                                                   \
                __m128 m = _mm256_castps256_ps128(mins2[PAIRS]);                                          \
                cx_q4_1_step2(&acc[R - 1], &m, q.dm, ISUM(&q, cx_loadu(p->lo), cx_loadu(p->hi)),         \
                              _mm_loadu_ps(p->ds));                                                       \
                mins2[PAIRS] = _mm256_castps128_ps256(m);                                                 \
            }                                                                                             \
        }                                                                                                 \
        for (int r = 0; r < R; r++) {                                                                     \
            const __m256 m2 = mins2[r / 2];                                                               \
            cx_q4_1_acc a = cx_q4_1_narrow(acc[r], r % 2 ? _mm256_extractf128_ps(m2, 1) : _mm256_castps256_ps128(m2)); \
            if (b < nb) {                                                                                 \
                const mk_q8_pair *p = &x[r][b / 2];                                                       \
                cx_q4_1_one(&a, cx_q4_1_dm(w), cx_q4_1_unpack(w + 4), p->lo, p->hi, p->ds);               \
            }                                                                                             \
            out[r] = cx_q4_1_total(&a);                                                                   \
        }                                                                                                 \
    }

CX_Q4_1_DOTS(MK_AVX2, cx_dot_q4_1, cx_dotn_q4_1, cx_q4_1_isum2_avx2, CX_BY_ROWS4)

/* Row dots over activation blocks of type XTYPE from ROWS, the n-row kernel for a fixed row
 * count R: DOTN for 1 to BY's rows, and the one-row DOT as its one-row case, so DOTN's out[r]
 * has DOT's bits on that row (ARG goes to ROWS). */
#define CX_BLOCK_DOTS(ROWS, TARGET, DOT, DOTN, ARG, BY, XTYPE)                                             \
    BY(ROWS, TARGET, DOTN, ARG, XTYPE)                                                                    \
    TARGET static float DOT(const uint8_t *w, const XTYPE *x, size_t n) {                                 \
        float out;                                                                                        \
        DOTN##_1(w, &x, n, &out);                                                                         \
        return out;                                                                                       \
    }

/* Row dots over blocks of 32 signed values with an f16 scale in front (Q8_0: 34 bytes, the
 * values as bytes; Q4_0: 18 bytes, nibbles less 8), from a signed block-sum function DOTSS:
 * one row (DOT: two FMA chains, even and odd blocks, each block's scale d * x.d) and 1 to
 * BY's rows (DOTN: each weight block loaded and its scale converted once for all the rows,
 * every row stepped as DOT steps it). */
#define CX_Q8_0_DOTS(TARGET, DOT, DOTN, DOTSS, BY) \
    CX_BLOCK_DOTS(CX_Q8_0_ROWS, TARGET, DOT, DOTN, DOTSS, BY, mk_q8_block)
#define CX_Q4_0_DOTS(TARGET, DOT, DOTN, DOTSS, BY) \
    CX_BLOCK_DOTS(CX_Q4_0_ROWS, TARGET, DOT, DOTN, DOTSS, BY, mk_q8_block)

MK_AVX2 static inline __m256i cx_q8_0_values(const uint8_t *block) { return cx_loadu(block + 2); }
MK_AVX2 static inline __m256i cx_q4_0_values(const uint8_t *block) {
    return _mm256_sub_epi8(cx_nibbles(block + 2), _mm256_set1_epi8(8));
}
#define CX_Q8_0_ROWS(TARGET, NAME, DOTSS, R) CX_SIGNED_ROWS(TARGET, NAME, DOTSS, R, 34, cx_q8_0_values)
#define CX_Q4_0_ROWS(TARGET, NAME, DOTSS, R) CX_SIGNED_ROWS(TARGET, NAME, DOTSS, R, 18, cx_q4_0_values)

/* DOTN for a fixed number of rows R over blocks of BYTES bytes whose values VALUES gives. */
#define CX_SIGNED_ROWS(TARGET, NAME, DOTSS, R, BYTES, VALUES)                                              \
    TARGET static inline void NAME(const uint8_t *w, const mk_q8_block *const *x, size_t n, float *out) { \
        __m256 acc0[R], acc1[R];                                                                          \
        for (int r = 0; r < R; r++) acc0[r] = _mm256_setzero_ps(), acc1[r] = _mm256_setzero_ps();         \
        const size_t nb = n / 32;                                                                         \
        size_t b = 0;                                                                                     \
        for (; b + 1 < nb; b += 2, w += 2 * (BYTES)) {                                                    \
            CX_PREFETCH(w);                                                                               \
            const __m256i w0 = VALUES(w), w1 = VALUES(w + (BYTES));                                       \
            const float d0 = cx_f16(w), d1 = cx_f16(w + (BYTES));                                         \
            CX_UNROLL for (int r = 0; r < R; r++) {                                                      \
                const __m256i p0 = DOTSS(w0, cx_loadu(x[r][b].q)), p1 = DOTSS(w1, cx_loadu(x[r][b + 1].q)); \
                acc0[r] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * x[r][b].d), _mm256_cvtepi32_ps(p0), acc0[r]); \
                acc1[r] = _mm256_fmadd_ps(_mm256_set1_ps(d1 * x[r][b + 1].d), _mm256_cvtepi32_ps(p1), acc1[r]); \
            }                                                                                             \
        }                                                                                                 \
        if (b < nb) {                                                                                     \
            const __m256i w0 = VALUES(w);                                                                 \
            const float d0 = cx_f16(w);                                                                   \
            for (int r = 0; r < R; r++)                                                                   \
                acc0[r] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * x[r][b].d),                                 \
                                          _mm256_cvtepi32_ps(DOTSS(w0, cx_loadu(x[r][b].q))), acc0[r]);   \
        }                                                                                                 \
        for (int r = 0; r < R; r++) out[r] = cx_hsum(_mm256_add_ps(acc0[r], acc1[r]));                   \
    }
CX_Q8_0_DOTS(MK_AVX2, cx_dot_q8_0, cx_dotn_q8_0, cx_dot_ss, CX_BY_ROWS4)
CX_Q4_0_DOTS(MK_AVX2, cx_dot_q4_0, cx_dotn_q4_0, cx_dot_ss, CX_BY_ROWS4)

/* ============================================================= K-quants == */

/* The K-quant kernels' weighted sums come from OPS: OPS##_wsum(acc, p, w) adds the sums of
 * adjacent products of 16-bit p and w to acc's i32 lanes. */
MK_AVX2 static inline __m256i cx_k_avx2_wsum(__m256i acc, __m256i p, __m256i w) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, w));
}

/* Q4_K row dots: one row (DOT) and 1 to BY's rows (DOTN: each super-block's scales decoded
 * and its nibbles unpacked once for all the rows). Per row and super-block the eight
 * sub-block products (pairs of u4 x s8 by maddubs: |sum| <= 3810) weighted by their 6-bit
 * scales make one i32 sum (|lane| < 2^22: exact in float), the mins times the activation
 * group sums another (one madd); then x.d * (d * isum - dmin * imin). A row's operations do
 * not depend on the other rows, so DOTN's out[r] has DOT's bits on that row. */
#define CX_Q4_K_DOTS(TARGET, DOT, DOTN, OPS, BY) CX_BLOCK_DOTS(CX_Q4_K_ROWS, TARGET, DOT, DOTN, OPS, BY, mk_q8k_block)

/* DOTN for a fixed number of rows R. */
#define CX_Q4_K_ROWS(TARGET, NAME, OPS, R)                                                                 \
    TARGET static inline void NAME(const uint8_t *w, const mk_q8k_block *const *x, size_t n, float *out) { \
        __m256 acc[R];                                                                                    \
        for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                                         \
        const __m256i m4 = _mm256_set1_epi8(0x0f);                                                        \
        for (size_t sb = 0; sb < n / 256; sb++, w += 144) {                                               \
            CX_PREFETCH_BLOCK(w, 144);                                                                    \
            const __m256 vd = _mm256_set1_ps(cx_f16(w)), vdmin = _mm256_set1_ps(cx_f16(w + 2));           \
            uint8_t sc[8], mn[8];                                                                         \
            mk_k4_scales_mins(w + 4, sc, mn);                                                             \
            /* the mins by group of 16: m0, m0, m1, m1, ... as 16-bit */                                  \
            const __m128i mn8 = _mm_loadl_epi64((const __m128i *)mn);                                     \
            const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));                       \
            __m256i q[8], scale[8]; /* sub-block 2j: the low nibbles of 32 bytes, 2j + 1 the high */      \
            for (int j = 0; j < 4; j++) {                                                                 \
                const __m256i raw = cx_loadu(w + 16 + 32 * j);                                            \
                q[2 * j] = _mm256_and_si256(raw, m4);                                                     \
                q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);                           \
            }                                                                                             \
            for (int j = 0; j < 8; j++) scale[j] = _mm256_set1_epi16(sc[j]);                              \
            CX_UNROLL for (int r = 0; r < R; r++) {                                                      \
                const mk_q8k_block *xb = &x[r][sb];                                                       \
                __m256i isum = _mm256_setzero_si256();                                                    \
                for (int j = 0; j < 8; j++)                                                               \
                    isum = OPS##_wsum(isum, _mm256_maddubs_epi16(q[j], cx_loadu(xb->q + 32 * j)), scale[j]); \
                const __m256i imin = _mm256_madd_epi16(cx_loadu(xb->sums), mins);                         \
                const __m256 t = _mm256_fnmadd_ps(vdmin, _mm256_cvtepi32_ps(imin),                        \
                                                  _mm256_mul_ps(vd, _mm256_cvtepi32_ps(isum)));           \
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(xb->d), t, acc[r]);                               \
            }                                                                                             \
        }                                                                                                 \
        for (int r = 0; r < R; r++) out[r] = cx_hsum(acc[r]);                                             \
    }
CX_Q4_K_DOTS(MK_AVX2, cx_dot_q4_k, cx_dotn_q4_k, cx_k_avx2, CX_BY_ROWS4)

/* Q6_K row dots, as Q4_K's: each super-block's 6-bit values assembled and its scales spread
 * once for all the rows; per row the eight groups' q x s8 pair sums (q in 0..63: |sum| <=
 * 16002) weighted by the int8 scales into one i32 sum, less 32 x the scales times the
 * activation group sums (the values are q - 32), then one float term d * x.d per
 * super-block. The offset's lanes hold other groups than the products' lanes, so a lane
 * can pass 2^24 (|lane| < 2^26, no i32 overflow) and round in the conversion; the lanes'
 * total is the super-block's exact sum, and the rounding is the same in every table. */
#define CX_Q6_K_DOTS(TARGET, DOT, DOTN, OPS, BY) CX_BLOCK_DOTS(CX_Q6_K_ROWS, TARGET, DOT, DOTN, OPS, BY, mk_q8k_block)

/* DOTN for a fixed number of rows R. */
#define CX_Q6_K_ROWS(TARGET, NAME, OPS, R)                                                                 \
    TARGET static inline void NAME(const uint8_t *w, const mk_q8k_block *const *x, size_t n, float *out) { \
        __m256 acc[R];                                                                                    \
        for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                                         \
        const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);                              \
        for (size_t sb = 0; sb < n / 256; sb++, w += 210) {                                               \
            CX_PREFETCH_BLOCK(w, 210);                                                                    \
            const float d = cx_f16(w + 208);                                                              \
            /* the 16 scales in group order, as 16-bit */                                                 \
            const __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 192)));   \
            __m256i q[8], scales[8]; /* group 4h + k: 32 values of half h, and their two scales */       \
            for (int h = 0; h < 2; h++) {                                                                 \
                const __m256i ql0 = cx_loadu(w + 64 * h), ql1 = cx_loadu(w + 64 * h + 32);               \
                const __m256i qh = cx_loadu(w + 128 + 32 * h);                                            \
                const int8_t *sc = (const int8_t *)(w + 192 + 8 * h);                                     \
                /* The two high bits sit in bits 0-1 of each byte after the mask; a 16-bit shift    \
                 * by 4 moves them to bits 4-5 of the same byte. */                                       \
                q[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4)); \
                q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),                                 \
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4)); \
                q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),           \
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4)); \
                q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),           \
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4)); \
                for (int k = 0; k < 4; k++)                                                               \
                    scales[4 * h + k] = _mm256_inserti128_si256(                                          \
                        _mm256_castsi128_si256(_mm_set1_epi16(sc[2 * k])), _mm_set1_epi16(sc[2 * k + 1]), 1); \
            }                                                                                             \
            CX_UNROLL for (int r = 0; r < R; r++) {                                                      \
                const mk_q8k_block *xb = &x[r][sb];                                                       \
                __m256i isum = _mm256_setzero_si256();                                                    \
                for (int i = 0; i < 8; i++)                                                               \
                    isum = OPS##_wsum(isum, _mm256_maddubs_epi16(q[i], cx_loadu(xb->q + 32 * i)), scales[i]); \
                const __m256i offset = _mm256_madd_epi16(cx_loadu(xb->sums), scales16);                   \
                isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(offset, 5));                              \
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(isum), acc[r]);    \
            }                                                                                             \
        }                                                                                                 \
        for (int r = 0; r < R; r++) out[r] = cx_hsum(acc[r]);                                             \
    }
CX_Q6_K_DOTS(MK_AVX2, cx_dot_q6_k, cx_dotn_q6_k, cx_k_avx2, CX_BY_ROWS4)

/* ===================================================================== VNNI == */

/* vpdpbusd multiplies unsigned by signed bytes and adds each group of four products into a
 * 32-bit lane: the i32 lanes maddubs + madd form above, in one instruction and without the
 * i16 step (which never saturates here either), so the VNNI dots compute the same integers
 * and then the same float operations as the AVX2 ones: bit-identical results (tested).
 * Two encodings of the same 256-bit instruction: AVX-VNNI (VEX; Intel Alder Lake and
 * later) and AVX512-VNNI with AVX512VL (EVEX; AMD Zen 4, Intel Ice Lake and later). */
#define MK_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#define MK_VNNI512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))

/* The Q4_0, Q4_1, Q8_0, Q4_K and Q6_K dots for one encoding: TARGET compiles them, DPBUSD
 * and DPWSSD are its intrinsics, BY makes its n-row kernels (CX_BY_ROWS8 only where TARGET
 * has AVX-512's 32 registers). */
#define CX_VNNI_DOTS(TARGET, DPBUSD, DPWSSD, SUFFIX, BY)                                                   \
    TARGET static inline __m256i cx_q4_1_isum2_##SUFFIX(const cx_q4_1_wide *q, __m256i y0, __m256i y1) { \
        return DPBUSD(DPBUSD(_mm256_setzero_si256(), q->lo, y0), q->hi, y1);                              \
    }                                                                                                     \
    CX_Q4_1_DOTS(TARGET, cx_dot_q4_1_##SUFFIX, cx_dotn_q4_1_##SUFFIX, cx_q4_1_isum2_##SUFFIX, BY)         \
    /* Signed weights through the sign trick as in cx_dot_ss, one vpdpbusd for the sums of      \
     * four (|w| <= 128 times |x| <= 127: the same integers as maddubs + madd). */                        \
    TARGET static inline __m256i cx_dot_ss_##SUFFIX(__m256i a, __m256i b) {                               \
        return DPBUSD(_mm256_setzero_si256(), _mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));            \
    }                                                                                                     \
    CX_Q8_0_DOTS(TARGET, cx_dot_q8_0_##SUFFIX, cx_dotn_q8_0_##SUFFIX, cx_dot_ss_##SUFFIX, BY)                \
    CX_Q4_0_DOTS(TARGET, cx_dot_q4_0_##SUFFIX, cx_dotn_q4_0_##SUFFIX, cx_dot_ss_##SUFFIX, BY)                \
    /* The K-quants' weighted sums: vpdpwssd adds the same i32 sums as madd + add. */         \
    TARGET static inline __m256i cx_k_##SUFFIX##_wsum(__m256i acc, __m256i p, __m256i w) {                \
        return DPWSSD(acc, p, w);                                                                         \
    }                                                                                                     \
    CX_Q4_K_DOTS(TARGET, cx_dot_q4_k_##SUFFIX, cx_dotn_q4_k_##SUFFIX, cx_k_##SUFFIX, BY)                  \
    CX_Q6_K_DOTS(TARGET, cx_dot_q6_k_##SUFFIX, cx_dotn_q6_k_##SUFFIX, cx_k_##SUFFIX, BY)

CX_VNNI_DOTS(MK_VNNI, _mm256_dpbusd_avx_epi32, _mm256_dpwssd_avx_epi32, vnni, CX_BY_ROWS4)
CX_VNNI_DOTS(MK_VNNI512, _mm256_dpbusd_epi32, _mm256_dpwssd_epi32, vnni512, CX_BY_ROWS8)


/* ============================================================ 16-bit floats == */

MK_AVX2 static inline __m256 cx_load_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

MK_AVX2 static inline __m256 cx_load_bf16(const uint16_t *p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

#define CX_HDOT(fn, load, scalar)                                                                       \
    MK_AVX2 static float fn(const uint16_t *w, const float *x, size_t n) {                              \
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()}; \
        size_t i = 0;                                                                                   \
        for (; i + 32 <= n; i += 32)                                                                    \
            for (int k = 0; k < 4; k++)                                                                 \
                acc[k] = _mm256_fmadd_ps(load(w + i + 8 * k), _mm256_loadu_ps(x + i + 8 * k), acc[k]);  \
        for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load(w + i), _mm256_loadu_ps(x + i), acc[0]); \
        float sum = cx_hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))); \
        for (; i < n; i++) sum += scalar(w[i]) * x[i];                                                  \
        return sum;                                                                                     \
    }

MK_AVX2 static inline float cx_f16_scalar(uint16_t h) { return _cvtsh_ss(h); }
static inline float cx_bf16_scalar(uint16_t b) {
    const uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

CX_HDOT(cx_dot_f16, cx_load_f16, cx_f16_scalar)
CX_HDOT(cx_dot_bf16, cx_load_bf16, cx_bf16_scalar)

/* =============================================================== dispatch == */

static const mk_cpu_quant cx_avx2 = {
    .name = "avx2",
    .quantize_row = cx_quantize_row,
    .quantize_row_k = cx_quantize_row_k,
    .dot_q4_0 = cx_dot_q4_0,
    .dotn_q4_0 = cx_dotn_q4_0,
    .dot_q4_1 = cx_dot_q4_1,
    .dotn_q4_1 = cx_dotn_q4_1,
    .dotn_q8_0 = cx_dotn_q8_0,
    .dot_q8_0 = cx_dot_q8_0,
    .dotn_rows = 4,
    .dot_q4_k = cx_dot_q4_k,
    .dotn_q4_k = cx_dotn_q4_k,
    .dot_q6_k = cx_dot_q6_k,
    .dotn_q6_k = cx_dotn_q6_k,
    .dot_f16 = cx_dot_f16,
    .dot_bf16 = cx_dot_bf16,
};

/* The state components the OS saves (XCR0's low word); only after cpuid says OSXSAVE. */
static unsigned cx_xcr0(void) {
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return lo;
}

/* AVX2, FMA and F16C from cpuid, and the OS saving the YMM state (OSXSAVE + XCR0). */
static bool cx_cpu_has_avx2(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28), f16c = c & (1u << 29);
    if (!(fma && osxsave && avx && f16c)) return false;
    if ((cx_xcr0() & 6u) != 6u) return false;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return b & (1u << 5); /* AVX2 */
}

/* The AVX2 table with the formats VNNI speeds up (the ones SmolLM2-class GGUFs store). */
#define CX_VNNI_TABLE(NAME, SUFFIX, ROWS)          \
    {                                              \
        .name = NAME,                              \
        .quantize_row = cx_quantize_row,           \
        .quantize_row_k = cx_quantize_row_k,       \
        .dot_q4_0 = cx_dot_q4_0_##SUFFIX,          \
        .dotn_q4_0 = cx_dotn_q4_0_##SUFFIX,        \
        .dot_q4_1 = cx_dot_q4_1_##SUFFIX,          \
        .dotn_q4_1 = cx_dotn_q4_1_##SUFFIX,        \
        .dotn_q8_0 = cx_dotn_q8_0_##SUFFIX,        \
        .dot_q8_0 = cx_dot_q8_0_##SUFFIX,          \
        .dotn_rows = ROWS,                         \
        .dot_q4_k = cx_dot_q4_k_##SUFFIX,          \
        .dotn_q4_k = cx_dotn_q4_k_##SUFFIX,        \
        .dot_q6_k = cx_dot_q6_k_##SUFFIX,          \
        .dotn_q6_k = cx_dotn_q6_k_##SUFFIX,        \
        .dot_f16 = cx_dot_f16,                     \
        .dot_bf16 = cx_dot_bf16,                   \
    }
static const mk_cpu_quant cx_vnni = CX_VNNI_TABLE("avx-vnni", vnni, 4);
static const mk_cpu_quant cx_vnni512 = CX_VNNI_TABLE("avx512-vnni", vnni512, 8);

/* AVX-VNNI (the VEX-encoded 256-bit vpdpbusd): cpuid leaf 7 subleaf 1, eax bit 4. */
static bool cx_cpu_has_avx_vnni(void) {
    unsigned a, b, c, d;
    if (!cx_cpu_has_avx2() || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
    return a & (1u << 4);
}

/* AVX512-VNNI on 256-bit registers: leaf 7 ebx bits 16 (AVX512F) and 31 (AVX512VL), ecx
 * bit 11 (AVX512_VNNI), and the OS saving the opmask and upper ZMM state (XCR0 bits 5-7),
 * which every EVEX-encoded instruction needs, whatever its width. */
static bool cx_cpu_has_avx512_vnni(void) {
    unsigned a, b, c, d;
    if (!cx_cpu_has_avx2() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!((b & (1u << 16)) && (b & (1u << 31)) && (c & (1u << 11)))) return false;
    return (cx_xcr0() & 0xe6u) == 0xe6u;
}

const mk_cpu_quant *mk_cpu_quant_avx2(void) { return cx_cpu_has_avx2() ? &cx_avx2 : NULL; }
const mk_cpu_quant *mk_cpu_quant_avx512_vnni(void) { return cx_cpu_has_avx512_vnni() ? &cx_vnni512 : NULL; }
const mk_cpu_quant *mk_cpu_quant_vnni(void) { return cx_cpu_has_avx_vnni() ? &cx_vnni : mk_cpu_quant_avx512_vnni(); }

#else

const mk_cpu_quant *mk_cpu_quant_avx2(void) { return NULL; }
const mk_cpu_quant *mk_cpu_quant_vnni(void) { return NULL; }
const mk_cpu_quant *mk_cpu_quant_avx512_vnni(void) { return NULL; }

#endif
