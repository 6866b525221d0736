/* mk_cuda_compat.h (cudasim flavour) - the one header every kernel .cu includes first,
 * when the kernels are compiled by the host compiler and run by cudasim. The nvcc flavour,
 * kernels/nvcc/mk_cuda_compat.h, documents MK_LAUNCH and MK_DYNAMIC_SHARED; the build
 * picks one of the two by include path. */
#ifndef MK_CUDA_COMPAT_H
#define MK_CUDA_COMPAT_H

#include "cudasim.h"
#include "cudasim_wmma.h" /* nvcuda::wmma: the real <mma.h> under nvcc */

#define MK_LAUNCH(kernel, grid, block, shmem_bytes, stream, ...) \
  CUDASIM_LAUNCH(kernel, grid, block, shmem_bytes, stream, ##__VA_ARGS__)

#define MK_DYNAMIC_SHARED(type, name) \
  type *name = reinterpret_cast<type *>(::cudasim::detail::dynamic_shared())

#endif /* MK_CUDA_COMPAT_H */
