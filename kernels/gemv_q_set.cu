/* gemv_q_set.cu - the native decode GEMV's fused launches: Q, K and V in one launch, and gate
 * and up with SwiGLU in one launch, over matrices each in its own stored format (a block
 * format of gguf_blocks.cuh, or BF16 for a matrix whose source format has no device GEMV).
 * Apart from gemv_q.cu (the single products) so the two compile side by side: every format
 * inlined into these kernels, for every row count, is most of the kernels' build time. */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"
#include "gguf_blocks.cuh"
#include "gemv_dot.cuh"

/* ====================================================== fused native launches == */
/* Q, K and V (one launch) and gate/up with SwiGLU (one launch) over the matrices of a native
 * weight set: each matrix in its own stored format (a block type above, or BF16 for a matrix
 * whose source format has no device GEMV), dispatched per warp (a warp's output row belongs
 * to one matrix, so the branch is uniform). Each product calls the dot function that its
 * separate launch calls (mk_kernel_gemv_q, or mk_kernel_gemv on BF16 with the same vector
 * choice), so the fused launches give the bits of the separate ones. */

#define GEMVQ_MAX_SET 3
struct gemvq_set {
  float *y[GEMVQ_MAX_SET];          /* [R, out[i]] (SwiGLU: y[0] only) */
  const uint8_t *w[GEMVQ_MAX_SET];  /* [out[i], in_dim] in type[i] */
  size_t out[GEMVQ_MAX_SET];
  uint32_t type[GEMVQ_MAX_SET];     /* a block format of gguf_blocks.cuh, or GGML_BF16 */
  bool vec[GEMVQ_MAX_SET];          /* BF16: 16-byte loads, as mk_kernel_gemv would choose */
};

/* Fields of the set are read with gemv_pick3 (gemv_dot.cuh): constant indices only. */
static_assert(GEMVQ_MAX_SET == 3, "gemv_pick3 picks among three");

template <int T>
static __device__ __forceinline__ const uint8_t *gemvq_row_ptr(const uint8_t *w, size_t o, size_t in_dim) {
  return w + o * (in_dim / gemvq_fmt<T>::BE) * gemvq_fmt<T>::BB;
}

/* Row o of matrix m of the set, by one warp. */
template <int R>
static __device__ __forceinline__ void gemvq_set_dot(float (&acc)[R], const gemvq_set &set, int m,
                                                     const float *__restrict__ x, size_t o, size_t in_dim, int lane) {
  const uint8_t *w = gemv_pick3(set.w, m);
#define GEMVQ_SET_DOT(T) \
  case T: gemvq_dot<T, R>(acc, x, gemvq_row_ptr<T>(w, o, in_dim), in_dim, lane); break;
  switch (gemv_pick3(set.type, m)) {
    MK_GEMVQ_FORMATS(GEMVQ_SET_DOT)
#undef GEMVQ_SET_DOT
    default: {
      const char *row = reinterpret_cast<const char *>(w) + o * in_dim * 2;
      if (gemv_pick3(set.vec, m)) gemv_dot<MK_DTYPE_BF16, R, true>(acc, x, row, in_dim, lane);
      else gemv_dot<MK_DTYPE_BF16, R, false>(acc, x, row, in_dim, lane);
    }
  }
}

template <int R>
static __global__ void gemvq_multi_kernel(gemvq_set set, const float *__restrict__ x /* [R, in_dim] */, size_t in_dim,
                                          size_t total_out) {
  const int lane = threadIdx.x & 31;
  size_t o = (size_t)blockIdx.x * GEMVQ_WARPS + (threadIdx.x >> 5);
  if (o >= total_out) return; /* whole warps leave together: no barrier follows */
  const int m = gemv_set_locate(o, set.out);
  float acc[R];
  gemvq_set_dot<R>(acc, set, m, x, o, in_dim, lane);
  if (lane == 0) {
    float *y = gemv_pick3(set.y, m);
    const size_t out = gemv_pick3(set.out, m);
    MK_UNROLL
    for (int r = 0; r < R; r++) y[(size_t)r * out + o] = acc[r];
  }
}

/* out = silu(x . w_gate) * (x . w_up), the operation order of swiglu.cu. */
template <int R>
static __global__ void gemvq_swiglu_kernel(gemvq_set set /* w[0] gate, w[1] up, y[0] out [R, out[0]] */,
                                           const float *__restrict__ x /* [R, in_dim] */, size_t in_dim) {
  const int lane = threadIdx.x & 31;
  const size_t out_dim = set.out[0];
  const size_t o = (size_t)blockIdx.x * GEMVQ_WARPS + (threadIdx.x >> 5);
  if (o >= out_dim) return; /* whole warps leave together: no barrier follows */
  float g[R], u[R];
  gemvq_set_dot<R>(g, set, 0, x, o, in_dim, lane);
  gemvq_set_dot<R>(u, set, 1, x, o, in_dim, lane);
  if (lane == 0) {
    MK_UNROLL
    for (int r = 0; r < R; r++) set.y[0][(size_t)r * out_dim + o] = __fmul_rn(g[r] / (1.0f + expf(-g[r])), u[r]);
  }
}

template <int R>
static mk_status launch_gemvq_set_r(const gemvq_set &S, bool swiglu, const float *x, size_t in_dim, size_t total,
                                    cudaStream_t stream) {
  const dim3 grid(mk_ceil_div_u(total, GEMVQ_WARPS)), block(GEMVQ_WARPS * MK_WARP);
  if (swiglu) {
    MK_LAUNCH(gemvq_swiglu_kernel<R>, grid, block, 0, stream, S, x, in_dim);
    return mk_check_launch("mk_kernel_gemv_q_swiglu");
  }
  MK_LAUNCH(gemvq_multi_kernel<R>, grid, block, 0, stream, S, x, in_dim, total);
  return mk_check_launch("mk_kernel_gemv_q_multi");
}

static mk_status launch_gemvq_set(const gemvq_set &S, bool swiglu, const float *x, size_t rows, size_t in_dim,
                                  size_t total, cudaStream_t stream) {
  switch (rows) {
    case 1: return launch_gemvq_set_r<1>(S, swiglu, x, in_dim, total, stream);
    case 2: return launch_gemvq_set_r<2>(S, swiglu, x, in_dim, total, stream);
    case 3: return launch_gemvq_set_r<3>(S, swiglu, x, in_dim, total, stream);
    case 4: return launch_gemvq_set_r<4>(S, swiglu, x, in_dim, total, stream);
    case 5: return launch_gemvq_set_r<5>(S, swiglu, x, in_dim, total, stream);
    case 6: return launch_gemvq_set_r<6>(S, swiglu, x, in_dim, total, stream);
    case 7: return launch_gemvq_set_r<7>(S, swiglu, x, in_dim, total, stream);
    default: return launch_gemvq_set_r<8>(S, swiglu, x, in_dim, total, stream);
  }
}

/* Matrix i of a set: its format is one the set kernels read, in_dim fits its blocks, its
 * pointer is aligned for them; records the BF16 vector choice. */
static mk_status gemvq_set_member(const char *what, gemvq_set &S, size_t i, const void *w, uint32_t type,
                                  const float *x, size_t in_dim) {
  S.w[i] = static_cast<const uint8_t *>(w);
  S.type[i] = type;
  S.vec[i] = false;
  size_t be = 1, align = 1;
#define GEMVQ_LAYOUT(T) \
  case T: be = gemvq_fmt<T>::BE, align = gemvq_fmt<T>::ALIGN; break;
  switch (type) {
    MK_GEMVQ_FORMATS(GEMVQ_LAYOUT)
#undef GEMVQ_LAYOUT
    case GGML_BF16: align = 2; break;
    default:
      return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s: matrix %zu has ggml type %u (a device block format or BF16)",
                     what, i, type);
  }
  if (in_dim % be != 0)
    return mk_fail(MK_ERR_SHAPE, "%s: input width %zu is not a multiple of matrix %zu's block size %zu", what, in_dim,
                   i, be);
  if (!w) return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s: null pointer", what);
  if (((uintptr_t)w % align) != 0)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s: matrix %zu not %zu-byte aligned", what, i, align);
  /* mk_kernel_gemv's choice for one BF16 matrix (gemv.cu launch_gemv_r) */
  if (type == GGML_BF16) S.vec[i] = in_dim % 8 == 0 && ((uintptr_t)x & 15u) == 0 && ((uintptr_t)w & 15u) == 0;
  return MK_OK;
}

static mk_status gemvq_set_check(const char *what, size_t rows, size_t in_dim, size_t total_out, bool *skip) {
  *skip = false;
  if (rows > MK_GEMV_MAX_ROWS)
    return mk_fail(MK_ERR_SHAPE, "%s: %zu rows exceed the decode limit %d", what, rows, MK_GEMV_MAX_ROWS);
  if (in_dim == 0) return mk_fail(MK_ERR_SHAPE, "%s: zero input width", what);
  if (total_out / GEMVQ_WARPS >= 2147483647u)
    return mk_fail(MK_ERR_SHAPE, "%s: %zu outputs exceed the grid", what, total_out);
  *skip = rows == 0 || total_out == 0;
  return MK_OK;
}

extern "C" bool mk_kernel_gemv_q_set_supports(uint32_t ggml_type) {
  return mk_kernel_gemv_q_supports(ggml_type) || ggml_type == GGML_BF16;
}

extern "C" mk_status mk_kernel_gemv_q_multi(size_t n, float *const *y, const void *const *w, const uint32_t *ggml_type,
                                            const size_t *out_dim, const float *x, size_t rows, size_t in_dim,
                                            cudaStream_t stream) {
  const char *what = "mk_kernel_gemv_q_multi";
  if (n == 0 || n > GEMVQ_MAX_SET)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s: %zu matrices (1..%d)", what, n, GEMVQ_MAX_SET);
  if (!y || !w || !ggml_type || !out_dim) return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s: null pointer", what);
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += out_dim[i];
  bool skip;
  MK_TRY(gemvq_set_check(what, rows, in_dim, total, &skip));
  if (skip) return MK_OK;
  if (!x) return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s: null pointer", what);
  gemvq_set S = {};
  for (size_t i = 0; i < n; i++) {
    S.out[i] = out_dim[i];
    S.y[i] = y[i];
    if (!out_dim[i]) continue; /* an empty matrix: no warp reaches it */
    if (!y[i]) return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s: null pointer", what);
    MK_TRY(gemvq_set_member(what, S, i, w[i], ggml_type[i], x, in_dim));
  }
  return launch_gemvq_set(S, false, x, rows, in_dim, total, stream);
}

extern "C" mk_status mk_kernel_gemv_q_swiglu(float *out, const float *x, const void *w_gate, uint32_t gate_type,
                                             const void *w_up, uint32_t up_type, size_t rows, size_t in_dim,
                                             size_t out_dim, cudaStream_t stream) {
  const char *what = "mk_kernel_gemv_q_swiglu";
  bool skip;
  MK_TRY(gemvq_set_check(what, rows, in_dim, out_dim, &skip));
  if (skip) return MK_OK;
  if (!out || !x) return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s: null pointer", what);
  gemvq_set S = {};
  S.y[0] = out;
  S.out[0] = out_dim;
  MK_TRY(gemvq_set_member(what, S, 0, w_gate, gate_type, x, in_dim));
  MK_TRY(gemvq_set_member(what, S, 1, w_up, up_type, x, in_dim));
  return launch_gemvq_set(S, true, x, rows, in_dim, out_dim, stream);
}
