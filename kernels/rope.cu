/* rope.cu - rotary position embedding in place, both pair layouts, per-row positions.
 * One block per row: the row's cos/sin table (head_dim/2 entries) is computed once into
 * shared memory exactly as the CPU backend does (inv_freq by double pow rounded to float,
 * angle as a float product, cos/sin in double rounded to float), then every head of the
 * row is rotated from it. */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"


static __global__ void rope_kernel(float *__restrict__ x /* [rows, heads, head_dim] */,
                                   const int32_t *__restrict__ positions /* [rows] */, size_t heads, int head_dim,
                                   float theta, int rotate_half) {
  __shared__ float cos_t[MK_MAX_HEAD_DIM / 2];
  __shared__ float sin_t[MK_MAX_HEAD_DIM / 2];
  const int half = head_dim / 2;
  const size_t row = blockIdx.x;
  const float pos = (float)positions[row];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float inv_freq = (float)pow((double)theta, -(double)(2 * i) / (double)head_dim);
    const float angle = __fmul_rn(pos, inv_freq);
    cos_t[i] = (float)cos((double)angle);
    sin_t[i] = (float)sin((double)angle);
  }
  __syncthreads();
  float *xr = x + row * heads * (size_t)head_dim;
  const size_t items = heads * (size_t)half;
  for (size_t j = threadIdx.x; j < items; j += blockDim.x) {
    const size_t h = j / (size_t)half;
    const int i = (int)(j - h * (size_t)half);
    float *head = xr + h * (size_t)head_dim;
    const int a = rotate_half ? i : 2 * i;
    const int b = rotate_half ? i + half : 2 * i + 1;
    const float xa = head[a], xb = head[b], c = cos_t[i], s = sin_t[i];
    /* no FMA contraction: the CPU rounds each product */
    head[a] = __fadd_rn(__fmul_rn(xa, c), -__fmul_rn(xb, s));
    head[b] = __fadd_rn(__fmul_rn(xb, c), __fmul_rn(xa, s));
  }
}

extern "C" mk_status mk_kernel_rope(float *x, const int32_t *positions, size_t rows, size_t heads, size_t head_dim,
                                    float theta, mk_rope_layout layout, cudaStream_t stream) {
  if (layout != MK_ROPE_ROTATE_HALF && layout != MK_ROPE_ADJACENT_PAIRS)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_rope: unknown layout %d", (int)layout);
  if (head_dim == 0 || head_dim % 2 != 0 || head_dim > MK_MAX_HEAD_DIM)
    return mk_fail(MK_ERR_SHAPE, "mk_kernel_rope: head_dim %zu must be even and <= %d", head_dim, MK_MAX_HEAD_DIM);
  if (heads == 0) return mk_fail(MK_ERR_SHAPE, "mk_kernel_rope: zero heads");
  if (!(theta > 0.0f)) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_rope: theta %g must be > 0", (double)theta);
  if (rows > 2147483647u) return mk_fail(MK_ERR_SHAPE, "mk_kernel_rope: %zu rows exceed the grid", rows);
  if (rows == 0) return MK_OK;
  if (!x || !positions) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_rope: null pointer");
  const size_t items = heads * (head_dim / 2);
  const unsigned threads = items <= 32 ? 32u : items <= 128 ? 128u : 256u;
  MK_LAUNCH(rope_kernel, dim3((unsigned)rows), dim3(threads), 0, stream, x, positions, heads, (int)head_dim, theta,
            layout == MK_ROPE_ROTATE_HALF ? 1 : 0);
  return mk_check_launch("mk_kernel_rope");
}
