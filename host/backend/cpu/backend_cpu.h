/* What the cpu backend tells beyond the op interface (backend.h). */
#ifndef MK_BACKEND_CPU_H
#define MK_BACKEND_CPU_H

#include <stddef.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of native-product scratch b holds now (quantized activation rows and, once a stored
 * weight needs them, the per-thread weight tiles); 0 outside native mode. b must be a cpu
 * backend. */
size_t mk_cpu_backend_scratch_bytes(mk_backend *b);

#ifdef __cplusplus
}
#endif

#endif
