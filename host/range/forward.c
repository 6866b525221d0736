/* The forward pass: one entry (mk_forward) that every public form wraps. A form checks
 * only what is its own (its arguments, whose buffers), states where the inputs are and
 * where the outputs go (mk_forward_io), and mk_forward does the rest in one order: the
 * input kind, the contract (unless the boundary passed it on arrival for this sequence at
 * its length), the device work, the outputs, the sequence's advance. Nothing in it
 * allocates: outputs a form hands to its caller are made before the forward runs.
 * Decode steps (one row) run as a captured graph where the backend has them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mk_error.h"
#include "protocol/boundary.h"
#include "range/range_impl.h"

/* One forward, whatever form the caller used. */
typedef struct mk_forward_io {
    const int32_t *token_ids;       /* head: [n_tokens] */
    size_t n_tokens;
    const mk_boundary_header *in;   /* the input boundary's header (NULL: token ids) */
    const void *in_payload;         /* dev: its rows, copied into the residual (NULL: already there) */
    bool in_checked;                /* the contract passed `in` for this sequence at its length */
    void *out_payload;              /* dev: where a non-tail range's residual goes, or NULL */
    mk_boundary_header *out;        /* the header of that residual, or NULL */
    mk_bundle *out_host;            /* or a host bundle made for it (rows x hidden), or NULL */
    float *logits;                  /* tail: [vocab], or NULL (the token alone) */
    int32_t *token;                 /* tail: [1] */
} mk_forward_io;

/* A run of consecutive rows of one sequence in a forward: a forward of one sequence has
 * one; a batch forward (mk_range_forward_batch) one per entry. */
typedef struct mk_span {
    mk_sequence *seq;
    size_t row0, rows;
} mk_span;

/* Runs one op (MK_TRY) and charges its host time to family f of the range's profile. */
#define MK_OP(r, f, call)                                                  \
    do {                                                                   \
        const double mk_op_t0_ = mk_op_profile_clock(&(r)->profile);       \
        MK_TRY(call);                                                      \
        mk_op_profile_add(&(r)->profile, (f), mk_op_t0_);                  \
    } while (0)

/* The 16-bit buffer a product of `rows` rows reads its input from, or NULL where the
 * backend multiplies those rows in F32 (always on cpu; decode rows on cuda). */
static void *mk_gemm_lowp(const mk_range *r, size_t rows) {
    const mk_backend_ops *ops = r->backend->ops;
    if (!ops->gemm_input || ops->gemm_input(r->backend, rows) == MK_DTYPE_F32) return NULL;
    return r->act.lowp;
}

/* One layer. Residual adds are fused into the norm that follows them: the mlp output of
 * layer l stays in a->proj and is added by layer l+1's attention norm, or by a plain add
 * after the range's last layer (its raw residual is what leaves the range). The fused op
 * performs the same float operations in the same order, so results are unchanged. */
/* RoPE, the cache write and attention of one span: its rows against its own sequence's
 * cache only (the other spans' rows are other sequences). */
static mk_status mk_run_attention(mk_range *r, const mk_span *sp, size_t layer_index) {
    const mk_hparams *hp = &r->hp;
    mk_backend *b = r->backend;
    const mk_backend_ops *ops = b->ops;
    const mk_activations *a = &r->act;
    const size_t kv_dim = hp->n_kv_heads * hp->head_dim, q_dim = hp->n_heads * hp->head_dim;
    const size_t rows = sp->rows, past = sp->seq->length;
    uint8_t *k_cache = mk_kv_slab(r, 2 * layer_index);     /* the pool's [rows, kv_dim] in the KV dtype */
    uint8_t *v_cache = mk_kv_slab(r, 2 * layer_index + 1); /* read through the sequence's block table */
    const mk_kv_pages pages = mk_kv_pages_of(sp->seq);
    float *q = a->q + sp->row0 * q_dim, *k = a->k + sp->row0 * kv_dim, *v = a->v + sp->row0 * kv_dim;
    float *att = a->att + sp->row0 * q_dim;
    const int32_t *pos = a->pos + sp->row0;
    /* The fused RoPE + cache write stores rows in the backend's KV dtype (one launch). */
    if (ops->rope_kv) {
        MK_OP(r, MK_OPF_ROPE_KV,
              ops->rope_kv(b, q, k, v, k_cache, v_cache, pages, pos, past, rows, hp->n_heads, hp->n_kv_heads, hp->head_dim,
                           hp->rope_theta, hp->rope_layout));
    } else {
        MK_OP(r, MK_OPF_ROPE_KV, ops->rope(b, q, pos, rows, hp->n_heads, hp->head_dim, hp->rope_theta, hp->rope_layout));
        MK_OP(r, MK_OPF_ROPE_KV,
              ops->rope(b, k, pos, rows, hp->n_kv_heads, hp->head_dim, hp->rope_theta, hp->rope_layout));
        if (ops->kv_store) {
            MK_OP(r, MK_OPF_ROPE_KV, ops->kv_store(b, k_cache, pages, past, k, rows, kv_dim));
            MK_OP(r, MK_OPF_ROPE_KV, ops->kv_store(b, v_cache, pages, past, v, rows, kv_dim));
        } else { /* an F32 cache written row by row (each row's block from the host's copy of the table) */
            const mk_kv_pages host_pages = {sp->seq->host_table, pages.block_shift, 0};
            const size_t row_bytes = kv_dim * sizeof(float);
            for (size_t i = 0; i < rows; i++) {
                const size_t at = mk_kv_row(host_pages, past + i) * row_bytes;
                MK_OP(r, MK_OPF_ROPE_KV, ops->copy(b, k_cache + at, k + i * kv_dim, row_bytes));
                MK_OP(r, MK_OPF_ROPE_KV, ops->copy(b, v_cache + at, v + i * kv_dim, row_bytes));
            }
        }
    }
    MK_OP(r, MK_OPF_ATTENTION,
          ops->attention(b, att, q, k_cache, v_cache, pages, pos, rows, past, hp->n_heads, hp->n_kv_heads, hp->head_dim));
    return MK_OK;
}

/* The rows of a forward as its products see them: groups of rows multiplied together. A
 * forward of one sequence is one group; a batch puts its decode rows (one-row spans, first)
 * in groups of at most the rows a product computes each alone, and each prompt chunk in a
 * group of its own, so every product a row meets is the product its sequence alone meets. */
typedef struct mk_group {
    size_t row0, rows;
    bool alone; /* decode rows of several sequences: each computed as it would be alone */
} mk_group;

typedef struct mk_plan {
    const mk_span *spans;
    size_t n_spans;
    const mk_group *groups;
    size_t n_groups;
    size_t rows; /* all of them */
    /* A batch's decode rows (rows [0, decode_rows), one per sequence; act.tables holds their
     * block tables) and their past keys summed: a backend with decode_rows runs their RoPE,
     * cache writes and attention in one call each. 0 in a forward of one sequence. */
    size_t decode_rows, decode_past;
} mk_plan;

/* Rows [0, rows) of different sequences as groups of at most `cap` (products that compute
 * each row alone), appended to groups[*n]. */
static void mk_groups_alone(mk_group *groups, size_t *n, size_t rows, size_t cap) {
    for (size_t g0 = 0; g0 < rows; g0 += cap) groups[(*n)++] = (mk_group){g0, rows - g0 < cap ? rows - g0 : cap, true};
}

/* RoPE, the cache writes and attention of a batch's decode rows together, each row through
 * its own sequence's block table (act.tables) at its own position: one launch each. */
static mk_status mk_run_decode_attention(mk_range *r, const mk_plan *p, size_t layer_index) {
    const mk_hparams *hp = &r->hp;
    mk_backend *b = r->backend;
    const mk_activations *a = &r->act;
    uint8_t *k_cache = mk_kv_slab(r, 2 * layer_index), *v_cache = mk_kv_slab(r, 2 * layer_index + 1);
    const mk_kv_pages pages = {a->tables, r->kv.shift, (uint32_t)r->table_stride};
    MK_OP(r, MK_OPF_ROPE_KV,
          b->ops->rope_kv(b, a->q, a->k, a->v, k_cache, v_cache, pages, a->pos, p->decode_past, p->decode_rows, hp->n_heads,
                          hp->n_kv_heads, hp->head_dim, hp->rope_theta, hp->rope_layout));
    MK_OP(r, MK_OPF_ATTENTION,
          b->ops->attention(b, a->att, a->q, k_cache, v_cache, pages, a->pos, p->decode_rows, p->decode_past, hp->n_heads,
                            hp->n_kv_heads, hp->head_dim));
    return MK_OK;
}

/* A product's input for one group: its rows of x (width w->cols), and of the 16-bit copy
 * where the backend multiplies that many rows in 16 bits. */
static mk_gemm_input mk_group_input(const mk_range *r, const mk_group *g, const float *x, bool ready,
                                    const mk_weight *w) {
    void *lowp = mk_gemm_lowp(r, g->rows);
    const size_t es = lowp ? mk_dtype_size(r->backend->ops->gemm_input(r->backend, g->rows)) : 0;
    return (mk_gemm_input){x + g->row0 * w->cols, lowp ? (uint8_t *)lowp + g->row0 * w->cols * es : NULL, ready,
                           g->alone};
}

/* y = x @ w^T over every group (y's rows of width w->rows). */
static mk_status mk_product(mk_range *r, const mk_plan *p, float *y, const float *x, bool ready, const mk_weight *w) {
    for (size_t i = 0; i < p->n_groups; i++) {
        const mk_group *g = &p->groups[i];
        const mk_gemm_input in = mk_group_input(r, g, x, ready, w);
        MK_TRY(r->backend->ops->matmul(r->backend, y + g->row0 * w->rows, &in, w, g->rows));
    }
    return MK_OK;
}

static mk_status mk_run_layer(mk_range *r, const mk_plan *p, size_t layer_index, bool last) {
    const mk_hparams *hp = &r->hp;
    mk_backend *b = r->backend;
    const mk_backend_ops *ops = b->ops;
    const mk_layer_weights *w = &r->layers[layer_index];
    const mk_activations *a = &r->act;
    const size_t rows = p->rows;
    /* Where the backend multiplies a group's rows in 16 bits, each norm also writes its output
     * in that dtype (the products that read it find it ready); the other products' inputs
     * (attention's output, the SwiGLU) are converted into the same buffer on the way. */
    void *lowp = NULL;
    for (size_t i = 0; i < p->n_groups && !lowp; i++) lowp = mk_gemm_lowp(r, p->groups[i].rows);

    /* attention block */
    if (layer_index == 0)
        MK_OP(r, MK_OPF_NORM, ops->rmsnorm(b, a->xn, lowp, a->x, w->attn_norm, rows, hp->hidden, hp->rms_eps));
    else
        MK_OP(r, MK_OPF_NORM,
              ops->add_rmsnorm(b, a->x, a->xn, lowp, a->proj, w->attn_norm, rows, hp->hidden, hp->rms_eps));
    for (size_t i = 0; i < p->n_groups; i++) {
        const mk_group *g = &p->groups[i];
        const mk_gemm_input xn = mk_group_input(r, g, a->xn, true, &w->wq);
        if (ops->matmul_shared) {
            float *const y[3] = {a->q + g->row0 * w->wq.rows, a->k + g->row0 * w->wk.rows, a->v + g->row0 * w->wv.rows};
            const mk_weight *const wqkv[3] = {&w->wq, &w->wk, &w->wv};
            MK_OP(r, MK_OPF_QKV, ops->matmul_shared(b, 3, y, wqkv, &xn, g->rows));
        } else {
            MK_OP(r, MK_OPF_QKV, ops->matmul(b, a->q + g->row0 * w->wq.rows, &xn, &w->wq, g->rows));
            MK_OP(r, MK_OPF_QKV, ops->matmul(b, a->k + g->row0 * w->wk.rows, &xn, &w->wk, g->rows));
            MK_OP(r, MK_OPF_QKV, ops->matmul(b, a->v + g->row0 * w->wv.rows, &xn, &w->wv, g->rows));
        }
    }
    const bool together = p->decode_rows > 0 && ops->decode_rows;
    if (together) MK_TRY(mk_run_decode_attention(r, p, layer_index));
    for (size_t i = 0; i < p->n_spans; i++)
        if (!together || p->spans[i].rows > 1) MK_TRY(mk_run_attention(r, &p->spans[i], layer_index));
    MK_OP(r, MK_OPF_ATTN_OUT, mk_product(r, p, a->proj, a->att, false, &w->wo));

    /* mlp block */
    MK_OP(r, MK_OPF_NORM,
          ops->add_rmsnorm(b, a->x, a->xn, lowp, a->proj, w->ffn_norm, rows, hp->hidden, hp->rms_eps));
    for (size_t i = 0; i < p->n_groups; i++) {
        const mk_group *g = &p->groups[i];
        const mk_gemm_input xn = mk_group_input(r, g, a->xn, true, &w->w_gate);
        float *gate = a->gate + g->row0 * hp->intermediate, *up = a->up + g->row0 * hp->intermediate;
        if (ops->matmul_swiglu) {
            MK_OP(r, MK_OPF_GATE_UP, ops->matmul_swiglu(b, gate, up, &xn, &w->w_gate, &w->w_up, g->rows));
        } else {
            MK_OP(r, MK_OPF_GATE_UP, ops->matmul(b, gate, &xn, &w->w_gate, g->rows));
            MK_OP(r, MK_OPF_GATE_UP, ops->matmul(b, up, &xn, &w->w_up, g->rows));
        }
    }
    if (!ops->matmul_swiglu) MK_OP(r, MK_OPF_GATE_UP, ops->swiglu(b, a->gate, a->gate, a->up, rows * hp->intermediate));
    MK_OP(r, MK_OPF_DOWN, mk_product(r, p, a->proj, a->gate, false, &w->w_down));
    if (last) MK_OP(r, MK_OPF_ADD, ops->add(b, a->x, a->proj, rows * hp->hidden));
    return MK_OK;
}

/* The header of what this range emits after `rows` rows of `seq`. No final norm, no
 * pruning, no sampling: the raw residual is the next range's input. */
static void mk_emit_header(const mk_range *r, const mk_sequence *seq, size_t rows, mk_boundary_header *h) {
    mk_boundary_header_defaults(h);
    h->next_layer = r->end + 1;
    h->normalized = false;
    memcpy(h->recipe_digest, r->digest, sizeof h->recipe_digest);
    h->rows = rows;
    h->hidden = r->hp.hidden;
    h->position = (int64_t)seq->length;
    h->step = seq->steps;
}

/* The raw residual of `rows` rows of `seq` into a host bundle whose arrays hold them
 * (mk_range_forward's, made before the forward ran). */
static mk_status mk_fill_bundle(mk_range *r, const mk_sequence *seq, size_t rows, const int32_t *positions,
                                mk_bundle *bundle) {
    MK_TRY(r->backend->ops->download(r->backend, bundle->residual, r->act.x, rows * r->hp.hidden * sizeof(float)));
    memcpy(bundle->positions, positions, rows * sizeof(int32_t));
    mk_emit_header(r, seq, rows, &bundle->h);
    return MK_OK;
}

/* Tail-only pruning: final norm and lm_head on the last row alone, then the sample. */
static mk_status mk_tail_compute(mk_range *r, size_t rows) {
    const mk_hparams *hp = &r->hp;
    mk_backend *b = r->backend;
    const mk_activations *a = &r->act;
    const float *last = a->x + (rows - 1) * hp->hidden;
    void *lowp = mk_gemm_lowp(r, 1);
    const mk_gemm_input xn = {a->xn, lowp, true, false};
    MK_OP(r, MK_OPF_LM_HEAD, b->ops->rmsnorm(b, a->xn, lowp, last, r->output_norm, 1, hp->hidden, hp->rms_eps));
    MK_OP(r, MK_OPF_LM_HEAD, b->ops->matmul(b, a->logits, &xn, &r->lm_head, 1));
    MK_OP(r, MK_OPF_SAMPLE, b->ops->argmax(b, a->token, a->logits, 1, hp->vocab));
    return MK_OK;
}

/* The tail of a batch: each entry's last row normed (gathered into xn's first rows), the
 * lm_head product of those rows in groups a product computes row by row, one sample per
 * row. Every row's arithmetic is the one its sequence alone meets. */
static mk_status mk_tail_compute_batch(mk_range *r, const mk_plan *p) {
    const mk_hparams *hp = &r->hp;
    mk_backend *b = r->backend;
    const mk_activations *a = &r->act;
    const size_t n = p->n_spans;
    /* entries whose last rows follow each other (a batch's decode rows) are normed in one
     * call: the norm of a row does not depend on the rows beside it */
    for (size_t i = 0, run = 1; i < n; i += run) {
        const size_t last = p->spans[i].row0 + p->spans[i].rows - 1;
        for (run = 1; i + run < n && p->spans[i + run].row0 + p->spans[i + run].rows - 1 == last + run; run++) {
        }
        MK_OP(r, MK_OPF_LM_HEAD,
              b->ops->rmsnorm(b, a->xn + i * hp->hidden, NULL, a->x + last * hp->hidden, r->output_norm, run, hp->hidden,
                              hp->rms_eps));
    }
    mk_group groups[MK_MAX_BATCH_SEQUENCES];
    size_t n_groups = 0;
    mk_groups_alone(groups, &n_groups, n, r->tail_rows_alone);
    const mk_plan tail = {p->spans, n, groups, n_groups, n, 0, 0};
    MK_OP(r, MK_OPF_LM_HEAD, mk_product(r, &tail, a->logits, a->xn, false, &r->lm_head));
    MK_OP(r, MK_OPF_SAMPLE, b->ops->argmax(b, a->token, a->logits, n, hp->vocab));
    return MK_OK;
}

/* The tail's results to the host: the token alone (token_only: 4 bytes, one wait), or the
 * logits and the token, both copies queued into the staging buffer and one wait. */
static mk_status mk_tail_download(mk_range *r, float *logits /* [vocab] or NULL */, int32_t *token) {
    mk_backend *b = r->backend;
    const mk_activations *a = &r->act;
    const size_t logit_bytes = r->hp.vocab * sizeof(float);
    const double t0 = mk_op_profile_clock(&r->profile);
    mk_status s = MK_OK;
    if (logits && r->tail_stage) {
        uint8_t *stage = r->tail_stage;
        s = b->ops->download_async(b, stage, a->logits, logit_bytes);
        if (s == MK_OK) s = b->ops->download_async(b, stage + logit_bytes, a->token, sizeof(int32_t));
        if (s == MK_OK) s = b->ops->synchronize(b);
        if (s == MK_OK) {
            memcpy(logits, stage, logit_bytes);
            memcpy(token, stage + logit_bytes, sizeof(int32_t));
        }
    } else {
        if (logits) s = b->ops->download(b, logits, a->logits, logit_bytes);
        if (s == MK_OK) s = b->ops->download(b, token, a->token, sizeof(int32_t));
    }
    mk_op_profile_add(&r->profile, MK_OPF_SAMPLE, t0);
    return s;
}

/* A tail output for the caller, made before the forward runs (so a forward that fails
 * has nothing to undo, and one that runs allocates nothing). */
static mk_status mk_tail_output_new(const mk_range *r, const mk_sampling_contract *sampling, mk_tail_output **out) {
    mk_tail_output *t = calloc(1, sizeof *t);
    if (!t) return mk_fail(MK_ERR_OUT_OF_MEMORY, "tail output: out of memory");
    t->batch = 1;
    t->vocab = r->hp.vocab;
    t->sampling = *sampling;
    /* The token was sampled on the backend (argmax): token_only brings back its 4 bytes alone. */
    t->logits = r->token_only ? NULL : malloc(r->hp.vocab * sizeof(float));
    t->token_ids = malloc(sizeof(int32_t));
    if ((!t->logits && !r->token_only) || !t->token_ids) {
        mk_tail_output_free(t);
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "tail output: out of memory");
    }
    *out = t;
    return MK_OK;
}

/* Argument checks of the two forms that hand out a tail output or take a boundary. */
static mk_status mk_forward_args(mk_range *r, mk_sequence *seq, bool has_out, mk_tail_output **out_tail,
                                 const mk_sampling_contract *sampling, mk_sampling_contract *contract) {
    if (!r || !seq) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_range_forward: NULL range or sequence");
    if (seq->range != r) return mk_fail(MK_ERR_INVALID_ARGUMENT, "sequence belongs to another range");
    const bool tail = mk_role_owns_final_head(r->role);
    if (tail ? !out_tail : !has_out)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s range needs %s", mk_role_name(r->role),
                       tail ? "out_tail" : "out_bundle");
    contract->mode = MK_SAMPLING_GREEDY;
    if (sampling) MK_TRY(mk_sampling_contract_init(contract, sampling->mode));
    return MK_OK;
}

/* The device work of one forward once its inputs are on the device: the input boundary
 * copied into the residual (in), the embedding (head), the layers, then the tail's norm,
 * lm_head and sample, or the residual copied to the output boundary (out). Everything it
 * reads that changes per token (positions, token id) is in device memory, so for one row it
 * can be recorded once and replayed. */
static mk_status mk_forward_device(mk_range *r, const mk_plan *p, const void *in, void *out) {
    mk_backend *b = r->backend;
    const mk_activations *a = &r->act;
    const size_t rows = p->rows;
    const size_t residual_bytes = rows * r->hp.hidden * sizeof(float);
    if (in) MK_TRY(b->ops->copy(b, a->x, in, residual_bytes));
    if (mk_role_owns_embedding(r->role))
        MK_OP(r, MK_OPF_EMBED, b->ops->embed(b, a->x, &r->token_embd, a->ids, rows));
    const size_t n_layers = (size_t)(r->end - r->start + 1);
    for (size_t l = 0; l < n_layers; l++) MK_TRY(mk_run_layer(r, p, l, l + 1 == n_layers));
    if (mk_role_owns_final_head(r->role)) return p->n_spans == 1 ? mk_tail_compute(r, rows) : mk_tail_compute_batch(r, p);
    if (out) MK_TRY(b->ops->copy(b, out, a->x, residual_bytes));
    return MK_OK;
}

/* Decode rows' block tables into act.tables: row k gets rows[k]'s table. Staged on the
 * host, and uploaded (in one copy, from the first row that changed to the last) only where
 * a row differs from what the host last wrote there: a sequence decoding on in the same row
 * uploads nothing until it takes a new block. */
static mk_status mk_stage_tables(mk_range *r, const mk_sequence *const *rows, size_t n) {
    size_t lo = n, hi = 0, hi_entries = 0;
    for (size_t k = 0; k < n; k++) {
        int32_t *row = r->host_tables + k * r->table_stride;
        const size_t bytes = rows[k]->n_blocks * sizeof(int32_t);
        if (memcmp(row, rows[k]->host_table, bytes) == 0) continue;
        memcpy(row, rows[k]->host_table, bytes);
        if (lo == n) lo = k;
        hi = k;
        hi_entries = rows[k]->n_blocks;
    }
    if (lo == n) return MK_OK;
    mk_backend *b = r->backend;
    const size_t first = lo * r->table_stride, count = hi * r->table_stride + hi_entries - first;
    return b->ops->upload(b, r->act.tables + first, r->host_tables + first, count * sizeof(int32_t));
}

/* Decode steps as captured graphs, one per bucket of rows (1, 2, 4, ... up to the range's
 * max_batch_sequences), recorded on first use and replayed for every mix of sequences: all
 * that changes from step to step is a device input the host writes before the launch (the
 * positions, the token ids, each row's block table in act.tables), and the boundaries are
 * copied in and out around it. Rows past the step's own pad its bucket: position -1 (no
 * cache write; one key read through pool block 0), token 0, outputs never read. */
static size_t mk_bucket_rows(const mk_range *r, size_t n) {
    size_t rows = 1;
    while (rows < n) rows <<= 1;
    return rows < r->max_seqs ? rows : r->max_seqs;
}

static size_t mk_bucket_index(size_t rows) {
    size_t i = 0;
    while (((size_t)1 << i) < rows) i++;
    return i;
}

/* The step of decode rows [0, n): their positions, token ids or residual rows and block
 * tables are staged; `keys` the keys they attend in all (the bytes-read model). A step that
 * cannot be recorded runs op by op, with graphs off from then on. */
static mk_status mk_forward_bucket(mk_range *r, size_t n, size_t keys) {
    mk_backend *b = r->backend;
    const mk_activations *a = &r->act;
    const size_t rows = mk_bucket_rows(r, n), at = mk_bucket_index(rows);
    if (rows > n) {
        static const int32_t zeros[MK_MAX_BATCH_SEQUENCES];
        for (size_t i = n; i < rows; i++) r->host_positions[i] = -1;
        MK_TRY(b->ops->upload(b, a->pos + n, r->host_positions + n, (rows - n) * sizeof(int32_t)));
        for (size_t i = n; i < rows; i++) /* each padding row reads key 0 of pool block 0 */
            if (r->host_tables[i * r->table_stride] != 0) {
                r->host_tables[i * r->table_stride] = 0;
                MK_TRY(b->ops->upload(b, a->tables + i * r->table_stride, zeros, sizeof(int32_t)));
            }
        if (mk_role_owns_embedding(r->role)) MK_TRY(b->ops->upload(b, a->ids + n, zeros, (rows - n) * sizeof(int32_t)));
        keys += rows - n;
    }
    mk_span spans[MK_MAX_BATCH_SEQUENCES];
    for (size_t i = 0; i < rows; i++) spans[i] = (mk_span){NULL, i, 1};
    mk_group groups[MK_MAX_BATCH_SEQUENCES];
    size_t n_groups = 0;
    mk_groups_alone(groups, &n_groups, rows, r->rows_alone);
    const mk_plan plan = {spans, rows, groups, n_groups, rows, rows, keys - rows};
    if (!r->steps[at]) {
        void *step = NULL;
        mk_status s = b->ops->step_begin(b, keys);
        if (s == MK_OK) {
            s = mk_forward_device(r, &plan, NULL, NULL);
            const mk_status e = b->ops->step_end(b, &step); /* ends the recording whatever happened */
            if (s == MK_OK) s = e;
        }
        if (s != MK_OK) {
            if (step) b->ops->step_destroy(b, step);
            /* kept for mk_range_graph_failure (the CLI says so once); then the step runs op by
             * op instead, where a real fault is reported */
            snprintf(r->graph_failure, sizeof r->graph_failure, "%s: %s", mk_status_name(s), mk_last_error());
            mk_clear_error();
            r->graphs = false;
            return mk_forward_device(r, &plan, NULL, NULL);
        }
        r->steps[at] = step;
    }
    return b->ops->step_launch(b, r->steps[at], keys);
}

/* One sequence's decode row as the bucket of one: its block table staged as row 0 of
 * act.tables, its boundary copied in before and out after the replay. */
static mk_status mk_forward_step(mk_range *r, mk_sequence *seq, const void *in, void *out) {
    mk_backend *b = r->backend;
    const mk_activations *a = &r->act;
    const size_t residual_bytes = r->hp.hidden * sizeof(float);
    MK_TRY(mk_stage_tables(r, (const mk_sequence *const[]){seq}, 1));
    if (in) MK_TRY(b->ops->copy(b, a->x, in, residual_bytes));
    MK_TRY(mk_forward_bucket(r, 1, seq->length + 1));
    if (out) MK_TRY(b->ops->copy(b, out, a->x, residual_bytes));
    return MK_OK;
}

/* One forward: positions (host staging) and token ids uploaded, then the device work, as a
 * replayed step for one row where the backend has graphs (and the op profile, which times
 * ops on the host, is off), op by op otherwise. A host bundle's residual is already in act.x. */
static mk_status mk_forward_run(mk_range *r, mk_sequence *seq, const int32_t *token_ids, size_t rows, const void *in,
                                void *out) {
    mk_backend *b = r->backend;
    const mk_activations *a = &r->act;
    int32_t *positions = r->host_positions;
    for (size_t i = 0; i < rows; i++) positions[i] = (int32_t)(seq->length + i);
    MK_TRY(b->ops->upload(b, a->pos, positions, rows * sizeof(int32_t)));
    if (mk_role_owns_embedding(r->role)) MK_TRY(b->ops->upload(b, a->ids, token_ids, rows * sizeof(int32_t)));
    if (r->profile.on) r->profile.forwards++;
    if (rows == 1 && r->graphs && !r->profile.on) return mk_forward_step(r, seq, in, out);
    const mk_span span = {seq, 0, rows};
    const mk_group group = {0, rows, false};
    const mk_plan plan = {&span, 1, &group, 1, rows, 0, 0};
    return mk_forward_device(r, &plan, in, out);
}

/* The one forward. */
static mk_status mk_forward(mk_range *r, mk_sequence *seq, const mk_forward_io *io) {
    MK_TRY(mk_check_input_kind(r, io->token_ids, io->n_tokens, io->in != NULL));
    const size_t rows = io->in ? io->in->rows : io->n_tokens;
    if (io->in && !io->in_checked) MK_TRY(mk_check_header(r, seq, io->in));
    else if (!io->in) MK_TRY(mk_check_rows(r, seq, rows));
    MK_TRY(mk_kv_grow(seq, seq->length + rows));
    const bool tail = mk_role_owns_final_head(r->role);
    MK_TRY(mk_forward_run(r, seq, io->token_ids, rows, io->in_payload, tail ? NULL : io->out_payload));
    if (tail) {
        MK_TRY(mk_tail_download(r, io->logits, io->token));
    } else {
        if (io->out_host) MK_TRY(mk_fill_bundle(r, seq, rows, r->host_positions, io->out_host));
        if (io->out) mk_emit_header(r, seq, rows, io->out);
    }
    seq->length += rows;
    seq->steps++;
    return MK_OK;
}

/* A boundary the contract passed on arrival for this sequence, at the length it has now
 * (the seam's receive stamped it; a forward's output or a new receive clears the stamp). */
static bool mk_boundary_checked_for(const mk_boundary *in, const mk_sequence *seq) {
    return in->checked_seq == seq && in->checked_length == seq->length;
}

/* ======================================================= the public forms == */

/* A check's failure, named by the batch entry it came from. */
static mk_status mk_fail_entry(mk_status s, size_t i) {
    char message[480];
    snprintf(message, sizeof message, "%s", mk_last_error());
    return mk_fail(s, "batch entry %zu: %s", i, message);
}

/* Host bundles in and out (the protobuf-facing form). */
mk_status mk_range_forward(mk_range *r, mk_sequence *seq, const int32_t *token_ids, size_t n_tokens,
                           const mk_bundle *bundle, const mk_sampling_contract *sampling, mk_bundle **out_bundle,
                           mk_tail_output **out_tail) {
    mk_clear_error();
    mk_sampling_contract contract;
    MK_TRY(mk_forward_args(r, seq, out_bundle != NULL, out_tail, sampling, &contract));
    MK_TRY(mk_check_input_kind(r, token_ids, n_tokens, bundle != NULL));
    mk_forward_io io = {.token_ids = token_ids, .n_tokens = n_tokens};
    if (bundle) {
        /* The bundle's arrays are checked here (positions row by row, finite values), its
         * header with them; then its rows go straight into the residual. */
        MK_TRY(mk_check_bundle(r, seq, bundle));
        MK_TRY(r->backend->ops->upload(r->backend, r->act.x, bundle->residual,
                                       bundle->h.rows * r->hp.hidden * sizeof(float)));
        io.in = &bundle->h;
        io.in_checked = true;
    } else {
        MK_TRY(mk_check_rows(r, seq, n_tokens));
    }
    const size_t rows = bundle ? bundle->h.rows : n_tokens;
    mk_tail_output *tail = NULL;
    mk_bundle *host = NULL;
    if (mk_role_owns_final_head(r->role)) {
        MK_TRY(mk_tail_output_new(r, &contract, &tail));
        io.logits = tail->logits;
        io.token = tail->token_ids;
    } else {
        MK_TRY(mk_bundle_create(1, rows, r->hp.hidden, &host));
        io.out_host = host;
    }
    const mk_status s = mk_forward(r, seq, &io);
    if (s != MK_OK) {
        mk_tail_output_free(tail);
        mk_bundle_free(host);
        return s;
    }
    if (tail) *out_tail = tail;
    else *out_bundle = host;
    return MK_OK;
}

/* Boundaries in backend memory in and out; a tail output for the caller. */
mk_status mk_range_forward_boundary(mk_range *r, mk_sequence *seq, const int32_t *token_ids, size_t n_tokens,
                                    const mk_boundary *in, const mk_sampling_contract *sampling, mk_boundary *out,
                                    mk_tail_output **out_tail) {
    mk_clear_error();
    mk_sampling_contract contract;
    MK_TRY(mk_forward_args(r, seq, out != NULL, out_tail, sampling, &contract));
    if ((in && in->range != r) || (out && out->range != r))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "boundary belongs to another range");
    const bool tail = mk_role_owns_final_head(r->role);
    mk_forward_io io = {.token_ids = token_ids, .n_tokens = n_tokens};
    if (in) {
        io.in = &in->h;
        io.in_payload = in->payload;
        io.in_checked = mk_boundary_checked_for(in, seq);
    }
    mk_tail_output *t = NULL;
    if (tail) {
        /* the tail output is made once the inputs are known to be acceptable */
        MK_TRY(mk_check_input_kind(r, token_ids, n_tokens, in != NULL));
        MK_TRY(mk_tail_output_new(r, &contract, &t));
        io.logits = t->logits;
        io.token = t->token_ids;
    } else {
        out->checked_seq = NULL; /* its header is about to change */
        io.out_payload = out->payload;
        io.out = &out->h;
    }
    const mk_status s = mk_forward(r, seq, &io);
    if (s != MK_OK) {
        mk_tail_output_free(t);
        return s;
    }
    if (tail) *out_tail = t;
    return MK_OK;
}

/* The scheduler's and the stage runtime's step: boundaries in backend memory, the tail's
 * logits and token written into buffers the caller owns (a preallocated activation slot),
 * so a step allocates nothing. */
mk_status mk_range_forward_into(mk_range *r, mk_sequence *seq, const int32_t *token_ids, size_t n_tokens,
                                const mk_boundary *in, mk_boundary *out, float *out_logits, int32_t *out_token) {
    if (!r || !seq) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_range_forward_into: NULL range or sequence");
    if (seq->range != r) return mk_fail(MK_ERR_INVALID_ARGUMENT, "sequence belongs to another range");
    const bool tail = mk_role_owns_final_head(r->role);
    if (tail ? (!out_logits && !r->token_only) || !out_token : !out)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s range needs %s", mk_role_name(r->role),
                       tail ? "logits and token buffers" : "an output boundary");
    if ((in && in->range != r) || (out && out->range != r))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "boundary belongs to another range");
    mk_forward_io io = {.token_ids = token_ids, .n_tokens = n_tokens};
    if (in) {
        io.in = &in->h;
        io.in_payload = in->payload;
        io.in_checked = mk_boundary_checked_for(in, seq);
    }
    if (tail) {
        io.logits = r->token_only ? NULL : out_logits;
        io.token = out_token;
    } else {
        out->checked_seq = NULL; /* its header is about to change */
        io.out_payload = out->payload;
        io.out = &out->h;
    }
    return mk_forward(r, seq, &io);
}

/* ==================================================== the batch forward == */

/* One entry's checks, before anything runs: its sequence, its input, its outputs. */
static mk_status mk_batch_entry_check(mk_range *r, const mk_forward_entry *e, size_t i, size_t *rows) {
    const bool tail = mk_role_owns_final_head(r->role);
    if (!e->seq) return mk_fail(MK_ERR_INVALID_ARGUMENT, "batch entry %zu: NULL sequence", i);
    if (e->seq->range != r) return mk_fail(MK_ERR_INVALID_ARGUMENT, "batch entry %zu: sequence of another range", i);
    if (tail ? (!e->logits && !r->token_only) || !e->token : !e->out)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "batch entry %zu: %s range needs %s", i, mk_role_name(r->role),
                       tail ? "logits and token buffers" : "an output boundary");
    if ((e->in && e->in->range != r) || (e->out && e->out->range != r))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "batch entry %zu: boundary of another range", i);
    const mk_status k = mk_check_input_kind(r, e->token_ids, e->n_tokens, e->in != NULL);
    if (k != MK_OK) return mk_fail_entry(k, i);
    *rows = e->in ? e->in->h.rows : e->n_tokens;
    const mk_status c = e->in ? (mk_boundary_checked_for(e->in, e->seq) ? MK_OK : mk_check_header(r, e->seq, &e->in->h))
                              : mk_check_rows(r, e->seq, *rows);
    return c == MK_OK ? MK_OK : mk_fail_entry(c, i);
}

mk_status mk_range_check_batch_entry(mk_range *r, const mk_forward_entry *e, size_t i) {
    size_t rows = 0;
    if (!r || !e) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_range_check_batch_entry: NULL argument");
    return mk_batch_entry_check(r, e, i, &rows);
}

mk_status mk_range_forward_batch(mk_range *r, const mk_forward_entry *entries, size_t n) {
    mk_clear_error();
    if (!r || !entries || n == 0) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_range_forward_batch: NULL or empty batch");
    if (n > r->max_seqs)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "a batch of %zu sequences; this range takes at most %zu per forward "
                       "(mk_range_options.max_batch_sequences)", n, r->max_seqs);
    if (n == 1) { /* one sequence: the forward of one (a captured graph for a decode row) */
        const mk_forward_entry *e = entries;
        return mk_range_forward_into(r, e->seq, e->token_ids, e->n_tokens, e->in, e->out, e->logits, e->token);
    }
    /* spans[i] is entry i's; its rows sit where the plan puts them: decode rows first */
    mk_span spans[MK_MAX_BATCH_SEQUENCES];
    size_t total = 0, decode_rows = 0;
    for (size_t i = 0; i < n; i++) {
        size_t rows = 0;
        MK_TRY(mk_batch_entry_check(r, &entries[i], i, &rows));
        for (size_t j = 0; j < i; j++) {
            if (entries[j].seq == entries[i].seq)
                return mk_fail(MK_ERR_INVALID_ARGUMENT, "batch entries %zu and %zu are the same sequence", j, i);
            /* one output each: a shared one would hold the later entry's rows alone */
            const bool tail_out = mk_role_owns_final_head(r->role);
            if (tail_out ? entries[j].token == entries[i].token ||
                               (!r->token_only && entries[j].logits == entries[i].logits)
                         : entries[j].out == entries[i].out)
                return mk_fail(MK_ERR_INVALID_ARGUMENT, "batch entries %zu and %zu write the same output %s", j, i,
                               tail_out ? "buffer" : "boundary");
        }
        spans[i] = (mk_span){entries[i].seq, 0, rows};
        total += rows;
        decode_rows += rows == 1;
    }
    mk_group groups[MK_MAX_BATCH_SEQUENCES];
    size_t n_groups = 0, next_decode = 0, next_chunk = decode_rows;
    for (size_t i = 0; i < n; i++) spans[i].row0 = spans[i].rows == 1 ? next_decode++ : (next_chunk += spans[i].rows) - spans[i].rows;
    mk_groups_alone(groups, &n_groups, decode_rows, r->rows_alone);
    for (size_t i = 0; i < n; i++)
        if (spans[i].rows > 1) groups[n_groups++] = (mk_group){spans[i].row0, spans[i].rows, false};
    if (total > r->max_rows)
        return mk_fail(MK_ERR_SHAPE, "a batch of %zu rows; this range's forwards take at most %zu (max_batch_tokens)",
                       total, r->max_rows);
    size_t held[MK_MAX_BATCH_SEQUENCES], promised[MK_MAX_BATCH_SEQUENCES];
    for (size_t i = 0; i < n; i++) { /* all or nothing: a later entry's refusal undoes the earlier grows */
        held[i] = spans[i].seq->n_blocks;
        promised[i] = spans[i].seq->promised;
        const mk_status g = mk_kv_grow(spans[i].seq, spans[i].seq->length + spans[i].rows);
        if (g != MK_OK) {
            for (size_t j = 0; j < i; j++) mk_kv_shrink(spans[j].seq, held[j], promised[j]);
            return mk_fail_entry(g, i);
        }
    }
    mk_backend *b = r->backend;
    const mk_activations *a = &r->act;
    const size_t hidden = r->hp.hidden;
    const bool head = mk_role_owns_embedding(r->role), tail = mk_role_owns_final_head(r->role);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < spans[i].rows; k++) r->host_positions[spans[i].row0 + k] = (int32_t)(spans[i].seq->length + k);
    MK_TRY(b->ops->upload(b, a->pos, r->host_positions, total * sizeof(int32_t)));
    size_t decode_past = 0;
    if (b->ops->decode_rows && decode_rows > 0) { /* decode row k's block table at row k of act.tables */
        const mk_sequence *row_seq[MK_MAX_BATCH_SEQUENCES];
        for (size_t i = 0; i < n; i++)
            if (spans[i].rows == 1) {
                row_seq[spans[i].row0] = spans[i].seq;
                decode_past += spans[i].seq->length;
            }
        MK_TRY(mk_stage_tables(r, row_seq, decode_rows));
    }
    for (size_t i = 0; i < n; i++) {
        const mk_forward_entry *e = &entries[i];
        if (head) MK_TRY(b->ops->upload(b, a->ids + spans[i].row0, e->token_ids, spans[i].rows * sizeof(int32_t)));
        else MK_TRY(b->ops->copy(b, a->x + spans[i].row0 * hidden, e->in->payload, spans[i].rows * hidden * sizeof(float)));
    }
    if (r->profile.on) r->profile.forwards++;
    if (decode_rows == n && r->graphs && !r->profile.on) { /* decode rows only: the bucket's replay */
        MK_TRY(mk_forward_bucket(r, n, decode_past + n));
    } else {
        const mk_plan plan = {spans, n, groups, n_groups, total, decode_rows, decode_past};
        MK_TRY(mk_forward_device(r, &plan, NULL, NULL));
    }
    for (size_t i = 0; i < n; i++) {
        const mk_forward_entry *e = &entries[i];
        if (tail) {
            if (e->logits && !r->token_only)
                MK_TRY(b->ops->download(b, e->logits, a->logits + i * r->hp.vocab, r->hp.vocab * sizeof(float)));
            MK_TRY(b->ops->download(b, e->token, a->token + i, sizeof(int32_t)));
        } else {
            e->out->checked_seq = NULL; /* its header is about to change */
            MK_TRY(b->ops->copy(b, e->out->payload, a->x + spans[i].row0 * hidden, spans[i].rows * hidden * sizeof(float)));
            mk_emit_header(r, e->seq, spans[i].rows, &e->out->h);
        }
    }
    for (size_t i = 0; i < n; i++) {
        spans[i].seq->length += spans[i].rows;
        spans[i].seq->steps++;
    }
    return MK_OK;
}

void mk_tail_output_free(mk_tail_output *t) {
    if (!t) return;
    free(t->logits);
    free(t->token_ids);
    free(t);
}

