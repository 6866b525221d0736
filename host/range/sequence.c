/* Sequences: each owns a KV cache of max_context positions for every layer of its range
 * (one allocation at open; a forward only writes rows into it). */
#include <stdlib.h>

#include "core/mk_size.h"
#include "mk_error.h"
#include "range/range_impl.h"

/* ============================================================== sequences == */

mk_status mk_sequence_open(mk_range *r, mk_sequence **out) {
    mk_clear_error();
    if (!r || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sequence_open: NULL argument");
    *out = NULL;
    mk_sequence *seq = calloc(1, sizeof *seq);
    if (!seq) return mk_fail(MK_ERR_OUT_OF_MEMORY, "sequence: out of memory");
    seq->range = r;
    const size_t layers = (size_t)(r->end - r->start + 1);
    size_t bytes;
    if (!mk_size_mul(layers * 2, mk_kv_slab_elems(r), &bytes) || !mk_size_mul(bytes, mk_kv_elem_size(r), &bytes)) {
        free(seq);
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "sequence: KV cache of %zu layers x %zu positions overflows", layers,
                       r->max_context);
    }
    const mk_status s = r->backend->ops->alloc(r->backend, bytes, &seq->kv_arena);
    if (s != MK_OK) {
        free(seq);
        return s;
    }
    *out = seq;
    return MK_OK;
}

void mk_sequence_close(mk_sequence *seq) {
    if (!seq) return;
    seq->range->backend->ops->release(seq->range->backend, seq->kv_arena);
    free(seq);
}

mk_status mk_sequence_reset(mk_sequence *seq) {
    mk_clear_error();
    if (!seq) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sequence_reset: NULL sequence");
    seq->length = 0; /* stale cache rows are never read: attention reads [0, length) */
    seq->steps = 0;
    return MK_OK;
}

size_t mk_sequence_length(const mk_sequence *seq) { return seq ? seq->length : 0; }

mk_status mk_sequence_rewind(mk_sequence *seq, size_t length) {
    if (!seq) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sequence_rewind: NULL sequence");
    if (length > seq->length)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sequence_rewind: %zu is past the sequence's %zu positions", length,
                       seq->length);
    if (length < seq->length && seq->steps) seq->steps--; /* the failed step is retried */
    seq->length = length; /* cache rows past `length` are stale and never read */
    return MK_OK;
}
