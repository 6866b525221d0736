/* mk_cuda_compat.h - the one header every kernel .cu includes first.
 *
 * Two worlds, one kernel source:
 *   nvcc (__CUDACC__)      : the real CUDA headers; MK_LAUNCH is the only `<<<>>>` in the project.
 *   g++ -DMK_CUDASIM       : tests/cudasim/cudasim.h gives CUDA semantics on the CPU
 *                            (blocks of cooperative fibers, real barriers and warp exchanges).
 *
 * MK_LAUNCH(kernel, grid, block, shmem_bytes, stream, args...)
 *     Launch `kernel`. A template kernel whose argument list contains a comma must be
 *     parenthesised: MK_LAUNCH((k<float, 256>), ...). Check cudaGetLastError() after it.
 * MK_DYNAMIC_SHARED(type, name)
 *     A statement inside the kernel body: declares `type *name` pointing at the block's
 *     dynamic shared memory (the launch's shmem_bytes, 16-byte aligned).
 */
#ifndef MK_CUDA_COMPAT_H
#define MK_CUDA_COMPAT_H

#if defined(__CUDACC__)

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define MK_LAUNCH(kernel, grid, block, shmem_bytes, stream, ...) \
  (kernel)<<<(grid), (block), (shmem_bytes), (stream)>>>(__VA_ARGS__)

/* One raw byte array for every kernel, so kernels with different element types never
 * declare the same extern __shared__ symbol with conflicting types. */
#define MK_DYNAMIC_SHARED(type, name)                                   \
  extern __shared__ __align__(16) unsigned char mk_dynamic_smem_raw_[]; \
  type *name = reinterpret_cast<type *>(mk_dynamic_smem_raw_)

#elif defined(MK_CUDASIM)

#if __has_include("cudasim.h")
#include "cudasim.h"
#else
#include "../tests/cudasim/cudasim.h"
#endif

#define MK_LAUNCH(kernel, grid, block, shmem_bytes, stream, ...) \
  CUDASIM_LAUNCH(kernel, grid, block, shmem_bytes, stream, ##__VA_ARGS__)

#define MK_DYNAMIC_SHARED(type, name) \
  type *name = reinterpret_cast<type *>(::cudasim::detail::dynamic_shared())

#else
#error "mk_cuda_compat.h: compile kernels with nvcc, or with a C++ compiler and -DMK_CUDASIM (cudasim)"
#endif

#endif /* MK_CUDA_COMPAT_H */
