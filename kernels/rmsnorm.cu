/* rmsnorm.cu - RMSNorm and the fused residual-add + RMSNorm.
 * One block per row; sum of squares in float (warp shuffles, then shared memory across
 * warps); 256 threads below 1024 columns, 1024 above. */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"

/* ADD: residual += delta first (written back), then normalise the updated residual. */
template <bool ADD>
static __global__ void rmsnorm_kernel(float *__restrict__ out /* [rows, cols] */,
                                      float *__restrict__ residual /* [rows, cols], ADD only */,
                                      const float *__restrict__ x /* [rows, cols]: x, or delta if ADD */,
                                      const float *__restrict__ w /* [cols] */, size_t cols, float eps) {
  __shared__ float scratch[32];
  const size_t off = (size_t)blockIdx.x * cols;
  const float *src = ADD ? residual + off : x + off;
  float ss = 0.0f;
  for (size_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v;
    if (ADD) {
      v = residual[off + c] + x[off + c];
      residual[off + c] = v; /* re-read below by this same thread only */
    } else {
      v = src[c];
    }
    ss += v * v;
  }
  ss = mk_block_sum(ss, scratch);
  const float scale = rsqrtf(ss / (float)cols + eps);
  float *o = out + off;
  for (size_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = src[c] * scale * w[c];
}

static unsigned rmsnorm_threads(size_t cols) { return cols <= 32 ? 32u : cols < 1024 ? 256u : 1024u; }

static mk_status rmsnorm_check(const char *what, size_t rows, size_t cols) {
  if (cols == 0) return mk_fail(MK_ERR_SHAPE, "%s: zero columns", what);
  if (rows > 2147483647u) return mk_fail(MK_ERR_SHAPE, "%s: %zu rows exceed the grid", what, rows);
  return MK_OK;
}

extern "C" mk_status mk_kernel_rmsnorm(float *out, const float *x, const float *w, size_t rows, size_t cols,
                                       float eps, cudaStream_t stream) {
  MK_TRY(rmsnorm_check("mk_kernel_rmsnorm", rows, cols));
  if (rows == 0) return MK_OK;
  if (!out || !x || !w) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_rmsnorm: null pointer");
  MK_LAUNCH(rmsnorm_kernel<false>, dim3((unsigned)rows), dim3(rmsnorm_threads(cols)), 0, stream, out,
            (float *)nullptr, x, w, cols, eps);
  return mk_check_launch("mk_kernel_rmsnorm");
}

extern "C" mk_status mk_kernel_add_rmsnorm(float *residual, float *out, const float *delta, const float *w,
                                           size_t rows, size_t cols, float eps, cudaStream_t stream) {
  MK_TRY(rmsnorm_check("mk_kernel_add_rmsnorm", rows, cols));
  if (rows == 0) return MK_OK;
  if (!residual || !out || !delta || !w) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_add_rmsnorm: null pointer");
  MK_LAUNCH(rmsnorm_kernel<true>, dim3((unsigned)rows), dim3(rmsnorm_threads(cols)), 0, stream, out, residual, delta,
            w, cols, eps);
  return mk_check_launch("mk_kernel_add_rmsnorm");
}
