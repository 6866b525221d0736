/* broken_kernels.cu - deliberately wrong kernels: the simulator must catch each one, either
 * by reporting an error or by producing a wrong answer in some thread order. */
#include "mk_cuda_compat.h"

#include "test_kernels.h"

/* A kernel's faults surface when it has run, as on a GPU: wait for it, then take the error. */
static cudaError_t launched(cudaStream_t s) {
  cudaStreamSynchronize(s);
  return cudaGetLastError();
}

/* Tree reduction with the barrier between the shared-memory store and the first read
 * missing: a thread may read s[t + stride] before its owner wrote it. */
static __global__ void sum_missing_sync_kernel(float *out, const float *x, int n) {
  __shared__ float s[256];
  const int t = threadIdx.x;
  float v = 0.0f;
  for (int i = t; i < n; i += blockDim.x) v += x[i];
  s[t] = v;
  /* BUG: __syncthreads() missing here */
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) *out = s[0];
}

cudaError_t tk_sum_missing_sync(float *out, const float *x, int n, cudaStream_t s) {
  MK_LAUNCH(sum_missing_sync_kernel, 1, 256, 0, s, out, x, n);
  return launched(s);
}

/* The pre-Volta warp-synchronous idiom: a last-warp reduction over volatile shared memory
 * that assumes the 32 lanes run in lock-step (no __syncwarp, no _sync intrinsics). */
static __global__ void warp_lockstep_kernel(float *out, const float *x) {
  __shared__ float s[64];
  const int t = threadIdx.x;
  s[t] = x[t];
  s[t + 32] = x[t + 32];
  __syncthreads();
  volatile float *vs = s;
  vs[t] += vs[t + 32];
  vs[t] += vs[t + 16]; /* BUG: reads lanes that may not have done the previous step */
  vs[t] += vs[t + 8];
  vs[t] += vs[t + 4];
  vs[t] += vs[t + 2];
  vs[t] += vs[t + 1];
  if (t == 0) *out = vs[0];
}

cudaError_t tk_warp_lockstep(float *out, const float *x, cudaStream_t s) {
  MK_LAUNCH(warp_lockstep_kernel, 1, 32, 0, s, out, x);
  return launched(s);
}

/* Two warps; warp 0 publishes its inputs in shared memory, both warps reduce with
 * __shfl_xor_sync, then warp 1 reads what warp 0 stored. The shuffles synchronise only
 * within each warp: without the __syncthreads warp 1 may read before warp 0 wrote. */
template <bool kSync>
static __global__ void cross_warp_shfl_kernel(float *out, const float *x) {
  MK_DYNAMIC_SHARED(float, s);
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const float *xb = x + blockIdx.x * 64;
  if (warp == 0) s[lane] = xb[lane];
  if (kSync) __syncthreads(); /* BUG when kSync is false: only warp intrinsics follow */
  float v = xb[t];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (warp == 1) out[blockIdx.x * 32 + lane] = s[lane] + v;
}

cudaError_t tk_cross_warp_shfl(float *out, const float *x, int blocks, bool sync, cudaStream_t s) {
  if (sync)
    MK_LAUNCH((cross_warp_shfl_kernel<true>), blocks, 64, 32 * sizeof(float), s, out, x);
  else
    MK_LAUNCH((cross_warp_shfl_kernel<false>), blocks, 64, 32 * sizeof(float), s, out, x);
  return launched(s);
}

/* __syncthreads reached by half the block only. */
static __global__ void divergent_barrier_kernel() {
  if (threadIdx.x < 16) __syncthreads();
}

cudaError_t tk_divergent_barrier(cudaStream_t s) {
  MK_LAUNCH(divergent_barrier_kernel, dim3(2, 2), 64, 0, s);
  return launched(s);
}

void tk_divergent_barrier_no_check(cudaStream_t s) {
  MK_LAUNCH(divergent_barrier_kernel, dim3(2, 2), 64, 0, s);
}

/* The early-return idiom before a barrier: the exited threads never arrive. */
static __global__ void barrier_after_exit_kernel() {
  __shared__ int s[64];
  if (blockIdx.x == 3 && threadIdx.x >= 40) return;
  s[threadIdx.x] = 1;
  __syncthreads();
  if (s[63 - threadIdx.x] != 1) s[threadIdx.x] = 2;
}

cudaError_t tk_barrier_after_exit(cudaStream_t s) {
  MK_LAUNCH(barrier_after_exit_kernel, 5, 64, 0, s);
  return launched(s);
}

/* Lanes 16..31 return; the rest shuffle down by 16, reading the exited lanes. */
static __global__ void shfl_exited_kernel(float *out) {
  const int l = threadIdx.x & 31;
  if (l >= 16) return;
  float v = __shfl_down_sync(0x0000ffffu, 1.0f, 16);
  out[l] = v;
}

cudaError_t tk_shfl_exited_lane(float *out, cudaStream_t s) {
  MK_LAUNCH(shfl_exited_kernel, 1, 32, 0, s, out);
  return launched(s);
}

/* Full mask although lanes 16..31 have exited. */
static __global__ void mask_exited_kernel(float *out) {
  const int l = threadIdx.x & 31;
  if (l >= 16) return;
  out[l] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

cudaError_t tk_mask_exited(float *out, cudaStream_t s) {
  MK_LAUNCH(mask_exited_kernel, 1, 32, 0, s, out);
  return launched(s);
}

/* Lane 0 waits at a full-warp shuffle while the other lanes wait at __syncthreads. */
static __global__ void warp_vs_barrier_kernel() {
  float v = 1.0f;
  if (threadIdx.x == 0) v = __shfl_sync(0xffffffffu, v, 1);
  __syncthreads();
  (void)v;
}

cudaError_t tk_warp_vs_barrier(cudaStream_t s) {
  MK_LAUNCH(warp_vs_barrier_kernel, 1, 32, 0, s);
  return launched(s);
}

/* Lanes disagree about the mask of the same shuffle. */
static __global__ void mask_mismatch_kernel() {
  const unsigned m = threadIdx.x == 5 ? 0x0000ffffu : 0xffffffffu;
  float v = __shfl_xor_sync(m, 1.0f, 1);
  (void)v;
}

cudaError_t tk_mask_mismatch(cudaStream_t s) {
  MK_LAUNCH(mask_mismatch_kernel, 1, 32, 0, s);
  return launched(s);
}

/* Unbounded recursion: overflows the fiber stack into its guard page. */
static __device__ int deep(int n, int limit, volatile char *prev) {
  volatile char frame[1024];
  frame[0] = (char)n;
  frame[1023] = prev ? prev[0] : 0;
  return n < limit ? deep(n + 1, limit, frame) + frame[1023] : frame[0];
}

static __global__ void stack_overflow_kernel(int *out, int limit) {
  *out = deep(0, limit, nullptr);
}

cudaError_t tk_stack_overflow(int *out, int limit, cudaStream_t s) {
  MK_LAUNCH(stack_overflow_kernel, 1, 32, 0, s, out, limit);
  return launched(s);
}

/* Odd blocks read the static __shared__ arrays before any thread of the block wrote them
 * (BUG): on a GPU they see whatever an earlier block left in that SM's shared memory, so
 * cudasim fills static shared memory with 0xff bytes before every block. A template, so
 * the arrays are block-scope statics of a function template instantiation. */
template <int N>
static __global__ void stale_static_shared_kernel(unsigned *out_u, float *out_f) {
  __shared__ unsigned su[N];
  __shared__ float sf[N];
  const unsigned t = threadIdx.x, b = blockIdx.x;
  if (b % 2 == 0) {
    su[t] = 1000u + b * N + t;
    sf[t] = static_cast<float>(b * N + t);
  }
  __syncthreads();
  out_u[b * N + t] = su[t];
  out_f[b * N + t] = sf[t];
}

cudaError_t tk_stale_static_shared(unsigned *out_u, float *out_f, int blocks, cudaStream_t s) {
  MK_LAUNCH(stale_static_shared_kernel<32>, blocks, 32, 0, s, out_u, out_f);
  return launched(s);
}
