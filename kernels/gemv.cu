/* gemv.cu - decode matrix products with 1..MK_GEMV_MAX_ROWS activation rows and dense
 * weights (F32, F16, BF16): y[r, o] = sum_k x[r, k] * w[o, k], F32 accumulation.
 *
 * Decode is bound by reading the weights, so each weight byte is read once: one warp per
 * output row o reads w[o, :] in 16-byte vectors (consecutive lanes, consecutive vectors:
 * one coalesced 512-byte transaction per warp step) and multiplies every element into all
 * R activation rows held in R register accumulators. The activations (R x in_dim floats,
 * at most a few hundred KiB) stay in L1/L2 across the warps of a block and the blocks.
 * The order of the sums is fixed (per-lane partial sums, then the same xor tree), so the
 * result is deterministic and identical between calls with the same shapes. */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"

#define GEMV_WARPS 4 /* output rows per block */

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

/* VEC: the weight rows and x rows are 16-byte aligned and in_dim is a multiple of the
 * vector width (checked by the launcher); otherwise every element is loaded alone. */
template <int D, int R, bool VEC>
static __global__ void gemv_kernel(float *__restrict__ y /* [R, out_dim] */, const float *__restrict__ x /* [R, in_dim] */,
                                   const void *__restrict__ w /* [out_dim, in_dim] */, size_t in_dim, size_t out_dim) {
  const int lane = threadIdx.x & 31;
  const size_t o = (size_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  if (o >= out_dim) return; /* whole warps leave together: no barrier follows */
  float acc[R];
  MK_UNROLL
  for (int r = 0; r < R; r++) acc[r] = 0.0f;
  const size_t esize = D == MK_DTYPE_F32 ? 4 : 2;
  const char *wrow = static_cast<const char *>(w) + o * in_dim * esize;
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
  for (int r = 0; r < R; r++) {
    const float s = mk_warp_sum(acc[r]);
    if (lane == 0) y[(size_t)r * out_dim + o] = s;
  }
}

template <int D, int R>
static mk_status launch_gemv_r(float *y, const float *x, const void *w, size_t in_dim, size_t out_dim,
                               cudaStream_t stream) {
  const size_t esize = D == MK_DTYPE_F32 ? 4 : 2;
  const size_t per = 16 / esize;
  const bool vec = in_dim % per == 0 && ((uintptr_t)w & 15u) == 0 && ((uintptr_t)x & 15u) == 0;
  const dim3 grid(mk_ceil_div_u(out_dim, GEMV_WARPS)), block(GEMV_WARPS * MK_WARP);
  if (vec) MK_LAUNCH((gemv_kernel<D, R, true>), grid, block, 0, stream, y, x, w, in_dim, out_dim);
  else MK_LAUNCH((gemv_kernel<D, R, false>), grid, block, 0, stream, y, x, w, in_dim, out_dim);
  return mk_check_launch("mk_kernel_gemv");
}

template <int D>
static mk_status launch_gemv(float *y, const float *x, const void *w, size_t rows, size_t in_dim, size_t out_dim,
                             cudaStream_t stream) {
  switch (rows) {
    case 1: return launch_gemv_r<D, 1>(y, x, w, in_dim, out_dim, stream);
    case 2: return launch_gemv_r<D, 2>(y, x, w, in_dim, out_dim, stream);
    case 3: return launch_gemv_r<D, 3>(y, x, w, in_dim, out_dim, stream);
    case 4: return launch_gemv_r<D, 4>(y, x, w, in_dim, out_dim, stream);
    case 5: return launch_gemv_r<D, 5>(y, x, w, in_dim, out_dim, stream);
    case 6: return launch_gemv_r<D, 6>(y, x, w, in_dim, out_dim, stream);
    case 7: return launch_gemv_r<D, 7>(y, x, w, in_dim, out_dim, stream);
    default: return launch_gemv_r<D, 8>(y, x, w, in_dim, out_dim, stream);
  }
}

extern "C" mk_status mk_kernel_gemv(float *y, const float *x, const void *w, mk_dtype w_dtype, size_t rows,
                                    size_t in_dim, size_t out_dim, cudaStream_t stream) {
  if (!mk_float_dtype(w_dtype))
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv: weight dtype %d is not F32/F16/BF16", (int)w_dtype);
  if (rows > MK_GEMV_MAX_ROWS)
    return mk_fail(MK_ERR_SHAPE, "mk_kernel_gemv: %zu rows exceed the decode limit %d", rows, MK_GEMV_MAX_ROWS);
  if (in_dim == 0) return mk_fail(MK_ERR_SHAPE, "mk_kernel_gemv: zero input width");
  if (out_dim / GEMV_WARPS >= 2147483647u) return mk_fail(MK_ERR_SHAPE, "mk_kernel_gemv: %zu outputs exceed the grid", out_dim);
  if (rows == 0 || out_dim == 0) return MK_OK;
  if (!y || !x || !w) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv: null pointer");
  switch (w_dtype) {
    case MK_DTYPE_F32: return launch_gemv<MK_DTYPE_F32>(y, x, w, rows, in_dim, out_dim, stream);
    case MK_DTYPE_F16: return launch_gemv<MK_DTYPE_F16>(y, x, w, rows, in_dim, out_dim, stream);
    default: return launch_gemv<MK_DTYPE_BF16>(y, x, w, rows, in_dim, out_dim, stream);
  }
}
