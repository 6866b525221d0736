/* mk_kernels_common.cuh - device helpers shared by the kernel files (kernels/<op>.cu):
 * warp/block reductions, exact F16/BF16 <-> F32 conversions (bit-identical to the CPU
 * backend's mk_f32_to_f16 & co.), grid arithmetic and the launch check.
 *
 * Included after mk_cuda_compat.h. Everything here is static/inline: no symbols. */
#ifndef MK_KERNELS_COMMON_CUH
#define MK_KERNELS_COMMON_CUH

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "mk_error.h" /* common/: the library's per-thread error record, shared with host */

#define MK_WARP 32

/* Full unrolling of a loop with a compile-time trip count (keeps register arrays in
 * registers); the host compiler's spelling under cudasim. */
#if defined(__CUDACC__)
#define MK_UNROLL _Pragma("unroll")
#else
#define MK_UNROLL _Pragma("GCC unroll 16")
#endif
#define MK_FULL_MASK 0xffffffffu

/* ================================================================ reductions == */

static __device__ __forceinline__ float mk_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(MK_FULL_MASK, v, o);
  return v;
}

static __device__ __forceinline__ float mk_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(MK_FULL_MASK, v, o));
  return v;
}

/* Sum over the block (blockDim.x a multiple of 32). `scratch` is a __shared__ float[32];
 * every thread gets the result. Ends with a barrier so scratch can be reused at once. */
static __device__ __forceinline__ float mk_block_sum(float v, float *scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_warps = (int)(blockDim.x >> 5);
  v = mk_warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < n_warps ? scratch[lane] : 0.0f;
    t = mk_warp_sum(t);
    if (lane == 0) scratch[0] = t;
  }
  __syncthreads();
  const float total = scratch[0];
  __syncthreads();
  return total;
}

static __device__ __forceinline__ float mk_block_max(float v, float *scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_warps = (int)(blockDim.x >> 5);
  v = mk_warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < n_warps ? scratch[lane] : -INFINITY;
    t = mk_warp_max(t);
    if (lane == 0) scratch[0] = t;
  }
  __syncthreads();
  const float total = scratch[0];
  __syncthreads();
  return total;
}

/* =============================================================== conversions == */
/* Bit-exact twins of mk_f16_to_f32 / mk_f32_to_f16 / mk_bf16_to_f32 / mk_f32_to_bf16
 * (host/cpu_ops.c): the device and the CPU backend must produce the same bits, NaN
 * payloads included, so these do not use the hardware cvt instructions. */

static __device__ __forceinline__ float mk_dev_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) { /* zero or subnormal: mant * 2^-24 is exact in float */
    const float f = (float)mant * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  const uint32_t bits = exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp + 112u) << 23) | (mant << 13));
  return __uint_as_float(bits);
}

static __device__ __forceinline__ uint16_t mk_dev_f32_to_f16(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
  if (abs < 0x38800000u) {                                    /* subnormal or zero */
    if (abs < 0x33000000u) return (uint16_t)sign;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - (int)(abs >> 23);
    uint32_t half_mant = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) half_mant++;
    return (uint16_t)(sign | half_mant);
  }
  uint32_t h = (abs >> 13) - (112u << 10);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

static __device__ __forceinline__ float mk_dev_bf16_to_f32(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

static __device__ __forceinline__ uint16_t mk_dev_f32_to_bf16(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

/* Element i of a table of dtype D (MK_DTYPE_F32 / F16 / BF16) as float. */
template <int D>
static __device__ __forceinline__ float mk_load_as_f32(const void *p, size_t i) {
  if (D == MK_DTYPE_F32) return static_cast<const float *>(p)[i];
  if (D == MK_DTYPE_F16) return mk_dev_f16_to_f32(static_cast<const uint16_t *>(p)[i]);
  return mk_dev_bf16_to_f32(static_cast<const uint16_t *>(p)[i]);
}

/* ======================================================= host-side launch help == */

static inline unsigned mk_ceil_div_u(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

/* Blocks for a grid-stride elementwise launch of n items with `threads` per block:
 * enough to fill any current GPU, capped so the grid stays small for huge n. */
static inline unsigned mk_elementwise_blocks(size_t n, unsigned threads) {
  const size_t want = (n + threads - 1) / threads;
  const size_t cap = 65536;
  return (unsigned)(want < cap ? (want ? want : 1) : cap);
}

/* The status of the launch just issued (cudaGetLastError also clears it). */
static inline mk_status mk_check_launch(const char *what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return mk_fail(MK_ERR_KERNEL_LAUNCH, "%s: kernel launch failed: %s (%s)", what, cudaGetErrorName(e),
                   cudaGetErrorString(e));
  return MK_OK;
}

static inline bool mk_float_dtype(mk_dtype d) { return d == MK_DTYPE_F32 || d == MK_DTYPE_F16 || d == MK_DTYPE_BF16; }

#endif /* MK_KERNELS_COMMON_CUH */
