/* Native-format dot products with AVX2 + FMA + F16C (see cpu_quant.h). Each kernel is
 * compiled for those instructions through a function-level target attribute and only
 * reached after a run-time check, so the library stays portable.
 *
 * The integer part of every block is computed the way the format allows: unsigned 4/6-bit
 * weights times signed 8-bit activations with maddubs (u8 x s8 -> pairs of i16, no
 * saturation at these ranges), signed 8-bit weights through the sign trick
 * (|w| x sign(w)*x), then pairs summed to i32 with madd. The blocks of 32 (Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0) go eight weight rows at a time, one row per lane, each block's sum scaled into one
 * float accumulator per output; the K-quants go one weight row at a time, each super-block's
 * i32 lanes converted and accumulated with its scale in eight float lanes, added once at
 * the end of the row. */
#include "backend/cpu/cpu_quant.h"
#include "model/gguf.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#define MK_AVX2 __attribute__((target("avx2,fma,f16c")))

/* How far ahead of the block being multiplied the K-quants' weight stream is prefetched. A
 * decode step reads every weight once (tens of MB, from DRAM), and the hardware prefetcher
 * alone kept a dot at 5-7 GB/s on this project's 2-core Xeon, against 20 GB/s for a plain
 * streaming read; asking for the line 4 KiB ahead (into the rows that follow: a thread
 * takes consecutive rows) halved a DRAM-resident row's time and costs nothing when the
 * weights sit in cache (cpu_quant microbenchmark in the notes of #27). The eight-row kernels
 * of the blocks of 32 prefetch their own way (CX_W8_ROWS). A prefetch never faults, so
 * running past the last row is harmless. */
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
        out[b].sum = lo + hi;
        out[b].s = d * (float)out[b].sum;
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


/* ============================================ blocks of 32, 8 weight rows == */

/* The kernels' helpers must inline for their vectors to stay in registers (gcc stops
 * inlining plain `inline` ones once a file holds this many kernels: 1.6x slower). */
#define CX_INLINE static inline __attribute__((always_inline))

/* Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 multiply eight consecutive weight rows at once with 1 to BY's activation
 * rows. Weight row i sits in 32-bit lane i of every vector and each activation row's groups
 * of four bytes are broadcast across the lanes, so a block costs, per activation row, one
 * vpdpbusd per group of four values for all eight weight rows (AVX2: maddubs summed as i16,
 * then one madd; Q8_0's signed bytes through the sign trick), one conversion and one FMA
 * (two for Q4_1), and no horizontal sum; the weights are regrouped and the scales converted
 * once per block for all the activation rows. llama.cpp repacks a file's Q4_0 rows this way
 * at load; here the regrouping is done in registers, so the stored rows keep the file's
 * layout (the embedding and the tiles read it) at a cost shared by the activation rows
 * (Q4_0 with 8 activation rows: 2.3x less time per block and row than one weight row at a
 * time, on a Zen 4 core; notes of #27).
 *
 * Each output's arithmetic, in every SIMD table: per block the exact integer sum isum of its
 * 32 products (Q4_0: the unsigned nibbles' products less 8 x the activations' sum, x.sum;
 * Q5_0: the unsigned five-bit values' less 16 x x.sum), then acc = fma(d * x.d, isum, acc),
 * Q4_1 and Q5_1 then acc = fma(m, x.s, acc), block after block from
 * acc = 0: it depends only on that weight row and that activation row, so an output has the
 * same bits in any lane, beside any other rows, at any batch size; the one-row dot is the
 * kernel with the row given eight times (row_bytes 0). */

/* The 16 nibble bytes of one block in each of eight rows (qs: row 0's, rows rb apart) as
 * eight vectors: g[k] holds values 4k..4k+3 of every row (row i in lane i), the low nibbles
 * of bytes 4k..4k+3 for k < 4, the high nibbles of bytes 4(k-4).. for k >= 4 (ggml's order:
 * byte j holds values j and j + 16). */
MK_AVX2 CX_INLINE void cx_nibble_groups8(const uint8_t *qs, size_t rb, __m256i g[8]) {
    __m256i a[4]; /* rows i (low half) and i + 4 (high half) */
    CX_UNROLL for (int i = 0; i < 4; i++)
        a[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(qs + i * rb))),
                                       _mm_loadu_si128((const __m128i *)(qs + (i + 4) * rb)), 1);
    /* a 4 x 4 transpose of 32-bit words in each half: v[k] = word k of rows 0-3 | of rows 4-7 */
    const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    const __m256i v[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                          _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    CX_UNROLL for (int k = 0; k < 4; k++) {
        g[k] = _mm256_and_si256(v[k], m4);
        g[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v[k], 4), m4);
    }
}

/* The 32 value bytes of one block in each of eight rows (qs: row 0's, rows rb apart) as
 * g[k] = bytes 4k..4k+3 of every row (row i in lane i): an 8 x 8 transpose of 32-bit words. */
MK_AVX2 CX_INLINE void cx_byte_groups8(const uint8_t *qs, size_t rb, __m256i g[8]) {
    __m256i a[8], t[8], u[8];
    CX_UNROLL for (int i = 0; i < 8; i++) a[i] = cx_loadu(qs + i * rb);
    CX_UNROLL for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(a[i], a[i + 1]);     /* words 0, 1 | 4, 5 of rows i, i + 1 */
        t[i + 1] = _mm256_unpackhi_epi32(a[i], a[i + 1]); /* words 2, 3 | 6, 7 */
    }
    CX_UNROLL for (int h = 0; h < 8; h += 4) { /* rows h..h+3: u[h + k] = word k | word k + 4 */
        u[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);
        u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);
        u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
        u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
    CX_UNROLL for (int k = 0; k < 4; k++) {
        g[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
        g[k + 4] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
    }
}

/* Q5_0's and Q5_1's 32 values of one block in each of eight rows (qh: row 0's fifth bits, a
 * u32 whose bit j belongs to value j, followed by the nibbles as Q4_0's; rows rb apart) as
 * cx_nibble_groups8's g[k] with each value's fifth bit added as 16: group k's four bits are
 * nibble k of qh, so byte k / 2 of each row's qh is copied into its lane's four bytes, byte
 * b tested for bit b (+ 4 for odd k) and 16 put in where it is set. */
MK_AVX2 CX_INLINE void cx_five_groups8(const uint8_t *qh, size_t rb, __m256i g[8]) {
    cx_nibble_groups8(qh + 4, rb, g);
    uint32_t h[8];
    CX_UNROLL for (int i = 0; i < 8; i++) memcpy(&h[i], qh + i * rb, sizeof h[i]);
    const __m256i bits = _mm256_setr_epi32((int)h[0], (int)h[1], (int)h[2], (int)h[3], (int)h[4], (int)h[5],
                                           (int)h[6], (int)h[7]);
    /* byte 4L + b of each 128-bit half reads byte 4L + k / 2 (lane L's qh byte) */
    const __m256i lane_base = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c, 0, 0x04040404, 0x08080808,
                                                0x0c0c0c0c);
    const __m256i sixteen = _mm256_set1_epi8(16);
    CX_UNROLL for (int k = 0; k < 8; k++) {
        const __m256i spread = _mm256_shuffle_epi8(bits, _mm256_add_epi8(lane_base, _mm256_set1_epi8((char)(k / 2))));
        const __m256i mask = _mm256_set1_epi32(k % 2 ? (int)0x80402010 : 0x08040201);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
        g[k] = _mm256_or_si256(g[k], _mm256_and_si256(set, sixteen));
    }
}

/* IQ4_NL's 32 values of one block in each of eight rows (qs: row 0's indices, rows rb
 * apart) as cx_nibble_groups8's g[k], each index looked up in mk_iq4_values (vpshufb: the
 * 16 values sit in both 128-bit halves): signed bytes, multiplied as Q8_0's. */
MK_AVX2 CX_INLINE __m256i cx_iq4_lut(void) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)mk_iq4_values));
}
MK_AVX2 CX_INLINE void cx_iq4_groups8(const uint8_t *qs, size_t rb, __m256i g[8]) {
    cx_nibble_groups8(qs, rb, g);
    const __m256i lut = cx_iq4_lut();
    CX_UNROLL for (int k = 0; k < 8; k++) g[k] = _mm256_shuffle_epi8(lut, g[k]);
}

/* The f16 at p, p + rb, ..., p + 7 rb as eight floats. */
MK_AVX2 CX_INLINE __m256 cx_f16x8(const uint8_t *p, size_t rb) {
    uint16_t h[8];
    CX_UNROLL for (int i = 0; i < 8; i++) memcpy(&h[i], p + i * rb, sizeof h[i]);
    return _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], (short)h[4], (short)h[5],
                                          (short)h[6], (short)h[7]));
}

/* Four activation bytes from q broadcast to every lane. */
MK_AVX2 CX_INLINE __m256i cx_group4(const int8_t *q) {
    int32_t v;
    memcpy(&v, q, sizeof v);
    return _mm256_set1_epi32(v);
}

/* The integer sums of one block for the eight weight rows, from init: AVX2's pair sums of
 * the eight groups stay i16 (each <= 2 x 15 x 127, all eight <= 30480) before one madd. */
MK_AVX2 CX_INLINE __m256i cx_nibble_sums_avx2(__m256i init, const __m256i g[8], const int8_t *q) {
    __m256i p = _mm256_maddubs_epi16(g[0], cx_group4(q));
    CX_UNROLL for (int k = 1; k < 8; k++) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(g[k], cx_group4(q + 4 * k)));
    return _mm256_add_epi32(init, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

/* The same for five-bit weights (Q5_0, Q5_1): a group's pair sums reach 2 x 31 x 127, so
 * four groups at a time stay i16 (<= 31496) before their madd. */
MK_AVX2 CX_INLINE __m256i cx_five_sums_avx2(__m256i init, const __m256i g[8], const int8_t *q) {
    const __m256i ones = _mm256_set1_epi16(1);
    CX_UNROLL for (int h = 0; h < 8; h += 4) {
        __m256i p = _mm256_maddubs_epi16(g[h], cx_group4(q + 4 * h));
        CX_UNROLL for (int k = h + 1; k < h + 4; k++)
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(g[k], cx_group4(q + 4 * k)));
        init = _mm256_add_epi32(init, _mm256_madd_epi16(p, ones));
    }
    return init;
}

/* The same for signed weight bytes (Q8_0): |w| times x with w's sign (the pair sums of
 * maddubs reach 2 x 128 x 127, so each group is widened to i32 before the next). */
MK_AVX2 CX_INLINE __m256i cx_byte_sums_avx2(__m256i init, const __m256i g[8], const int8_t *q) {
    const __m256i ones = _mm256_set1_epi16(1);
    CX_UNROLL for (int k = 0; k < 8; k++)
        init = _mm256_add_epi32(init, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(g[k], g[k]),
                                                                             _mm256_sign_epi8(cx_group4(q + 4 * k), g[k])),
                                                        ones));
    return init;
}

/* Per format: the block's bytes, where its values start (Q5: their fifth bits) and how they
 * are regrouped, what a block's sums start from, and the float terms after the scaled sum
 * (Q4_1's and Q5_1's min; m holds the eight rows' mins). */
#define CX_Q4_0_BYTES 18
#define CX_Q4_0_QS 2
#define CX_Q4_0_GROUPS cx_nibble_groups8
#define CX_Q4_0_INIT(xb) _mm256_set1_epi32(-8 * (xb)->sum)
#define CX_Q4_0_MINS(p, rb) _mm256_setzero_ps()
#define CX_Q4_0_MIN(acc, m, xb) (acc)
#define CX_Q4_1_BYTES 20
#define CX_Q4_1_QS 4
#define CX_Q4_1_GROUPS cx_nibble_groups8
#define CX_Q4_1_INIT(xb) _mm256_setzero_si256()
#define CX_Q4_1_MINS(p, rb) cx_f16x8((p) + 2, rb)
#define CX_Q4_1_MIN(acc, m, xb) _mm256_fmadd_ps(m, _mm256_set1_ps((xb)->s), acc)
#define CX_Q5_0_BYTES 22
#define CX_Q5_0_QS 2
#define CX_Q5_0_GROUPS cx_five_groups8
#define CX_Q5_0_INIT(xb) _mm256_set1_epi32(-16 * (xb)->sum)
#define CX_Q5_0_MINS(p, rb) _mm256_setzero_ps()
#define CX_Q5_0_MIN(acc, m, xb) (acc)
#define CX_Q5_1_BYTES 24
#define CX_Q5_1_QS 4
#define CX_Q5_1_GROUPS cx_five_groups8
#define CX_Q5_1_INIT(xb) _mm256_setzero_si256()
#define CX_Q5_1_MINS(p, rb) cx_f16x8((p) + 2, rb)
#define CX_Q5_1_MIN(acc, m, xb) _mm256_fmadd_ps(m, _mm256_set1_ps((xb)->s), acc)
#define CX_Q8_0_BYTES 34
#define CX_Q8_0_QS 2
#define CX_Q8_0_GROUPS cx_byte_groups8
#define CX_Q8_0_INIT(xb) _mm256_setzero_si256()
#define CX_Q8_0_MINS(p, rb) _mm256_setzero_ps()
#define CX_Q8_0_MIN(acc, m, xb) (acc)
#define CX_IQ4_NL_BYTES 18
#define CX_IQ4_NL_QS 2
#define CX_IQ4_NL_GROUPS cx_iq4_groups8
#define CX_IQ4_NL_INIT(xb) _mm256_setzero_si256()
#define CX_IQ4_NL_MINS(p, rb) _mm256_setzero_ps()
#define CX_IQ4_NL_MIN(acc, m, xb) (acc)

/* The kernel for R activation rows (the accumulators stay in registers): FMT is Q4_0, Q4_1,
 * Q5_0, Q5_1 or Q8_0, SUMS the table's block sums for its values. Each block prefetches its share of
 * the group of eight rows two ahead (a thread takes a tile of consecutive weight rows; one
 * sequence's decode fell from about 250 to 160 tokens/s without it). */
#define CX_W8_ROWS(TARGET, NAME, FMT, SUMS, R)                                                          \
    TARGET static inline void NAME(const uint8_t *w, size_t rb, const mk_q8_block *const *x, size_t n,     \
                                   float *out) {                                                            \
        __m256 acc[R];                                                                                      \
        CX_UNROLL for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                                 \
        for (size_t b = 0; b < n / 32; b++) {                                                               \
            const uint8_t *p = w + b * CX_##FMT##_BYTES;                                                    \
            /* the group two ahead, as one stream: this block's share of its 8 rows' bytes */             \
            const char *ahead = (const char *)w + 16 * rb + b * 8 * CX_##FMT##_BYTES;                       \
            CX_UNROLL for (int line = 0; line < 8 * CX_##FMT##_BYTES; line += 64)                           \
                _mm_prefetch(ahead + line, _MM_HINT_T0);                                                    \
            __m256i g[8];                                                                                   \
            CX_##FMT##_GROUPS(p + CX_##FMT##_QS, rb, g);                                                    \
            const __m256 d = cx_f16x8(p, rb);                                                               \
            const __m256 m = CX_##FMT##_MINS(p, rb);                                                        \
            (void)m;                                                                                        \
            CX_UNROLL for (int r = 0; r < R; r++) {                                                        \
                const mk_q8_block *xb = &x[r][b];                                                           \
                const __m256i isum = SUMS(CX_##FMT##_INIT(xb), g, xb->q);                                   \
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(xb->d)), _mm256_cvtepi32_ps(isum), acc[r]); \
                acc[r] = CX_##FMT##_MIN(acc[r], m, xb);                                                     \
            }                                                                                               \
        }                                                                                                   \
        CX_UNROLL for (int r = 0; r < R; r++) _mm256_storeu_ps(out + 8 * r, acc[r]);                        \
    }

/* DOT8 for 1 to 4 (ROWS4) or 1 to 8 (ROWS8) activation rows, and the one-row DOT. */
#define CX_W8_CASES4(TARGET, DOT8, FMT, SUMS)                                                          \
    CX_W8_ROWS(TARGET, DOT8##_1, FMT, SUMS, 1)                                                         \
    CX_W8_ROWS(TARGET, DOT8##_2, FMT, SUMS, 2)                                                         \
    CX_W8_ROWS(TARGET, DOT8##_3, FMT, SUMS, 3)                                                         \
    CX_W8_ROWS(TARGET, DOT8##_4, FMT, SUMS, 4)
/* The dispatch by rows: 1 to 3, MORE's cases, then LAST for the rest. */
#define CX_W8_CALL(DOT8, R) \
    case R: DOT8##_##R(w, rb, x, n, out); break;
#define CX_W8_DISPATCH(TARGET, DOT8, MORE, LAST)                                                            \
    TARGET static void DOT8(const uint8_t *w, size_t rb, const mk_q8_block *const *x, size_t rows, size_t n, \
                            float *out) {                                                                   \
        switch (rows) {                                                                                     \
            CX_W8_CALL(DOT8, 1)                                                                             \
            CX_W8_CALL(DOT8, 2)                                                                             \
            CX_W8_CALL(DOT8, 3)                                                                             \
            MORE                                                                                            \
            default: LAST(w, rb, x, n, out); break;                                                         \
        }                                                                                                   \
    }
#define CX_W8_ROWS4(TARGET, DOT8, FMT, SUMS) \
    CX_W8_CASES4(TARGET, DOT8, FMT, SUMS)    \
    CX_W8_DISPATCH(TARGET, DOT8, , DOT8##_4)
#define CX_W8_ROWS8(TARGET, DOT8, FMT, SUMS)                                                     \
    CX_W8_CASES4(TARGET, DOT8, FMT, SUMS)                                                        \
    CX_W8_ROWS(TARGET, DOT8##_5, FMT, SUMS, 5)                                                   \
    CX_W8_ROWS(TARGET, DOT8##_6, FMT, SUMS, 6)                                                   \
    CX_W8_ROWS(TARGET, DOT8##_7, FMT, SUMS, 7)                                                   \
    CX_W8_ROWS(TARGET, DOT8##_8, FMT, SUMS, 8)                                                   \
    CX_W8_DISPATCH(TARGET, DOT8, CX_W8_CALL(DOT8, 4) CX_W8_CALL(DOT8, 5) CX_W8_CALL(DOT8, 6) \
                   CX_W8_CALL(DOT8, 7), DOT8##_8)
#define CX_W8_DOTS(TARGET, DOT, DOT8, FMT, SUMS, BY)                                                   \
    CX_W8_##BY(TARGET, DOT8, FMT, SUMS)                                                                \
    TARGET static float DOT(const uint8_t *w, const mk_q8_block *x, size_t n) {                             \
        float out[8];                                                                                       \
        DOT8##_1(w, 0, &x, n, out);                                                                         \
        return out[0];                                                                                      \
    }
CX_W8_DOTS(MK_AVX2, cx_dot_q4_0, cx_dot8_q4_0, Q4_0, cx_nibble_sums_avx2, ROWS4)
CX_W8_DOTS(MK_AVX2, cx_dot_q4_1, cx_dot8_q4_1, Q4_1, cx_nibble_sums_avx2, ROWS4)
CX_W8_DOTS(MK_AVX2, cx_dot_q5_0, cx_dot8_q5_0, Q5_0, cx_five_sums_avx2, ROWS4)
CX_W8_DOTS(MK_AVX2, cx_dot_q5_1, cx_dot8_q5_1, Q5_1, cx_five_sums_avx2, ROWS4)
CX_W8_DOTS(MK_AVX2, cx_dot_q8_0, cx_dot8_q8_0, Q8_0, cx_byte_sums_avx2, ROWS4)
CX_W8_DOTS(MK_AVX2, cx_dot_iq4_nl, cx_dot8_iq4_nl, IQ4_NL, cx_byte_sums_avx2, ROWS4)

/* ============================================================= K-quants == */

/* The K-quant kernels' weighted sums come from OPS: OPS##_wsum(acc, p, w) adds the sums of
 * adjacent products of 16-bit p and w to acc's i32 lanes. */
MK_AVX2 static inline __m256i cx_k_avx2_wsum(__m256i acc, __m256i p, __m256i w) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, w));
}

/* Q4_K and Q5_K row dots: one row (DOT) and 1 to BY's rows (DOTN: each super-block's scales
 * decoded and its values unpacked once for all the rows). Per row and super-block the eight
 * sub-block products (pairs of u4 or u5 x s8 by maddubs: |sum| <= 7874) weighted by their
 * 6-bit scales make one i32 sum (|lane| < 2^23: exact in float), the mins times the
 * activation group sums another (one madd); then x.d * (d * isum - dmin * imin). A row's
 * operations do not depend on the other rows, so DOTN's out[r] has DOT's bits on that row.
 * Q5_K is Q4_K with each value's fifth bit in qh (32 bytes before the nibbles: bit u of
 * qh[l] belongs to value l of sub-block u), put in as 16. */
#define CX_Q4_K_DOTS(TARGET, DOT, DOTN, OPS, BY) CX_BLOCK_DOTS(CX_Q4_K_ROWS, TARGET, DOT, DOTN, OPS, BY, mk_q8k_block)
#define CX_Q5_K_DOTS(TARGET, DOT, DOTN, OPS, BY) CX_BLOCK_DOTS(CX_Q5_K_ROWS, TARGET, DOT, DOTN, OPS, BY, mk_q8k_block)
#define CX_Q4_K_ROWS(TARGET, NAME, OPS, R) CX_K_ROWS(TARGET, NAME, OPS, R, Q4_K)
#define CX_Q5_K_ROWS(TARGET, NAME, OPS, R) CX_K_ROWS(TARGET, NAME, OPS, R, Q5_K)

/* The fifth bits of Q5_K's eight sub-blocks (qh: 32 bytes) added to their nibbles q[u]:
 * bit u of each byte, shifted into place as 16 (a 16-bit shift moves the high byte's bits
 * into the low byte's top bits, which the mask drops). */
MK_AVX2 CX_INLINE void cx_k5_fifth(__m256i q[8], const uint8_t *qh) {
    const __m256i bits = cx_loadu(qh), one = _mm256_set1_epi8(1);
    CX_UNROLL for (int u = 0; u < 8; u++)
        q[u] = _mm256_or_si256(q[u], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bits, u), one), 4));
}
/* Per format: the super-block's bytes, where its nibbles start, its fifth bits. */
#define CX_Q4_K_BYTES 144
#define CX_Q4_K_QS 16
#define CX_Q4_K_FIFTH(q, w) (void)0
#define CX_Q5_K_BYTES 176
#define CX_Q5_K_QS 48
#define CX_Q5_K_FIFTH(q, w) cx_k5_fifth(q, (w) + 16)

/* isum: the eight weighted group sums of one activation row and super-block, the products
 * PRODUCT(j) (i16 pair sums of group j) weighted by SCALE[j], in two integer chains that
 * meet at the end: exact (integer adds in any order give the same bits), and a row's eight
 * sums do not wait on one another's latency (one chain: Q4_K's one-row dot ~10% slower). */
#define CX_K_WSUM8(OPS, isum, PRODUCT, SCALE)                                                             \
    __m256i isum;                                                                                         \
    {                                                                                                     \
        __m256i chain_[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};                             \
        CX_UNROLL for (int j = 0; j < 8; j++) chain_[j & 1] = OPS##_wsum(chain_[j & 1], PRODUCT(j), SCALE[j]); \
        isum = _mm256_add_epi32(chain_[0], chain_[1]);                                                    \
    }
/* Group j's products for unsigned weight values q[j] (inside a row loop: xb in scope). */
#define CX_K_UNSIGNED_PRODUCT(j) _mm256_maddubs_epi16(q[j], cx_loadu(xb->q + 32 * (j)))

/* The per-row part of the dots with mins (Q4_K, Q5_K, Q2_K; inside a kernel: x, sb, q, scale,
 * mins, vd, vdmin and acc in scope): the eight groups of 32 weighted by their scales
 * (16-bit, one per 16 values) into one i32 sum, the mins times the activation group sums
 * another, then x.d * (d * isum - dmin * imin). */
#define CX_K_MIN_ROWS(OPS, R)                                                                             \
    CX_UNROLL for (int r = 0; r < R; r++) {                                                              \
        const mk_q8k_block *xb = &x[r][sb];                                                               \
        CX_K_WSUM8(OPS, isum, CX_K_UNSIGNED_PRODUCT, scale)                                               \
        const __m256i imin = _mm256_madd_epi16(cx_loadu(xb->sums), mins);                                 \
        const __m256 t = _mm256_fnmadd_ps(vdmin, _mm256_cvtepi32_ps(imin),                                \
                                          _mm256_mul_ps(vd, _mm256_cvtepi32_ps(isum)));                   \
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(xb->d), t, acc[r]);                                       \
    }

/* DOTN for a fixed number of rows R. */
#define CX_K_ROWS(TARGET, NAME, OPS, R, FMT)                                                               \
    TARGET static inline void NAME(const uint8_t *w, const mk_q8k_block *const *x, size_t n, float *out) { \
        __m256 acc[R];                                                                                    \
        for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                                         \
        const __m256i m4 = _mm256_set1_epi8(0x0f);                                                        \
        for (size_t sb = 0; sb < n / 256; sb++, w += CX_##FMT##_BYTES) {                                  \
            CX_PREFETCH_BLOCK(w, CX_##FMT##_BYTES);                                                       \
            const __m256 vd = _mm256_set1_ps(cx_f16(w)), vdmin = _mm256_set1_ps(cx_f16(w + 2));           \
            uint8_t sc[8], mn[8];                                                                         \
            mk_k4_scales_mins(w + 4, sc, mn);                                                             \
            /* the mins by group of 16: m0, m0, m1, m1, ... as 16-bit */                                  \
            const __m128i mn8 = _mm_loadl_epi64((const __m128i *)mn);                                     \
            const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));                       \
            __m256i q[8], scale[8]; /* sub-block 2j: the low nibbles of 32 bytes, 2j + 1 the high */      \
            for (int j = 0; j < 4; j++) {                                                                 \
                const __m256i raw = cx_loadu(w + CX_##FMT##_QS + 32 * j);                                 \
                q[2 * j] = _mm256_and_si256(raw, m4);                                                     \
                q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);                           \
            }                                                                                             \
            CX_##FMT##_FIFTH(q, w);                                                                       \
            for (int j = 0; j < 8; j++) scale[j] = _mm256_set1_epi16(sc[j]);                              \
            CX_K_MIN_ROWS(OPS, R)                                                                         \
        }                                                                                                 \
        for (int r = 0; r < R; r++) out[r] = cx_hsum(acc[r]);                                             \
    }
CX_Q4_K_DOTS(MK_AVX2, cx_dot_q4_k, cx_dotn_q4_k, cx_k_avx2, CX_BY_ROWS4)
CX_Q5_K_DOTS(MK_AVX2, cx_dot_q5_k, cx_dotn_q5_k, cx_k_avx2, CX_BY_ROWS4)

/* Q6_K row dots, as Q4_K's: each super-block's 6-bit values assembled and its scales spread
 * once for all the rows; per row the eight groups' q x s8 pair sums (q in 0..63: |sum| <=
 * 16002) weighted by the int8 scales into one i32 sum, less 32 x the scales times the
 * activation group sums (the values are q - 32), then one float term d * x.d per
 * super-block. The offset's lanes hold other groups than the products' lanes, so a lane
 * can pass 2^24 (|lane| < 2^26, no i32 overflow) and round in the conversion; the lanes'
 * total is the super-block's exact sum, and the rounding is the same in every table. */
#define CX_Q6_K_DOTS(TARGET, DOT, DOTN, OPS, BY) CX_BLOCK_DOTS(CX_Q6_K_ROWS, TARGET, DOT, DOTN, OPS, BY, mk_q8k_block)

/* The 16 signed scales of a Q6_K or Q3_K super-block (sc: int8, in group order; group i of
 * 32 values has scales 2i and 2i + 1, one per 16 values) as *scales16 (16-bit, in order:
 * for the offset term) and scales[i]: scale 2i in every 16-bit element of the low 128 bits,
 * 2i + 1 in the high (the pair sums of a group's maddubs): shuffles, no scalar loads. */
MK_AVX2 CX_INLINE void cx_k_pair_scales(__m128i sc, __m256i *scales16, __m256i scales[8]) {
    *scales16 = _mm256_cvtepi8_epi16(sc);
    /* the even scales as 16-bit in the low half, the odd ones in the high */
    const __m256i eo = _mm256_cvtepi8_epi16(
        _mm_shuffle_epi8(sc, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15)));
    CX_UNROLL for (int i = 0; i < 8; i++) scales[i] = _mm256_shuffle_epi8(eo, _mm256_set1_epi16((short)(0x0100 + 0x0202 * i)));
}

/* The per-row part of the Q6_K and Q3_K dots (inside a kernel: x, sb, q, scales, scales16, d
 * and acc in scope): the eight groups' products weighted by their scales, less 2^SHIFT (the
 * values' offset: 32 or 4) x the scales times the activation group sums, then one float
 * term d * x.d. */
#define CX_K_OFFSET_ROWS(OPS, R, SHIFT)                                                                   \
    CX_UNROLL for (int r = 0; r < R; r++) {                                                              \
        const mk_q8k_block *xb = &x[r][sb];                                                               \
        CX_K_WSUM8(OPS, isum, CX_K_UNSIGNED_PRODUCT, scales)                                              \
        const __m256i offset = _mm256_madd_epi16(cx_loadu(xb->sums), scales16);                           \
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(offset, SHIFT));                                  \
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(isum), acc[r]);            \
    }

/* DOTN for a fixed number of rows R. */
#define CX_Q6_K_ROWS(TARGET, NAME, OPS, R)                                                                 \
    TARGET static inline void NAME(const uint8_t *w, const mk_q8k_block *const *x, size_t n, float *out) { \
        __m256 acc[R];                                                                                    \
        for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                                         \
        const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);                              \
        for (size_t sb = 0; sb < n / 256; sb++, w += 210) {                                               \
            CX_PREFETCH_BLOCK(w, 210);                                                                    \
            const float d = cx_f16(w + 208);                                                              \
            __m256i q[8], scales[8], scales16; /* group 4h + k: 32 values of half h */                   \
            cx_k_pair_scales(_mm_loadu_si128((const __m128i *)(w + 192)), &scales16, scales);             \
            for (int h = 0; h < 2; h++) {                                                                 \
                const __m256i ql0 = cx_loadu(w + 64 * h), ql1 = cx_loadu(w + 64 * h + 32);               \
                const __m256i qh = cx_loadu(w + 128 + 32 * h);                                            \
                /* The two high bits sit in bits 0-1 of each byte after the mask; a 16-bit shift    \
                 * by 4 moves them to bits 4-5 of the same byte. */                                       \
                q[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4)); \
                q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),                                 \
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4)); \
                q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),           \
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4)); \
                q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),           \
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4)); \
            }                                                                                             \
            CX_K_OFFSET_ROWS(OPS, R, 5)                                                                   \
        }                                                                                                 \
        for (int r = 0; r < R; r++) out[r] = cx_hsum(acc[r]);                                             \
    }
CX_Q6_K_DOTS(MK_AVX2, cx_dot_q6_k, cx_dotn_q6_k, cx_k_avx2, CX_BY_ROWS4)

/* Q3_K's 16 signed 6-bit scales from its 12 packed bytes s, as mk_k3_scales reads them:
 * the low four bits of scale k from byte k (k < 8) or the high nibble of byte k - 8, the top
 * two from byte 8 + k % 4 at bit 2 (k / 4), less 32; 16 int8 in one vector (loads stay
 * inside the 12 bytes). */
MK_AVX2 CX_INLINE __m128i cx_k3_scales(const uint8_t *s) {
    const __m128i m4 = _mm_set1_epi8(0x0f), b8 = _mm_loadl_epi64((const __m128i *)s);
    uint32_t h;
    memcpy(&h, s + 8, sizeof h);
    /* bytes 0-7: the low nibbles, 8-15: the high ones (a 16-bit shift's borrowed bits are masked) */
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(b8, m4), _mm_and_si128(_mm_srli_epi16(b8, 4), m4));
    /* 32-bit lane j: the four bytes shifted by 2j, two bits kept per byte */
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)h), _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
}

/* Q3_K row dots, as Q6_K's: each super-block's 3-bit values assembled (two bits from qs,
 * the third from hmask) and its 16 signed scales (cx_k3_scales) spread once for all the
 * rows; per row the eight groups' u3 x s8 pair sums (|sum| <= 1778) weighted by the scales
 * into one i32 sum, less 4 x the scales times the activation group sums (the values are
 * u - 4; |lane| < 2^21, exact in float), then one float term d * x.d per super-block. */
#define CX_Q3_K_DOTS(TARGET, DOT, DOTN, OPS, BY) CX_BLOCK_DOTS(CX_Q3_K_ROWS, TARGET, DOT, DOTN, OPS, BY, mk_q8k_block)

/* DOTN for a fixed number of rows R. */
#define CX_Q3_K_ROWS(TARGET, NAME, OPS, R)                                                                 \
    TARGET static inline void NAME(const uint8_t *w, const mk_q8k_block *const *x, size_t n, float *out) { \
        __m256 acc[R];                                                                                    \
        for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                                         \
        const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);                                \
        for (size_t sb = 0; sb < n / 256; sb++, w += 110) {                                               \
            CX_PREFETCH_BLOCK(w, 110);                                                                    \
            const float d = cx_f16(w + 108);                                                              \
            __m256i q[8], scales[8], scales16; /* group i: values 32i..32i+31 as 0..7 */                 \
            cx_k_pair_scales(cx_k3_scales(w + 96), &scales16, scales);                                    \
            const __m256i hm = cx_loadu(w);                                                               \
            CX_UNROLL for (int i = 0; i < 8; i++) {                                                       \
                /* 16-bit shifts: the bits a byte takes from its neighbour fall outside the mask */      \
                const __m256i two = _mm256_and_si256(_mm256_srli_epi16(cx_loadu(w + 32 + 32 * (i / 4)), 2 * (i % 4)), m2); \
                const __m256i third = _mm256_and_si256(_mm256_srli_epi16(hm, i), one);                   \
                q[i] = _mm256_or_si256(two, _mm256_slli_epi16(third, 2));                                 \
            }                                                                                             \
            CX_K_OFFSET_ROWS(OPS, R, 2)                                                                   \
        }                                                                                                 \
        for (int r = 0; r < R; r++) out[r] = cx_hsum(acc[r]);                                             \
    }
CX_Q3_K_DOTS(MK_AVX2, cx_dot_q3_k, cx_dotn_q3_k, cx_k_avx2, CX_BY_ROWS4)

/* Q2_K row dots, as Q4_K's with a scale and a min per 16 values: each super-block's 2-bit
 * values (group j of 32: bits 2 (j % 4) of the 32 bytes of half j / 4), its 16 scales (low
 * nibbles, spread in pairs by cx_k_pair_scales) and mins (high nibbles) unpacked once for all
 * the rows; per row CX_K_MIN_ROWS (u2 x s8 pair sums <= 762, weighted by scales <= 15). */
#define CX_Q2_K_DOTS(TARGET, DOT, DOTN, OPS, BY) CX_BLOCK_DOTS(CX_Q2_K_ROWS, TARGET, DOT, DOTN, OPS, BY, mk_q8k_block)

/* DOTN for a fixed number of rows R. */
#define CX_Q2_K_ROWS(TARGET, NAME, OPS, R)                                                                 \
    TARGET static inline void NAME(const uint8_t *w, const mk_q8k_block *const *x, size_t n, float *out) { \
        __m256 acc[R];                                                                                    \
        for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                                         \
        const __m256i m2 = _mm256_set1_epi8(3);                                                           \
        const __m128i m4 = _mm_set1_epi8(0x0f);                                                           \
        for (size_t sb = 0; sb < n / 256; sb++, w += 84) {                                                \
            CX_PREFETCH_BLOCK(w, 84);                                                                     \
            const __m256 vd = _mm256_set1_ps(cx_f16(w + 80)), vdmin = _mm256_set1_ps(cx_f16(w + 82));     \
            const __m128i packed = _mm_loadu_si128((const __m128i *)w); /* scale | min << 4, per 16 */  \
            const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));      \
            __m256i q[8], scale[8], scales16;                                                             \
            cx_k_pair_scales(_mm_and_si128(packed, m4), &scales16, scale);                                \
            (void)scales16;                                                                               \
            CX_UNROLL for (int j = 0; j < 8; j++)                                                         \
                q[j] = _mm256_and_si256(_mm256_srli_epi16(cx_loadu(w + 16 + 32 * (j / 4)), 2 * (j % 4)), m2); \
            CX_K_MIN_ROWS(OPS, R)                                                                         \
        }                                                                                                 \
        for (int r = 0; r < R; r++) out[r] = cx_hsum(acc[r]);                                             \
    }
CX_Q2_K_DOTS(MK_AVX2, cx_dot_q2_k, cx_dotn_q2_k, cx_k_avx2, CX_BY_ROWS4)

/* IQ4_XS row dots, as Q4_K's: each super-block's 8 sub-blocks of 32 looked up in
 * mk_iq4_values (cx_iq4_values32: low nibbles are values 0-15, high 16-31) with their
 * magnitudes, and their signed scales (mk_iq4xs_scale) spread, once for all the rows; per
 * row the sub-blocks' |w| x sign(x, w) pair sums (<= 2 x 127 x 127: no i16 overflow)
 * weighted by the scales into one i32 sum (|lane| < 2^24, exact in float), then one float
 * term d * x.d per super-block. */
MK_AVX2 CX_INLINE __m256i cx_iq4_values32(const uint8_t *qs, __m256i lut) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0f);
    const __m256i idx = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(raw, m4)),
                                                _mm_and_si128(_mm_srli_epi16(raw, 4), m4), 1);
    return _mm256_shuffle_epi8(lut, idx);
}
#define CX_IQ4_XS_DOTS(TARGET, DOT, DOTN, OPS, BY) CX_BLOCK_DOTS(CX_IQ4_XS_ROWS, TARGET, DOT, DOTN, OPS, BY, mk_q8k_block)

/* Sub-block j's products: |w| times x with w's sign (v: the looked-up values, mag: |v|). */
#define CX_IQ4_XS_PRODUCT(j) _mm256_maddubs_epi16(mag[j], _mm256_sign_epi8(cx_loadu(xb->q + 32 * (j)), v[j]))

/* DOTN for a fixed number of rows R. */
#define CX_IQ4_XS_ROWS(TARGET, NAME, OPS, R)                                                               \
    TARGET static inline void NAME(const uint8_t *w, const mk_q8k_block *const *x, size_t n, float *out) { \
        __m256 acc[R];                                                                                    \
        for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                                         \
        const __m256i lut = cx_iq4_lut();                                                                 \
        for (size_t sb = 0; sb < n / 256; sb++, w += 136) {                                               \
            CX_PREFETCH_BLOCK(w, 136);                                                                    \
            const float d = cx_f16(w);                                                                    \
            __m256i v[8], mag[8], scale[8]; /* sub-block ib: its values, their magnitudes, its scale */  \
            CX_UNROLL for (int ib = 0; ib < 8; ib++) {                                                    \
                v[ib] = cx_iq4_values32(w + 8 + 16 * ib, lut);                                            \
                mag[ib] = _mm256_abs_epi8(v[ib]);                                                         \
                scale[ib] = _mm256_set1_epi16((short)mk_iq4xs_scale(w, ib));                              \
            }                                                                                             \
            CX_UNROLL for (int r = 0; r < R; r++) {                                                      \
                const mk_q8k_block *xb = &x[r][sb];                                                       \
                CX_K_WSUM8(OPS, isum, CX_IQ4_XS_PRODUCT, scale)                                           \
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(isum), acc[r]);    \
            }                                                                                             \
        }                                                                                                 \
        for (int r = 0; r < R; r++) out[r] = cx_hsum(acc[r]);                                             \
    }
CX_IQ4_XS_DOTS(MK_AVX2, cx_dot_iq4_xs, cx_dotn_iq4_xs, cx_k_avx2, CX_BY_ROWS4)

/* ===================================================================== VNNI == */

/* vpdpbusd multiplies unsigned by signed bytes and adds each group of four products into a
 * 32-bit lane: the i32 lanes maddubs + madd form above, in one instruction and without the
 * i16 step (which never saturates here either), so the VNNI dots compute the same integers
 * and then the same float operations as the AVX2 ones: bit-identical results (tested).
 * Two encodings of the same 256-bit instruction: AVX-VNNI (VEX; Intel Alder Lake and
 * later) and AVX512-VNNI with AVX512VL (EVEX; AMD Zen 4, Intel Ice Lake and later). */
#define MK_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#define MK_VNNI512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))

/* The Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS dots for one encoding: TARGET compiles them, DPBUSD
 * and DPWSSD are its intrinsics, BY and BY8 make its n-row kernels (CX_BY_ROWS8 and ROWS8
 * only where TARGET has AVX-512's 32 registers). */
#define CX_VNNI_DOTS(TARGET, DPBUSD, DPWSSD, SUFFIX, BY, BY8)                                              \
    /* The eight weight rows' block sums: one vpdpbusd per group of four (the same i32 lanes as \
     * cx_nibble_sums_avx2's). */                                                                         \
    TARGET CX_INLINE __m256i cx_nibble_sums_##SUFFIX(__m256i init, const __m256i g[8], const int8_t *q) { \
        CX_UNROLL for (int k = 0; k < 8; k++) init = DPBUSD(init, g[k], cx_group4(q + 4 * k));            \
        return init;                                                                                      \
    }                                                                                                     \
    CX_W8_DOTS(TARGET, cx_dot_q4_0_##SUFFIX, cx_dot8_q4_0_##SUFFIX, Q4_0, cx_nibble_sums_##SUFFIX, BY8) \
    CX_W8_DOTS(TARGET, cx_dot_q4_1_##SUFFIX, cx_dot8_q4_1_##SUFFIX, Q4_1, cx_nibble_sums_##SUFFIX, BY8) \
    /* Five-bit values are unsigned bytes too (<= 31): the same sums */                           \
    CX_W8_DOTS(TARGET, cx_dot_q5_0_##SUFFIX, cx_dot8_q5_0_##SUFFIX, Q5_0, cx_nibble_sums_##SUFFIX, BY8) \
    CX_W8_DOTS(TARGET, cx_dot_q5_1_##SUFFIX, cx_dot8_q5_1_##SUFFIX, Q5_1, cx_nibble_sums_##SUFFIX, BY8) \
    /* Signed weight bytes through the sign trick, one vpdpbusd per group (|w| <= 128 times    \
     * |x| <= 127: the same i32 lanes as cx_byte_sums_avx2's). */                                       \
    TARGET CX_INLINE __m256i cx_byte_sums_##SUFFIX(__m256i init, const __m256i g[8], const int8_t *q) { \
        CX_UNROLL for (int k = 0; k < 8; k++)                                                             \
            init = DPBUSD(init, _mm256_sign_epi8(g[k], g[k]), _mm256_sign_epi8(cx_group4(q + 4 * k), g[k])); \
        return init;                                                                                      \
    }                                                                                                     \
    CX_W8_DOTS(TARGET, cx_dot_q8_0_##SUFFIX, cx_dot8_q8_0_##SUFFIX, Q8_0, cx_byte_sums_##SUFFIX, BY8)     \
    CX_W8_DOTS(TARGET, cx_dot_iq4_nl_##SUFFIX, cx_dot8_iq4_nl_##SUFFIX, IQ4_NL, cx_byte_sums_##SUFFIX, BY8) \
    /* The K-quants' weighted sums: vpdpwssd adds the same i32 sums as madd + add. */         \
    TARGET static inline __m256i cx_k_##SUFFIX##_wsum(__m256i acc, __m256i p, __m256i w) {                \
        return DPWSSD(acc, p, w);                                                                         \
    }                                                                                                     \
    CX_Q2_K_DOTS(TARGET, cx_dot_q2_k_##SUFFIX, cx_dotn_q2_k_##SUFFIX, cx_k_##SUFFIX, BY)                  \
    CX_Q3_K_DOTS(TARGET, cx_dot_q3_k_##SUFFIX, cx_dotn_q3_k_##SUFFIX, cx_k_##SUFFIX, BY)                  \
    CX_Q4_K_DOTS(TARGET, cx_dot_q4_k_##SUFFIX, cx_dotn_q4_k_##SUFFIX, cx_k_##SUFFIX, BY)                  \
    CX_Q5_K_DOTS(TARGET, cx_dot_q5_k_##SUFFIX, cx_dotn_q5_k_##SUFFIX, cx_k_##SUFFIX, BY)                  \
    CX_Q6_K_DOTS(TARGET, cx_dot_q6_k_##SUFFIX, cx_dotn_q6_k_##SUFFIX, cx_k_##SUFFIX, BY)                  \
    CX_IQ4_XS_DOTS(TARGET, cx_dot_iq4_xs_##SUFFIX, cx_dotn_iq4_xs_##SUFFIX, cx_k_##SUFFIX, BY)

CX_VNNI_DOTS(MK_VNNI, _mm256_dpbusd_avx_epi32, _mm256_dpwssd_avx_epi32, vnni, CX_BY_ROWS4, ROWS4)
CX_VNNI_DOTS(MK_VNNI512, _mm256_dpbusd_epi32, _mm256_dpwssd_epi32, vnni512, CX_BY_ROWS8, ROWS8)


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
    .dot8_q4_0 = cx_dot8_q4_0,
    .dot_q4_1 = cx_dot_q4_1,
    .dot8_q4_1 = cx_dot8_q4_1,
    .dot_q5_0 = cx_dot_q5_0,
    .dot8_q5_0 = cx_dot8_q5_0,
    .dot_q5_1 = cx_dot_q5_1,
    .dot8_q5_1 = cx_dot8_q5_1,
    .dot_q8_0 = cx_dot_q8_0,
    .dot8_q8_0 = cx_dot8_q8_0,
    .dotn_rows = 4,
    .dot_q2_k = cx_dot_q2_k,
    .dotn_q2_k = cx_dotn_q2_k,
    .dot_q3_k = cx_dot_q3_k,
    .dotn_q3_k = cx_dotn_q3_k,
    .dot_q4_k = cx_dot_q4_k,
    .dotn_q4_k = cx_dotn_q4_k,
    .dot_q5_k = cx_dot_q5_k,
    .dotn_q5_k = cx_dotn_q5_k,
    .dot_q6_k = cx_dot_q6_k,
    .dotn_q6_k = cx_dotn_q6_k,
    .dot_iq4_nl = cx_dot_iq4_nl,
    .dot8_iq4_nl = cx_dot8_iq4_nl,
    .dot_iq4_xs = cx_dot_iq4_xs,
    .dotn_iq4_xs = cx_dotn_iq4_xs,
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
        .dot8_q4_0 = cx_dot8_q4_0_##SUFFIX,        \
        .dot_q4_1 = cx_dot_q4_1_##SUFFIX,          \
        .dot8_q4_1 = cx_dot8_q4_1_##SUFFIX,        \
        .dot_q5_0 = cx_dot_q5_0_##SUFFIX,          \
        .dot8_q5_0 = cx_dot8_q5_0_##SUFFIX,        \
        .dot_q5_1 = cx_dot_q5_1_##SUFFIX,          \
        .dot8_q5_1 = cx_dot8_q5_1_##SUFFIX,        \
        .dot_q8_0 = cx_dot_q8_0_##SUFFIX,          \
        .dot8_q8_0 = cx_dot8_q8_0_##SUFFIX,        \
        .dotn_rows = ROWS,                         \
        .dot_q2_k = cx_dot_q2_k_##SUFFIX,          \
        .dotn_q2_k = cx_dotn_q2_k_##SUFFIX,        \
        .dot_q3_k = cx_dot_q3_k_##SUFFIX,          \
        .dotn_q3_k = cx_dotn_q3_k_##SUFFIX,        \
        .dot_q4_k = cx_dot_q4_k_##SUFFIX,          \
        .dotn_q4_k = cx_dotn_q4_k_##SUFFIX,        \
        .dot_q5_k = cx_dot_q5_k_##SUFFIX,          \
        .dotn_q5_k = cx_dotn_q5_k_##SUFFIX,        \
        .dot_q6_k = cx_dot_q6_k_##SUFFIX,          \
        .dotn_q6_k = cx_dotn_q6_k_##SUFFIX,        \
        .dot_iq4_nl = cx_dot_iq4_nl_##SUFFIX,      \
        .dot8_iq4_nl = cx_dot8_iq4_nl_##SUFFIX,    \
        .dot_iq4_xs = cx_dot_iq4_xs_##SUFFIX,      \
        .dotn_iq4_xs = cx_dotn_iq4_xs_##SUFFIX,    \
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
