/* mk_cuda_compat.h (nvcc flavour) - the one header every kernel .cu includes first.
 *
 * Two flavours of this header exist, with the same name; the build picks one by include
 * path, so kernel sources carry no #ifdef for it:
 *   kernels/nvcc/mk_cuda_compat.h    (this file) nvcc and the real CUDA headers; added to
 *                                    meshkern_kernels_cuda's include path
 *   tests/cudasim/mk_cuda_compat.h   the host compiler and cudasim (CPU execution with CUDA
 *                                    semantics); on the include path of everything that
 *                                    links the `cudasim` target
 *
 * Both define:
 * MK_LAUNCH(kernel, grid, block, shmem_bytes, stream, args...)
 *     Launch `kernel`. A template kernel whose argument list contains a comma must be
 *     parenthesised: MK_LAUNCH((k<float, 256>), ...). Check cudaGetLastError() after it.
 * MK_DYNAMIC_SHARED(type, name)
 *     A statement inside the kernel body: declares `type *name` pointing at the block's
 *     dynamic shared memory (the launch's shmem_bytes, 16-byte aligned).
 */
#ifndef MK_CUDA_COMPAT_H
#define MK_CUDA_COMPAT_H

#if !defined(__CUDACC__)
#error "kernels/nvcc/mk_cuda_compat.h is for nvcc; host-compiler builds take tests/cudasim/mk_cuda_compat.h"
#endif

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h> /* nvcuda::wmma; cudasim supplies tests/cudasim/cudasim_wmma.h */

/* MK_LAUNCH is the only `<<<>>>` in the project. */
#define MK_LAUNCH(kernel, grid, block, shmem_bytes, stream, ...) \
  (kernel)<<<(grid), (block), (shmem_bytes), (stream)>>>(__VA_ARGS__)

/* One raw byte array for every kernel, so kernels with different element types never
 * declare the same extern __shared__ symbol with conflicting types. */
#define MK_DYNAMIC_SHARED(type, name)                                   \
  extern __shared__ __align__(16) unsigned char mk_dynamic_smem_raw_[]; \
  type *name = reinterpret_cast<type *>(mk_dynamic_smem_raw_)

#endif /* MK_CUDA_COMPAT_H */
