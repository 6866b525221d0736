/* Internal to the executor (range.c) and the pipeline driver (pipeline.c). */
#ifndef MK_RANGE_H
#define MK_RANGE_H

#include "backend.h"
#include "meshkern.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Shorten a sequence to `length` (<= its length) positions: a pipeline step that failed
 * after some ranges had advanced puts every sequence back where the step began. */
mk_status mk_sequence_rewind(mk_sequence *seq, size_t length);

/* The structural counters of the range's backend (see mk_backend_counters): internal, for
 * tests and benchmarks. The pointer lives as long as the range. */
const mk_backend_counters *mk_range_backend_counters(const mk_range *r);

#ifdef __cplusplus
}
#endif

#endif
