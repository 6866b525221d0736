/* elementwise.cu - the small streaming ops: residual add, dtype conversion, last-row
 * pruning, KV-cache append. Grid-stride loops over size_t indices. */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"

#define EW_THREADS 256

/* ======================================================================= add == */

static __global__ void add_kernel(float *__restrict__ y, const float *__restrict__ x, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] += x[i];
}

extern "C" mk_status mk_kernel_add(float *y, const float *x, size_t n, cudaStream_t stream) {
  if (n == 0) return MK_OK;
  if (!y || !x) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_add: null pointer");
  MK_LAUNCH(add_kernel, dim3(mk_elementwise_blocks(n, EW_THREADS)), dim3(EW_THREADS), 0, stream, y, x, n);
  return mk_check_launch("mk_kernel_add");
}

/* =================================================================== convert == */

template <int S, int D>
static __global__ void convert_kernel(void *__restrict__ dst, const void *__restrict__ src, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (S == D) {
      if (S == MK_DTYPE_F32) static_cast<float *>(dst)[i] = static_cast<const float *>(src)[i];
      else static_cast<uint16_t *>(dst)[i] = static_cast<const uint16_t *>(src)[i];
      continue;
    }
    const float f = mk_load_as_f32<S>(src, i);
    if (D == MK_DTYPE_F32) static_cast<float *>(dst)[i] = f;
    else if (D == MK_DTYPE_F16) static_cast<uint16_t *>(dst)[i] = mk_dev_f32_to_f16(f);
    else static_cast<uint16_t *>(dst)[i] = mk_dev_f32_to_bf16(f);
  }
}

template <int S, int D>
static void launch_convert(void *dst, const void *src, size_t n, cudaStream_t stream) {
  MK_LAUNCH((convert_kernel<S, D>), dim3(mk_elementwise_blocks(n, EW_THREADS)), dim3(EW_THREADS), 0, stream, dst, src,
            n);
}

/* F32 <-> F16 / BF16 and same-dtype copies. F16 <-> BF16 goes through F32 (exact on the
 * way up, one rounding on the way down), as the CPU backend would do it. */
extern "C" mk_status mk_kernel_convert(void *dst, mk_dtype dst_dtype, const void *src, mk_dtype src_dtype, size_t n,
                                       cudaStream_t stream) {
  if (!mk_float_dtype(dst_dtype) || !mk_float_dtype(src_dtype))
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_convert: unsupported dtypes %d -> %d", (int)src_dtype,
                   (int)dst_dtype);
  if (n == 0) return MK_OK;
  if (!dst || !src) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_convert: null pointer");
#define MK_CONV_CASE(S, D)                                 \
  if (src_dtype == S && dst_dtype == D) {                  \
    launch_convert<S, D>(dst, src, n, stream);             \
    return mk_check_launch("mk_kernel_convert");           \
  }
  MK_CONV_CASE(MK_DTYPE_F32, MK_DTYPE_F16)
  MK_CONV_CASE(MK_DTYPE_F32, MK_DTYPE_BF16)
  MK_CONV_CASE(MK_DTYPE_F16, MK_DTYPE_F32)
  MK_CONV_CASE(MK_DTYPE_BF16, MK_DTYPE_F32)
  MK_CONV_CASE(MK_DTYPE_F16, MK_DTYPE_BF16)
  MK_CONV_CASE(MK_DTYPE_BF16, MK_DTYPE_F16)
  MK_CONV_CASE(MK_DTYPE_F32, MK_DTYPE_F32)
  MK_CONV_CASE(MK_DTYPE_F16, MK_DTYPE_F16)
  MK_CONV_CASE(MK_DTYPE_BF16, MK_DTYPE_BF16)
#undef MK_CONV_CASE
  return mk_fail(MK_ERR_INTERNAL, "mk_kernel_convert: unreachable dtype pair");
}

/* ================================================================== last row == */

static __global__ void copy_kernel(float *__restrict__ dst, const float *__restrict__ src, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
}

extern "C" mk_status mk_kernel_last_row(float *out, const float *x, size_t rows, size_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return mk_fail(MK_ERR_SHAPE, "mk_kernel_last_row: shape [%zu, %zu]", rows, cols);
  if (!out || !x) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_last_row: null pointer");
  MK_LAUNCH(copy_kernel, dim3(mk_elementwise_blocks(cols, EW_THREADS)), dim3(EW_THREADS), 0, stream, out,
            x + (rows - 1) * cols, cols);
  return mk_check_launch("mk_kernel_last_row");
}

/* ================================================================= KV append == */

/* Rows are contiguous in both the new K/V and the cache, so the append is two flat copies
 * of rows * kv_dim floats into the cache at row `past`. */
static __global__ void kv_append_kernel(float *__restrict__ k_dst, float *__restrict__ v_dst,
                                        const float *__restrict__ k, const float *__restrict__ v, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    k_dst[i] = k[i];
    v_dst[i] = v[i];
  }
}

extern "C" mk_status mk_kernel_kv_append(float *k_cache, float *v_cache, const float *k, const float *v, size_t past,
                                         size_t rows, size_t kv_dim, cudaStream_t stream) {
  if (kv_dim == 0) return mk_fail(MK_ERR_SHAPE, "mk_kernel_kv_append: zero kv_dim");
  if (rows == 0) return MK_OK;
  if (!k_cache || !v_cache || !k || !v) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_kv_append: null pointer");
  const size_t n = rows * kv_dim;
  MK_LAUNCH(kv_append_kernel, dim3(mk_elementwise_blocks(n, EW_THREADS)), dim3(EW_THREADS), 0, stream,
            k_cache + past * kv_dim, v_cache + past * kv_dim, k, v, n);
  return mk_check_launch("mk_kernel_kv_append");
}
