/* Internal to the executor (range.c, cuts.c) and the drivers above it (pipeline/, sched/,
 * stage/). */
#ifndef MK_RANGE_H
#define MK_RANGE_H

#include "backend/backend.h"
#include "meshkern.h"
#include "range/op_profile.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The layers [start, end] (inclusive) of one range of a split. */
typedef struct mk_layer_span {
    int64_t start, end;
} mk_layer_span;

/* The one check of a split (cuts.c): cuts [n_cuts] are the last layer of each range but
 * the last, strictly ascending, each in [0, n_layers - 1). Fills spans [n_cuts + 1] (may
 * be NULL: check only). Refusals, each with its own message: a NULL list with n_cuts > 0
 * and too many cuts (n_cuts + 1 ranges past max_ranges, or past n_layers) are
 * MK_ERR_INVALID_ARGUMENT; a cut out of range, a repeated cut (an empty range) and a cut
 * below its predecessor (unsorted) are MK_ERR_INVALID_RANGE. */
mk_status mk_cuts_to_spans(const int64_t *cuts, size_t n_cuts, size_t n_layers, size_t max_ranges,
                           mk_layer_span *spans);

/* Shorten a sequence to `length` (<= its length) positions: a pipeline step that failed
 * after some ranges had advanced puts every sequence back where the step began. */
mk_status mk_sequence_rewind(mk_sequence *seq, size_t length);

/* The structural counters of the range's backend (see mk_backend_counters): internal, for
 * tests and benchmarks. The pointer lives as long as the range. */
const mk_backend_counters *mk_range_backend_counters(const mk_range *r);
/* Whether the range's KV pool could ever hold one sequence of up to `positions` positions
 * (at most max_context): MK_OK, or MK_ERR_KV_POOL_FULL naming the blocks it needs and has.
 * The admission rules' refusal of a request no pool could ever take (never a wait). */
mk_status mk_range_kv_fits(const mk_range *r, size_t positions);

/* The part of the boundary contract (mk_range_check_boundary) that every entry of a batch
 * message shares, checked without a sequence: role, normalized flag, schema, architecture,
 * adapter, tensor name, boundary point, next_layer, recipe digest, hidden width, dtype. A
 * failure here is the sending rank's (another model or cut), not one sequence's. */
mk_status mk_range_check_boundary_shared(const mk_range *r, const mk_boundary_header *h);

/* Switch the per-op-family timing of the range's forwards on or off; either way the
 * figures so far are reset. Internal, for benchmarks. */
void mk_range_profile(mk_range *r, bool on);
/* The figures since the last mk_range_profile(r, true); lives as long as the range. */
const mk_op_profile *mk_range_op_profile(const mk_range *r);

/* mk_range_forward_boundary into caller-owned buffers (the scheduler's preallocated
 * activation slots): `in` (a boundary of this range a transport filled) or token ids; a
 * non-tail range writes its raw residual and header into `out` (a boundary of this range);
 * a tail range fills out_logits [vocab] (a token_only range may pass NULL: then only the token
 * comes back) and out_token [1] (greedy). Allocates nothing. */
mk_status mk_range_forward_into(mk_range *range, mk_sequence *seq, const int32_t *token_ids, size_t n_tokens,
                                const mk_boundary *in, mk_boundary *out, float *out_logits, int32_t *out_token);
/* One sequence's rows in a batch forward: token ids (head) or a received boundary (the
 * others); a non-tail range's output boundary, or a tail's logits [vocab] (NULL on a
 * token_only range) and token. */
typedef struct mk_forward_entry {
    mk_sequence *seq;
    const int32_t *token_ids;
    size_t n_tokens;
    const mk_boundary *in;
    mk_boundary *out;
    float *logits;
    int32_t *token;
} mk_forward_entry;
/* One forward over several sequences (continuous batching): the entries' rows one after the
 * other, decode rows and prompt chunks alike. Norms and products run over all rows at once
 * (the weights are read once per forward, not once per sequence); RoPE, the cache write
 * and attention run per prompt chunk, and for all decode rows together where the backend
 * takes them so (cuda: one launch each per layer, each row through its own block table),
 * each row attending to its own sequence's keys only. Each
 * entry is checked as its own forward would be, all before anything runs (a failure names
 * the entry, and nothing ran); a sequence may appear once. A row's arithmetic does not
 * depend on the others in the batch wherever the backend's product for the batch's rows is
 * computed row by row (cpu: quantized or 16-bit weights under MK_NATIVE_GEMM_MIN_ROWS rows,
 * any number for the formats with an n-row dot; cuda: the GEMV path, up to 8 rows), so each entry's results are bit-identical to
 * its forward alone there. One entry: exactly mk_range_forward_into. Allocates nothing. */
mk_status mk_range_forward_batch(mk_range *range, const mk_forward_entry *entries, size_t n);
/* Entry i's own checks as mk_range_forward_batch makes them (its sequence, input kind and
 * token ids, rows against the context, outputs): a caller that assembles a batch leaves
 * out an entry that would fail it, so that entry fails alone. */
mk_status mk_range_check_batch_entry(mk_range *range, const mk_forward_entry *e, size_t i);
/* Chunked prefill, the one rule of the scheduler and the stage runtime: the prompt rows of a
 * sequence's next step when `left` of its prompt remain and steps take at most `chunk`
 * prompt rows (0: the whole prompt in one step). */
static inline size_t mk_prefill_rows(size_t left, size_t chunk) { return chunk && left > chunk ? chunk : left; }
/* Sequences one forward may carry: its max_batch_sequences. */
size_t mk_range_max_seqs(const mk_range *range);
/* The backend a range runs on (the seams stage payloads through it). */
mk_backend *mk_range_backend(const mk_range *range);
/* Largest forward (rows) the range accepts: its max_batch_tokens. */
size_t mk_range_max_rows(const mk_range *range);
/* The range a sequence was opened on. */
const mk_range *mk_sequence_range(const mk_sequence *seq);
/* Width of the residual stream (the model's hidden size). */
size_t mk_range_hidden(const mk_range *range);
/* KV positions per sequence: its max_context. */
size_t mk_range_max_context(const mk_range *range);

#ifdef __cplusplus
}
#endif

#endif
