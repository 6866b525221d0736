/* Option structs passed across the API (mk_backend_config, mk_range_options, mk_seam_options,
 * mk_pipeline_options, mk_sched_options, mk_stage_options) start with
 * struct_size (the rule is in include/meshkern.h). Fields are only ever appended; the
 * *_V1_SIZE below is the size of the first version that had struct_size, the smallest a
 * caller may pass. */
#ifndef MK_OPTIONS_H
#define MK_OPTIONS_H

#include <stddef.h>

#include "meshkern.h"

#define MK_BACKEND_CONFIG_V1_SIZE (offsetof(mk_backend_config, speed_mode) + sizeof(bool))
#define MK_RANGE_OPTIONS_V1_SIZE (offsetof(mk_range_options, max_batch_tokens) + sizeof(size_t))
/* struct_size came to these in 0.2.0: their first version is the whole struct. */
#define MK_SEAM_OPTIONS_V1_SIZE (offsetof(mk_seam_options, tls) + sizeof(mk_seam_tls))
#define MK_PIPELINE_OPTIONS_V1_SIZE (offsetof(mk_pipeline_options, n_devices) + sizeof(size_t))
#define MK_STAGE_OPTIONS_V1_SIZE (offsetof(mk_stage_options, tls) + sizeof(mk_seam_tls))
/* mk_sched_options had struct_size from the start; its first version ended before seam. */
#define MK_SCHED_OPTIONS_V1_SIZE offsetof(mk_sched_options, seam)

/* Copy the caller's struct (`src`, its first struct_size bytes) over `dst`, which already
 * holds the defaults of this build (current_size bytes); fields the caller's version does
 * not have keep their defaults. Refuses a struct_size outside [v1_size, current_size]. */
mk_status mk_options_take(void *dst, size_t current_size, size_t v1_size, const void *src, const char *what);

#endif
