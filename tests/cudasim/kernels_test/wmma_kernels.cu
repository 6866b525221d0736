/* wmma_kernels.cu - the nvcuda::wmma stand-in (cudasim_wmma.h) exercised: products in every
 * layout against a plain loop (test_cudasim.cpp), and the misuses it must catch. */
#include "mk_cuda_compat.h"

#include "test_kernels.h"

namespace wmma = nvcuda::wmma;

/* Each warp: D = post_scale * (A B + C), A 16 x (16 ktiles), B (16 ktiles) x 16, with C loaded
 * (c != nullptr, layout c_col) or filled with c_fill; D stored at d + warp * 16 * ldc. */
template <class T, class LA, class LB>
static __global__ void wmma_gemm_kernel(float *d, const T *a, const T *b, const float *c, float c_fill, int ktiles,
                                        unsigned lda, unsigned ldb, unsigned ldc, int c_col, int d_col,
                                        float post_scale) {
  const bool a_row = std::is_same<LA, wmma::row_major>::value, b_row = std::is_same<LB, wmma::row_major>::value;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  if (c) wmma::load_matrix_sync(acc, c, ldc, c_col ? wmma::mem_col_major : wmma::mem_row_major);
  else wmma::fill_fragment(acc, c_fill);
  for (int kt = 0; kt < ktiles; ++kt) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> fb;
    wmma::load_matrix_sync(fa, a + (a_row ? kt * 16 : kt * 16 * lda), lda);
    wmma::load_matrix_sync(fb, b + (b_row ? kt * 16 * ldb : kt * 16), ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  for (int i = 0; i < acc.num_elements; ++i) acc.x[i] *= post_scale; /* uniform: allowed */
  wmma::store_matrix_sync(d + (threadIdx.x / 32) * 16 * ldc, acc, ldc, d_col ? wmma::mem_col_major : wmma::mem_row_major);
}

template <class T>
static cudaError_t gemm(float *d, const T *a, const T *b, const float *c, float c_fill, int ktiles, bool a_row,
                        bool b_row, unsigned lda, unsigned ldb, unsigned ldc, bool c_col, bool d_col,
                        float post_scale, int warps, cudaStream_t s) {
  using R = wmma::row_major;
  using C = wmma::col_major;
  const dim3 block(32 * warps);
  if (a_row && b_row)
    MK_LAUNCH((wmma_gemm_kernel<T, R, R>), 1, block, 0, s, d, a, b, c, c_fill, ktiles, lda, ldb, ldc, c_col, d_col, post_scale);
  else if (a_row)
    MK_LAUNCH((wmma_gemm_kernel<T, R, C>), 1, block, 0, s, d, a, b, c, c_fill, ktiles, lda, ldb, ldc, c_col, d_col, post_scale);
  else if (b_row)
    MK_LAUNCH((wmma_gemm_kernel<T, C, R>), 1, block, 0, s, d, a, b, c, c_fill, ktiles, lda, ldb, ldc, c_col, d_col, post_scale);
  else
    MK_LAUNCH((wmma_gemm_kernel<T, C, C>), 1, block, 0, s, d, a, b, c, c_fill, ktiles, lda, ldb, ldc, c_col, d_col, post_scale);
  return cudaGetLastError();
}

cudaError_t tk_wmma_gemm_bf16(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *b, const float *c, float c_fill,
                              int ktiles, bool a_row, bool b_row, unsigned lda, unsigned ldb, unsigned ldc, bool c_col,
                              bool d_col, float post_scale, int warps, cudaStream_t s) {
  return gemm(d, a, b, c, c_fill, ktiles, a_row, b_row, lda, ldb, ldc, c_col, d_col, post_scale, warps, s);
}
cudaError_t tk_wmma_gemm_f16(float *d, const __half *a, const __half *b, const float *c, float c_fill, int ktiles,
                             bool a_row, bool b_row, unsigned lda, unsigned ldb, unsigned ldc, bool c_col, bool d_col,
                             float post_scale, int warps, cudaStream_t s) {
  return gemm(d, a, b, c, c_fill, ktiles, a_row, b_row, lda, ldb, ldc, c_col, d_col, post_scale, warps, s);
}

static __device__ unsigned char *aligned32(unsigned char *p) {
  return reinterpret_cast<unsigned char *>((reinterpret_cast<uintptr_t>(p) + 31) & ~static_cast<uintptr_t>(31));
}

/* The lanes stage A (row-major 16 x 16) in shared memory, then the warp loads it as
 * matrix_a and multiplies by the identity: d = A. Without the __syncwarp between the lanes'
 * writes and the load, a lane reads elements other lanes have not written yet. */
static __global__ void wmma_staged_load_kernel(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *eye, int sync) {
  MK_DYNAMIC_SHARED(unsigned char, raw);
  __nv_bfloat16 *s = reinterpret_cast<__nv_bfloat16 *>(aligned32(raw));
  for (int i = threadIdx.x; i < 256; i += 32) s[i] = a[i];
  if (sync) __syncwarp();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(fa, s, 16);
  wmma::load_matrix_sync(fb, eye, 16);
  wmma::fill_fragment(acc, 0.0f);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

cudaError_t tk_wmma_staged_load(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *eye, bool sync, cudaStream_t s) {
  MK_LAUNCH(wmma_staged_load_kernel, 1, 32, 256 * 2 + 32, s, d, a, eye, (int)sync);
  return cudaGetLastError();
}

/* The warp stores a filled accumulator to shared memory; each lane then sums its row of it
 * (lane < 16). Without the __syncwarp after the store, a lane reads elements other lanes
 * have not stored yet (each lane stores only the elements it holds). */
static __global__ void wmma_store_then_read_kernel(float *out, int sync) {
  MK_DYNAMIC_SHARED(unsigned char, raw);
  float *s = reinterpret_cast<float *>(aligned32(raw));
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 2.0f);
  wmma::store_matrix_sync(s, acc, 16, wmma::mem_row_major);
  if (sync) __syncwarp();
  float sum = 0.0f;
  for (int j = 0; j < 16; ++j) sum += s[(threadIdx.x & 15) * 16 + j];
  out[threadIdx.x] = sum;
}

cudaError_t tk_wmma_store_then_read(float *out, bool sync, cudaStream_t s) {
  MK_LAUNCH(wmma_store_then_read_kernel, 1, 32, 256 * 4 + 32, s, out, (int)sync);
  return cudaGetLastError();
}

/* Only half the warp reaches the warp-collective fill_fragment (the rest returned). */
static __global__ void wmma_half_warp_kernel(float *out) {
  if (threadIdx.x >= 16) return;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 1.0f);
  wmma::store_matrix_sync(out, acc, 16, wmma::mem_row_major);
}

cudaError_t tk_wmma_half_warp(float *out, cudaStream_t s) {
  MK_LAUNCH(wmma_half_warp_kernel, 1, 32, 0, s, out);
  return cudaGetLastError();
}

/* A fragment load from a pointer that is not 32-byte aligned (or with ldm not a multiple
 * of 8 16-bit elements). */
static __global__ void wmma_misaligned_kernel(float *out, const __half *a, unsigned offset, unsigned ldm) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
  wmma::load_matrix_sync(fa, a + offset, ldm);
  out[threadIdx.x] = __half2float(fa.x[0]);
}

cudaError_t tk_wmma_misaligned(float *out, const __half *a, unsigned offset, unsigned ldm, cudaStream_t s) {
  MK_LAUNCH(wmma_misaligned_kernel, 1, 32, 0, s, out, a, offset, ldm);
  return cudaGetLastError();
}
