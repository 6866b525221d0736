/* rope.cu - rotary position embedding in place, both pair layouts, per-row positions.
 * One block per row: the row's cos/sin table (head_dim/2 entries) is computed once into
 * shared memory exactly as the CPU backend does (inv_freq by double pow rounded to float,
 * angle as a float product, cos/sin in double rounded to float), then every head of the
 * row is rotated from it. mk_kernel_rope_kv does the same for Q and K in one launch and
 * writes the rotated K and V into the KV cache (F32, F16 or BF16) at the slot
 * positions[row] names, read on the device, through the row's block table (one sequence's,
 * or each row its own: decode rows of many sequences): the launch is the same every decode
 * step (a captured graph replays it). */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"


/* The row's cos/sin table, computed as the CPU backend does. Ends with a barrier. */
static __device__ __forceinline__ void rope_table(float *cos_t, float *sin_t, float pos, int head_dim, float theta) {
  const int half = head_dim / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float inv_freq = (float)pow((double)theta, -(double)(2 * i) / (double)head_dim);
    const float angle = __fmul_rn(pos, inv_freq);
    cos_t[i] = (float)cos((double)angle);
    sin_t[i] = (float)sin((double)angle);
  }
  __syncthreads();
}

/* Rotate pair i of one head in place. */
static __device__ __forceinline__ void rope_pair(float *head, int i, int head_dim, int rotate_half, float c, float s) {
  const int half = head_dim / 2;
  const int a = rotate_half ? i : 2 * i;
  const int b = rotate_half ? i + half : 2 * i + 1;
  const float xa = head[a], xb = head[b];
  /* no FMA contraction: the CPU rounds each product */
  const float ya = __fadd_rn(__fmul_rn(xa, c), -__fmul_rn(xb, s));
  const float yb = __fadd_rn(__fmul_rn(xb, c), __fmul_rn(xa, s));
  head[a] = ya;
  head[b] = yb;
}

static __global__ void rope_kernel(float *__restrict__ x /* [rows, heads, head_dim] */,
                                   const int32_t *__restrict__ positions /* [rows] */, size_t heads, int head_dim,
                                   float theta, int rotate_half) {
  __shared__ float cos_t[MK_MAX_HEAD_DIM / 2];
  __shared__ float sin_t[MK_MAX_HEAD_DIM / 2];
  const int half = head_dim / 2;
  const size_t row = blockIdx.x;
  rope_table(cos_t, sin_t, (float)positions[row], head_dim, theta);
  float *xr = x + row * heads * (size_t)head_dim;
  const size_t items = heads * (size_t)half;
  for (size_t j = threadIdx.x; j < items; j += blockDim.x) {
    const size_t h = j / (size_t)half;
    const int i = (int)(j - h * (size_t)half);
    rope_pair(xr + h * (size_t)head_dim, i, head_dim, rotate_half, cos_t[i], sin_t[i]);
  }
}

/* One cache element in the cache dtype: F32 as is, F16/BF16 with the CPU backend's rounding. */
template <int KVD> struct RopeKvElem;
template <> struct RopeKvElem<MK_DTYPE_F32> {
  typedef float type;
  static __device__ __forceinline__ float of(float x) { return x; }
};
template <> struct RopeKvElem<MK_DTYPE_F16> {
  typedef uint16_t type;
  static __device__ __forceinline__ uint16_t of(float x) { return mk_dev_f32_to_f16(x); }
};
template <> struct RopeKvElem<MK_DTYPE_BF16> {
  typedef uint16_t type;
  static __device__ __forceinline__ uint16_t of(float x) { return mk_dev_f32_to_bf16(x); }
};

/* RoPE of Q and K plus the KV-cache write, one launch per forward (decode: after the fused
 * Q/K/V product): q and k rotated in place as rope_kernel does, then the rotated k and v
 * stored at the row's cache slot in the cache dtype. */
template <int KVD>
static __global__ void rope_kv_kernel(float *__restrict__ q /* [rows, n_heads, head_dim] */,
                                      float *__restrict__ k /* [rows, n_kv_heads, head_dim] */,
                                      const float *__restrict__ v /* [rows, n_kv_heads, head_dim] */,
                                      typename RopeKvElem<KVD>::type *__restrict__ k_cache /* [cache_rows, kv_dim] */,
                                      typename RopeKvElem<KVD>::type *__restrict__ v_cache /* [cache_rows, kv_dim] */,
                                      const int32_t *__restrict__ kv_table, uint32_t kv_shift, uint32_t kv_row_stride,
                                      const int32_t *__restrict__ positions, size_t cache_rows, size_t n_heads,
                                      size_t n_kv_heads, int head_dim, float theta, int rotate_half) {
  __shared__ float cos_t[MK_MAX_HEAD_DIM / 2];
  __shared__ float sin_t[MK_MAX_HEAD_DIM / 2];
  const int half = head_dim / 2;
  const size_t row = blockIdx.x;
  const size_t kv_dim = n_kv_heads * (size_t)head_dim;
  const int32_t pos = positions[row];
  rope_table(cos_t, sin_t, (float)pos, head_dim, theta);
  float *qr = q + row * n_heads * (size_t)head_dim;
  float *kr = k + row * kv_dim;
  const size_t items = (n_heads + n_kv_heads) * (size_t)half;
  for (size_t j = threadIdx.x; j < items; j += blockDim.x) {
    const size_t h = j / (size_t)half;
    const int i = (int)(j - h * (size_t)half);
    float *x = h < n_heads ? qr + h * (size_t)head_dim : kr + (h - n_heads) * (size_t)head_dim;
    rope_pair(x, i, head_dim, rotate_half, cos_t[i], sin_t[i]);
  }
  /* The row's cache slot is its position's row in its sequence's block table (the executor
   * guarantees positions[r] == past + r of one sequence, or, with a row stride, each row's
   * table covering its position); one outside the cache is not stored rather than written
   * out of bounds. */
  if (pos < 0 || (size_t)pos >= cache_rows) return; /* uniform over the block */
  __syncthreads(); /* the rotated k row is complete */
  const float *vr = v + row * kv_dim;
  const int32_t *table = kv_table + row * kv_row_stride;
  typename RopeKvElem<KVD>::type *kd = k_cache + mk_kv_page_row(table, kv_shift, (size_t)pos) * kv_dim;
  typename RopeKvElem<KVD>::type *vd = v_cache + mk_kv_page_row(table, kv_shift, (size_t)pos) * kv_dim;
  for (size_t j = threadIdx.x; j < kv_dim; j += blockDim.x) {
    kd[j] = RopeKvElem<KVD>::of(kr[j]);
    vd[j] = RopeKvElem<KVD>::of(vr[j]);
  }
}

static mk_status rope_check(const char *what, size_t rows, size_t heads, size_t head_dim, float theta,
                            mk_rope_layout layout) {
  if (layout != MK_ROPE_ROTATE_HALF && layout != MK_ROPE_ADJACENT_PAIRS)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s: unknown layout %d", what, (int)layout);
  if (head_dim == 0 || head_dim % 2 != 0 || head_dim > MK_MAX_HEAD_DIM)
    return mk_fail(MK_ERR_SHAPE, "%s: head_dim %zu must be even and <= %d", what, head_dim, MK_MAX_HEAD_DIM);
  if (heads == 0) return mk_fail(MK_ERR_SHAPE, "%s: zero heads", what);
  if (!(theta > 0.0f)) return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s: theta %g must be > 0", what, (double)theta);
  if (rows > 2147483647u) return mk_fail(MK_ERR_SHAPE, "%s: %zu rows exceed the grid", what, rows);
  return MK_OK;
}

static unsigned rope_threads(size_t items) { return items <= 32 ? 32u : items <= 128 ? 128u : 256u; }

extern "C" mk_status mk_kernel_rope_kv(float *q, float *k, const float *v, void *k_cache, void *v_cache,
                                       mk_kv_pages pages, mk_dtype kv_dtype, const int32_t *positions, size_t cache_rows, size_t rows,
                                       size_t n_heads, size_t n_kv_heads, size_t head_dim, float theta,
                                       mk_rope_layout layout, cudaStream_t stream) {
  MK_TRY(rope_check("mk_kernel_rope_kv", rows, n_heads, head_dim, theta, layout));
  if (n_kv_heads == 0) return mk_fail(MK_ERR_SHAPE, "mk_kernel_rope_kv: zero kv heads");
  if (kv_dtype != MK_DTYPE_F32 && kv_dtype != MK_DTYPE_F16 && kv_dtype != MK_DTYPE_BF16)
    return mk_fail(MK_ERR_DTYPE, "mk_kernel_rope_kv: KV cache dtype %s is not f32, f16 or bf16", mk_dtype_name(kv_dtype));
  if (rows == 0) return MK_OK;
  if (!q || !k || !v || !k_cache || !v_cache || !positions)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_rope_kv: null pointer");
  if (!pages.table) /* the caches are read through a table, never as contiguous rows */
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_rope_kv: no block table");
  const dim3 grid((unsigned)rows), block(rope_threads((n_heads + n_kv_heads) * (head_dim / 2)));
  const int rh = layout == MK_ROPE_ROTATE_HALF ? 1 : 0;
  if (kv_dtype == MK_DTYPE_F32)
    MK_LAUNCH(rope_kv_kernel<MK_DTYPE_F32>, grid, block, 0, stream, q, k, v, static_cast<float *>(k_cache),
              static_cast<float *>(v_cache), pages.table, pages.block_shift, pages.row_stride, positions, cache_rows, n_heads, n_kv_heads, (int)head_dim, theta, rh);
  else if (kv_dtype == MK_DTYPE_F16)
    MK_LAUNCH(rope_kv_kernel<MK_DTYPE_F16>, grid, block, 0, stream, q, k, v, static_cast<uint16_t *>(k_cache),
              static_cast<uint16_t *>(v_cache), pages.table, pages.block_shift, pages.row_stride, positions, cache_rows, n_heads, n_kv_heads, (int)head_dim, theta, rh);
  else
    MK_LAUNCH(rope_kv_kernel<MK_DTYPE_BF16>, grid, block, 0, stream, q, k, v, static_cast<uint16_t *>(k_cache),
              static_cast<uint16_t *>(v_cache), pages.table, pages.block_shift, pages.row_stride, positions, cache_rows, n_heads, n_kv_heads, (int)head_dim, theta, rh);
  return mk_check_launch("mk_kernel_rope_kv");
}

extern "C" mk_status mk_kernel_rope(float *x, const int32_t *positions, size_t rows, size_t heads, size_t head_dim,
                                    float theta, mk_rope_layout layout, cudaStream_t stream) {
  MK_TRY(rope_check("mk_kernel_rope", rows, heads, head_dim, theta, layout));
  if (rows == 0) return MK_OK;
  if (!x || !positions) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_rope: null pointer");
  MK_LAUNCH(rope_kernel, dim3((unsigned)rows), dim3(rope_threads(heads * (head_dim / 2))), 0, stream, x, positions,
            heads, (int)head_dim, theta, layout == MK_ROPE_ROTATE_HALF ? 1 : 0);
  return mk_check_launch("mk_kernel_rope");
}
