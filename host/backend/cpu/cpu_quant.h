/* Dot products of weight rows kept in their GGUF block format ("native" weights) with an
 * activation row, for the cpu backend's matrix products.
 *
 * Quantized weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) are multiplied with the activation row quantized to
 * 8 bits per block of 32 (mk_q8_block, as llama.cpp's Q8_1): the inner products are exact
 * integer sums and each block contributes one float term. The K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS take
 * the row quantized with one scale per 256 values and the integer sums of its groups of 16
 * (mk_q8k_block, as llama.cpp's Q8_K): a super-block's sub-block sums are weighted by their
 * integer scales and added as integers, Q2_K's, Q4_K's and Q5_K's mins and the offsets of Q3_K (4) and Q6_K (32) come from the
 * group sums in one multiply, and the super-block contributes one float term (two with
 * mins) instead of eight. IQ4_NL's and IQ4_XS's 4-bit indices are looked up in their
 * 16 signed values (mk_iq4_values) and multiplied as Q8_0's signed bytes. F16 and BF16 rows are multiplied with the float
 * activations directly (widened in registers).
 *
 * Four implementations share one table layout: portable C (the reference the others are
 * tested against), AVX2+FMA+F16C, and AVX-VNNI and AVX512-VNNI (the AVX2 kernels with
 * vpdpbusd / vpdpwssd for the integer sums: the same integers and float operations, so
 * bit-identical to AVX2). The best one the running CPU supports is chosen once at run time
 * (mk_cpu_quant_best); the SIMD file compiles its kernels with function-level target
 * attributes, so the library itself is built for baseline x86-64 and runs everywhere.
 *
 * Numerics: activation quantization is bit-identical across implementations (same float
 * multiply, round-to-nearest-even, integer sums). The dots differ only in the order the
 * per-block float terms are summed, so SIMD and portable agree to float rounding; each
 * implementation is a fixed function of (weight row, activation row), so results do not
 * depend on threads or on how a model is split into ranges. */
#ifndef MK_CPU_QUANT_H
#define MK_CPU_QUANT_H

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MK_Q8_BLOCK 32

/* One block of 32 activations: x[i] ~= d * q[i]; sum = q[0] + ... + q[31] (the offsets of
 * Q4_0, 8, and Q5_0, 16, come from it) and s = d * sum (for formats with a min). */
typedef struct mk_q8_block {
    float d;
    float s;
    int32_t sum;
    int8_t q[MK_Q8_BLOCK];
} mk_q8_block;

#define MK_Q8K_BLOCK 256

/* 256 activations for the K-quants: x[i] ~= d * q[i], d from the largest |x| of the 256;
 * sums[g] = q[16g] + ... + q[16g + 15] (|sums| <= 2032). */
typedef struct mk_q8k_block {
    float d;
    int16_t sums[MK_Q8K_BLOCK / 16];
    int8_t q[MK_Q8K_BLOCK];
} mk_q8k_block;

/* The scale rule every table shares, from the largest |x| of a span as its bit pattern
 * (x & 0x7fffffff): for non-negative floats the integer order is the float order with NaN
 * above Inf above every finite value, so an integer max sees a NaN or an Inf wherever it
 * sits and in any order (a float max drops a NaN or keeps it depending on operand order).
 *   - a span holding NaN or Inf: d = NaN, and its q and sums are 0 (x * id has no integer
 *     value): every product it enters is NaN, as the float product would be, not a
 *     finite number that silently left the value out;
 *   - a span whose d would be under FLT_MIN (amax < 127 * FLT_MIN, subnormal values): d = 0
 *     and q = 0 (1 / d would overflow to Inf and x * Inf has no integer value either);
 *   - otherwise d = amax / 127, id = 1 / d, and |x * id| <= 127 rounds into int8.
 * Returns d; *id is 0 in the first two cases. */
static inline float mk_q8_scale_of_bits(uint32_t amax_bits, float *id) {
    if (amax_bits >= 0x7f800000u) {
        *id = 0.0f;
        return NAN;
    }
    float amax;
    memcpy(&amax, &amax_bits, sizeof amax);
    const float d = amax / 127.0f;
    if (!(d >= FLT_MIN)) {
        *id = 0.0f;
        return 0.0f;
    }
    *id = 1.0f / d;
    return d;
}

/* out[n / 32] from x[n]; n a multiple of 32. */
typedef void (*mk_quantize_row_fn)(mk_q8_block *out, const float *x, size_t n);
/* out[n / 256] from x[n]; n a multiple of 256. */
typedef void (*mk_quantize_row_k_fn)(mk_q8k_block *out, const float *x, size_t n);
/* Dot of one weight row of n elements (n / block_elements whole blocks) with the
 * quantized activation row xq[n / 32] (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL). */
typedef float (*mk_qdot_fn)(const uint8_t *w, const mk_q8_block *xq, size_t n);
/* The same for the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS, with the row xk[n / 256]. */
typedef float (*mk_kdot_fn)(const uint8_t *w, const mk_q8k_block *xk, size_t n);
/* Eight consecutive weight rows (w, row_bytes apart; 0: one row eight times) times `rows`
 * (1 to the table's dotn_rows) activation rows: out[8 * r + i] = the dot of weight row i
 * with activation row r, each with the bits of the one-row dot (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL:
 * the weight values are regrouped once per block for every activation row, and each output
 * is computed in an order that depends only on its two rows, whoever else is in the call;
 * Q8_0 likewise). */
typedef void (*mk_qdot8_fn)(const uint8_t *w, size_t row_bytes, const mk_q8_block *const *xq, size_t rows, size_t n,
                            float *out);
/* The dot of one weight row with `rows` (1 to dotn_rows) activation rows into out[0..rows-1],
 * each out[r] bit-identical to the one-row dot with that row (the K-quants, IQ4_XS). */
typedef void (*mk_kdotn_fn)(const uint8_t *w, const mk_q8k_block *const *xk, size_t rows, size_t n, float *out);
/* The most activation rows any table's n-row dots take in one call (mk_cpu_quant.dotn_rows). */
enum { MK_QDOTN_MAX_ROWS = 8 };
/* Dot of one F16/BF16 weight row with float activations x[n] (any n). */
typedef float (*mk_hdot_fn)(const uint16_t *w, const float *x, size_t n);

typedef struct mk_cpu_quant {
    const char *name; /* "portable", "avx2", "avx-vnni", "avx512-vnni" */
    mk_quantize_row_fn quantize_row;     /* for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL */
    mk_quantize_row_k_fn quantize_row_k; /* for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS */
    mk_qdot_fn dot_q4_0, dot_q4_1, dot_q5_0, dot_q5_1, dot_q8_0, dot_iq4_nl;
    mk_kdot_fn dot_q2_k, dot_q3_k, dot_q4_k, dot_q5_k, dot_q6_k, dot_iq4_xs;
    mk_qdot8_fn dot8_q4_0, dot8_q4_1, dot8_q5_0, dot8_q5_1, dot8_q8_0, dot8_iq4_nl; /* NULL: one-row dots */
    mk_kdotn_fn dotn_q2_k, dotn_q3_k, dotn_q4_k, dotn_q5_k, dotn_q6_k, dotn_iq4_xs;
    /* Activation rows per n-row call (0 without them): as many as the kernels' per-row
     * accumulators leave room for in the vector registers, 4 of 16, 8 of AVX-512's 32 (the
     * weight rows, eight for the blocks of 32, are unpacked once per call, so more rows per
     * call is less work per row). */
    size_t dotn_rows;
    mk_hdot_fn dot_f16, dot_bf16;
} mk_cpu_quant;

/* The portable C implementation (always available). */
const mk_cpu_quant *mk_cpu_quant_portable(void);
/* The AVX2 implementation, or NULL when this CPU (or the compiler) lacks AVX2/FMA/F16C. */
const mk_cpu_quant *mk_cpu_quant_avx2(void);
/* The VNNI implementation (AVX-VNNI, else AVX512-VNNI on 256-bit registers), or NULL when
 * this CPU (or the compiler) has neither. */
const mk_cpu_quant *mk_cpu_quant_vnni(void);
/* The AVX512-VNNI one alone (what mk_cpu_quant_vnni gives where AVX-VNNI is missing), or
 * NULL: tests compare it with the others on CPUs that have both encodings. */
const mk_cpu_quant *mk_cpu_quant_avx512_vnni(void);
/* The fastest implementation this CPU runs; MESHKERN_CPU_KERNELS=portable or =avx2 in the
 * environment caps it there (for comparisons). */
const mk_cpu_quant *mk_cpu_quant_best(void);

/* The dot for a ggml weight type (mk_ggml_type id) over blocks of 32 in table q (Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0, IQ4_NL), or NULL (F32 and the formats below are dequantized at load
 * instead; the K-quants and IQ4_XS take mk_cpu_quant_kdot_for). */
mk_qdot_fn mk_cpu_quant_dot_for(const mk_cpu_quant *q, uint32_t ggml_type);
/* Its eight-weight-row dot (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), or NULL. */
mk_qdot8_fn mk_cpu_quant_dot8_for(const mk_cpu_quant *q, uint32_t ggml_type);
/* The K-quants' dot and n-row dot (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS), or NULL for the other types. */
mk_kdot_fn mk_cpu_quant_kdot_for(const mk_cpu_quant *q, uint32_t ggml_type);
mk_kdotn_fn mk_cpu_quant_kdotn_for(const mk_cpu_quant *q, uint32_t ggml_type);
/* True for the ggml types the cpu backend keeps in their stored format. */
bool mk_cpu_quant_keeps(uint32_t ggml_type);

#ifdef __cplusplus
}
#endif
#endif
