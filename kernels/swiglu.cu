/* swiglu.cu - out = silu(gate) * up, silu(g) = g / (1 + exp(-g)); gate/up in F32, F16 or
 * BF16 (widened exactly to F32), out F32. Same operation order as mk_cpu_swiglu. */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"

/* out may alias gate or up (the executor writes over gate): each element is read before
 * it is written by the same thread, so the pointers are not declared __restrict__. */
template <int D>
static __global__ void swiglu_kernel(float *out, const void *gate, const void *up, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = mk_load_as_f32<D>(gate, i);
    const float u = mk_load_as_f32<D>(up, i);
    out[i] = __fmul_rn(g / (1.0f + expf(-g)), u);
  }
}

template <int D>
static mk_status launch_swiglu(float *out, const void *gate, const void *up, size_t n, cudaStream_t stream) {
  MK_LAUNCH(swiglu_kernel<D>, dim3(mk_elementwise_blocks(n, 256)), dim3(256), 0, stream, out, gate, up, n);
  return mk_check_launch("mk_kernel_swiglu");
}

extern "C" mk_status mk_kernel_swiglu(float *out, const void *gate, const void *up, mk_dtype dtype, size_t n,
                                      cudaStream_t stream) {
  if (!mk_float_dtype(dtype))
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_swiglu: dtype %d is not F32/F16/BF16", (int)dtype);
  if (n == 0) return MK_OK;
  if (!out || !gate || !up) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_swiglu: null pointer");
  switch (dtype) {
    case MK_DTYPE_F32: return launch_swiglu<MK_DTYPE_F32>(out, gate, up, n, stream);
    case MK_DTYPE_F16: return launch_swiglu<MK_DTYPE_F16>(out, gate, up, n, stream);
    default: return launch_swiglu<MK_DTYPE_BF16>(out, gate, up, n, stream);
  }
}
