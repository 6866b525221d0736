/* gemv.cu - decode matrix products with 1..MK_GEMV_MAX_ROWS activation rows and dense
 * weights (F32, F16, BF16): y[r, o] = sum_k x[r, k] * w[o, k], F32 accumulation; also up to
 * three products sharing the input in one launch (Q, K, V) and the gate and up products
 * with SwiGLU applied in the same launch.
 *
 * Decode is bound by reading the weights, so each weight byte is read once: one warp per
 * output row o reads w[o, :] in 16-byte vectors (consecutive lanes, consecutive vectors:
 * one coalesced 512-byte transaction per warp step) and multiplies every element into all
 * R activation rows held in R register accumulators. The activations (R x in_dim floats,
 * at most a few hundred KiB) stay in L1/L2 across the warps of a block and the blocks.
 * The order of the sums is fixed (per-lane partial sums, then the same xor tree), so the
 * result is deterministic and identical between calls with the same shapes. */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"
#include "gemv_dot.cuh"

#define GEMV_WARPS 4 /* output rows per block */

/* Up to GEMV_MAX_SET weight matrices sharing one input (Q, K and V): one launch, the
 * output rows of all of them numbered one after the other. */
#define GEMV_MAX_SET 3
static_assert(GEMV_MAX_SET == 3, "gemv_pick3 picks among three");
struct gemv_set {
  float *y[GEMV_MAX_SET];       /* [R, out[i]] */
  const void *w[GEMV_MAX_SET];  /* [out[i], in_dim] */
  size_t out[GEMV_MAX_SET];
};

template <int D, int R, bool VEC>
static __global__ void gemv_kernel(gemv_set set, const float *__restrict__ x /* [R, in_dim] */, size_t in_dim,
                                   size_t total_out) {
  const int lane = threadIdx.x & 31;
  size_t o = (size_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  if (o >= total_out) return; /* whole warps leave together: no barrier follows */
  const int m = gemv_set_locate(o, set.out);
  const size_t esize = D == MK_DTYPE_F32 ? 4 : 2;
  float acc[R];
  gemv_dot<D, R, VEC>(acc, x, static_cast<const char *>(gemv_pick3(set.w, m)) + o * in_dim * esize, in_dim, lane);
  if (lane == 0) {
    float *y = gemv_pick3(set.y, m);
    const size_t out = gemv_pick3(set.out, m);
    MK_UNROLL
    for (int r = 0; r < R; r++) y[(size_t)r * out + o] = acc[r];
  }
}

/* out = silu(x . w_gate) * (x . w_up) (SwiGLU over the gate and up products, the operation
 * order of swiglu.cu): the two products and the activation in one launch. */
template <int D, int R, bool VEC>
static __global__ void gemv_swiglu_kernel(float *__restrict__ out /* [R, out_dim] */,
                                          const float *__restrict__ x /* [R, in_dim] */, const void *__restrict__ wg,
                                          const void *__restrict__ wu, size_t in_dim, size_t out_dim) {
  const int lane = threadIdx.x & 31;
  const size_t o = (size_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  if (o >= out_dim) return; /* whole warps leave together: no barrier follows */
  const size_t esize = D == MK_DTYPE_F32 ? 4 : 2;
  float g[R], u[R];
  gemv_dot<D, R, VEC>(g, x, static_cast<const char *>(wg) + o * in_dim * esize, in_dim, lane);
  gemv_dot<D, R, VEC>(u, x, static_cast<const char *>(wu) + o * in_dim * esize, in_dim, lane);
  if (lane == 0) {
    MK_UNROLL
    for (int r = 0; r < R; r++) out[(size_t)r * out_dim + o] = __fmul_rn(g[r] / (1.0f + expf(-g[r])), u[r]);
  }
}

/* Which kernel a launch takes. */
enum gemv_kind { GEMV_SET, GEMV_SWIGLU };

struct gemv_launch {
  enum gemv_kind kind;
  gemv_set set;      /* GEMV_SET: n matrices; GEMV_SWIGLU: w[0] gate, w[1] up, y[0] out, out[0] */
  size_t n;
  const float *x;
  size_t in_dim;
};

template <int D, int R>
static mk_status launch_gemv_r(const gemv_launch &L, cudaStream_t stream) {
  const size_t per = D == MK_DTYPE_F32 ? 4 : 8;
  bool vec = L.in_dim % per == 0 && ((uintptr_t)L.x & 15u) == 0;
  size_t total = 0;
  for (size_t i = 0; i < L.n; i++) {
    vec = vec && ((uintptr_t)L.set.w[i] & 15u) == 0;
    total += L.set.out[i];
  }
  if (L.kind == GEMV_SWIGLU) total = L.set.out[0];
  const dim3 grid(mk_ceil_div_u(total, GEMV_WARPS)), block(GEMV_WARPS * MK_WARP);
  if (L.kind == GEMV_SWIGLU) {
    if (vec)
      MK_LAUNCH((gemv_swiglu_kernel<D, R, true>), grid, block, 0, stream, L.set.y[0], L.x, L.set.w[0], L.set.w[1],
                L.in_dim, total);
    else
      MK_LAUNCH((gemv_swiglu_kernel<D, R, false>), grid, block, 0, stream, L.set.y[0], L.x, L.set.w[0], L.set.w[1],
                L.in_dim, total);
    return mk_check_launch("mk_kernel_gemv_swiglu");
  }
  if (vec) MK_LAUNCH((gemv_kernel<D, R, true>), grid, block, 0, stream, L.set, L.x, L.in_dim, total);
  else MK_LAUNCH((gemv_kernel<D, R, false>), grid, block, 0, stream, L.set, L.x, L.in_dim, total);
  return mk_check_launch("mk_kernel_gemv");
}

template <int D>
static mk_status launch_gemv(const gemv_launch &L, size_t rows, cudaStream_t stream) {
  switch (rows) {
    case 1: return launch_gemv_r<D, 1>(L, stream);
    case 2: return launch_gemv_r<D, 2>(L, stream);
    case 3: return launch_gemv_r<D, 3>(L, stream);
    case 4: return launch_gemv_r<D, 4>(L, stream);
    case 5: return launch_gemv_r<D, 5>(L, stream);
    case 6: return launch_gemv_r<D, 6>(L, stream);
    case 7: return launch_gemv_r<D, 7>(L, stream);
    default: return launch_gemv_r<D, 8>(L, stream);
  }
}

/* Shape checks shared by the entries; *skip when there is nothing to do. */
static mk_status gemv_check(const char *what, mk_dtype w_dtype, size_t rows, size_t in_dim, size_t total_out,
                            bool *skip) {
  *skip = false;
  if (!mk_float_dtype(w_dtype))
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s: weight dtype %d is not F32/F16/BF16", what, (int)w_dtype);
  if (rows > MK_GEMV_MAX_ROWS)
    return mk_fail(MK_ERR_SHAPE, "%s: %zu rows exceed the decode limit %d", what, rows, MK_GEMV_MAX_ROWS);
  if (in_dim == 0) return mk_fail(MK_ERR_SHAPE, "%s: zero input width", what);
  if (total_out / GEMV_WARPS >= 2147483647u) return mk_fail(MK_ERR_SHAPE, "%s: %zu outputs exceed the grid", what, total_out);
  *skip = rows == 0 || total_out == 0;
  return MK_OK;
}

static mk_status gemv_dispatch(const gemv_launch &L, mk_dtype w_dtype, size_t rows, cudaStream_t stream) {
  switch (w_dtype) {
    case MK_DTYPE_F32: return launch_gemv<MK_DTYPE_F32>(L, rows, stream);
    case MK_DTYPE_F16: return launch_gemv<MK_DTYPE_F16>(L, rows, stream);
    default: return launch_gemv<MK_DTYPE_BF16>(L, rows, stream);
  }
}

extern "C" mk_status mk_kernel_gemv_multi(size_t n, float *const *y, const void *const *w, const size_t *out_dim,
                                          mk_dtype w_dtype, const float *x, size_t rows, size_t in_dim,
                                          cudaStream_t stream) {
  if (n == 0 || n > GEMV_MAX_SET)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv_multi: %zu matrices (1..%d)", n, GEMV_MAX_SET);
  if (!y || !w || !out_dim) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv_multi: null pointer");
  gemv_launch L = {};
  L.kind = GEMV_SET;
  L.n = n;
  L.x = x;
  L.in_dim = in_dim;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    L.set.y[i] = y[i];
    L.set.w[i] = w[i];
    L.set.out[i] = out_dim[i];
    total += out_dim[i];
  }
  bool skip;
  MK_TRY(gemv_check("mk_kernel_gemv_multi", w_dtype, rows, in_dim, total, &skip));
  if (skip) return MK_OK;
  for (size_t i = 0; i < n; i++)
    if (out_dim[i] && (!y[i] || !w[i])) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv_multi: null pointer");
  if (!x) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv_multi: null pointer");
  return gemv_dispatch(L, w_dtype, rows, stream);
}

extern "C" mk_status mk_kernel_gemv_swiglu(float *out, const float *x, const void *w_gate, const void *w_up,
                                           mk_dtype w_dtype, size_t rows, size_t in_dim, size_t out_dim,
                                           cudaStream_t stream) {
  bool skip;
  MK_TRY(gemv_check("mk_kernel_gemv_swiglu", w_dtype, rows, in_dim, out_dim, &skip));
  if (skip) return MK_OK;
  if (!out || !x || !w_gate || !w_up) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv_swiglu: null pointer");
  gemv_launch L = {};
  L.kind = GEMV_SWIGLU;
  L.n = 2;
  L.x = x;
  L.in_dim = in_dim;
  L.set.y[0] = out;
  L.set.w[0] = w_gate;
  L.set.w[1] = w_up;
  L.set.out[0] = out_dim;
  return gemv_dispatch(L, w_dtype, rows, stream);
}

extern "C" mk_status mk_kernel_gemv(float *y, const float *x, const void *w, mk_dtype w_dtype, size_t rows,
                                    size_t in_dim, size_t out_dim, cudaStream_t stream) {
  bool skip;
  MK_TRY(gemv_check("mk_kernel_gemv", w_dtype, rows, in_dim, out_dim, &skip));
  if (skip) return MK_OK;
  if (!y || !x || !w) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv: null pointer");
  gemv_launch L = {};
  L.kind = GEMV_SET;
  L.n = 1;
  L.x = x;
  L.in_dim = in_dim;
  L.set.y[0] = y;
  L.set.w[0] = w;
  L.set.out[0] = out_dim;
  return gemv_dispatch(L, w_dtype, rows, stream);
}
