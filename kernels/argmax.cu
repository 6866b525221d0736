/* argmax.cu - greedy argmax per row, lowest index on ties, NaN never wins (an all-NaN
 * row gives 0, as the CPU backend). One block per row: each thread scans a strided
 * slice in increasing index order (16-byte loads when the row is aligned), then the
 * (value, index) pairs are combined with warp shuffles and shared memory. */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"

/* (av, ai) beats (bv, bi)? An index < 0 means "nothing found yet". */
static __device__ __forceinline__ bool am_better(float av, int ai, float bv, int bi) {
  if (ai < 0) return false;
  if (bi < 0) return true;
  return av > bv || (av == bv && ai < bi);
}

static __device__ __forceinline__ void am_take(float v, int i, float &bv, int &bi) {
  if (!isnan(v) && (bi < 0 || v > bv)) { /* strict: the earlier (lower) index keeps a tie */
    bv = v;
    bi = i;
  }
}

template <bool VEC4>
static __global__ void __launch_bounds__(1024) argmax_kernel(int32_t *__restrict__ out /* [rows] */, const float *__restrict__ x, size_t n) {
  __shared__ float s_val[32];
  __shared__ int s_idx[32];
  const float *xr = x + (size_t)blockIdx.x * n;
  float bv = -INFINITY;
  int bi = -1;
  if (VEC4) {
    const float4 *x4 = reinterpret_cast<const float4 *>(xr);
    const size_t n4 = n / 4;
    for (size_t i = threadIdx.x; i < n4; i += blockDim.x) {
      const float4 v = x4[i];
      const int j = (int)(4 * i);
      am_take(v.x, j, bv, bi);
      am_take(v.y, j + 1, bv, bi);
      am_take(v.z, j + 2, bv, bi);
      am_take(v.w, j + 3, bv, bi);
    }
  } else {
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) am_take(xr[i], (int)i, bv, bi);
  }
  /* butterfly: every lane ends with the warp's best (the order is total) */
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(MK_FULL_MASK, bv, o);
    const int oi = __shfl_xor_sync(MK_FULL_MASK, bi, o);
    if (am_better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    s_val[warp] = bv;
    s_idx[warp] = bi;
  }
  __syncthreads();
  if (warp == 0) {
    const int n_warps = (int)(blockDim.x >> 5);
    bv = lane < n_warps ? s_val[lane] : -INFINITY;
    bi = lane < n_warps ? s_idx[lane] : -1;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(MK_FULL_MASK, bv, o);
      const int oi = __shfl_xor_sync(MK_FULL_MASK, bi, o);
      if (am_better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) out[blockIdx.x] = bi < 0 ? 0 : bi;
  }
}

extern "C" mk_status mk_kernel_argmax(int32_t *out, const float *x, size_t rows, size_t n, cudaStream_t stream) {
  if (n == 0 || n > 2147483647u) return mk_fail(MK_ERR_SHAPE, "mk_kernel_argmax: row length %zu", n);
  if (rows > 2147483647u) return mk_fail(MK_ERR_SHAPE, "mk_kernel_argmax: %zu rows exceed the grid", rows);
  if (rows == 0) return MK_OK;
  if (!out || !x) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_argmax: null pointer");
  const unsigned threads = n >= 4096 ? 1024u : n > 32 ? 256u : 32u;
  const bool vec4 = n % 4 == 0 && ((uintptr_t)x & 15u) == 0;
  if (vec4) MK_LAUNCH(argmax_kernel<true>, dim3((unsigned)rows), dim3(threads), 0, stream, out, x, n);
  else MK_LAUNCH(argmax_kernel<false>, dim3((unsigned)rows), dim3(threads), 0, stream, out, x, n);
  return mk_check_launch("mk_kernel_argmax");
}
