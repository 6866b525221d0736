/* gemv_q.cu - decode matrix products with 1..MK_GEMV_MAX_ROWS activation rows and weights
 * kept in their GGUF block format on the device (Q8_0, Q4_1, Q4_K), dequantized in
 * registers: y[r, o] = sum_k x[r, k] * dequant(w)[o, k], F32 accumulation.
 *
 * The weights are read once: one warp per output row o walks the row's blocks; each block
 * is cut into PARTS parts of 2*H values, lane u takes part u % PARTS of block u / PARTS, so
 * a warp step reads 32 consecutive parts (32 * 8 bytes of quants: Q8_0 and Q4_K, 32 * 4:
 * Q4_1) and every lane has work even for short rows (576 columns = 18 Q8_0 blocks = 72
 * parts). Each weight is dequantized as the format defines it (d * q, d * q + m, d*sc * q
 * - dmin*mn, the reference's operand order) and multiplied into all R rows.
 *
 * Block layouts (gguf_blocks.cuh; host/gguf_dequant.c has the same table in the dequantizers):
 *   Q8_0  34 bytes / 32 values: d f16, qs int8[32]                       y[j] = qs[j] * d
 *   Q4_1  20 bytes / 32 values: d f16, m f16, qs[16] (j low nibble, j+16 high) y = d*q + m
 *   Q4_K 144 bytes / 256 values: d f16, dmin f16, scales[12] (6-bit sc/mn of 8 groups of
 *        32), qs[128]: byte 32g+l holds value 64g+l (low) and 64g+32+l (high). */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"
#include "gguf_blocks.cuh"

#define GEMVQ_WARPS 4 /* output rows per block */

template <int T, int R>
static __global__ void gemvq_kernel(float *__restrict__ y /* [R, out_dim] */, const float *__restrict__ x /* [R, in_dim] */,
                                    const uint8_t *__restrict__ w /* [out_dim, in_dim / BE * BB] */, size_t in_dim,
                                    size_t out_dim) {
  typedef gemvq_fmt<T> F;
  const int lane = threadIdx.x & 31;
  const size_t o = (size_t)blockIdx.x * GEMVQ_WARPS + (threadIdx.x >> 5);
  if (o >= out_dim) return; /* whole warps leave together: no barrier follows */
  float acc[R];
  MK_UNROLL
  for (int r = 0; r < R; r++) acc[r] = 0.0f;
  const size_t n_blocks = in_dim / F::BE;
  const uint8_t *wrow = w + o * n_blocks * F::BB;
  const size_t units = n_blocks * F::PARTS;
  for (size_t u = (size_t)lane; u < units; u += MK_WARP) {
    const size_t b = u / F::PARTS;
    float wa[F::H], wb[F::H];
    int ka, kb;
    F::part(wrow + b * F::BB, (int)(u % F::PARTS), wa, wb, ka, kb);
    const float *xb = x + b * F::BE;
    MK_UNROLL
    for (int r = 0; r < R; r++) {
      const float *xr = xb + (size_t)r * in_dim;
      float s = acc[r];
      MK_UNROLL
      for (int i = 0; i < F::H; i++) s += __ldg(xr + ka + i) * wa[i];
      MK_UNROLL
      for (int i = 0; i < F::H; i++) s += __ldg(xr + kb + i) * wb[i];
      acc[r] = s;
    }
  }
  MK_UNROLL
  for (int r = 0; r < R; r++) {
    const float s = mk_warp_sum(acc[r]);
    if (lane == 0) y[(size_t)r * out_dim + o] = s;
  }
}

template <int T, int R>
static mk_status launch_gemvq_r(float *y, const float *x, const void *w, size_t in_dim, size_t out_dim,
                                cudaStream_t stream) {
  MK_LAUNCH((gemvq_kernel<T, R>), dim3(mk_ceil_div_u(out_dim, GEMVQ_WARPS)), dim3(GEMVQ_WARPS * MK_WARP), 0, stream, y,
            x, static_cast<const uint8_t *>(w), in_dim, out_dim);
  return mk_check_launch("mk_kernel_gemv_q");
}

template <int T>
static mk_status launch_gemvq(float *y, const float *x, const void *w, size_t rows, size_t in_dim, size_t out_dim,
                              cudaStream_t stream) {
  typedef gemvq_fmt<T> F;
  if (in_dim % F::BE != 0)
    return mk_fail(MK_ERR_SHAPE, "mk_kernel_gemv_q: input width %zu is not a multiple of the block size %d", in_dim,
                   (int)F::BE);
  if (((uintptr_t)w % F::ALIGN) != 0)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv_q: weights not %d-byte aligned", (int)F::ALIGN);
  switch (rows) {
    case 1: return launch_gemvq_r<T, 1>(y, x, w, in_dim, out_dim, stream);
    case 2: return launch_gemvq_r<T, 2>(y, x, w, in_dim, out_dim, stream);
    case 3: return launch_gemvq_r<T, 3>(y, x, w, in_dim, out_dim, stream);
    case 4: return launch_gemvq_r<T, 4>(y, x, w, in_dim, out_dim, stream);
    case 5: return launch_gemvq_r<T, 5>(y, x, w, in_dim, out_dim, stream);
    case 6: return launch_gemvq_r<T, 6>(y, x, w, in_dim, out_dim, stream);
    case 7: return launch_gemvq_r<T, 7>(y, x, w, in_dim, out_dim, stream);
    default: return launch_gemvq_r<T, 8>(y, x, w, in_dim, out_dim, stream);
  }
}

extern "C" bool mk_kernel_gemv_q_supports(uint32_t ggml_type) {
  return ggml_type == GGML_Q8_0 || ggml_type == GGML_Q4_1 || ggml_type == GGML_Q4_K;
}

extern "C" mk_status mk_kernel_gemv_q(float *y, const float *x, const void *w, uint32_t ggml_type, size_t rows,
                                      size_t in_dim, size_t out_dim, cudaStream_t stream) {
  if (!mk_kernel_gemv_q_supports(ggml_type))
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv_q: ggml type %u has no device GEMV (Q8_0, Q4_1, Q4_K)",
                   ggml_type);
  if (rows > MK_GEMV_MAX_ROWS)
    return mk_fail(MK_ERR_SHAPE, "mk_kernel_gemv_q: %zu rows exceed the decode limit %d", rows, MK_GEMV_MAX_ROWS);
  if (in_dim == 0) return mk_fail(MK_ERR_SHAPE, "mk_kernel_gemv_q: zero input width");
  if (out_dim / GEMVQ_WARPS >= 2147483647u)
    return mk_fail(MK_ERR_SHAPE, "mk_kernel_gemv_q: %zu outputs exceed the grid", out_dim);
  if (rows == 0 || out_dim == 0) return MK_OK;
  if (!y || !x || !w) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv_q: null pointer");
  switch (ggml_type) {
    case GGML_Q8_0: return launch_gemvq<GGML_Q8_0>(y, x, w, rows, in_dim, out_dim, stream);
    case GGML_Q4_1: return launch_gemvq<GGML_Q4_1>(y, x, w, rows, in_dim, out_dim, stream);
    default: return launch_gemvq<GGML_Q4_K>(y, x, w, rows, in_dim, out_dim, stream);
  }
}
