/* How many cores this process may use (core/cores.c). */
#ifndef MK_CORE_CORES_H
#define MK_CORE_CORES_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CPUs in this process's affinity mask; at least 1. */
size_t mk_core_count(void);

#ifdef __cplusplus
}
#endif
#endif
