/* Binaries linked without the cuda backend (host/cuda/) still link: selecting it reports
 * clearly that this build has none. Weak, so the real definition wins where it is linked. */
#include "backend/backend.h"
#include "mk_error.h"

__attribute__((weak)) mk_status mk_backend_cuda_create(const mk_backend_config *config, mk_backend **out) {
    (void)config;
    *out = NULL;
    return mk_fail(MK_ERR_NO_DEVICE, "this meshkern build has no cuda backend; use --backend cpu");
}
