/* Internal to the executor (range.c) and the pipeline driver (pipeline.c). */
#ifndef MK_RANGE_H
#define MK_RANGE_H

#include "meshkern.h"

/* Shorten a sequence to `length` (<= its length) positions: a pipeline step that failed
 * after some ranges had advanced puts every sequence back where the step began. */
mk_status mk_sequence_rewind(mk_sequence *seq, size_t length);

#endif
