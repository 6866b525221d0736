/* Sequences: each holds its positions in its range's KV pool through a block table (one
 * table allocation at open, of max_context positions' blocks; the blocks come from the pool
 * as the positions fill, kv_pool.c). */
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
    mk_backend *b = r->backend;
    const size_t bytes = mk_kv_blocks_for(&r->kv, r->max_context) * sizeof(int32_t);
    /* A host-addressable backend reads the table where the host writes it; cuda keeps a
     * device copy, fed from pinned staging in stream order. */
    mk_status s = b->ops->host_addressable ? b->ops->alloc(b, bytes, (void **)&seq->host_table)
                                           : b->ops->host_alloc(b, bytes, (void **)&seq->host_table);
    if (s == MK_OK) {
        if (b->ops->host_addressable) seq->table = seq->host_table;
        else s = b->ops->alloc(b, bytes, (void **)&seq->table);
    }
    if (s != MK_OK) {
        mk_sequence_close(seq);
        return s;
    }
    *out = seq;
    return MK_OK;
}

void mk_sequence_close(mk_sequence *seq) {
    if (!seq) return;
    mk_backend *b = seq->range->backend;
    if (seq->host_table) mk_kv_release(seq);
    if (b->ops->host_addressable) {
        if (seq->host_table) b->ops->release(b, seq->host_table);
    } else {
        if (seq->table) b->ops->release(b, seq->table);
        if (seq->host_table) b->ops->host_release(b, seq->host_table);
    }
    free(seq);
}

mk_status mk_sequence_reset(mk_sequence *seq) {
    mk_clear_error();
    if (!seq) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sequence_reset: NULL sequence");
    mk_kv_release(seq); /* every block back: stale rows are never read, attention reads [0, length) */
    seq->length = 0;
    seq->steps = 0;
    return MK_OK;
}

size_t mk_sequence_length(const mk_sequence *seq) { return seq ? seq->length : 0; }

const mk_range *mk_sequence_range(const mk_sequence *seq) { return seq ? seq->range : NULL; }

mk_status mk_sequence_rewind(mk_sequence *seq, size_t length) {
    if (!seq) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sequence_rewind: NULL sequence");
    if (length > seq->length)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sequence_rewind: %zu is past the sequence's %zu positions", length,
                       seq->length);
    if (length < seq->length && seq->steps) seq->steps--; /* the failed step is retried */
    seq->length = length; /* cache rows past `length` are stale and never read; their blocks stay held */
    return MK_OK;
}
