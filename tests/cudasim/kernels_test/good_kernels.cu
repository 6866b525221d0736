/* good_kernels.cu - correct kernels the simulator must run to the right answer in any order. */
#include "mk_cuda_compat.h"

#include "test_kernels.h"

/* Block tree reduction in static shared memory: out[b] = sum of the block's slice. */
static __global__ void block_sum_kernel(float *out, const float *x, int n) {
  __shared__ float s[256];
  const int t = threadIdx.x;
  float v = 0.0f;
  for (int i = (int)blockIdx.x * n + t; i < ((int)blockIdx.x + 1) * n; i += blockDim.x) v += x[i];
  s[t] = v;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

cudaError_t tk_block_sum(float *out, const float *x, int n, int blocks, cudaStream_t s) {
  MK_LAUNCH(block_sum_kernel, blocks, 256, 0, s, out, x, n);
  return cudaGetLastError();
}

static __device__ __forceinline__ float warp_reduce(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

static __global__ void warp_sum_kernel(float *out, const float *x) {
  const int gw = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  float v = warp_reduce(x[blockIdx.x * blockDim.x + threadIdx.x]);
  float d = x[blockIdx.x * blockDim.x + threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) d += __shfl_down_sync(0xffffffffu, d, o);
  d = __shfl_sync(0xffffffffu, d, 0);
  if ((threadIdx.x & 31) == 0) out[gw] = (v == d) ? v : -1.0f;
}

cudaError_t tk_warp_sum(float *out, const float *x, int n_warps, cudaStream_t s) {
  MK_LAUNCH(warp_sum_kernel, n_warps / 4, 128, 0, s, out, x);
  return cudaGetLastError();
}

static __global__ void atomic_kernel(int *count, float *fsum, unsigned long long *umax) {
  atomicAdd(count, 1);
  atomicAdd(fsum, 0.5f);
  atomicMax(umax, static_cast<unsigned long long>(blockIdx.x * blockDim.x + threadIdx.x));
}

cudaError_t tk_atomic_count(int *count, float *fsum, unsigned long long *umax, int blocks,
                            cudaStream_t s) {
  MK_LAUNCH(atomic_kernel, blocks, 64, 0, s, count, fsum, umax);
  return cudaGetLastError();
}

/* Reverse each block's slice through dynamic shared memory. */
static __global__ void dyn_reverse_kernel(float *y, const float *x) {
  MK_DYNAMIC_SHARED(float, tile);
  const int base = blockIdx.x * blockDim.x;
  tile[threadIdx.x] = x[base + threadIdx.x];
  __syncthreads();
  y[base + threadIdx.x] = tile[blockDim.x - 1 - threadIdx.x];
}

cudaError_t tk_dynamic_reverse(float *y, const float *x, int block, int blocks, cudaStream_t s) {
  MK_LAUNCH(dyn_reverse_kernel, blocks, block, block * sizeof(float), s, y, x);
  return cudaGetLastError();
}

static __global__ void grid2d_kernel(int *out, int w, int h) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int r = blockIdx.y * blockDim.y + threadIdx.y;
  if (c < w && r < h) out[r * w + c] = r * 1000 + c + (int)(gridDim.x * 0 + blockDim.z - 1);
}

cudaError_t tk_grid2d(int *out, int w, int h, cudaStream_t s) {
  dim3 block(16, 8);
  dim3 grid((w + 15) / 16, (h + 7) / 8);
  MK_LAUNCH(grid2d_kernel, grid, block, 0, s, out, w, h);
  return cudaGetLastError();
}

/* Template kernel with a static __shared__ array sized by the template parameter. */
template <int BS, typename T>
static __global__ void template_sum_kernel(T *out, const T *x, int n) {
  __shared__ T s[BS];
  T v = 0;
  for (int i = threadIdx.x; i < n; i += BS) v += x[i];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int stride = BS / 2; stride > 0; stride >>= 1) {
    if ((int)threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = s[0];
}

cudaError_t tk_template_sum(double *out, const double *x, int n, int block_size, cudaStream_t s) {
  if (block_size == 64) MK_LAUNCH((template_sum_kernel<64, double>), 1, 64, 0, s, out, x, n);
  else MK_LAUNCH((template_sum_kernel<512, double>), 1, 512, 0, s, out, x, n);
  return cudaGetLastError();
}

static __global__ void votes_kernel(unsigned *out, const int *pred) {
  const int l = threadIdx.x;
  out[l] = __ballot_sync(0xffffffffu, pred[l]);
  out[32 + l] = (unsigned)__any_sync(0xffffffffu, pred[l]);
  out[64 + l] = (unsigned)__all_sync(0xffffffffu, pred[l]);
  __syncwarp();
  /* half-warp groups with their own masks */
  const unsigned m = l < 16 ? 0x0000ffffu : 0xffff0000u;
  out[96 + l] = __ballot_sync(m, pred[l]);
}

cudaError_t tk_warp_votes(unsigned *out, const int *pred, cudaStream_t s) {
  MK_LAUNCH(votes_kernel, 1, 32, 0, s, out, pred);
  return cudaGetLastError();
}

/* Inclusive scan of 64 ints with __shfl_up_sync over width 32 and 16 (two segments). */
static __global__ void scan_up_kernel(int *out, const int *x) {
  int v = x[threadIdx.x];
  const int width = threadIdx.x < 32 ? 32 : 16;
  (void)width;
  for (int o = 1; o < 32; o <<= 1) {
    int u = __shfl_up_sync(0xffffffffu, v, o, 32);
    if ((int)(threadIdx.x & 31) >= o) v += u;
  }
  out[threadIdx.x] = v;
}

cudaError_t tk_scan_up(int *out, const int *x, cudaStream_t s) {
  MK_LAUNCH(scan_up_kernel, 1, 64, 0, s, out, x);
  return cudaGetLastError();
}

static __global__ void sync_count_kernel(int *out, const int *pred) {
  const int p = pred[threadIdx.x];
  const int c = __syncthreads_count(p);
  const int a = __syncthreads_and(p);
  const int o = __syncthreads_or(p);
  if (threadIdx.x == 0) {
    out[0] = c;
    out[1] = a;
    out[2] = o;
  }
}

cudaError_t tk_sync_count(int *out, const int *pred, int n, cudaStream_t s) {
  MK_LAUNCH(sync_count_kernel, 1, n, 0, s, out, pred);
  return cudaGetLastError();
}

static __global__ void half_kernel(float *out, const float *x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  __half h = __float2half(x[i]);
  __nv_bfloat16 b = __float2bfloat16(x[i]);
  out[i] = __half2float(__hfma(h, __float2half(1.0f), __float2half(0.0f)));
  out[n + i] = __bfloat162float(b) + fmaxf(0.0f, rsqrtf(4.0f) - 0.5f) + __fdividef(0.0f, 1.0f) +
               (float)min(0, 1) + (float)max(0u, 0u) + __ldg(&x[i]) * 0.0f - sqrtf(0.0f) +
               __expf(0.0f) - expf(0.0f);
}

cudaError_t tk_half_roundtrip(float *out, const float *x, int n, cudaStream_t s) {
  MK_LAUNCH(half_kernel, (n + 127) / 128, 128, 0, s, out, x, n);
  return cudaGetLastError();
}

/* Dynamic shared memory above the 48 KiB default needs cudaFuncSetAttribute. */
static __global__ void big_dynamic_kernel(float *out, int n_floats) {
  MK_DYNAMIC_SHARED(float, buf);
  for (int i = threadIdx.x; i < n_floats; i += blockDim.x) buf[i] = (float)(i & 1);
  __syncthreads();
  float v = 0.0f;
  for (int i = threadIdx.x; i < n_floats; i += blockDim.x) v += buf[n_floats - 1 - i];
  atomicAdd(out, v);
}

cudaError_t tk_big_dynamic(float *out, int n_floats, cudaStream_t s) {
  const size_t bytes = (size_t)n_floats * sizeof(float);
  if (bytes > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(big_dynamic_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) return e;
  }
  MK_LAUNCH(big_dynamic_kernel, 1, 128, bytes, s, out, n_floats);
  return cudaGetLastError();
}

static __global__ void no_args_kernel() {}
static __global__ void flag_kernel(int *flag) { *flag = 7; }

cudaError_t tk_no_args(int *flag, cudaStream_t s) {
  MK_LAUNCH(no_args_kernel, 1, 1, 0, s);
  MK_LAUNCH(flag_kernel, 1, 1, 0, s, flag);
  return cudaGetLastError();
}

/* Lanes 0-15 shuffle among themselves (mask 0x0000ffff: lanes 16-31 take no part), then the
 * whole warp shuffles with the full mask - legal, the half-warp exchange only waits for the
 * lanes it names. out[64 * warp + l]: l < 16 the half-warp result, 32 + l the full one. */
static __global__ void half_then_full_shfl_kernel(int *out) {
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x / 32);
  int v = 100 * warp + lane;
  if (lane < 16) {
    v = __shfl_sync(0x0000ffffu, v, (lane + 1) % 16);
    out[64 * warp + lane] = v;
  }
  const int w = __shfl_sync(0xffffffffu, v, 31 - lane);
  out[64 * warp + 32 + lane] = w;
}

cudaError_t tk_half_then_full_shfl(int *out, cudaStream_t s) {
  MK_LAUNCH(half_then_full_shfl_kernel, 1, 64, 0, s, out);
  return cudaGetLastError();
}
