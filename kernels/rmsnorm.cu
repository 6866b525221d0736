/* rmsnorm.cu - RMSNorm and the fused residual-add + RMSNorm.
 * One block per row; sum of squares in float (warp shuffles, then shared memory across
 * warps); 256 threads below 1024 columns, 1024 above.
 *
 * The _lowp entries also write the output converted to F16 or BF16 (round to nearest even,
 * the bits mk_kernel_convert gives the F32 output): the input of a following F16/BF16 GEMM,
 * without a conversion launch of its own. */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"

/* ADD: residual += delta first (written back), then normalise the updated residual.
 * LD: 0, or MK_DTYPE_F16 / MK_DTYPE_BF16: lowp gets the output in that dtype too. */
template <bool ADD, int LD>
static __global__ void __launch_bounds__(1024) rmsnorm_kernel(float *__restrict__ out /* [rows, cols] */,
                                      uint16_t *__restrict__ lowp /* [rows, cols], LD only */,
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
  for (size_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = src[c] * scale * w[c];
    o[c] = v;
    if (LD == MK_DTYPE_BF16) lowp[off + c] = mk_dev_f32_to_bf16(v);
    else if (LD == MK_DTYPE_F16) lowp[off + c] = mk_dev_f32_to_f16(v);
  }
}

static unsigned rmsnorm_threads(size_t cols) { return cols <= 32 ? 32u : cols < 1024 ? 256u : 1024u; }

static mk_status rmsnorm_check(const char *what, size_t rows, size_t cols) {
  if (cols == 0) return mk_fail(MK_ERR_SHAPE, "%s: zero columns", what);
  if (rows > 2147483647u) return mk_fail(MK_ERR_SHAPE, "%s: %zu rows exceed the grid", what, rows);
  return MK_OK;
}

/* Launch with the low-precision copy (lowp non-null) or without. */
template <bool ADD>
static void rmsnorm_launch(float *out, float *residual, const float *x, const float *w, void *lowp,
                           mk_dtype lowp_dtype, size_t rows, size_t cols, float eps, cudaStream_t stream) {
  const dim3 grid((unsigned)rows), block(rmsnorm_threads(cols));
  uint16_t *l = static_cast<uint16_t *>(lowp);
  if (!lowp) MK_LAUNCH((rmsnorm_kernel<ADD, 0>), grid, block, 0, stream, out, l, residual, x, w, cols, eps);
  else if (lowp_dtype == MK_DTYPE_BF16)
    MK_LAUNCH((rmsnorm_kernel<ADD, MK_DTYPE_BF16>), grid, block, 0, stream, out, l, residual, x, w, cols, eps);
  else MK_LAUNCH((rmsnorm_kernel<ADD, MK_DTYPE_F16>), grid, block, 0, stream, out, l, residual, x, w, cols, eps);
}

static mk_status rmsnorm_lowp_check(const char *what, const void *lowp, mk_dtype lowp_dtype) {
  if (lowp && lowp_dtype != MK_DTYPE_F16 && lowp_dtype != MK_DTYPE_BF16)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s: low-precision dtype %d is not F16/BF16", what, (int)lowp_dtype);
  return MK_OK;
}

extern "C" mk_status mk_kernel_rmsnorm_lowp(float *out, void *lowp, mk_dtype lowp_dtype, const float *x,
                                            const float *w, size_t rows, size_t cols, float eps, cudaStream_t stream) {
  MK_TRY(rmsnorm_check("mk_kernel_rmsnorm", rows, cols));
  MK_TRY(rmsnorm_lowp_check("mk_kernel_rmsnorm", lowp, lowp_dtype));
  if (rows == 0) return MK_OK;
  if (!out || !x || !w) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_rmsnorm: null pointer");
  rmsnorm_launch<false>(out, nullptr, x, w, lowp, lowp_dtype, rows, cols, eps, stream);
  return mk_check_launch("mk_kernel_rmsnorm");
}

extern "C" mk_status mk_kernel_add_rmsnorm_lowp(float *residual, float *out, void *lowp, mk_dtype lowp_dtype,
                                                const float *delta, const float *w, size_t rows, size_t cols,
                                                float eps, cudaStream_t stream) {
  MK_TRY(rmsnorm_check("mk_kernel_add_rmsnorm", rows, cols));
  MK_TRY(rmsnorm_lowp_check("mk_kernel_add_rmsnorm", lowp, lowp_dtype));
  if (rows == 0) return MK_OK;
  if (!residual || !out || !delta || !w) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_add_rmsnorm: null pointer");
  rmsnorm_launch<true>(out, residual, delta, w, lowp, lowp_dtype, rows, cols, eps, stream);
  return mk_check_launch("mk_kernel_add_rmsnorm");
}

extern "C" mk_status mk_kernel_rmsnorm(float *out, const float *x, const float *w, size_t rows, size_t cols,
                                       float eps, cudaStream_t stream) {
  return mk_kernel_rmsnorm_lowp(out, nullptr, MK_DTYPE_F32, x, w, rows, cols, eps, stream);
}

extern "C" mk_status mk_kernel_add_rmsnorm(float *residual, float *out, const float *delta, const float *w,
                                           size_t rows, size_t cols, float eps, cudaStream_t stream) {
  return mk_kernel_add_rmsnorm_lowp(residual, out, nullptr, MK_DTYPE_F32, delta, w, rows, cols, eps, stream);
}
