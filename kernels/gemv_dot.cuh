/* gemv_dot.cuh - the per-output-row dot products of the decode GEMV kernels: one warp computes
 * x[r, :] . w[o, :] for all R activation rows, for dense weights (F32/F16/BF16, gemv.cu) and for
 * GGUF block weights dequantized in registers (gguf_blocks.cuh's formats, gemv_q.cu and
 * gemv_q_set.cu). Every kernel that computes one product (alone, in a Q/K/V set, or fused with
 * SwiGLU) calls the same function with the same template arguments, so they all produce the
 * same bits.
 *
 * Included after mk_cuda_compat.h. Everything here is static inline: no symbols. */
#ifndef MK_GEMV_DOT_CUH
#define MK_GEMV_DOT_CUH

#include "mk_kernels_common.cuh"
#include "gguf_blocks.cuh"

/* Field m (0, 1 or 2) of a 3-element array in a kernel's parameter struct, with constant
 * indices only: a run-time index into a parameter struct makes nvcc copy the struct to the
 * local stack of every thread (a stack frame and local loads in every decode GEMV). */
template <class V>
static __device__ __forceinline__ V gemv_pick3(const V (&a)[3], int m) {
  return m == 0 ? a[0] : m == 1 ? a[1] : a[2];
}

/* Which matrix of a set of three output row o (numbered through the set) belongs to, with o
 * made local to it: unrolled compares, no run-time index into the parameter struct. */
static __device__ __forceinline__ int gemv_set_locate(size_t &o, const size_t (&out)[3]) {
  if (o < out[0]) return 0;
  o -= out[0];
  if (o < out[1]) return 1;
  o -= out[1];
  return 2;
}

/* Widen element i of a 16-byte vector of dtype D (F32: 4 elements, F16/BF16: 8). */
template <int D>
static __device__ __forceinline__ float gemv_vec_elem(const uint4 &v, int i) {
  /* i is a compile-time constant after unrolling, so this selects a register. */
  const int wi = D == MK_DTYPE_F32 ? i : i >> 1;
  const uint32_t word = wi == 0 ? v.x : wi == 1 ? v.y : wi == 2 ? v.z : v.w;
  if (D == MK_DTYPE_F32) return __uint_as_float(word);
  const uint16_t h = (uint16_t)((i & 1) ? (word >> 16) : (word & 0xffffu));
  return D == MK_DTYPE_F16 ? mk_dev_f16_to_f32(h) : mk_dev_bf16_to_f32(h);
}

/* The R sums x[r, :] . wrow for one weight row, by one warp; every lane gets the totals.
 * VEC: the weight row and x rows are 16-byte aligned and in_dim is a multiple of the vector
 * width (checked by the launcher); otherwise every element is loaded alone. The order of
 * the additions depends only on (D, VEC, in_dim): every kernel below computes one product
 * with the same bits. */
template <int D, int R, bool VEC>
static __device__ __forceinline__ void gemv_dot(float (&acc)[R], const float *__restrict__ x, const char *wrow,
                                                size_t in_dim, int lane) {
  MK_UNROLL
  for (int r = 0; r < R; r++) acc[r] = 0.0f;
  const size_t esize = D == MK_DTYPE_F32 ? 4 : 2;
  if (VEC) {
    const int per = 16 / (int)esize; /* elements per vector */
    const size_t n_vec = in_dim / (size_t)per;
    const uint4 *wv = reinterpret_cast<const uint4 *>(wrow);
    for (size_t v = (size_t)lane; v < n_vec; v += MK_WARP) {
      const uint4 wq = __ldg(wv + v);
      const size_t k0 = v * (size_t)per;
      MK_UNROLL
      for (int r = 0; r < R; r++) {
        const float4 *xv = reinterpret_cast<const float4 *>(x + (size_t)r * in_dim + k0);
        const float4 xa = __ldg(xv);
        float s = acc[r];
        s += xa.x * gemv_vec_elem<D>(wq, 0);
        s += xa.y * gemv_vec_elem<D>(wq, 1);
        s += xa.z * gemv_vec_elem<D>(wq, 2);
        s += xa.w * gemv_vec_elem<D>(wq, 3);
        if (D != MK_DTYPE_F32) {
          const float4 xb = __ldg(xv + 1);
          s += xb.x * gemv_vec_elem<D>(wq, 4);
          s += xb.y * gemv_vec_elem<D>(wq, 5);
          s += xb.z * gemv_vec_elem<D>(wq, 6);
          s += xb.w * gemv_vec_elem<D>(wq, 7);
        }
        acc[r] = s;
      }
    }
  } else {
    for (size_t k = (size_t)lane; k < in_dim; k += MK_WARP) {
      const float wk = mk_load_as_f32<D>(wrow, k);
      MK_UNROLL
      for (int r = 0; r < R; r++) acc[r] += __ldg(x + (size_t)r * in_dim + k) * wk;
    }
  }
  MK_UNROLL
  for (int r = 0; r < R; r++) acc[r] = mk_warp_sum(acc[r]);
}

/* Output rows per thread block of the native GEMV kernels (gemv_q.cu, gemv_q_set.cu): one
 * warp each. */
#define GEMVQ_WARPS 4

/* The R sums x[r, :] . dequant(wrow) for one row of blocks of format T, by one warp; every
 * lane gets the totals. Each block is cut into PARTS parts of 2*H values; lane u takes part
 * u % PARTS of block u / PARTS, so a warp step reads 32 consecutive parts and every lane has
 * work even for short rows. The order of the additions depends only on (T, in_dim). */
template <int T, int R>
static __device__ __forceinline__ void gemvq_dot(float (&acc)[R], const float *__restrict__ x,
                                                 const uint8_t *__restrict__ wrow, size_t in_dim, int lane) {
  typedef gemvq_fmt<T> F;
  MK_UNROLL
  for (int r = 0; r < R; r++) acc[r] = 0.0f;
  const size_t n_blocks = in_dim / F::BE;
  const size_t units = n_blocks * F::PARTS;
  for (size_t u = (size_t)lane; u < units; u += MK_WARP) {
    const size_t b = u / F::PARTS;
    float wa[F::H], wb[F::H];
    int ka, kb;
    F::part(wrow + b * F::BB, (int)(u % F::PARTS), wa, wb, ka, kb);
    const float *xb = x + b * F::BE;
    MK_UNROLL
    for (int r = 0; r < R; r++) {
      const float *xr = xb + (size_t)r * in_dim;
      float s = acc[r];
      MK_UNROLL
      for (int i = 0; i < F::H; i++) s += __ldg(xr + ka + i) * wa[i];
      MK_UNROLL
      for (int i = 0; i < F::H; i++) s += __ldg(xr + kb + i) * wb[i];
      acc[r] = s;
    }
  }
  MK_UNROLL
  for (int r = 0; r < R; r++) acc[r] = mk_warp_sum(acc[r]);
}

#endif /* MK_GEMV_DOT_CUH */
