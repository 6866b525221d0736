/* The range: a contiguous layer range [start, end] of one model on one backend (its
 * weights, plus the token embedding for a head and the final norm and lm_head for a tail),
 * and an activation arena sized at creation so no forward allocates. Built and freed here;
 * the weights are loaded by weights.c, sequences live in sequence.c, the contract in
 * check.c, the forward pass in forward.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mk_size.h"
#include "core/options.h"
#include "mk_error.h"
#include "range/range_impl.h"

mk_range_options mk_range_options_default(void) {
    mk_range_options o = {.struct_size = sizeof o, .architecture = NULL,
                          .backend = mk_backend_config_default(MK_BACKEND_CPU), .max_context = 0,
                          .max_batch_tokens = 0, .token_only = false, .eager_decode = false};
    return o;
}

/* A NULL range (mk_pipeline_range or mk_sched_worker_range past the end) reads as no range,
 * as the other getters read NULL: role 0, layers -1, no bytes, no digest. */
mk_role mk_range_role(const mk_range *r) { return r ? r->role : (mk_role)0; }
int64_t mk_range_start(const mk_range *r) { return r ? r->start : -1; }
int64_t mk_range_end(const mk_range *r) { return r ? r->end : -1; }
size_t mk_range_weight_bytes(const mk_range *r) { return r ? r->weight_bytes : 0; }
const char *mk_range_recipe_digest(const mk_range *r) { return r ? r->digest : NULL; }
const char *mk_range_graph_failure(const mk_range *r) { return r && r->graph_failure[0] ? r->graph_failure : NULL; }
const mk_backend_counters *mk_range_backend_counters(const mk_range *r) { return &r->backend->counters; }
mk_backend *mk_range_backend(const mk_range *r) { return r->backend; }

void mk_range_profile(mk_range *r, bool on) {
    memset(&r->profile, 0, sizeof r->profile);
    r->profile.on = on;
}

const mk_op_profile *mk_range_op_profile(const mk_range *r) { return &r->profile; }
size_t mk_range_max_rows(const mk_range *r) { return r->max_rows; }
size_t mk_range_max_seqs(const mk_range *r) { return r->max_seqs; }
size_t mk_range_max_context(const mk_range *r) { return r->max_context; }
size_t mk_range_hidden(const mk_range *r) { return r->hp.hidden; }

/* ============================================================ activations == */

static void mk_range_activations(mk_range *r, mk_carver *c) {
    const mk_hparams *hp = &r->hp;
    const size_t rows = r->max_rows, q_dim = hp->n_heads * hp->head_dim, kv_dim = hp->n_kv_heads * hp->head_dim;
    mk_activations *a = &r->act;
    a->x = mk_carve(c, rows * hp->hidden * sizeof(float));
    a->xn = mk_carve(c, rows * hp->hidden * sizeof(float));
    a->q = mk_carve(c, rows * q_dim * sizeof(float));
    a->k = mk_carve(c, rows * kv_dim * sizeof(float));
    a->v = mk_carve(c, rows * kv_dim * sizeof(float));
    a->att = mk_carve(c, rows * q_dim * sizeof(float));
    a->proj = mk_carve(c, rows * hp->hidden * sizeof(float));
    a->gate = mk_carve(c, rows * hp->intermediate * sizeof(float));
    a->up = mk_carve(c, rows * hp->intermediate * sizeof(float));
    /* The 16-bit copy of a product's input, where the backend multiplies in one (cuda's
     * cuBLAS path with 16-bit or native weights): the widest input is one of these three. */
    const mk_dtype lowp = r->backend->ops->gemm_input ? r->backend->ops->gemm_input(r->backend, rows) : MK_DTYPE_F32;
    size_t width = hp->hidden > q_dim ? hp->hidden : q_dim;
    if (hp->intermediate > width) width = hp->intermediate;
    a->lowp = lowp == MK_DTYPE_F32 ? NULL : mk_carve(c, rows * width * mk_dtype_size(lowp));
    a->logits = mk_carve(c, mk_role_owns_final_head(r->role) ? r->max_seqs * hp->vocab * sizeof(float) : 0);
    a->ids = mk_carve(c, rows * sizeof(int32_t));
    a->pos = mk_carve(c, rows * sizeof(int32_t));
    a->token = mk_carve(c, r->max_seqs * sizeof(int32_t));
    a->tables = r->host_tables ? mk_carve(c, r->max_seqs * r->table_stride * sizeof(int32_t)) : NULL;
}

/* How many decode rows of different sequences one product may take, each computed as it
 * would be alone: the least the backend promises over every matrix of the layers (and over
 * lm_head for the tail's product). */
static size_t mk_weight_rows_alone(const mk_range *r, const mk_weight *w) {
    const mk_backend_ops *ops = r->backend->ops;
    const size_t n = ops->gemm_rows_alone ? ops->gemm_rows_alone(r->backend, w) : 1;
    return n ? n : 1;
}

static void mk_range_rows_alone(mk_range *r) {
    size_t least = MK_MAX_BATCH_SEQUENCES;
    for (int64_t l = 0; l <= r->end - r->start; l++) {
        const mk_layer_weights *w = &r->layers[l];
        const mk_weight *all[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
            const size_t n = mk_weight_rows_alone(r, all[i]);
            if (n < least) least = n;
        }
    }
    r->rows_alone = least;
    r->tail_rows_alone = mk_role_owns_final_head(r->role) ? mk_weight_rows_alone(r, &r->lm_head) : 1;
    if (r->tail_rows_alone > MK_MAX_BATCH_SEQUENCES) r->tail_rows_alone = MK_MAX_BATCH_SEQUENCES;
}

/* ============================================================= lifecycle == */

mk_status mk_range_create(const mk_model *model, int64_t start, int64_t end, const mk_range_options *options,
                          mk_range **out) {
    mk_clear_error();
    if (!model || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_range_create: NULL argument");
    *out = NULL;
    mk_range_options taken = mk_range_options_default();
    if (options) MK_TRY(mk_options_take(&taken, sizeof taken, MK_RANGE_OPTIONS_V1_SIZE, options, "mk_range_options"));
    const mk_range_options *opt = &taken;
    /* Fail closed before touching any weight. */
    const char *advertised = opt->architecture ? opt->architecture : model->architecture;
    MK_TRY(mk_certified_architecture(advertised, NULL));
    mk_role role;
    MK_TRY(mk_role_for_range(start, end, (int64_t)model->hp.n_layers, &role));
    size_t max_context = opt->max_context ? opt->max_context : model->hp.max_context;
    if (!opt->max_context && max_context > 4096) max_context = 4096;
    if (max_context > model->hp.max_context)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "range max_context %zu exceeds the model's %zu", max_context,
                       model->hp.max_context);
    const size_t max_rows = opt->max_batch_tokens ? opt->max_batch_tokens : max_context;
    if (max_rows > max_context)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "max_batch_tokens %zu exceeds max_context %zu", max_rows, max_context);
    const size_t max_seqs = opt->max_batch_sequences ? opt->max_batch_sequences : 1;
    if (max_seqs > MK_MAX_BATCH_SEQUENCES || max_seqs > max_rows)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "max_batch_sequences %zu: at most %d, and at most max_batch_tokens (%zu)",
                       max_seqs, MK_MAX_BATCH_SEQUENCES, max_rows);

    mk_range *r = calloc(1, sizeof *r);
    if (!r) return mk_fail(MK_ERR_OUT_OF_MEMORY, "range: out of memory");
    r->model = model;
    r->hp = model->hp;
    r->start = start;
    r->end = end;
    r->role = role;
    r->max_context = max_context;
    r->max_rows = max_rows;
    r->max_seqs = max_seqs;
    r->token_only = opt->token_only;
    r->graphs = !opt->eager_decode;
    r->layers = calloc((size_t)(end - start + 1), sizeof *r->layers);
    r->host_positions = calloc(max_rows, sizeof(int32_t));
    mk_status s = r->layers && r->host_positions ? MK_OK : mk_fail(MK_ERR_OUT_OF_MEMORY, "range: out of memory");
    if (s == MK_OK) s = mk_backend_create(&opt->backend, &r->backend);
    if (s == MK_OK && mk_backend_kv_dtype(r->backend) != MK_DTYPE_F32 && !r->backend->ops->kv_store &&
        !r->backend->ops->rope_kv)
        s = mk_fail(MK_ERR_DTYPE, "%s backend keeps its KV cache in f32 only (asked for %s)", r->backend->ops->name,
                    mk_dtype_name(opt->backend.kv_dtype));
    if (s == MK_OK) {
        /* The digest binds the model identity and the weight dtype the residual came from. */
        mk_sha256 *ctx;
        s = mk_sha256_begin(&ctx);
        if (s == MK_OK) {
            char text[96];
            /* An F16 KV cache changes the residual too; F32 (the default) adds nothing, so
             * digests of F32-cache ranges are what they always were. */
            const mk_dtype kv = opt->backend.kv_dtype;
            const char *kv_tag = kv == MK_DTYPE_F16 ? ";kv=f16" : kv == MK_DTYPE_BF16 ? ";kv=bf16" : "";
            const int n = snprintf(text, sizeof text, "%s;weights=%s%s", model->digest,
                                   mk_dtype_name(opt->backend.weight_dtype), kv_tag);
            mk_sha256_update(ctx, text, (size_t)n);
            mk_sha256_finish(ctx, r->digest);
        }
    }
    if (s == MK_OK) s = r->backend->ops->reserve(r->backend, max_rows, max_seqs, max_context, &r->hp);
    if (s == MK_OK) s = mk_range_load(r);
    if (s == MK_OK) s = mk_kv_pool_create(r, opt);
    if (s == MK_OK) mk_range_rows_alone(r);
    if (s == MK_OK && r->backend->ops->decode_rows) { /* a batch's decode rows' tables, staged per step */
        r->table_stride = mk_kv_blocks_for(&r->kv, max_context);
        r->host_tables = mk_alloc_array(max_seqs * r->table_stride, sizeof(int32_t), "range: decode rows' block tables");
        if (!r->host_tables) s = MK_ERR_OUT_OF_MEMORY;
        /* -1 names no block: every row differs from a sequence's table at its first staging,
         * so the device rows (never written) are uploaded before they are read */
        else memset(r->host_tables, 0xFF, max_seqs * r->table_stride * sizeof(int32_t));
    }
    if (s == MK_OK) {
        mk_carver sizing = {0, NULL};
        mk_range_activations(r, &sizing);
        s = r->backend->ops->alloc(r->backend, sizing.offset, &r->act_arena);
        if (s == MK_OK) {
            mk_carver carving = {0, r->act_arena};
            mk_range_activations(r, &carving);
        }
    }
    mk_backend *b = r->backend;
    r->graphs = r->graphs && s == MK_OK && b->ops->step_begin && b->ops->decode_rows;
    /* A tail that brings logits back stages them with the token in one host buffer: both
     * copies queued, then one wait (a host-addressable backend reads its memory directly). */
    if (s == MK_OK && mk_role_owns_final_head(role) && !r->token_only && !b->ops->host_addressable &&
        b->ops->host_alloc && b->ops->download_async)
        s = b->ops->host_alloc(b, r->hp.vocab * sizeof(float) + sizeof(int32_t), &r->tail_stage);
    if (s != MK_OK) {
        mk_range_free(r);
        return s;
    }
    *out = r;
    return MK_OK;
}

void mk_range_free(mk_range *r) {
    if (!r) return;
    if (r->backend) {
        for (size_t i = 0; i < MK_STEP_BUCKETS; i++)
            if (r->steps[i]) r->backend->ops->step_destroy(r->backend, r->steps[i]);
        if (r->tail_stage) r->backend->ops->host_release(r->backend, r->tail_stage);
        if (r->weight_arena) r->backend->ops->release(r->backend, r->weight_arena);
        if (r->act_arena) r->backend->ops->release(r->backend, r->act_arena);
        mk_kv_pool_free(r);
        mk_backend_destroy(r->backend);
    }
    free(r->layers);
    free(r->host_positions);
    free(r->host_tables);
    free(r);
}
