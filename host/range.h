/* Internal to the executor (range.c), the pipeline driver (pipeline.c) and the placed
 * pipeline (sched/). */
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

/* mk_range_forward into caller-owned buffers (the scheduler's preallocated activation
 * slots): a non-tail range fills out_bundle (residual capacity out_capacity_rows rows of
 * the model's hidden width; batch, seq and the boundary metadata are set); a tail range
 * fills out_logits [vocab] (a token_only range may pass NULL: then only the token comes back)
 * and out_token [1] (greedy). Allocates nothing. */
mk_status mk_range_forward_into(mk_range *range, mk_sequence *seq, const int32_t *token_ids, size_t n_tokens,
                                const mk_bundle *bundle, mk_bundle *out_bundle, size_t out_capacity_rows,
                                float *out_logits, int32_t *out_token);
/* Largest forward (rows) the range accepts: its max_batch_tokens. */
size_t mk_range_max_rows(const mk_range *range);

#ifdef __cplusplus
}
#endif

#endif
