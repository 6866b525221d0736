/* Native-format dot products, portable C (see cpu_quant.h): the reference the SIMD
 * kernels are tested against, and what runs on a CPU without AVX2. Block layouts are
 * ggml's (described in gguf_dequant.c). */
#include "backend/cpu/cpu_quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "model/gguf.h"

static float cq_f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return mk_f16_to_f32(h);
}

/* ============================================================ activations == */

/* d and id of the n values at x by the shared rule (mk_q8_scale_of_bits): d = amax / 127,
 * id = 1 / d; d = NaN (and id 0) for a span holding NaN or Inf, 0 for a span too small. */
static float cq_scale(const float *x, size_t n, float *id) {
    uint32_t amax = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        u &= 0x7fffffffu;
        if (u > amax) amax = u;
    }
    return mk_q8_scale_of_bits(amax, id);
}

/* q[0..n) from x[0..n) times id, rounded to nearest even (all 0 when id is 0: a NaN or Inf
 * times 0 has no integer value); returns their sum. */
static int cq_round(int8_t *q, const float *x, size_t n, float id) {
    if (id == 0.0f) {
        memset(q, 0, n);
        return 0;
    }
    int sum = 0;
    for (size_t i = 0; i < n; i++) {
        q[i] = (int8_t)(int)nearbyintf(x[i] * id);
        sum += q[i];
    }
    return sum;
}

static void cq_quantize_row(mk_q8_block *out, const float *x, size_t n) {
    for (size_t b = 0; b < n / MK_Q8_BLOCK; b++) {
        float id;
        out[b].d = cq_scale(x + b * MK_Q8_BLOCK, MK_Q8_BLOCK, &id);
        out[b].sum = cq_round(out[b].q, x + b * MK_Q8_BLOCK, MK_Q8_BLOCK, id);
        out[b].s = out[b].d * (float)out[b].sum;
    }
}

/* The same over 256 values with one scale, and the sums of each 16. */
static void cq_quantize_row_k(mk_q8k_block *out, const float *x, size_t n) {
    for (size_t b = 0; b < n / MK_Q8K_BLOCK; b++) {
        const float *xb = x + b * MK_Q8K_BLOCK;
        float id;
        out[b].d = cq_scale(xb, MK_Q8K_BLOCK, &id);
        for (int g = 0; g < MK_Q8K_BLOCK / 16; g++) out[b].sums[g] = (int16_t)cq_round(out[b].q + 16 * g, xb + 16 * g, 16, id);
    }
}

/* ========================================================= 32-wide blocks == */

/* Q4_0 and IQ4_NL: d f16 and 16 bytes of 4-bit indices (value j the low nibble of byte j,
 * value j + 16 the high one) into the format's 16 values: Q4_0's are q - 8, IQ4_NL's the
 * non-uniform mk_iq4_values. */
static const int8_t cq_q4_0_values[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};

static float cq_dot_nibbles(const uint8_t *w, const mk_q8_block *x, size_t n, const int8_t values[16]) {
    float sum = 0.0f;
    for (size_t b = 0; b < n / 32; b++, w += 18) {
        const uint8_t *qs = w + 2;
        int isum = 0;
        for (int j = 0; j < 16; j++) isum += values[qs[j] & 0x0f] * x[b].q[j] + values[qs[j] >> 4] * x[b].q[j + 16];
        sum += cq_f16_at(w) * x[b].d * (float)isum;
    }
    return sum;
}

static float cq_dot_q4_0(const uint8_t *w, const mk_q8_block *x, size_t n) {
    return cq_dot_nibbles(w, x, n, cq_q4_0_values);
}
static float cq_dot_iq4_nl(const uint8_t *w, const mk_q8_block *x, size_t n) {
    return cq_dot_nibbles(w, x, n, mk_iq4_values);
}

static float cq_dot_q4_1(const uint8_t *w, const mk_q8_block *x, size_t n) {
    float sum = 0.0f;
    for (size_t b = 0; b < n / 32; b++, w += 20) {
        const uint8_t *qs = w + 4;
        int isum = 0;
        for (int j = 0; j < 16; j++) isum += (qs[j] & 0x0f) * x[b].q[j] + (qs[j] >> 4) * x[b].q[j + 16];
        sum += cq_f16_at(w) * x[b].d * (float)isum + cq_f16_at(w + 2) * x[b].s;
    }
    return sum;
}

/* Q5_0 and Q5_1: the nibbles as Q4_0's and Q4_1's, each value's fifth bit in qh (a u32
 * before them: bit j for value j), so value j is nibble | bit << 4, Q5_0's less 16. */
static int cq_five_isum(const uint8_t *qh_at, const int8_t *q, int offset) {
    uint32_t qh;
    memcpy(&qh, qh_at, sizeof qh);
    const uint8_t *qs = qh_at + 4;
    int isum = 0;
    for (int j = 0; j < 16; j++) {
        const int lo = (int)((qs[j] & 0x0f) | (((qh >> j) & 1u) << 4));
        const int hi = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
        isum += (lo - offset) * q[j] + (hi - offset) * q[j + 16];
    }
    return isum;
}

static float cq_dot_q5_0(const uint8_t *w, const mk_q8_block *x, size_t n) {
    float sum = 0.0f;
    for (size_t b = 0; b < n / 32; b++, w += 22) sum += cq_f16_at(w) * x[b].d * (float)cq_five_isum(w + 2, x[b].q, 16);
    return sum;
}

static float cq_dot_q5_1(const uint8_t *w, const mk_q8_block *x, size_t n) {
    float sum = 0.0f;
    for (size_t b = 0; b < n / 32; b++, w += 24)
        sum += cq_f16_at(w) * x[b].d * (float)cq_five_isum(w + 4, x[b].q, 0) + cq_f16_at(w + 2) * x[b].s;
    return sum;
}

static float cq_dot_q8_0(const uint8_t *w, const mk_q8_block *x, size_t n) {
    float sum = 0.0f;
    for (size_t b = 0; b < n / 32; b++, w += 34) {
        const int8_t *qs = (const int8_t *)(w + 2);
        int isum = 0;
        for (int j = 0; j < 32; j++) isum += qs[j] * x[b].q[j];
        sum += cq_f16_at(w) * x[b].d * (float)isum;
    }
    return sum;
}

/* ============================================================= K-quants == */

/* Q2_K and Q3_K keep the same two low bits of value i (of 256): bits 2 ((i % 128) / 32) of
 * qs[32 (i / 128) + i % 32], four planes of 32 bytes per half of 128 values. */
static inline int cq_two_bits(const uint8_t *qs, int i) {
    return (qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
}

/* Q2_K: 256 values in 16 groups of 16, each with a 4-bit scale (low nibble of scales[g]) and
 * min (high nibble); value i is its two bits (cq_two_bits, 0..3), weighted d * scale, less
 * dmin * min; a group's activations sum to its group sum. */
static float cq_dot_q2_k(const uint8_t *w, const mk_q8k_block *x, size_t n) {
    float sum = 0.0f;
    for (size_t sb = 0; sb < n / 256; sb++, w += 84, x++) {
        const uint8_t *qs = w + 16;
        int isum = 0, imin = 0;
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int i = 16 * g; i < 16 * g + 16; i++) s += cq_two_bits(qs, i) * x->q[i];
            isum += (w[g] & 0x0f) * s;
            imin += (w[g] >> 4) * x->sums[g];
        }
        sum += x->d * (cq_f16_at(w + 80) * (float)isum - cq_f16_at(w + 82) * (float)imin);
    }
    return sum;
}

/* Q3_K: 256 values in 16 groups of 16 with a signed 6-bit scale each (mk_k3_scales); value i
 * is its two bits in qs (cq_two_bits) and its third in hmask (bit i / 32 of byte i % 32),
 * less 4. */
static float cq_dot_q3_k(const uint8_t *w, const mk_q8k_block *x, size_t n) {
    float sum = 0.0f;
    for (size_t sb = 0; sb < n / 256; sb++, w += 110, x++) {
        const uint8_t *hmask = w, *qs = w + 32;
        int8_t scale[16];
        mk_k3_scales(w + 96, scale);
        int isum = 0;
        for (int i = 0; i < 256; i++) {
            const int third = (hmask[i % 32] >> (i / 32)) & 1;
            isum += scale[i / 16] * ((cq_two_bits(qs, i) | third << 2) - 4) * x->q[i];
        }
        sum += cq_f16_at(w + 108) * x->d * (float)isum;
    }
    return sum;
}

/* Q4_K: 256 values as 8 sub-blocks of 32, value = d*sc*q - dmin*m; sub-block 2j holds the
 * low nibbles of qs[32j..32j+31], 2j+1 the high ones. A sub-block's activations sum to its
 * two groups' sums. Q5_K (five) is the same with each value's fifth bit in qh (32 bytes at
 * offset 16, before the nibbles: bit j of qh[l] belongs to value l of sub-block j).
 * `bytes`: the super-block's size, `qs_at`: where its nibbles start. */
static float cq_dot_k45(const uint8_t *w, const mk_q8k_block *x, size_t n, size_t bytes, size_t qs_at, bool five) {
    float sum = 0.0f;
    for (size_t sb = 0; sb < n / 256; sb++, w += bytes, x++) {
        const float d = cq_f16_at(w), dmin = cq_f16_at(w + 2);
        const uint8_t *qh = w + 16, *qs = w + qs_at;
        uint8_t scs[8], mns[8];
        mk_k4_scales_mins(w + 4, scs, mns);
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = qs + 32 * (j / 2);
            const int shift = (j % 2) * 4;
            int isum = 0;
            for (int l = 0; l < 32; l++)
                isum += (((q[l] >> shift) & 0x0f) | (five ? ((qh[l] >> j) & 1) << 4 : 0)) * x->q[32 * j + l];
            const int xsum = x->sums[2 * j] + x->sums[2 * j + 1];
            sum += x->d * (d * (float)scs[j] * (float)isum - dmin * (float)mns[j] * (float)xsum);
        }
    }
    return sum;
}

static float cq_dot_q4_k(const uint8_t *w, const mk_q8k_block *x, size_t n) {
    return cq_dot_k45(w, x, n, 144, 16, false);
}
static float cq_dot_q5_k(const uint8_t *w, const mk_q8k_block *x, size_t n) {
    return cq_dot_k45(w, x, n, 176, 48, true);
}

/* Q6_K: 256 values in two halves of 128; group k (32 values) of half h takes its low four
 * bits from ql and its high two from qh, and has one int8 scale per 16 values. */
static float cq_dot_q6_k(const uint8_t *w, const mk_q8k_block *x, size_t n) {
    float sum = 0.0f;
    for (size_t sb = 0; sb < n / 256; sb++, w += 210, x++) {
        const float d = cq_f16_at(w + 208);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w + 64 * h, *qh = w + 128 + 32 * h;
            const int8_t *sc = (const int8_t *)(w + 192 + 8 * h);
            for (int k = 0; k < 4; k++) {
                const int8_t *y = x->q + 128 * h + 32 * k;
                int isum[2] = {0, 0};
                for (int l = 0; l < 32; l++) {
                    const int lo = (ql[l + 32 * (k & 1)] >> (4 * (k >> 1))) & 0x0f;
                    const int hi = (qh[l] >> (2 * k)) & 3;
                    isum[l / 16] += ((lo | (hi << 4)) - 32) * y[l];
                }
                sum += d * x->d * (float)(sc[2 * k] * isum[0] + sc[2 * k + 1] * isum[1]);
            }
        }
    }
    return sum;
}

/* IQ4_XS: 256 values as 8 sub-blocks of 32 with a signed 6-bit scale each (mk_iq4xs_scale);
 * sub-block ib's 16 bytes at offset 8 + 16 ib hold its values j (low nibbles) and j + 16
 * (high), indices into mk_iq4_values. |isum| < 2^28: exact in int. */
static float cq_dot_iq4_xs(const uint8_t *w, const mk_q8k_block *x, size_t n) {
    float sum = 0.0f;
    for (size_t sb = 0; sb < n / 256; sb++, w += 136, x++) {
        int isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *qs = w + 8 + 16 * ib;
            const int8_t *y = x->q + 32 * ib;
            int s = 0;
            for (int j = 0; j < 16; j++) s += mk_iq4_values[qs[j] & 0x0f] * y[j] + mk_iq4_values[qs[j] >> 4] * y[j + 16];
            isum += mk_iq4xs_scale(w, ib) * s;
        }
        sum += cq_f16_at(w) * x->d * (float)isum;
    }
    return sum;
}

/* ============================================================ 16-bit floats == */

static float cq_dot_f16(const uint16_t *w, const float *x, size_t n) {
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) sum += mk_f16_to_f32(w[i]) * x[i];
    return sum;
}

static float cq_dot_bf16(const uint16_t *w, const float *x, size_t n) {
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) sum += mk_bf16_to_f32(w[i]) * x[i];
    return sum;
}

/* =============================================================== dispatch == */

static const mk_cpu_quant cq_portable = {
    .name = "portable",
    .quantize_row = cq_quantize_row,
    .quantize_row_k = cq_quantize_row_k,
    .dot_q4_0 = cq_dot_q4_0,
    .dot_q4_1 = cq_dot_q4_1,
    .dot_q5_0 = cq_dot_q5_0,
    .dot_q5_1 = cq_dot_q5_1,
    .dot_q8_0 = cq_dot_q8_0,
    .dot_q2_k = cq_dot_q2_k,
    .dot_q3_k = cq_dot_q3_k,
    .dot_q4_k = cq_dot_q4_k,
    .dot_q5_k = cq_dot_q5_k,
    .dot_q6_k = cq_dot_q6_k,
    .dot_iq4_nl = cq_dot_iq4_nl,
    .dot_iq4_xs = cq_dot_iq4_xs,
    .dot_f16 = cq_dot_f16,
    .dot_bf16 = cq_dot_bf16,
};

const mk_cpu_quant *mk_cpu_quant_portable(void) { return &cq_portable; }

const mk_cpu_quant *mk_cpu_quant_best(void) {
    const char *cap = getenv("MESHKERN_CPU_KERNELS");
    if (cap && strcmp(cap, "portable") == 0) return &cq_portable;
    const mk_cpu_quant *vnni = mk_cpu_quant_vnni();
    if (vnni && !(cap && strcmp(cap, "avx2") == 0)) return vnni;
    const mk_cpu_quant *avx2 = mk_cpu_quant_avx2();
    return avx2 ? avx2 : &cq_portable;
}

mk_qdot_fn mk_cpu_quant_dot_for(const mk_cpu_quant *q, uint32_t ggml_type) {
    switch (ggml_type) {
        case MK_GGML_TYPE_Q4_0: return q->dot_q4_0;
        case MK_GGML_TYPE_Q4_1: return q->dot_q4_1;
        case MK_GGML_TYPE_Q5_0: return q->dot_q5_0;
        case MK_GGML_TYPE_Q5_1: return q->dot_q5_1;
        case MK_GGML_TYPE_Q8_0: return q->dot_q8_0;
        case MK_GGML_TYPE_IQ4_NL: return q->dot_iq4_nl;
        default: return NULL;
    }
}

mk_qdot8_fn mk_cpu_quant_dot8_for(const mk_cpu_quant *q, uint32_t ggml_type) {
    switch (ggml_type) {
        case MK_GGML_TYPE_Q4_0: return q->dot8_q4_0;
        case MK_GGML_TYPE_Q4_1: return q->dot8_q4_1;
        case MK_GGML_TYPE_Q5_0: return q->dot8_q5_0;
        case MK_GGML_TYPE_Q5_1: return q->dot8_q5_1;
        case MK_GGML_TYPE_Q8_0: return q->dot8_q8_0;
        case MK_GGML_TYPE_IQ4_NL: return q->dot8_iq4_nl;
        default: return NULL;
    }
}

mk_kdot_fn mk_cpu_quant_kdot_for(const mk_cpu_quant *q, uint32_t ggml_type) {
    switch (ggml_type) {
        case MK_GGML_TYPE_Q2_K: return q->dot_q2_k;
        case MK_GGML_TYPE_Q3_K: return q->dot_q3_k;
        case MK_GGML_TYPE_Q4_K: return q->dot_q4_k;
        case MK_GGML_TYPE_Q5_K: return q->dot_q5_k;
        case MK_GGML_TYPE_Q6_K: return q->dot_q6_k;
        case MK_GGML_TYPE_IQ4_XS: return q->dot_iq4_xs;
        default: return NULL;
    }
}

mk_kdotn_fn mk_cpu_quant_kdotn_for(const mk_cpu_quant *q, uint32_t ggml_type) {
    switch (ggml_type) {
        case MK_GGML_TYPE_Q2_K: return q->dotn_q2_k;
        case MK_GGML_TYPE_Q3_K: return q->dotn_q3_k;
        case MK_GGML_TYPE_Q4_K: return q->dotn_q4_k;
        case MK_GGML_TYPE_Q5_K: return q->dotn_q5_k;
        case MK_GGML_TYPE_Q6_K: return q->dotn_q6_k;
        case MK_GGML_TYPE_IQ4_XS: return q->dotn_iq4_xs;
        default: return NULL;
    }
}

bool mk_cpu_quant_keeps(uint32_t ggml_type) {
    switch (ggml_type) {
        case MK_GGML_TYPE_Q4_0: case MK_GGML_TYPE_Q4_1: case MK_GGML_TYPE_Q5_0: case MK_GGML_TYPE_Q5_1:
        case MK_GGML_TYPE_Q8_0: case MK_GGML_TYPE_Q2_K: case MK_GGML_TYPE_Q3_K: case MK_GGML_TYPE_Q4_K: case MK_GGML_TYPE_Q5_K:
        case MK_GGML_TYPE_Q6_K: case MK_GGML_TYPE_IQ4_NL: case MK_GGML_TYPE_IQ4_XS:
        case MK_GGML_TYPE_F16: case MK_GGML_TYPE_BF16:
            return true;
        default:
            return false;
    }
}
