/* Private to host/range/: the range and sequence structs and what the range's files share.
 * range.c builds and frees a range, weights.c carves and loads its weights, kv_pool.c the
 * range's pool of KV blocks, sequence.c the sequences and their block tables, check.c the contract, forward.c the forward pass and
 * decode graphs, boundary.c the boundary object. */
#ifndef MK_RANGE_IMPL_H
#define MK_RANGE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

#include "backend/backend.h"
#include "meshkern.h"
#include "model/model.h"
#include "range/op_profile.h"
#include "range/range.h"

typedef struct mk_layer_weights {
    float *attn_norm; /* [hidden] f32 */
    mk_weight wq;     /* [n_heads * head_dim, hidden] */
    mk_weight wk;     /* [n_kv_heads * head_dim, hidden] */
    mk_weight wv;     /* [n_kv_heads * head_dim, hidden] */
    mk_weight wo;     /* [hidden, n_heads * head_dim] */
    float *ffn_norm;  /* [hidden] f32 */
    mk_weight w_gate; /* [intermediate, hidden] */
    mk_weight w_up;   /* [intermediate, hidden] */
    mk_weight w_down; /* [hidden, intermediate] */
} mk_layer_weights;

typedef struct mk_activations {
    float *x;       /* [rows, hidden] residual stream */
    float *xn;      /* [rows, hidden] normed */
    float *q;       /* [rows, n_heads * head_dim] */
    float *k;       /* [rows, n_kv_heads * head_dim] */
    float *v;       /* [rows, n_kv_heads * head_dim] */
    float *att;     /* [rows, n_heads * head_dim] */
    float *proj;    /* [rows, hidden] attention / mlp output */
    float *gate;    /* [rows, intermediate] */
    float *up;      /* [rows, intermediate] */
    void *lowp;     /* [rows, widest product input] in the backend's 16-bit GEMM dtype, where it
                     * has one for max_rows (mk_backend_ops.gemm_input); else NULL */
    float *logits;  /* [max_seqs, vocab] tail only: one row per sequence of a forward */
    int32_t *ids;   /* [rows] */
    int32_t *pos;   /* [rows] */
    int32_t *token; /* [max_seqs] tail only */
    int32_t *tables; /* [max_seqs, table_stride] backends with decode_rows: row r's block table
                      * for a batch's decode row r (their rope_kv and attention take them all) */
} mk_activations;

/* The paged KV cache of a range: blocks of 2^shift positions; layer l's keys are the pool
 * rows of slab 2l, its values slab 2l + 1, each slab [blocks << shift, kv_dim] in the KV
 * dtype. Block ids are handed out from a stack of free ones. `promised` of the free blocks
 * are set aside for sequences that reserved them. The mutex guards the counts: sequences of
 * one range grow on its worker's thread while an admission elsewhere reserves. */
typedef struct mk_kv_pool {
    void *arena;       /* dev */
    size_t slab_bytes; /* one layer's keys (or values) */
    size_t blocks;
    uint32_t shift;
    int32_t *free_ids; /* stack [blocks] */
    size_t n_free, promised;
    pthread_mutex_t mu;
    bool mu_ready;
} mk_kv_pool;

/* Buckets of decode rows a step is captured for: 1, 2, 4, ... up to max_batch_sequences
 * (MK_MAX_BATCH_SEQUENCES = 64: 7 buckets). */
#define MK_STEP_BUCKETS 7

struct mk_range {
    const mk_model *model;
    mk_hparams hp;
    int64_t start, end;
    mk_role role;
    size_t max_context, max_rows;
    size_t max_seqs;    /* sequences one forward may carry (mk_range_forward_batch) */
    size_t rows_alone;      /* rows one product of the layers' weights computes each alone (>= 1) */
    size_t tail_rows_alone; /* the same for lm_head */
    mk_backend *backend;
    char digest[MK_DIGEST_HEX_LEN + 1];

    void *weight_arena; /* dev: every weight of the range, carved below */
    size_t weight_bytes;
    mk_weight token_embd; /* [vocab, hidden] head, or tail with tied embeddings */
    float *output_norm;   /* [hidden] tail */
    mk_weight lm_head;    /* [vocab, hidden] tail: output.weight or token_embd */
    mk_layer_weights *layers; /* [end - start + 1] */
    mk_kv_pool kv;

    void *act_arena; /* dev */
    mk_activations act;
    int32_t *host_positions; /* [max_rows] host staging of the positions of one forward */
    size_t table_stride;     /* entries of one row of act.tables: a sequence's most blocks */
    int32_t *host_tables;    /* [max_seqs, table_stride] host staging of act.tables (decode_rows) */
    mk_op_profile profile;   /* host time per op family, when switched on (benchmarks) */
    bool token_only;         /* tail: download the sampled token id alone */
    /* Decode steps (forwards of decode rows only, of one sequence or many) as captured
     * graphs, one per bucket of rows, replayed for every mix of sequences: the backend has
     * step ops and takes decode rows together, and the range was not made with
     * eager_decode. Off for good after a capture failed (steps then run op by op). */
    bool graphs;
    void *steps[MK_STEP_BUCKETS]; /* the captured step of bucket i (2^i rows, or max_seqs), NULL until used */
    char graph_failure[256];      /* why recording stopped (mk_range_graph_failure); "" while on */
    void *tail_stage;        /* host staging (pinned on cuda): logits [vocab] then the token */
};

struct mk_sequence {
    mk_range *range;
    int32_t *table;      /* dev [max blocks]: the pool block of each block of its positions */
    int32_t *host_table; /* the same on the host (staging for the upload; pinned on cuda) */
    size_t n_blocks;     /* blocks it holds: table[0, n_blocks) */
    size_t promised;     /* further blocks the pool set aside for it */
    size_t length;       /* positions cached */
    uint64_t steps;      /* forwards so far: the step number a boundary carries */
};

/* ------------------------------------------------------------- arena carving -- */

static inline size_t mk_align_up(size_t n) { return (n + 255) & ~(size_t)255; }

/* A size table: reserve() adds aligned slices, then one allocation is carved. */
typedef struct mk_carver {
    size_t offset;
    uint8_t *base;
} mk_carver;

static inline void *mk_carve(mk_carver *c, size_t bytes) {
    void *p = c->base ? c->base + c->offset : NULL;
    c->offset += mk_align_up(bytes);
    return p;
}

/* ------------------------------------------------------------- KV cache shape -- */

static inline size_t mk_kv_elem_size(const mk_range *r) { return mk_dtype_size(mk_backend_kv_dtype(r->backend)); }
/* Blocks that hold n positions. */
static inline size_t mk_kv_blocks_for(const mk_kv_pool *p, size_t n) { return (n + ((size_t)1 << p->shift) - 1) >> p->shift; }
/* How a forward addresses a sequence's cache in layer l (keys: slab 2l, values: 2l + 1). */
static inline mk_kv_pages mk_kv_pages_of(const mk_sequence *seq) { return (mk_kv_pages){seq->table, seq->range->kv.shift, 0}; }
static inline uint8_t *mk_kv_slab(const mk_range *r, size_t slab) { return (uint8_t *)r->kv.arena + slab * r->kv.slab_bytes; }

/* kv_pool.c: size and allocate the pool from the options (after the backend exists), free it. */
mk_status mk_kv_pool_create(mk_range *r, const mk_range_options *opt);
void mk_kv_pool_free(mk_range *r);
/* Give the sequence the blocks it needs to hold `length` positions (its promise first, then
 * free blocks nobody was promised), their table entries uploaded in stream order:
 * MK_ERR_KV_POOL_FULL and nothing taken when the pool cannot. */
mk_status mk_kv_grow(mk_sequence *seq, size_t length);
/* Every block of the sequence and its promise back to the pool. */
void mk_kv_release(mk_sequence *seq);
/* Undo grows since the sequence held n_blocks with `promised` more promised: the blocks
 * taken since go back, to the promise they came out of where they did. */
void mk_kv_shrink(mk_sequence *seq, size_t n_blocks, size_t promised);

/* weights.c: size the range's weight arena, allocate it and load every weight. */
mk_status mk_range_load(mk_range *r);

/* check.c: the contract's parts, for forward.c. */
/* Which kind of input the range's role takes (token ids or a boundary). */
mk_status mk_check_input_kind(const mk_range *r, const int32_t *ids, size_t n_tokens, bool has_boundary);
/* The rows of one forward fit the activation arena and the sequence's KV cache. */
mk_status mk_check_rows(const mk_range *r, const mk_sequence *seq, size_t rows);
/* mk_range_check_boundary without touching the thread's message on success. */
mk_status mk_check_header(const mk_range *r, const mk_sequence *seq, const mk_boundary_header *h);
/* A host bundle: the header check, then its arrays (positions row by row, finite values). */
mk_status mk_check_bundle(const mk_range *r, const mk_sequence *seq, const mk_bundle *bundle);

#endif
