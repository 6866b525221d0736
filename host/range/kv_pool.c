/* The range's paged KV cache: one allocation of fixed-size blocks shared by its sequences.
 * A sequence takes a block when its positions reach it and gives all back at reset or
 * close; a reservation sets free blocks aside for one sequence so an admitted sequence never
 * fails mid-run for want of a block (the schedulers reserve at admission). */
#include <stdlib.h>

#include "core/mk_size.h"
#include "mk_error.h"
#include "range/range_impl.h"

enum { MK_KV_BLOCK_DEFAULT = 16, MK_KV_BLOCK_MIN = 4, MK_KV_BLOCK_MAX = 1024, MK_KV_DEFAULT_SEQUENCES = 4 };

static size_t mk_kv_layers(const mk_range *r) { return (size_t)(r->end - r->start + 1); }

mk_status mk_kv_pool_create(mk_range *r, const mk_range_options *opt) {
    mk_kv_pool *p = &r->kv;
    const size_t block = opt->kv_block_size ? opt->kv_block_size : MK_KV_BLOCK_DEFAULT;
    if (block < MK_KV_BLOCK_MIN || block > MK_KV_BLOCK_MAX || (block & (block - 1)))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "kv_block_size %zu: a power of two from %d to %d", block,
                       MK_KV_BLOCK_MIN, MK_KV_BLOCK_MAX);
    p->shift = 0;
    while (((size_t)1 << p->shift) < block) p->shift++;
    /* one block: keys and values of every layer (checked: a model's widths come from a file) */
    size_t row_bytes, block_bytes;
    if (!mk_size_mul(r->hp.n_kv_heads * r->hp.head_dim, mk_kv_elem_size(r), &row_bytes) ||
        !mk_size_mul(row_bytes, block, &block_bytes) || !mk_size_mul(block_bytes, 2 * mk_kv_layers(r), &block_bytes))
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "KV pool: a block of %zu positions overflows", block);
    size_t blocks = opt->kv_pool_blocks;
    if (!blocks && opt->kv_pool_bytes) {
        blocks = opt->kv_pool_bytes / block_bytes;
        if (!blocks)
            return mk_fail(MK_ERR_INVALID_ARGUMENT, "kv_pool_bytes %zu is less than one block (%zu bytes: %zu positions)",
                           opt->kv_pool_bytes, block_bytes, block);
    }
    if (!blocks) {
        const size_t sequences = r->max_seqs > MK_KV_DEFAULT_SEQUENCES ? r->max_seqs : MK_KV_DEFAULT_SEQUENCES;
        blocks = sequences * mk_kv_blocks_for(p, r->max_context);
    }
    if (blocks > INT32_MAX) return mk_fail(MK_ERR_INVALID_ARGUMENT, "KV pool of %zu blocks: at most %d", blocks, INT32_MAX);
    size_t arena_bytes;
    if (!mk_size_mul(blocks, block_bytes, &arena_bytes))
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "KV pool of %zu blocks of %zu bytes overflows", blocks, block_bytes);
    p->blocks = blocks;
    p->slab_bytes = arena_bytes / (2 * mk_kv_layers(r));
    /* the device arena first: a pool too big for the device fails there, before the host
     * writes a free list of that many ids */
    MK_TRY(r->backend->ops->alloc(r->backend, arena_bytes, &p->arena));
    p->free_ids = mk_alloc_array(blocks, sizeof *p->free_ids, "KV pool: the free list");
    if (!p->free_ids) return MK_ERR_OUT_OF_MEMORY;
    /* the lowest id on top: a fresh sequence's blocks come out in order */
    for (size_t i = 0; i < blocks; i++) p->free_ids[i] = (int32_t)(blocks - 1 - i);
    p->n_free = blocks;
    p->promised = 0;
    if (pthread_mutex_init(&p->mu, NULL) != 0) return mk_fail(MK_ERR_INTERNAL, "KV pool: mutex");
    p->mu_ready = true;
    return MK_OK;
}

void mk_kv_pool_free(mk_range *r) {
    mk_kv_pool *p = &r->kv;
    if (p->arena) r->backend->ops->release(r->backend, p->arena);
    free(p->free_ids);
    if (p->mu_ready) pthread_mutex_destroy(&p->mu);
    *p = (mk_kv_pool){0};
}

mk_status mk_kv_grow(mk_sequence *seq, size_t length) {
    mk_range *r = seq->range;
    mk_kv_pool *p = &r->kv;
    const size_t need = mk_kv_blocks_for(p, length);
    if (need <= seq->n_blocks) return MK_OK;
    const size_t more = need - seq->n_blocks;
    const size_t old = seq->n_blocks;
    pthread_mutex_lock(&p->mu);
    /* its own promise first, then free blocks promised to nobody */
    const size_t own = more < seq->promised ? more : seq->promised;
    if (more - own > p->n_free - p->promised) {
        const size_t unpromised = p->n_free - p->promised;
        pthread_mutex_unlock(&p->mu);
        return mk_fail(MK_ERR_KV_POOL_FULL,
                       "KV pool full: %zu positions need %zu more blocks of %zu; %zu of %zu are free and not promised "
                       "to other sequences",
                       length, more - own, (size_t)1 << p->shift, unpromised, p->blocks);
    }
    seq->promised -= own;
    p->promised -= own;
    for (size_t i = 0; i < more; i++) seq->host_table[old + i] = p->free_ids[--p->n_free];
    seq->n_blocks = need;
    pthread_mutex_unlock(&p->mu);
    mk_backend *b = r->backend;
    /* the new entries only: the host staging of entries already sent is never rewritten
     * while the sequence holds them, so an earlier copy still in flight reads what it should */
    if (b->ops->host_addressable) return MK_OK; /* table == host_table */
    return b->ops->upload_async(b, seq->table + old, seq->host_table + old, more * sizeof(int32_t));
}

void mk_kv_shrink(mk_sequence *seq, size_t n_blocks, size_t promised) {
    mk_kv_pool *p = &seq->range->kv;
    pthread_mutex_lock(&p->mu);
    for (size_t i = seq->n_blocks; i-- > n_blocks;) p->free_ids[p->n_free++] = seq->host_table[i];
    p->promised += promised - seq->promised; /* the promise they came out of stands again */
    pthread_mutex_unlock(&p->mu);
    seq->n_blocks = n_blocks;
    seq->promised = promised;
}

void mk_kv_release(mk_sequence *seq) { mk_kv_shrink(seq, 0, 0); }

mk_status mk_sequence_reserve(mk_sequence *seq, size_t positions) {
    mk_clear_error();
    if (!seq) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sequence_reserve: NULL sequence");
    mk_range *r = seq->range;
    mk_kv_pool *p = &r->kv;
    if (positions > r->max_context) positions = r->max_context;
    const size_t need = mk_kv_blocks_for(p, positions);
    pthread_mutex_lock(&p->mu);
    const size_t have = seq->n_blocks + seq->promised;
    mk_status s = MK_OK;
    if (need > have) {
        const size_t more = need - have;
        if (more > p->n_free - p->promised) {
            s = mk_fail(MK_ERR_KV_POOL_FULL,
                        "KV pool full: a reservation of %zu positions needs %zu more blocks; %zu of %zu are free and "
                        "not promised",
                        positions, more, p->n_free - p->promised, p->blocks);
        } else {
            seq->promised += more;
            p->promised += more;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return s;
}

mk_status mk_range_kv_pool(const mk_range *range, mk_kv_pool_info *info) {
    mk_clear_error();
    if (!range || !info) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_range_kv_pool: NULL argument");
    mk_kv_pool *p = (mk_kv_pool *)&range->kv; /* the counts are read under the lock */
    pthread_mutex_lock(&p->mu);
    info->block_size = (size_t)1 << p->shift;
    info->blocks = p->blocks;
    info->block_bytes = p->blocks ? 2 * mk_kv_layers(range) * p->slab_bytes / p->blocks : 0;
    info->free_blocks = p->n_free;
    info->promised_blocks = p->promised;
    pthread_mutex_unlock(&p->mu);
    return MK_OK;
}

mk_status mk_range_kv_fits(const mk_range *r, size_t positions) {
    const mk_kv_pool *p = &r->kv;
    if (positions > r->max_context) positions = r->max_context;
    const size_t need = mk_kv_blocks_for(p, positions);
    if (need <= p->blocks) return MK_OK;
    return mk_fail(MK_ERR_KV_POOL_FULL, "a sequence of up to %zu positions needs %zu KV blocks; the pool holds %zu of %zu",
                   positions, need, p->blocks, (size_t)1 << p->shift);
}
