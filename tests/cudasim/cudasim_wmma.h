/* cudasim_wmma.h - nvcuda::wmma (the warp matrix functions of <mma.h>) on cudasim.
 *
 * Included by the cudasim flavour of mk_cuda_compat.h (the nvcc flavour includes the real
 * <mma.h>). The 16x16x16 shape with __half / __nv_bfloat16 inputs and float (or __half)
 * accumulators: fragment, fill_fragment, load_matrix_sync, store_matrix_sync, mma_sync.
 *
 * The model (CUDA leaves the distribution of a fragment over the lanes unspecified, so a
 * correct kernel cannot tell; a kernel that depends on a particular layout or skips a
 * warp synchronisation fails here):
 * - matrix_a / matrix_b fragments: every lane holds the whole 16x16 tile.
 * - accumulator fragments: lane l owns the elements e with e % 32 == l (8 each, as on the
 *   hardware); mma_sync computes, and store_matrix_sync writes, only the owned elements.
 *   x[] holds the logical tile row-major (x[r * 16 + c]); the elements a lane does not own
 *   are NaN, so element-wise operations must be uniform (scale, fill), as CUDA requires.
 * - Every function is warp-collective: all 32 lanes of the warp must call it (a missing
 *   lane is a warp deadlock, reported with coordinates). Loads read memory before the warp
 *   meets, stores write after it: data another lane wrote without a __syncwarp() in
 *   between, or a read of a stored tile without one, gives stale bytes instead of passing
 *   by luck.
 * - Inputs are of the fragment's type already (rounded when the kernel converted them);
 *   products are exact and accumulate in float (fmaf over k in order), as the tensor
 *   cores' F32 accumulation (whose summation order is unspecified).
 * - Checked like the hardware requires: ldm a multiple of 8 (16-bit) or 4 (float) elements,
 *   the pointer 32-byte aligned; otherwise the launch fails with a diagnostic.
 */
#ifndef CUDASIM_WMMA_H
#define CUDASIM_WMMA_H

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cudasim.h"

namespace cudasim {
namespace detail {
/* Fails the running launch with msg (file:line and the thread's coordinates added). */
[[noreturn]] void device_error(const char *msg, const char *file, int line);
inline unsigned lane_id() {
  const uint3 t = threadIdx, d = blockDim;
  return (t.x + d.x * (t.y + d.y * t.z)) & 31u;
}
inline float wmma_to_float(float v) { return v; }
inline float wmma_to_float(__half v) { return __half2float(v); }
inline float wmma_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
inline T wmma_from_float(float v) {
  if constexpr (std::is_same<T, float>::value) return v;
  else if constexpr (std::is_same<T, __half>::value) return __float2half(v);
  else return __float2bfloat16(v);
}
}  // namespace detail
}  // namespace cudasim

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
  static_assert(M == 16 && N == 16 && K == 16, "cudasim wmma: only the 16x16x16 shape");
  static_assert(std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value ||
                    (std::is_same<Use, accumulator>::value && std::is_same<T, float>::value),
                "cudasim wmma: __half / __nv_bfloat16 inputs, float or __half accumulators");
  static_assert(std::is_same<Use, accumulator>::value == std::is_same<Layout, void>::value,
                "cudasim wmma: matrix_a/b take row_major or col_major, accumulators no layout");

 public:
  using element_type = T;
  using storage_element_type = T;
  enum { num_elements = 256 };
  T x[256];
};

namespace detail {
template <class Use, class T, class L>
using frag16 = fragment<Use, 16, 16, 16, T, L>;

inline void check(const void *p, unsigned ldm, size_t elem, const char *what, const char *file, int line) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0)
    ::cudasim::detail::device_error(what, file, line); /* pointer not 256-bit aligned */
  if (ldm % (elem == 2 ? 8u : 4u) != 0 || ldm < 16) ::cudasim::detail::device_error(what, file, line);
}
inline bool owns(unsigned e) { return e % 32u == ::cudasim::detail::lane_id(); }
template <class T>
inline T poison() {
  return ::cudasim::detail::wmma_from_float<T>(std::numeric_limits<float>::quiet_NaN());
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class L>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const typename fragment<Use, M, N, K, T, L>::element_type &v, const char *file = __builtin_FILE(),
                          int line = __builtin_LINE()) {
  for (int e = 0; e < 256; ++e)
    f.x[e] = (!std::is_same<Use, accumulator>::value || detail::owns(e)) ? v : detail::poison<T>();
  __syncwarp(0xffffffffu, file, line);
}

/* matrix_a is M x K (element (r, k)), matrix_b K x N (element (k, n)); row_major puts
 * element (i, j) at p[i * ldm + j], col_major at p[j * ldm + i]. */
template <class Use, class T, class L>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm,
                             const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  static_assert(!std::is_same<Use, accumulator>::value, "cudasim wmma: accumulators take a layout_t");
  detail::check(p, ldm, sizeof(T), "wmma::load_matrix_sync: pointer not 32-byte aligned or bad ldm", file, line);
  for (unsigned i = 0; i < 16; ++i)
    for (unsigned j = 0; j < 16; ++j)
      f.x[i * 16 + j] = std::is_same<L, row_major>::value ? p[i * ldm + j] : p[j * ldm + i];
  __syncwarp(0xffffffffu, file, line);
}

template <class T>
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, T> &f, const T *p, unsigned ldm, layout_t layout,
                             const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  detail::check(p, ldm, sizeof(T), "wmma::load_matrix_sync: pointer not 32-byte aligned or bad ldm", file, line);
  for (unsigned i = 0; i < 16; ++i)
    for (unsigned j = 0; j < 16; ++j)
      f.x[i * 16 + j] = !detail::owns(i * 16 + j) ? detail::poison<T>()
                        : layout == mem_row_major ? p[i * ldm + j]
                                                  : p[j * ldm + i];
  __syncwarp(0xffffffffu, file, line);
}

template <class T>
inline void store_matrix_sync(T *p, const fragment<accumulator, 16, 16, 16, T> &f, unsigned ldm, layout_t layout,
                              const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  detail::check(p, ldm, sizeof(T), "wmma::store_matrix_sync: pointer not 32-byte aligned or bad ldm", file, line);
  __syncwarp(0xffffffffu, file, line);
  for (unsigned i = 0; i < 16; ++i)
    for (unsigned j = 0; j < 16; ++j) {
      if (!detail::owns(i * 16 + j)) continue;
      (layout == mem_row_major ? p[i * ldm + j] : p[j * ldm + i]) = f.x[i * 16 + j];
    }
}

/* d = a * b + c (d may be c). */
template <class TI, class LA, class LB, class TC, class TD>
inline void mma_sync(fragment<accumulator, 16, 16, 16, TD> &d, const fragment<matrix_a, 16, 16, 16, TI, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, TI, LB> &b, const fragment<accumulator, 16, 16, 16, TC> &c,
                     const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  __syncwarp(0xffffffffu, file, line);
  for (unsigned e = 0; e < 256; ++e) {
    if (!detail::owns(e)) {
      d.x[e] = detail::poison<TD>();
      continue;
    }
    const unsigned i = e / 16, j = e % 16;
    float acc = ::cudasim::detail::wmma_to_float(c.x[e]);
    for (unsigned k = 0; k < 16; ++k)
      acc = fmaf(::cudasim::detail::wmma_to_float(a.x[i * 16 + k]), ::cudasim::detail::wmma_to_float(b.x[k * 16 + j]),
                 acc);
    d.x[e] = ::cudasim::detail::wmma_from_float<TD>(acc);
  }
}

}  // namespace wmma
}  // namespace nvcuda

#endif /* CUDASIM_WMMA_H */
