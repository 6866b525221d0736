/* attention_decode.cu - one query row over the KV cache, flash-decoding style.
 *
 * The key count is positions[0] + 1, read on the device, and the grid is fixed by the
 * cache capacity (max_keys): the launch is identical every token, so a captured CUDA graph
 * replays it unchanged as the context grows.
 *
 * Pass 1 (grid [chunks(max_keys), n_heads]): a block scores DEC_CHUNK consecutive keys of
 * one head (a warp per key, lanes over head dims: coalesced K rows), takes the chunk max
 * and sum of exp, and accumulates its slice of P.V (thread groups over keys, threads over
 * dims); it writes the partial (max, sum, acc[head_dim]) to the workspace. A block whose
 * chunk lies past the keys writes the neutral partial (max -inf, sum 0, acc 0).
 * Pass 2 (grid [n_heads]): rescales the partials of the chunks that hold keys to the global
 * max and divides; neutral partials are skipped (never exp(-inf - -inf) = NaN).
 *
 * Workspace: float [n_heads][chunks][head_dim + 2], chunks = ceil(max_keys / DEC_CHUNK). */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"


#define DEC_CHUNK 256
#define DEC_THREADS 128

extern "C" mk_status mk_attention_check_shape(const char *what, size_t n_heads, size_t n_kv_heads, size_t head_dim);

/* Keys of this step: positions[0] + 1, clamped to the cache (a bad position never reads
 * outside it; the executor validates positions before upload). */
static __device__ __forceinline__ size_t decode_keys(const int32_t *positions, size_t max_keys) {
  const int32_t p = positions[0];
  const size_t n = p < 0 ? 1 : (size_t)p + 1;
  return n < max_keys ? n : max_keys;
}

static __global__ void __launch_bounds__(DEC_THREADS)
    attention_decode_partial_kernel(float *__restrict__ ws, const float *__restrict__ q,
                                    const float *__restrict__ k_cache, const float *__restrict__ v_cache,
                                    const int32_t *__restrict__ positions, size_t max_keys, int n_heads,
                                    int n_kv_heads, int hd, float scale) {
  __shared__ float q_s[MK_MAX_HEAD_DIM];
  __shared__ float p_s[DEC_CHUNK];
  __shared__ float red[DEC_THREADS];
  __shared__ float scratch[32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h = blockIdx.y;
  const int kvh = h / (n_heads / n_kv_heads);
  const size_t kv_stride = (size_t)n_kv_heads * hd;
  const size_t t0 = (size_t)blockIdx.x * DEC_CHUNK;
  const size_t n_keys = decode_keys(positions, max_keys);
  float *part = ws + ((size_t)h * gridDim.x + blockIdx.x) * (size_t)(hd + 2);
  if (t0 >= n_keys) { /* past the keys: the neutral partial (uniform per block, no barrier skipped) */
    for (int d = tid; d < hd; d += DEC_THREADS) part[2 + d] = 0.0f;
    if (tid == 0) {
      part[0] = -INFINITY;
      part[1] = 0.0f;
    }
    return;
  }
  const int n = (int)(n_keys - t0 < DEC_CHUNK ? n_keys - t0 : DEC_CHUNK);

  for (int d = tid; d < hd; d += DEC_THREADS) q_s[d] = q[(size_t)h * hd + d];
  __syncthreads();

  const float *kh = k_cache + (size_t)kvh * hd;
  for (int i = warp; i < n; i += DEC_THREADS / 32) {
    const float *kr = kh + (t0 + i) * kv_stride;
    float s = 0.0f;
    for (int d = lane; d < hd; d += 32) s += q_s[d] * kr[d];
    s = mk_warp_sum(s);
    if (lane == 0) p_s[i] = s * scale;
  }
  __syncthreads();

  float mx = -INFINITY;
  for (int i = tid; i < n; i += DEC_THREADS) mx = fmaxf(mx, p_s[i]);
  mx = mk_block_max(mx, scratch);
  float sum = 0.0f;
  for (int i = tid; i < n; i += DEC_THREADS) {
    const float p = expf(p_s[i] - mx);
    p_s[i] = p;
    sum += p;
  }
  sum = mk_block_sum(sum, scratch); /* its barriers also publish p_s */

  const float *vh = v_cache + (size_t)kvh * hd + t0 * kv_stride;
  if (hd <= DEC_THREADS) {
    /* groups of hd threads split the keys; each thread owns one dim */
    const int groups = DEC_THREADS / hd;
    const int g = tid / hd, d = tid - g * hd;
    if (g < groups) {
      float a = 0.0f;
      for (int i = g; i < n; i += groups) a += p_s[i] * vh[(size_t)i * kv_stride + d];
      red[g * hd + d] = a;
    }
    __syncthreads();
    if (tid < hd) {
      float a = 0.0f;
      for (int gg = 0; gg < groups; ++gg) a += red[gg * hd + tid];
      part[2 + tid] = a;
    }
  } else {
    for (int d = tid; d < hd; d += DEC_THREADS) {
      float a = 0.0f;
      for (int i = 0; i < n; ++i) a += p_s[i] * vh[(size_t)i * kv_stride + d];
      part[2 + d] = a;
    }
  }
  if (tid == 0) {
    part[0] = mx;
    part[1] = sum;
  }
}

static __global__ void __launch_bounds__(DEC_THREADS)
    attention_decode_reduce_kernel(float *__restrict__ out, const float *__restrict__ ws,
                                   const int32_t *__restrict__ positions, size_t max_keys, int grid_chunks, int hd) {
  const int h = blockIdx.x;
  const float *parts = ws + (size_t)h * grid_chunks * (size_t)(hd + 2);
  /* Only the chunks that hold keys: the neutral ones past them would add exp(-inf) * 0. */
  const int chunks = (int)((decode_keys(positions, max_keys) + DEC_CHUNK - 1) / DEC_CHUNK);
  float gmax = -INFINITY;
  for (int c = 0; c < chunks; ++c) gmax = fmaxf(gmax, parts[(size_t)c * (hd + 2)]);
  float denom = 0.0f;
  for (int c = 0; c < chunks; ++c) {
    const float *pc = parts + (size_t)c * (hd + 2);
    denom += pc[1] * expf(pc[0] - gmax);
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float a = 0.0f;
    for (int c = 0; c < chunks; ++c) {
      const float *pc = parts + (size_t)c * (hd + 2);
      a += pc[2 + d] * expf(pc[0] - gmax);
    }
    out[(size_t)h * hd + d] = a / denom;
  }
}

static size_t decode_chunks(size_t keys) { return (keys + DEC_CHUNK - 1) / DEC_CHUNK; }

extern "C" size_t mk_kernel_attention_decode_workspace_bytes(size_t max_keys, size_t n_heads, size_t head_dim) {
  return decode_chunks(max_keys ? max_keys : 1) * n_heads * (head_dim + 2) * sizeof(float);
}

extern "C" mk_status mk_kernel_attention_decode(float *out, const float *q, const void *k_cache, const void *v_cache,
                                                mk_dtype kv_dtype, const int32_t *positions, size_t max_keys,
                                                size_t n_heads, size_t n_kv_heads, size_t head_dim, void *workspace,
                                                size_t workspace_bytes, cudaStream_t stream) {
  MK_TRY(mk_attention_check_shape("mk_kernel_attention_decode", n_heads, n_kv_heads, head_dim));
  if (kv_dtype != MK_DTYPE_F32)
    return mk_fail(MK_ERR_DTYPE, "mk_kernel_attention_decode: KV cache dtype %s is not f32", mk_dtype_name(kv_dtype));
  if (!out || !q || !k_cache || !v_cache || !positions || !workspace)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_decode: null pointer");
  if (max_keys == 0) return mk_fail(MK_ERR_SHAPE, "mk_kernel_attention_decode: max_keys is 0");
  const size_t chunks = decode_chunks(max_keys);
  if (chunks > 2147483647u || n_heads > 65535u)
    return mk_fail(MK_ERR_SHAPE, "mk_kernel_attention_decode: %zu keys x %zu heads exceed the grid", max_keys, n_heads);
  const size_t need = mk_kernel_attention_decode_workspace_bytes(max_keys, n_heads, head_dim);
  if (workspace_bytes < need)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_decode: workspace %zu bytes < %zu needed for %zu keys",
                   workspace_bytes, need, max_keys);
  const float scale = (float)(1.0 / sqrt((double)head_dim));
  float *ws = static_cast<float *>(workspace);
  const float *kc = static_cast<const float *>(k_cache), *vc = static_cast<const float *>(v_cache);
  MK_LAUNCH(attention_decode_partial_kernel, dim3((unsigned)chunks, (unsigned)n_heads), dim3(DEC_THREADS), 0, stream,
            ws, q, kc, vc, positions, max_keys, (int)n_heads, (int)n_kv_heads, (int)head_dim, scale);
  MK_TRY(mk_check_launch("mk_kernel_attention_decode (partial)"));
  MK_LAUNCH(attention_decode_reduce_kernel, dim3((unsigned)n_heads), dim3(DEC_THREADS), 0, stream, out,
            (const float *)ws, positions, max_keys, (int)chunks, (int)head_dim);
  return mk_check_launch("mk_kernel_attention_decode (reduce)");
}
