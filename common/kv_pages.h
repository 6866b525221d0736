/* How a kernel or a cpu op finds a key's row in a paged KV cache. The cache of one layer is
 * a pool of blocks of 2^block_shift positions each; a sequence's block table names, for each
 * block of its positions in order, the pool block that holds it. Position t of the sequence
 * lives at pool row table[t >> block_shift] * 2^block_shift + (t mod 2^block_shift). Plain C,
 * for nvcc, cudasim and the cpu backend alike: the one place the rule is written. */
#ifndef MK_KV_PAGES_H
#define MK_KV_PAGES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__ /* cudasim compiles kernels as host code: a plain function serves */
#define MK_KV_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MK_KV_HOST_DEVICE inline
#endif

typedef struct mk_kv_pages {
    const int32_t *table;  /* [blocks of the sequence] (device memory on cuda); NULL: contiguous (cpu ops only) */
    uint32_t block_shift;  /* log2 of the positions a block holds */
    /* 0: every row is the one sequence's (its rows at consecutive positions). Otherwise the
     * rows are decode rows of different sequences: row r's table is table + r * row_stride
     * and it attends keys 0..positions[r] (cuda rope_kv and decode attention only). */
    uint32_t row_stride;
} mk_kv_pages;

/* The pool row of position t through a block table. The kernels require a table (the
 * lookup is one unconditional load) and take it and the shift as two scalar parameters (a
 * struct parameter would be copied to local memory). */
static MK_KV_HOST_DEVICE size_t mk_kv_page_row(const int32_t *table, uint32_t shift, size_t t) {
    return ((size_t)table[t >> shift] << shift) | (t & (((size_t)1 << shift) - 1));
}

/* The same where a NULL table is a contiguous cache (row t): the cpu ops and references. */
static MK_KV_HOST_DEVICE size_t mk_kv_row(mk_kv_pages pages, size_t t) {
    return pages.table ? mk_kv_page_row(pages.table, pages.block_shift, t) : t;
}

#endif
