/* Builds without the cuda backend (no nvcc, or MESHKERN_CUDA=OFF) still link: selecting
 * it reports clearly that this build has none. */
#include "backend.h"
#include "mk_error.h"

mk_status mk_backend_cuda_create(const mk_backend_config *config, mk_backend **out) {
    (void)config;
    *out = NULL;
    return mk_fail(MK_ERR_NO_DEVICE, "this meshkern build has no cuda backend; use --backend cpu");
}
