/* rmsnorm_kernel.cu - an RMSNorm in the shape of the real one (a block of 256 threads per row,
 * warp shuffles then a shared-memory reduction across warps): the simulator's speed probe. */
#include "mk_cuda_compat.h"

#include "test_kernels.h"

static __device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int BS>
static __global__ void rmsnorm_kernel(float *__restrict__ y, const float *__restrict__ x,
                                      const float *__restrict__ w, int cols, float eps) {
  __shared__ float partial[BS / 32];
  const float *xr = x + (size_t)blockIdx.x * cols;
  float *yr = y + (size_t)blockIdx.x * cols;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < cols; c += BS) ss += xr[c] * xr[c];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  float tot = threadIdx.x < BS / 32 ? partial[threadIdx.x] : 0.0f;
  if (threadIdx.x < 32) tot = warp_sum(tot);
  if (threadIdx.x == 0) partial[0] = tot;
  __syncthreads();
  const float scale = rsqrtf(partial[0] / cols + eps);
  for (int c = threadIdx.x; c < cols; c += BS) yr[c] = xr[c] * scale * w[c];
}

cudaError_t tk_rmsnorm(float *y, const float *x, const float *w, int rows, int cols, float eps,
                       cudaStream_t s) {
  MK_LAUNCH(rmsnorm_kernel<256>, rows, 256, 0, s, y, x, w, cols, eps);
  return cudaGetLastError();
}
