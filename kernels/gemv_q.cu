/* gemv_q.cu - decode matrix products with 1..MK_GEMV_MAX_ROWS activation rows and weights
 * kept in their GGUF block format on the device (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K,
 * Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS: the list in gguf_blocks.cuh), dequantized in registers:
 * y[r, o] = sum_k x[r, k] * dequant(w)[o, k], F32 accumulation.
 *
 * The weights are read once: one warp per output row o walks the row's blocks; each block
 * is cut into PARTS parts of 2*H values, lane u takes part u % PARTS of block u / PARTS, so
 * a warp step reads 32 consecutive parts (32 * 8 bytes of quants for the K-quants and Q8_0,
 * 32 * 4 for the other blocks of 32) and every lane has work even for short rows (576
 * columns = 18 blocks of 32 = 72 parts). Each weight is dequantized as the format defines
 * it (gguf_blocks.cuh: the reference's operand order) and multiplied into all R rows. */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"
#include "gguf_blocks.cuh"
#include "gemv_dot.cuh"


template <int T, int R>
static __global__ void gemvq_kernel(float *__restrict__ y /* [R, out_dim] */, const float *__restrict__ x /* [R, in_dim] */,
                                    const uint8_t *__restrict__ w /* [out_dim, in_dim / BE * BB] */, size_t in_dim,
                                    size_t out_dim) {
  const int lane = threadIdx.x & 31;
  const size_t o = (size_t)blockIdx.x * GEMVQ_WARPS + (threadIdx.x >> 5);
  if (o >= out_dim) return; /* whole warps leave together: no barrier follows */
  float acc[R];
  gemvq_dot<T, R>(acc, x, w + o * (in_dim / gemvq_fmt<T>::BE) * gemvq_fmt<T>::BB, in_dim, lane);
  if (lane == 0) {
    MK_UNROLL
    for (int r = 0; r < R; r++) y[(size_t)r * out_dim + o] = acc[r];
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

#define GEMVQ_IS(T) || ggml_type == T
extern "C" bool mk_kernel_gemv_q_supports(uint32_t ggml_type) { return false MK_GEMVQ_FORMATS(GEMVQ_IS); }
#undef GEMVQ_IS

extern "C" mk_status mk_kernel_gemv_q(float *y, const float *x, const void *w, uint32_t ggml_type, size_t rows,
                                      size_t in_dim, size_t out_dim, cudaStream_t stream) {
  if (!mk_kernel_gemv_q_supports(ggml_type))
    return mk_fail(MK_ERR_INVALID_ARGUMENT,
                   "mk_kernel_gemv_q: ggml type %u has no device GEMV (Q4_0-Q8_0, Q2_K-Q6_K, IQ4_NL, IQ4_XS)",
                   ggml_type);
  if (rows > MK_GEMV_MAX_ROWS)
    return mk_fail(MK_ERR_SHAPE, "mk_kernel_gemv_q: %zu rows exceed the decode limit %d", rows, MK_GEMV_MAX_ROWS);
  if (in_dim == 0) return mk_fail(MK_ERR_SHAPE, "mk_kernel_gemv_q: zero input width");
  if (out_dim / GEMVQ_WARPS >= 2147483647u)
    return mk_fail(MK_ERR_SHAPE, "mk_kernel_gemv_q: %zu outputs exceed the grid", out_dim);
  if (rows == 0 || out_dim == 0) return MK_OK;
  if (!y || !x || !w) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv_q: null pointer");
#define GEMVQ_LAUNCH(T) \
  case T: return launch_gemvq<T>(y, x, w, rows, in_dim, out_dim, stream);
  switch (ggml_type) {
    MK_GEMVQ_FORMATS(GEMVQ_LAUNCH)
    default: return mk_fail(MK_ERR_INTERNAL, "mk_kernel_gemv_q: type %u", ggml_type);
  }
#undef GEMVQ_LAUNCH
}
