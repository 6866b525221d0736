/* gguf_blocks.cuh - the GGUF block formats the device reads in place (Q8_0, Q4_1, Q4_K):
 * layout constants and the dequantization of one part of a block, shared by the decode
 * GEMV (gemv_q.cu) and the dequantizer (dequant_q.cu) so both produce the same values.
 *
 *   Q8_0  34 bytes / 32 values: d f16, qs int8[32]                       y[j] = qs[j] * d
 *   Q4_1  20 bytes / 32 values: d f16, m f16, qs[16] (j low nibble, j+16 high) y = d*q + m
 *   Q4_K 144 bytes / 256 values: d f16, dmin f16, scales[12] (6-bit sc/mn of 8 groups of
 *        32), qs[128]: byte 32g+l holds value 64g+l (low) and 64g+32+l (high).
 * Each weight is dequantized as the format defines it (the reference's operand order). */
#ifndef MK_GGUF_BLOCKS_CUH
#define MK_GGUF_BLOCKS_CUH

#include "mk_kernels_common.cuh"

/* ggml's type ids (the values stored in GGUF files, host/gguf.h mk_ggml_type). */
enum { GGML_Q4_1 = 3, GGML_Q8_0 = 8, GGML_Q4_K = 12, GGML_BF16 = 30 };

static __device__ __forceinline__ float gemvq_f16(const uint8_t *p) {
  return mk_dev_f16_to_f32(*reinterpret_cast<const uint16_t *>(p));
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

template <>
struct gemvq_fmt<GGML_Q4_1> {
  enum { BE = 32, BB = 20, PARTS = 4, H = 4, ALIGN = 4 };
  static __device__ __forceinline__ void part(const uint8_t *blk, int p, float *wa, float *wb, int &ka, int &kb) {
    const float d = gemvq_f16(blk), m = gemvq_f16(blk + 2);
    const uint32_t q = __ldg(reinterpret_cast<const uint32_t *>(blk + 4 + 4 * p));
    MK_UNROLL
    for (int i = 0; i < 4; i++) {
      const uint32_t byte = (q >> (8 * i)) & 0xffu;
      wa[i] = d * (float)(byte & 0x0fu) + m;
      wb[i] = d * (float)(byte >> 4) + m;
    }
    ka = 4 * p;
    kb = 4 * p + 16;
  }
};

template <>
struct gemvq_fmt<GGML_Q4_K> {
  enum { BE = 256, BB = 144, PARTS = 16, H = 8, ALIGN = 8 };
  /* 6-bit scale and min of group g (0..7) from the 12 packed bytes. */
  static __device__ __forceinline__ void scale_min(int g, const uint8_t *s, int &sc, int &mn) {
    if (g < 4) {
      sc = s[g] & 63;
      mn = s[g + 4] & 63;
    } else {
      sc = (s[g + 4] & 0x0f) | ((s[g - 4] >> 6) << 4);
      mn = (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
    }
  }
  static __device__ __forceinline__ void part(const uint8_t *blk, int p, float *wa, float *wb, int &ka, int &kb) {
    const float d = gemvq_f16(blk), dmin = gemvq_f16(blk + 2);
    const int g = p >> 2, l0 = (p & 3) * 8;
    int sc, mn;
    scale_min(2 * g, blk + 4, sc, mn);
    const float d1 = d * (float)sc, m1 = dmin * (float)mn;
    scale_min(2 * g + 1, blk + 4, sc, mn);
    const float d2 = d * (float)sc, m2 = dmin * (float)mn;
    const uint2 q = __ldg(reinterpret_cast<const uint2 *>(blk + 16 + 32 * g + l0));
    MK_UNROLL
    for (int i = 0; i < 8; i++) {
      const uint32_t byte = ((i < 4 ? q.x : q.y) >> (8 * (i & 3))) & 0xffu;
      wa[i] = d1 * (float)(byte & 0x0fu) - m1;
      wb[i] = d2 * (float)(byte >> 4) - m2;
    }
    ka = 64 * g + l0;
    kb = 64 * g + 32 + l0;
  }
};

#endif
