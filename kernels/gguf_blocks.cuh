/* gguf_blocks.cuh - the GGUF block formats the device reads in place (Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0, IQ4_NL in blocks of 32; Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS in super-blocks
 * of 256): layout
 * constants and the dequantization of one part of a block, shared by the decode GEMV
 * (gemv_q.cu) and the dequantizer (dequant_q.cu) so both produce the same values.
 *
 *   Q4_0  18 bytes / 32 values: d f16, qs[16] (j low nibble, j+16 high)  y = d * (q - 8)
 *   Q4_1  20 bytes / 32 values: d f16, m f16, qs[16]                     y = d*q + m
 *   Q5_0  22 bytes / 32 values: d f16, qh u32 (bit j: value j's fifth bit), qs[16]
 *                                                                        y = d * (q - 16)
 *   Q5_1  24 bytes / 32 values: d f16, m f16, qh u32, qs[16]             y = d*q + m
 *   Q8_0  34 bytes / 32 values: d f16, qs int8[32]                       y = qs[j] * d
 *   Q2_K  84 bytes / 256 values: scales[16] (scale | min << 4 per 16 values), qs[64], d f16,
 *        dmin f16: value 128h+32j+l is bits 2j..2j+1 of qs[32h+l] (0..3), times d * scale,
 *        less dmin * min (of group 8h+2j+l/16)
 *   Q3_K 110 bytes / 256 values: hmask[32], qs[64], scales[12] (16 signed 6-bit scales),
 *        d f16: value 128h+32j+l is bits 2j..2j+1 of qs[32h+l], less 4 where bit 4h+j of
 *        hmask[l] is clear, times d * scale[8h+2j+l/16]
 *   Q4_K 144 bytes / 256 values: d f16, dmin f16, scales[12] (6-bit sc/mn of 8 groups of
 *        32), qs[128]: byte 32g+l holds value 64g+l (low) and 64g+32+l (high).
 *   Q5_K 176 bytes / 256 values: Q4_K with qh[32] before qs: bit 2g (2g+1) of qh[l] is the
 *        fifth bit of value 64g+l (64g+32+l).
 *   Q6_K 210 bytes / 256 values: ql[128], qh[64], scales int8[16], d f16: in half h, value
 *        l (< 32) of quarter s takes ql[64h+l] (s 0, 2: low nibble; 1, 3: ql[64h+32+l]...),
 *        two bits of qh[32h+l], less 32, times d * scale[8h+l/16+2s] (gguf_dequant.c).
 *   IQ4_NL 18 bytes / 32 values: Q4_0's layout, each nibble q an index: y = d * v[q], v the
 *        16 non-uniform values (host/model/gguf.h mk_iq4_values)
 *   IQ4_XS 136 bytes / 256 values: d f16, scales_h u16, scales_l[4], qs[128]: sub-block ib
 *        (32 values) has the signed scale (nibble ib of scales_l | bits 2ib of scales_h << 4)
 *        - 32 and its 16 bytes at 8 + 16 ib as IQ4_NL's: y = (d * scale) * v[q]
 * Each weight is dequantized as the format defines it (the reference's operand order:
 * host/model/gguf_dequant.c). Formats whose blocks sit at 2-byte offsets only (Q4_0, Q5_0,
 * Q3_K, Q6_K) are read in 16-bit words. */
#ifndef MK_GGUF_BLOCKS_CUH
#define MK_GGUF_BLOCKS_CUH

#include "mk_kernels_common.cuh"

/* ggml's type ids (the values stored in GGUF files, host/gguf.h mk_ggml_type). */
enum {
  GGML_Q4_0 = 2,
  GGML_Q4_1 = 3,
  GGML_Q5_0 = 6,
  GGML_Q5_1 = 7,
  GGML_Q8_0 = 8,
  GGML_Q2_K = 10,
  GGML_Q3_K = 11,
  GGML_Q4_K = 12,
  GGML_Q5_K = 13,
  GGML_Q6_K = 14,
  GGML_IQ4_NL = 20,
  GGML_IQ4_XS = 23,
  GGML_BF16 = 30
};

/* The block formats the device reads: the one list every dispatch is made from
 * (X(type id) per format). */
#define MK_GEMVQ_FORMATS(X) X(GGML_Q4_0) X(GGML_Q4_1) X(GGML_Q5_0) X(GGML_Q5_1) X(GGML_Q8_0) \
  X(GGML_Q2_K) X(GGML_Q3_K) X(GGML_Q4_K) X(GGML_Q5_K) X(GGML_Q6_K) X(GGML_IQ4_NL) X(GGML_IQ4_XS)

static __device__ __forceinline__ float gemvq_f16(const uint8_t *p) {
  return mk_dev_f16_to_f32(*reinterpret_cast<const uint16_t *>(p));
}

/* Four bytes at a 2-byte aligned p, little-endian, as two 16-bit loads. */
static __device__ __forceinline__ uint32_t gemvq_u32_a2(const uint8_t *p) {
  const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
  return (uint32_t)__ldg(h) | ((uint32_t)__ldg(h + 1) << 16);
}

/* Byte i (0..7) of the eight bytes q.x (0..3), q.y (4..7). */
static __device__ __forceinline__ uint32_t gemvq_byte8(uint2 q, int i) {
  return ((i < 4 ? q.x : q.y) >> (8 * (i & 3))) & 0xffu;
}

/* Eight bytes at a 2-byte aligned p. */
static __device__ __forceinline__ uint2 gemvq_u64_a2(const uint8_t *p) {
  return make_uint2(gemvq_u32_a2(p), gemvq_u32_a2(p + 4));
}

/* Each format: BE values and BB bytes per block, PARTS parts of two runs of H contiguous
 * values (wa at column ka of the block, wb at kb). */
template <int T>
struct gemvq_fmt;

template <>
struct gemvq_fmt<GGML_Q8_0> {
  enum { BE = 32, BB = 34, PARTS = 4, H = 4, ALIGN = 2 };
  static __device__ __forceinline__ void part(const uint8_t *blk, int p, float *wa, float *wb, int &ka, int &kb) {
    const float d = gemvq_f16(blk);
    const uint16_t *q16 = reinterpret_cast<const uint16_t *>(blk + 2 + 8 * p);
    MK_UNROLL
    for (int i = 0; i < 2; i++) {
      const uint16_t a = __ldg(q16 + i), b = __ldg(q16 + 2 + i);
      wa[2 * i] = (float)(int8_t)(a & 0xffu) * d;
      wa[2 * i + 1] = (float)(int8_t)(a >> 8) * d;
      wb[2 * i] = (float)(int8_t)(b & 0xffu) * d;
      wb[2 * i + 1] = (float)(int8_t)(b >> 8) * d;
    }
    ka = 8 * p;
    kb = 8 * p + 4;
  }
};

/* The blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL): part p holds values 4p..4p+3 (the low
 * nibbles of qs bytes 4p..4p+3: q, little-endian) and 4p+16.. (their high nibbles), Q5's
 * with the fifth bit of value j from bit j of qh (0 for the others); F::weight(u, d, m)
 * turns the unsigned 4- or 5-bit u into the format's weight. */
template <class F>
static __device__ __forceinline__ void gemvq_part32(float d, float m, uint32_t q, uint32_t qh, int p, float *wa,
                                                    float *wb, int &ka, int &kb) {
  MK_UNROLL
  for (int i = 0; i < 4; i++) {
    const uint32_t byte = (q >> (8 * i)) & 0xffu;
    wa[i] = F::weight((byte & 0x0fu) | (((qh >> (4 * p + i)) & 1u) << 4), d, m);
    wb[i] = F::weight((byte >> 4) | (((qh >> (4 * p + i + 16)) & 1u) << 4), d, m);
  }
  ka = 4 * p;
  kb = 4 * p + 16;
}

template <>
struct gemvq_fmt<GGML_Q4_0> {
  enum { BE = 32, BB = 18, PARTS = 4, H = 4, ALIGN = 2 };
  static __device__ __forceinline__ float weight(uint32_t u, float d, float) { return d * (float)((int)u - 8); }
  static __device__ __forceinline__ void part(const uint8_t *blk, int p, float *wa, float *wb, int &ka, int &kb) {
    gemvq_part32<gemvq_fmt>(gemvq_f16(blk), 0.0f, gemvq_u32_a2(blk + 2 + 4 * p), 0u, p, wa, wb, ka, kb);
  }
};

template <>
struct gemvq_fmt<GGML_Q4_1> {
  enum { BE = 32, BB = 20, PARTS = 4, H = 4, ALIGN = 4 };
  static __device__ __forceinline__ float weight(uint32_t u, float d, float m) { return d * (float)u + m; }
  static __device__ __forceinline__ void part(const uint8_t *blk, int p, float *wa, float *wb, int &ka, int &kb) {
    gemvq_part32<gemvq_fmt>(gemvq_f16(blk), gemvq_f16(blk + 2), __ldg(reinterpret_cast<const uint32_t *>(blk + 4 + 4 * p)),
                            0u, p, wa, wb, ka, kb);
  }
};

template <>
struct gemvq_fmt<GGML_Q5_0> {
  enum { BE = 32, BB = 22, PARTS = 4, H = 4, ALIGN = 2 };
  static __device__ __forceinline__ float weight(uint32_t u, float d, float) { return d * (float)((int)u - 16); }
  static __device__ __forceinline__ void part(const uint8_t *blk, int p, float *wa, float *wb, int &ka, int &kb) {
    gemvq_part32<gemvq_fmt>(gemvq_f16(blk), 0.0f, gemvq_u32_a2(blk + 6 + 4 * p), gemvq_u32_a2(blk + 2), p, wa, wb, ka,
                            kb);
  }
};

template <>
struct gemvq_fmt<GGML_Q5_1> {
  enum { BE = 32, BB = 24, PARTS = 4, H = 4, ALIGN = 4 };
  static __device__ __forceinline__ float weight(uint32_t u, float d, float m) {
    return gemvq_fmt<GGML_Q4_1>::weight(u, d, m);
  }
  static __device__ __forceinline__ void part(const uint8_t *blk, int p, float *wa, float *wb, int &ka, int &kb) {
    gemvq_part32<gemvq_fmt>(gemvq_f16(blk), gemvq_f16(blk + 2), __ldg(reinterpret_cast<const uint32_t *>(blk + 8 + 4 * p)),
                            __ldg(reinterpret_cast<const uint32_t *>(blk + 4)), p, wa, wb, ka, kb);
  }
};

/* The 6-bit scale and min of group g (0..7) from Q4_K's and Q5_K's 12 packed bytes. */
static __device__ __forceinline__ void gemvq_k4_scale_min(int g, const uint8_t *s, int &sc, int &mn) {
  if (g < 4) {
    sc = s[g] & 63;
    mn = s[g + 4] & 63;
  } else {
    sc = (s[g + 4] & 0x0f) | ((s[g - 4] >> 6) << 4);
    mn = (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
  }
}

/* A part of a Q4_K (FIVE false) or Q5_K super-block: group pair g = p / 4, eight bytes of
 * nibbles from l0 = 8 (p % 4): values 64g+l0.. (low nibbles) and 64g+32+l0.. (high). */
template <bool FIVE>
static __device__ __forceinline__ void gemvq_k45_part(const uint8_t *blk, int p, float *wa, float *wb, int &ka,
                                                      int &kb) {
  const float d = gemvq_f16(blk), dmin = gemvq_f16(blk + 2);
  const int g = p >> 2, l0 = (p & 3) * 8;
  int sc, mn;
  gemvq_k4_scale_min(2 * g, blk + 4, sc, mn);
  const float d1 = d * (float)sc, m1 = dmin * (float)mn;
  gemvq_k4_scale_min(2 * g + 1, blk + 4, sc, mn);
  const float d2 = d * (float)sc, m2 = dmin * (float)mn;
  const uint2 q = __ldg(reinterpret_cast<const uint2 *>(blk + (FIVE ? 48 : 16) + 32 * g + l0));
  const uint2 qh = FIVE ? __ldg(reinterpret_cast<const uint2 *>(blk + 16 + l0)) : make_uint2(0, 0);
  MK_UNROLL
  for (int i = 0; i < 8; i++) {
    const uint32_t byte = gemvq_byte8(q, i), h = gemvq_byte8(qh, i);
    const uint32_t lo = (byte & 0x0fu) | (((h >> (2 * g)) & 1u) << 4);
    const uint32_t hi = (byte >> 4) | (((h >> (2 * g + 1)) & 1u) << 4);
    wa[i] = d1 * (float)lo - m1;
    wb[i] = d2 * (float)hi - m2;
  }
  ka = 64 * g + l0;
  kb = 64 * g + 32 + l0;
}

template <>
struct gemvq_fmt<GGML_Q4_K> {
  enum { BE = 256, BB = 144, PARTS = 16, H = 8, ALIGN = 8 };
  static __device__ __forceinline__ void part(const uint8_t *blk, int p, float *wa, float *wb, int &ka, int &kb) {
    gemvq_k45_part<false>(blk, p, wa, wb, ka, kb);
  }
};

template <>
struct gemvq_fmt<GGML_Q5_K> {
  enum { BE = 256, BB = 176, PARTS = 16, H = 8, ALIGN = 8 };
  static __device__ __forceinline__ void part(const uint8_t *blk, int p, float *wa, float *wb, int &ka, int &kb) {
    gemvq_k45_part<true>(blk, p, wa, wb, ka, kb);
  }
};

/* Q3_K's signed scale k (0..15) from its 12 packed bytes: the low four bits from byte k
 * (k < 8) or the high nibble of byte k - 8, the top two from byte 8 + k % 4 at bit 2 (k / 4);
 * less 32 (host/model/gguf.h mk_k3_scales). */
static __device__ __forceinline__ int gemvq_k3_scale(const uint8_t *s, int k) {
  const int lo = k < 8 ? (s[k] & 0x0f) : (s[k - 8] >> 4);
  const int hi = (s[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
  return (lo | (hi << 4)) - 32;
}

/* The part index of the formats stored as 2-bit planes (Q2_K, Q3_K): part p takes half
 * h = p / 8, the shift pair j = 2 (p / 4 % 2) and j + 1, and eight bytes of each plane from
 * l0 = 8 (p % 4): run a is values 128h+32j+l0.. (group g of 16), run b the values 32 further
 * on (group g + 2). */
struct gemvq_planes {
  int h, j, l0, g;
};
static __device__ __forceinline__ gemvq_planes gemvq_planes_of(int p, int &ka, int &kb) {
  gemvq_planes x;
  x.h = p >> 3;
  x.j = ((p >> 2) & 1) * 2;
  x.l0 = (p & 3) * 8;
  x.g = 8 * x.h + 2 * x.j + (x.l0 >> 4);
  ka = 128 * x.h + 32 * x.j + x.l0;
  kb = ka + 32;
  return x;
}

/* Q3_K: the 2-bit planes in qs, the third bits in hmask (same bytes), a scale per group. */
template <>
struct gemvq_fmt<GGML_Q3_K> {
  enum { BE = 256, BB = 110, PARTS = 16, H = 8, ALIGN = 2 };
  static __device__ __forceinline__ void part(const uint8_t *blk, int p, float *wa, float *wb, int &ka, int &kb) {
    const float d = gemvq_f16(blk + 108);
    const gemvq_planes at = gemvq_planes_of(p, ka, kb);
    const int h = at.h, j = at.j, l0 = at.l0, k = at.g; /* run a's scale; run b's is k + 2 */
    const float da = d * (float)gemvq_k3_scale(blk + 96, k), db = d * (float)gemvq_k3_scale(blk + 96, k + 2);
    const uint2 q = gemvq_u64_a2(blk + 32 + 32 * h + l0), hm = gemvq_u64_a2(blk + l0);
    MK_UNROLL
    for (int i = 0; i < 8; i++) {
      const uint32_t byte = gemvq_byte8(q, i), m = gemvq_byte8(hm, i);
      const int qa = (int)((byte >> (2 * j)) & 3u) - (((m >> (4 * h + j)) & 1u) ? 0 : 4);
      const int qb = (int)((byte >> (2 * j + 2)) & 3u) - (((m >> (4 * h + j + 1)) & 1u) ? 0 : 4);
      wa[i] = da * (float)qa;
      wb[i] = db * (float)qb;
    }
  }
};

/* Q2_K: the 2-bit planes in qs, each run with its group's scale and min. */
template <>
struct gemvq_fmt<GGML_Q2_K> {
  enum { BE = 256, BB = 84, PARTS = 16, H = 8, ALIGN = 4 };
  static __device__ __forceinline__ void part(const uint8_t *blk, int p, float *wa, float *wb, int &ka, int &kb) {
    const float d = gemvq_f16(blk + 80), dmin = gemvq_f16(blk + 82);
    const gemvq_planes at = gemvq_planes_of(p, ka, kb);
    const int h = at.h, j = at.j, l0 = at.l0, g = at.g; /* run a's group of 16; run b's is g + 2 */
    const float da = d * (float)(blk[g] & 0x0f), ma = dmin * (float)(blk[g] >> 4);
    const float db = d * (float)(blk[g + 2] & 0x0f), mb = dmin * (float)(blk[g + 2] >> 4);
    const uint32_t *q32 = reinterpret_cast<const uint32_t *>(blk + 16 + 32 * h + l0);
    const uint2 q = make_uint2(__ldg(q32), __ldg(q32 + 1));
    MK_UNROLL
    for (int i = 0; i < 8; i++) {
      const uint32_t byte = gemvq_byte8(q, i);
      wa[i] = da * (float)((byte >> (2 * j)) & 3u) - ma;
      wb[i] = db * (float)((byte >> (2 * j + 2)) & 3u) - mb;
    }
  }
};

/* Q6_K: part p takes half h = p / 8, quarter pair s = p / 4 % 2 (quarters s and s + 2: the
 * low and high nibbles of ql[64h+32s+l]) and eight bytes from l0 = 8 (p % 4). */
template <>
struct gemvq_fmt<GGML_Q6_K> {
  enum { BE = 256, BB = 210, PARTS = 16, H = 8, ALIGN = 2 };
  static __device__ __forceinline__ void part(const uint8_t *blk, int p, float *wa, float *wb, int &ka, int &kb) {
    const float d = gemvq_f16(blk + 208);
    const int h = p >> 3, s = (p >> 2) & 1, l0 = (p & 3) * 8;
    const int8_t *sc = reinterpret_cast<const int8_t *>(blk + 192 + 8 * h) + (l0 >> 4) + 2 * s;
    const float da = d * (float)sc[0], db = d * (float)sc[4];
    const uint2 ql = gemvq_u64_a2(blk + 64 * h + 32 * s + l0), qh = gemvq_u64_a2(blk + 128 + 32 * h + l0);
    MK_UNROLL
    for (int i = 0; i < 8; i++) {
      const uint32_t byte = gemvq_byte8(ql, i), hb = gemvq_byte8(qh, i);
      const int qa = (int)((byte & 0x0fu) | (((hb >> (2 * s)) & 3u) << 4)) - 32;
      const int qb = (int)((byte >> 4) | (((hb >> (2 * s + 4)) & 3u) << 4)) - 32;
      wa[i] = da * (float)qa;
      wb[i] = db * (float)qb;
    }
    ka = 128 * h + 32 * s + l0;
    kb = ka + 64;
  }
};

/* IQ4's value of index q (0..15): the 16 signed bytes packed in two words (mk_iq4_values). */
static __device__ __forceinline__ float gemvq_iq4(uint32_t q) {
  const uint64_t t = q < 8 ? 0xf6eaddcfbfad9881ull : 0x7159453526190d01ull;
  return (float)(int8_t)(uint8_t)(t >> (8 * (q & 7u)));
}

template <>
struct gemvq_fmt<GGML_IQ4_NL> {
  enum { BE = 32, BB = 18, PARTS = 4, H = 4, ALIGN = 2 };
  static __device__ __forceinline__ float weight(uint32_t u, float d, float) { return d * gemvq_iq4(u); }
  static __device__ __forceinline__ void part(const uint8_t *blk, int p, float *wa, float *wb, int &ka, int &kb) {
    gemvq_part32<gemvq_fmt>(gemvq_f16(blk), 0.0f, gemvq_u32_a2(blk + 2 + 4 * p), 0u, p, wa, wb, ka, kb);
  }
};

/* IQ4_XS: part p takes half p % 2 of sub-block ib = p / 2: its eight bytes from 8 + 16 ib +
 * 8 (p % 2), values 32ib+8(p%2).. (low nibbles) and 16 further on (high). */
template <>
struct gemvq_fmt<GGML_IQ4_XS> {
  enum { BE = 256, BB = 136, PARTS = 16, H = 8, ALIGN = 8 };
  static __device__ __forceinline__ void part(const uint8_t *blk, int p, float *wa, float *wb, int &ka, int &kb) {
    const int ib = p >> 1, half = p & 1;
    const uint32_t h = (uint32_t)blk[2] | (uint32_t)blk[3] << 8;
    const int scale = (int)(((uint32_t)(blk[4 + (ib >> 1)] >> (4 * (ib & 1))) & 0x0fu) | ((h >> (2 * ib)) & 3u) << 4) - 32;
    const float dl = gemvq_f16(blk) * (float)scale;
    const uint2 q = __ldg(reinterpret_cast<const uint2 *>(blk + 8 + 16 * ib + 8 * half));
    MK_UNROLL
    for (int i = 0; i < 8; i++) {
      const uint32_t byte = gemvq_byte8(q, i);
      wa[i] = dl * gemvq_iq4(byte & 0x0fu);
      wb[i] = dl * gemvq_iq4(byte >> 4);
    }
    ka = 32 * ib + 8 * half;
    kb = ka + 16;
  }
};

#endif
