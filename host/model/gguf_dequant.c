/* ggml tensor types: block layouts and dequantization to float32.
 *
 * Each quantized type stores blocks of `block_elements` values in `block_bytes` bytes;
 * the layouts are those of llama.cpp's ggml (block_q4_0, block_q6_K, ...), written here
 * from the format description. Every kernel computes exactly what the format defines in
 * float32, in the same order as the reference (ggml's C and the `gguf` Python package):
 * scale products first (d * sc), then one multiply and one add/subtract per value, so
 * results are bit-identical to the reference (FMA contraction is switched off below).
 *
 * The caller (gguf.c) has already checked that src holds n / block_elements whole
 * blocks; the kernels only read inside [src, src + n / block_elements * block_bytes). */
#include <math.h>
#include <string.h>

/* Bit-exactness needs a*b+c evaluated as two roundings: forbid FMA contraction here even
 * when the library is built for a target that has FMA (-march=native). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "core/half.h"
#include "model/gguf.h"
#include "mk_error.h"

/* ================================================================ type table == */

typedef struct mk_ggml_layout {
    uint32_t id;
    const char *name;
    uint16_t block_elements;
    uint16_t block_bytes;
    /* Byte offsets in a block of the f16 scales every value of the block is multiplied by
     * (d, and dmin / m where the format has one; -1: none), for the types the loader reads:
     * a NaN or Inf there makes the whole block NaN or Inf (mk_gguf_check_finite). */
    int16_t f16_scales[2];
} mk_ggml_layout;

#define NO_SCALES {-1, -1}
static const mk_ggml_layout mk_ggml_layouts[] = {
    {MK_GGML_TYPE_F32, "F32", 1, 4, NO_SCALES},           {MK_GGML_TYPE_F16, "F16", 1, 2, NO_SCALES},
    {MK_GGML_TYPE_Q4_0, "Q4_0", 32, 18, {0, -1}},         {MK_GGML_TYPE_Q4_1, "Q4_1", 32, 20, {0, 2}},
    {MK_GGML_TYPE_Q5_0, "Q5_0", 32, 22, {0, -1}},         {MK_GGML_TYPE_Q5_1, "Q5_1", 32, 24, {0, 2}},
    {MK_GGML_TYPE_Q8_0, "Q8_0", 32, 34, {0, -1}},         {MK_GGML_TYPE_Q8_1, "Q8_1", 32, 40, NO_SCALES},
    {MK_GGML_TYPE_Q2_K, "Q2_K", 256, 84, {80, 82}},       {MK_GGML_TYPE_Q3_K, "Q3_K", 256, 110, {108, -1}},
    {MK_GGML_TYPE_Q4_K, "Q4_K", 256, 144, {0, 2}},        {MK_GGML_TYPE_Q5_K, "Q5_K", 256, 176, {0, 2}},
    {MK_GGML_TYPE_Q6_K, "Q6_K", 256, 210, {208, -1}},     {MK_GGML_TYPE_Q8_K, "Q8_K", 256, 292, NO_SCALES},
    {MK_GGML_TYPE_IQ2_XXS, "IQ2_XXS", 256, 66, NO_SCALES}, {MK_GGML_TYPE_IQ2_XS, "IQ2_XS", 256, 74, NO_SCALES},
    {MK_GGML_TYPE_IQ3_XXS, "IQ3_XXS", 256, 98, NO_SCALES}, {MK_GGML_TYPE_IQ1_S, "IQ1_S", 256, 50, NO_SCALES},
    {MK_GGML_TYPE_IQ4_NL, "IQ4_NL", 32, 18, {0, -1}},   {MK_GGML_TYPE_IQ3_S, "IQ3_S", 256, 110, NO_SCALES},
    {MK_GGML_TYPE_IQ2_S, "IQ2_S", 256, 82, NO_SCALES},    {MK_GGML_TYPE_IQ4_XS, "IQ4_XS", 256, 136, {0, -1}},
    {MK_GGML_TYPE_I8, "I8", 1, 1, NO_SCALES},             {MK_GGML_TYPE_I16, "I16", 1, 2, NO_SCALES},
    {MK_GGML_TYPE_I32, "I32", 1, 4, NO_SCALES},           {MK_GGML_TYPE_I64, "I64", 1, 8, NO_SCALES},
    {MK_GGML_TYPE_F64, "F64", 1, 8, NO_SCALES},           {MK_GGML_TYPE_IQ1_M, "IQ1_M", 256, 56, NO_SCALES},
    {MK_GGML_TYPE_BF16, "BF16", 1, 2, NO_SCALES},         {MK_GGML_TYPE_TQ1_0, "TQ1_0", 256, 54, NO_SCALES},
    {MK_GGML_TYPE_TQ2_0, "TQ2_0", 256, 66, NO_SCALES},    {MK_GGML_TYPE_MXFP4, "MXFP4", 32, 17, NO_SCALES},
};
#undef NO_SCALES

static const mk_ggml_layout *mk_ggml_find_layout(uint32_t type) {
    for (size_t i = 0; i < sizeof mk_ggml_layouts / sizeof mk_ggml_layouts[0]; i++)
        if (mk_ggml_layouts[i].id == type) return &mk_ggml_layouts[i];
    return NULL;
}

const char *mk_ggml_type_name(uint32_t type) {
    const mk_ggml_layout *l = mk_ggml_find_layout(type);
    return l ? l->name : NULL;
}

bool mk_ggml_type_layout(uint32_t type, size_t *block_elements, size_t *block_bytes) {
    const mk_ggml_layout *l = mk_ggml_find_layout(type);
    if (!l) return false;
    if (block_elements) *block_elements = l->block_elements;
    if (block_bytes) *block_bytes = l->block_bytes;
    return true;
}

bool mk_ggml_type_f16_scales(uint32_t type, int offsets[2]) {
    const mk_ggml_layout *l = mk_ggml_find_layout(type);
    if (!l || l->f16_scales[0] < 0) return false;
    offsets[0] = l->f16_scales[0];
    offsets[1] = l->f16_scales[1];
    return true;
}

bool mk_ggml_type_can_dequantize(uint32_t type) {
    switch (type) {
    case MK_GGML_TYPE_F32: case MK_GGML_TYPE_F16: case MK_GGML_TYPE_BF16:
    case MK_GGML_TYPE_Q4_0: case MK_GGML_TYPE_Q4_1: case MK_GGML_TYPE_Q5_0:
    case MK_GGML_TYPE_Q5_1: case MK_GGML_TYPE_Q8_0: case MK_GGML_TYPE_Q2_K:
    case MK_GGML_TYPE_Q3_K: case MK_GGML_TYPE_Q4_K: case MK_GGML_TYPE_Q5_K:
    case MK_GGML_TYPE_Q6_K: case MK_GGML_TYPE_IQ4_NL: case MK_GGML_TYPE_IQ4_XS:
        return true;
    default:
        return false;
    }
}

/* ========================================================= scalar conversions == */


static uint16_t gq_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static float gq_f16_at(const uint8_t *p) { return mk_f16_to_f32(gq_u16(p)); }

/* ============================================================ 32-wide blocks == */

static void dq_q4_0(const uint8_t *b, float *y) { /* d f16, qs[16] */
    const float d = gq_f16_at(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((int)(qs[j] & 0x0f) - 8);
        y[j + 16] = d * (float)((int)(qs[j] >> 4) - 8);
    }
}

static void dq_q4_1(const uint8_t *b, float *y) { /* d f16, m f16, qs[16] */
    const float d = gq_f16_at(b), m = gq_f16_at(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(qs[j] & 0x0f) + m;
        y[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

static uint32_t gq_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void dq_q5_0(const uint8_t *b, float *y) { /* d f16, qh u32, qs[16] */
    const float d = gq_f16_at(b);
    const uint32_t qh = gq_u32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int lo = (int)((qs[j] & 0x0f) | (((qh >> j) & 1u) << 4));
        int hi = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
        y[j] = d * (float)(lo - 16);
        y[j + 16] = d * (float)(hi - 16);
    }
}

static void dq_q5_1(const uint8_t *b, float *y) { /* d f16, m f16, qh u32, qs[16] */
    const float d = gq_f16_at(b), m = gq_f16_at(b + 2);
    const uint32_t qh = gq_u32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        unsigned lo = (qs[j] & 0x0fu) | (((qh >> j) & 1u) << 4);
        unsigned hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4);
        y[j] = d * (float)lo + m;
        y[j + 16] = d * (float)hi + m;
    }
}

static void dq_q8_0(const uint8_t *b, float *y) { /* d f16, qs[32] int8 */
    const float d = gq_f16_at(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

/* ============================================================= K-quants (256) == */

static void dq_q2_k(const uint8_t *b, float *y) { /* scales[16], qs[64], d, dmin */
    const uint8_t *scales = b, *qs = b + 16;
    const float d = gq_f16_at(b + 80), dmin = gq_f16_at(b + 82);
    for (int i = 0; i < 256; i++) {
        int half = i / 128, shift = (i % 128) / 32, l = i % 32;
        uint8_t sc = scales[i / 16];
        const float dl = d * (float)(sc & 0x0f), ml = dmin * (float)(sc >> 4);
        y[i] = dl * (float)((qs[half * 32 + l] >> (2 * shift)) & 3) - ml;
    }
}

static void dq_q3_k(const uint8_t *b, float *y) { /* hmask[32], qs[64], scales[12], d */
    const uint8_t *hmask = b, *qs = b + 32, *s = b + 96;
    const float d = gq_f16_at(b + 108);
    int8_t scale[16];
    mk_k3_scales(s, scale);
    for (int i = 0; i < 256; i++) {
        int half = i / 128, shift = (i % 128) / 32, l = i % 32;
        int q = (qs[half * 32 + l] >> (2 * shift)) & 3;
        int hbit = (hmask[l] >> (i / 32)) & 1;
        q -= hbit ? 0 : 4; /* the high bit clear means "subtract 4" */
        const float dl = d * (float)scale[i / 16];
        y[i] = dl * (float)q;
    }
}

static void dq_q4_k(const uint8_t *b, float *y) { /* d, dmin, scales[12], qs[128] */
    const float d = gq_f16_at(b), dmin = gq_f16_at(b + 2);
    const uint8_t *qs = b + 16;
    uint8_t sc[8], mn[8];
    mk_k4_scales_mins(b + 4, sc, mn);
    for (int j = 0; j < 4; j++) {
        const float d1 = d * (float)sc[2 * j], m1 = dmin * (float)mn[2 * j];
        const float d2 = d * (float)sc[2 * j + 1], m2 = dmin * (float)mn[2 * j + 1];
        for (int l = 0; l < 32; l++) {
            y[64 * j + l] = d1 * (float)(qs[32 * j + l] & 0x0f) - m1;
            y[64 * j + 32 + l] = d2 * (float)(qs[32 * j + l] >> 4) - m2;
        }
    }
}

static void dq_q5_k(const uint8_t *b, float *y) { /* d, dmin, scales[12], qh[32], qs[128] */
    const float d = gq_f16_at(b), dmin = gq_f16_at(b + 2);
    const uint8_t *qh = b + 16, *qs = b + 48;
    uint8_t sc[8], mn[8];
    mk_k4_scales_mins(b + 4, sc, mn);
    for (int j = 0; j < 4; j++) {
        const float d1 = d * (float)sc[2 * j], m1 = dmin * (float)mn[2 * j];
        const float d2 = d * (float)sc[2 * j + 1], m2 = dmin * (float)mn[2 * j + 1];
        for (int l = 0; l < 32; l++) {
            unsigned lo = (qs[32 * j + l] & 0x0fu) | (((qh[l] >> (2 * j)) & 1u) << 4);
            unsigned hi = (unsigned)(qs[32 * j + l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1u) << 4);
            y[64 * j + l] = d1 * (float)lo - m1;
            y[64 * j + 32 + l] = d2 * (float)hi - m2;
        }
    }
}

static void dq_q6_k(const uint8_t *b, float *y) { /* ql[128], qh[64], scales[16] i8, d */
    const float d = gq_f16_at(b + 208);
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * n);
        float *yy = y + 128 * n;
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int)((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = (int)((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            yy[l] = (d * (float)sc[is + 0]) * (float)q1;
            yy[l + 32] = (d * (float)sc[is + 2]) * (float)q2;
            yy[l + 64] = (d * (float)sc[is + 4]) * (float)q3;
            yy[l + 96] = (d * (float)sc[is + 6]) * (float)q4;
        }
    }
}

/* ============================================== non-uniform 4-bit (IQ4) == */

static void dq_iq4_nl(const uint8_t *b, float *y) { /* d f16, qs[16]: indices into mk_iq4_values */
    const float d = gq_f16_at(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)mk_iq4_values[qs[j] & 0x0f];
        y[j + 16] = d * (float)mk_iq4_values[qs[j] >> 4];
    }
}

static void dq_iq4_xs(const uint8_t *b, float *y) { /* d f16, scales_h u16, scales_l[4], qs[128] */
    const float d = gq_f16_at(b);
    for (int ib = 0; ib < 8; ib++) {
        const float dl = d * (float)mk_iq4xs_scale(b, ib);
        const uint8_t *qs = b + 8 + 16 * ib;
        for (int j = 0; j < 16; j++) {
            y[32 * ib + j] = dl * (float)mk_iq4_values[qs[j] & 0x0f];
            y[32 * ib + j + 16] = dl * (float)mk_iq4_values[qs[j] >> 4];
        }
    }
}

/* =========================================================== finite values == */

/* Exponent bits all set: NaN or Inf in each encoding. */
static bool gq_f32_nonfinite(const uint8_t *p) {
    uint32_t u;
    memcpy(&u, p, sizeof u);
    return (u & 0x7f800000u) == 0x7f800000u;
}
static bool gq_f16_nonfinite(const uint8_t *p) { return (gq_u16(p) & 0x7c00u) == 0x7c00u; }
static bool gq_bf16_nonfinite(const uint8_t *p) { return (gq_u16(p) & 0x7f80u) == 0x7f80u; }

mk_status mk_gguf_check_finite(uint32_t type, const void *src, size_t src_bytes) {
    const mk_ggml_layout *l = mk_ggml_find_layout(type);
    if (!l || !mk_ggml_type_can_dequantize(type)) return MK_OK; /* not loadable: refused elsewhere */
    if (src_bytes && !src) return mk_fail(MK_ERR_INVALID_ARGUMENT, "check finite: NULL buffer");
    const uint8_t *s = src;
    const size_t bb = l->block_bytes, n_blocks = src_bytes / bb;
    size_t bad = SIZE_MAX; /* one plain loop per encoding: gigabytes of F16 pass at memory speed */
    switch (type) {
    case MK_GGML_TYPE_F32:
        for (size_t i = 0; i < n_blocks && bad == SIZE_MAX; i++)
            if (gq_f32_nonfinite(s + 4 * i)) bad = i;
        break;
    case MK_GGML_TYPE_F16:
        for (size_t i = 0; i < n_blocks && bad == SIZE_MAX; i++)
            if (gq_f16_nonfinite(s + 2 * i)) bad = i;
        break;
    case MK_GGML_TYPE_BF16:
        for (size_t i = 0; i < n_blocks && bad == SIZE_MAX; i++)
            if (gq_bf16_nonfinite(s + 2 * i)) bad = i;
        break;
    default:
        break;
    }
    if (bad != SIZE_MAX) return mk_fail(MK_ERR_NONFINITE, "%s value %zu is NaN or infinite", l->name, bad);
    if (l->block_elements == 1) return MK_OK;
    for (size_t b = 0; b < n_blocks; b++)
        for (int k = 0; k < 2; k++)
            if (l->f16_scales[k] >= 0 && gq_f16_nonfinite(s + b * bb + l->f16_scales[k]))
                return mk_fail(MK_ERR_NONFINITE, "%s block %zu (values %zu-%zu) has a NaN or infinite scale", l->name, b,
                               b * l->block_elements, (b + 1) * l->block_elements - 1);
    return MK_OK;
}

/* =================================================================== driver == */

typedef void (*gq_block_fn)(const uint8_t *block, float *out);

mk_status mk_gguf_dequantize(uint32_t type, const void *src, size_t src_bytes, float *out,
                             size_t n) {
    size_t be, bb;
    if (!mk_ggml_type_layout(type, &be, &bb))
        return mk_fail(MK_ERR_GGUF_TENSOR_TYPE, "unknown ggml tensor type %u", type);
    if (!mk_ggml_type_can_dequantize(type))
        return mk_fail(MK_ERR_GGUF_TENSOR_TYPE,
                       "ggml tensor type %s (%u) is not supported for dequantization",
                       mk_ggml_type_name(type), type);
    if ((!src || !out) && n > 0)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "dequantize: NULL buffer");
    if (n % be != 0)
        return mk_fail(MK_ERR_GGUF_DIMS, "dequantize %s: %zu elements is not a multiple of the block size %zu",
                       mk_ggml_type_name(type), n, be);
    const size_t n_blocks = n / be;
    if (n_blocks > SIZE_MAX / bb || n_blocks * bb != src_bytes)
        return mk_fail(MK_ERR_GGUF_DATA_BOUNDS, "dequantize %s: %zu elements need %zu bytes, got %zu",
                       mk_ggml_type_name(type), n, n_blocks > SIZE_MAX / bb ? SIZE_MAX : n_blocks * bb,
                       src_bytes);
    const uint8_t *s = (const uint8_t *)src;
    switch (type) {
    case MK_GGML_TYPE_F32:
        if (n) memcpy(out, s, n * sizeof(float));
        return MK_OK;
    case MK_GGML_TYPE_F16:
        for (size_t i = 0; i < n; i++) out[i] = mk_f16_to_f32(gq_u16(s + 2 * i));
        return MK_OK;
    case MK_GGML_TYPE_BF16:
        for (size_t i = 0; i < n; i++) out[i] = mk_bf16_to_f32(gq_u16(s + 2 * i));
        return MK_OK;
    default:
        break;
    }
    gq_block_fn fn = NULL;
    switch (type) {
    case MK_GGML_TYPE_Q4_0: fn = dq_q4_0; break;
    case MK_GGML_TYPE_Q4_1: fn = dq_q4_1; break;
    case MK_GGML_TYPE_Q5_0: fn = dq_q5_0; break;
    case MK_GGML_TYPE_Q5_1: fn = dq_q5_1; break;
    case MK_GGML_TYPE_Q8_0: fn = dq_q8_0; break;
    case MK_GGML_TYPE_Q2_K: fn = dq_q2_k; break;
    case MK_GGML_TYPE_Q3_K: fn = dq_q3_k; break;
    case MK_GGML_TYPE_Q4_K: fn = dq_q4_k; break;
    case MK_GGML_TYPE_Q5_K: fn = dq_q5_k; break;
    case MK_GGML_TYPE_Q6_K: fn = dq_q6_k; break;
    case MK_GGML_TYPE_IQ4_NL: fn = dq_iq4_nl; break;
    case MK_GGML_TYPE_IQ4_XS: fn = dq_iq4_xs; break;
    default:
        return mk_fail(MK_ERR_INTERNAL, "no dequantizer for type %u", type);
    }
    for (size_t i = 0; i < n_blocks; i++) fn(s + i * bb, out + i * be);
    return MK_OK;
}
