/* Option structs passed across the API (mk_backend_config, mk_range_options) start with
 * struct_size (the rule is in include/meshkern.h). Fields are only ever appended; the
 * *_V1_SIZE below is the size of the first version that had struct_size, the smallest a
 * caller may pass. */
#ifndef MK_OPTIONS_H
#define MK_OPTIONS_H

#include <stddef.h>

#include "meshkern.h"

#define MK_BACKEND_CONFIG_V1_SIZE (offsetof(mk_backend_config, speed_mode) + sizeof(bool))
#define MK_RANGE_OPTIONS_V1_SIZE (offsetof(mk_range_options, max_batch_tokens) + sizeof(size_t))

/* Copy the caller's struct (`src`, its first struct_size bytes) over `dst`, which already
 * holds the defaults of this build (current_size bytes); fields the caller's version does
 * not have keep their defaults. Refuses a struct_size outside [v1_size, current_size]. */
mk_status mk_options_take(void *dst, size_t current_size, size_t v1_size, const void *src, const char *what);

#endif
