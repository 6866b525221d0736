/* The backend factory and what every backend shares: the kind picks the implementation
 * (backend/cpu/, backend/cuda/ or its absent stand-in), the rest is read off the config. */
#include "backend/backend.h"

#include "core/options.h"
#include "mk_error.h"

size_t mk_backend_weight_elem_size(const mk_backend *b) {
    /* The cpu backend keeps F32 storage in the F32/F16/BF16 modes (see above). */
    if (b->config.kind == MK_BACKEND_CPU) return sizeof(float);
    return mk_dtype_size(b->config.weight_dtype);
}

mk_dtype mk_backend_kv_dtype(const mk_backend *b) {
    return b->config.kv_dtype == 0 ? MK_DTYPE_F32 : b->config.kv_dtype;
}

mk_status mk_backend_create(const mk_backend_config *config, mk_backend **out) {
    if (out) *out = NULL;
    if (!config || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_backend_create: NULL argument");
    mk_backend_config taken = mk_backend_config_default(MK_BACKEND_CPU);
    MK_TRY(mk_options_take(&taken, sizeof taken, MK_BACKEND_CONFIG_V1_SIZE, config, "mk_backend_config"));
    config = &taken;
    switch (config->kind) {
        case MK_BACKEND_CPU: return mk_backend_cpu_create(config, out);
        case MK_BACKEND_CUDA: return mk_backend_cuda_create(config, out);
    }
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "unknown backend kind %d", (int)config->kind);
}

void mk_backend_destroy(mk_backend *b) {
    if (b) b->ops->destroy(b);
}
