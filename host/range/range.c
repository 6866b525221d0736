/* The range executor: the one place the boundary contract is enforced.
 *
 * A range owns the weights of layers [start, end] (plus the token embedding for a head,
 * the final norm and lm_head for a tail), one backend, and an activation arena sized at
 * creation so the forward path allocates nothing but its outputs. Each sequence owns a
 * KV cache of max_context positions for every layer of the range. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "protocol/boundary.h"
#include "model/model.h"
#include "mk_error.h"
#include "core/mk_size.h"
#include "range/op_profile.h"
#include "core/options.h"
#include "range/range.h"
#include "model/tensor_schema.h"

typedef struct mk_layer_weights {
    float *attn_norm; /* [hidden] f32 */
    void *wq;         /* [n_heads * head_dim, hidden] */
    void *wk;         /* [n_kv_heads * head_dim, hidden] */
    void *wv;         /* [n_kv_heads * head_dim, hidden] */
    void *wo;         /* [hidden, n_heads * head_dim] */
    float *ffn_norm;  /* [hidden] f32 */
    void *w_gate;     /* [intermediate, hidden] */
    void *w_up;       /* [intermediate, hidden] */
    void *w_down;     /* [hidden, intermediate] */
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
    float *logits;  /* [1, vocab] tail only */
    int32_t *ids;   /* [rows] */
    int32_t *pos;   /* [rows] */
    int32_t *token; /* [1] tail only */
} mk_activations;

/* What a captured decode step bakes in besides the range's own buffers: a step recorded
 * for other addresses is recaptured. */
typedef struct mk_step_key {
    const void *kv_arena;    /* the sequence's KV cache */
    const void *in_payload;  /* the boundary copied into the residual, or NULL */
    const void *out_payload; /* the boundary the residual is copied to, or NULL */
} mk_step_key;

struct mk_range {
    const mk_model *model;
    mk_hparams hp;
    int64_t start, end;
    mk_role role;
    size_t max_context, max_rows;
    mk_backend *backend;
    char digest[MK_DIGEST_HEX_LEN + 1];

    void *weight_arena; /* dev: every weight of the range, carved below */
    size_t weight_bytes;
    void *token_embd;   /* [vocab, hidden] head, or tail with tied embeddings */
    float *output_norm; /* [hidden] tail */
    const void *lm_head; /* [vocab, hidden] tail: output.weight or token_embd */
    mk_layer_weights *layers; /* [end - start + 1] */

    void *act_arena; /* dev */
    mk_activations act;
    int32_t *host_positions; /* [max_rows] host staging of the positions of one forward */
    mk_op_profile profile;   /* host time per op family, when switched on (benchmarks) */
    bool token_only;         /* tail: download the sampled token id alone */
    /* Decode steps (1-row forwards) as one captured graph, replayed per token: the backend
     * has step ops and the range was not made with eager_decode. Off for good after a
     * capture failed (the step then runs op by op). */
    bool graphs;
    void *step;              /* the captured step (backend's), NULL until the first decode */
    char graph_failure[256]; /* why recording stopped (mk_range_graph_failure); "" while on */
    mk_step_key step_key;    /* the addresses it bakes in */
    void *tail_stage;        /* host staging (pinned on cuda): logits [vocab] then the token */
};

struct mk_sequence {
    mk_range *range;
    void *kv_arena;  /* dev: [n_layers][2][max_context, kv_dim] in the backend's KV dtype */
    size_t length;   /* positions cached */
    uint64_t steps;  /* forwards so far: the step number a boundary carries */
};

/* ================================================================ helpers == */

static size_t mk_align_up(size_t n) { return (n + 255) & ~(size_t)255; }

/* A size table: reserve() adds aligned slices, then one allocation is carved. */
typedef struct mk_carver {
    size_t offset;
    uint8_t *base;
} mk_carver;

static void *mk_carve(mk_carver *c, size_t bytes) {
    void *p = c->base ? c->base + c->offset : NULL;
    c->offset += mk_align_up(bytes);
    return p;
}

mk_range_options mk_range_options_default(void) {
    mk_range_options o = {.struct_size = sizeof o, .architecture = NULL,
                          .backend = mk_backend_config_default(MK_BACKEND_CPU), .max_context = 0,
                          .max_batch_tokens = 0, .token_only = false, .eager_decode = false};
    return o;
}

mk_role mk_range_role(const mk_range *r) { return r->role; }
int64_t mk_range_start(const mk_range *r) { return r->start; }
int64_t mk_range_end(const mk_range *r) { return r->end; }
size_t mk_range_weight_bytes(const mk_range *r) { return r->weight_bytes; }
const char *mk_range_recipe_digest(const mk_range *r) { return r->digest; }
const char *mk_range_graph_failure(const mk_range *r) { return r && r->graph_failure[0] ? r->graph_failure : NULL; }
const mk_backend_counters *mk_range_backend_counters(const mk_range *r) { return &r->backend->counters; }
mk_backend *mk_range_backend(const mk_range *r) { return r->backend; }

void mk_range_profile(mk_range *r, bool on) {
    memset(&r->profile, 0, sizeof r->profile);
    r->profile.on = on;
}

const mk_op_profile *mk_range_op_profile(const mk_range *r) { return &r->profile; }
size_t mk_range_max_rows(const mk_range *r) { return r->max_rows; }
size_t mk_range_max_context(const mk_range *r) { return r->max_context; }
size_t mk_range_hidden(const mk_range *r) { return r->hp.hidden; }

/* ================================================================ weights == */

/* Native weight mode: a matrix kept in the format its source stores (or F32 for a source
 * without one), as the backend lays it out. */
static mk_status mk_range_native_matrix(mk_range *r, mk_carver *c, void **dst, const char *name, size_t rows,
                                        size_t cols, float *staging) {
    mk_backend *b = r->backend;
    if (!b->ops->native_weight_bytes)
        return mk_fail(MK_ERR_DTYPE, "%s backend has no native weight mode", b->ops->name);
    uint32_t type = 0; /* F32 */
    const void *src = NULL;
    size_t src_bytes = 0;
    const bool stored = mk_model_tensor_stored(r->model, name, rows * cols, &type, &src, &src_bytes);
    if (!stored) type = 0;
    const size_t bytes = b->ops->native_weight_bytes(b, type, rows, cols);
    if (!bytes)
        return mk_fail(MK_ERR_DTYPE, "%s backend cannot keep tensor '%s' [%zu, %zu] in its stored format",
                       b->ops->name, name, rows, cols);
    *dst = mk_carve(c, bytes);
    if (!c->base) return MK_OK;
    if (!stored) {
        MK_TRY(mk_model_load_tensor(r->model, name, staging, rows * cols));
        src = staging;
        src_bytes = rows * cols * sizeof(float);
    }
    return b->ops->upload_native_weight(b, *dst, type, src, src_bytes, rows, cols);
}

/* Carve (or, on the second pass, load) every weight the range owns. */
static mk_status mk_range_weights(mk_range *r, mk_carver *c, float *staging) {
    const mk_hparams *hp = &r->hp;
    const size_t welem = mk_backend_weight_elem_size(r->backend);
    mk_backend *b = r->backend;
    const bool loading = c->base != NULL;
    const bool native = b->config.weight_dtype == MK_DTYPE_NATIVE;

#define MK_MATRIX(dst, name, rows, cols)                                              \
    do {                                                                              \
        if (native) MK_TRY(mk_range_native_matrix(r, c, &(dst), (name), (rows), (cols), staging)); \
        else {                                                                        \
            (dst) = mk_carve(c, (rows) * (cols) * welem);                             \
            if (loading) {                                                            \
                MK_TRY(mk_model_load_tensor(r->model, (name), staging, (rows) * (cols))); \
                MK_TRY(b->ops->upload_weight(b, (dst), staging, (rows) * (cols)));    \
            }                                                                         \
        }                                                                             \
    } while (0)
#define MK_VECTOR(dst, name, count)                                                   \
    do {                                                                              \
        (dst) = mk_carve(c, (count) * sizeof(float));                                 \
        if (loading) {                                                                \
            MK_TRY(mk_model_load_tensor(r->model, (name), staging, (count)));         \
            MK_TRY(b->ops->upload(b, (dst), staging, (count) * sizeof(float)));       \
        }                                                                             \
    } while (0)

    /* Names and sizes come from the tensor schema; this says only where each one goes. */
    char name[96];
/* Vectors (norm weights) and matrices by their schema kind: name and shape from the table. */
#define MK_TENSOR_VECTOR(dst, kind, layer)                                                          \
    do {                                                                                            \
        mk_tensor_name((kind), (layer), name, sizeof name);                                         \
        MK_VECTOR(dst, name, mk_tensor_elems(hp, (kind)));                                          \
    } while (0)
#define MK_TENSOR(dst, kind, layer)                                                                 \
    do {                                                                                            \
        mk_tensor_name((kind), (layer), name, sizeof name);                                         \
        MK_MATRIX(dst, name, mk_tensor_dim_size(hp, mk_tensor_schema_of(kind)->rows),               \
                  mk_tensor_dim_size(hp, mk_tensor_schema_of(kind)->cols));                         \
    } while (0)
    char output_name[96];
    const bool tied = !mk_model_has_tensor(r->model, mk_tensor_name(MK_TENSOR_OUTPUT, 0, output_name, sizeof output_name));
    if (mk_role_owns_embedding(r->role) || (mk_role_owns_final_head(r->role) && tied))
        MK_TENSOR(r->token_embd, MK_TENSOR_TOKEN_EMBD, 0);
    for (int64_t l = r->start; l <= r->end; l++) {
        mk_layer_weights *w = &r->layers[l - r->start];
        MK_TENSOR_VECTOR(w->attn_norm, MK_TENSOR_ATTN_NORM, l);
        MK_TENSOR(w->wq, MK_TENSOR_ATTN_Q, l);
        MK_TENSOR(w->wk, MK_TENSOR_ATTN_K, l);
        MK_TENSOR(w->wv, MK_TENSOR_ATTN_V, l);
        MK_TENSOR(w->wo, MK_TENSOR_ATTN_OUTPUT, l);
        MK_TENSOR_VECTOR(w->ffn_norm, MK_TENSOR_FFN_NORM, l);
        MK_TENSOR(w->w_gate, MK_TENSOR_FFN_GATE, l);
        MK_TENSOR(w->w_up, MK_TENSOR_FFN_UP, l);
        MK_TENSOR(w->w_down, MK_TENSOR_FFN_DOWN, l);
    }
    if (mk_role_owns_final_head(r->role)) {
        MK_TENSOR_VECTOR(r->output_norm, MK_TENSOR_OUTPUT_NORM, 0);
        if (tied) {
            r->lm_head = r->token_embd;
        } else {
            void *head;
            MK_TENSOR(head, MK_TENSOR_OUTPUT, 0);
            r->lm_head = head;
        }
    }
#undef MK_TENSOR
#undef MK_TENSOR_VECTOR
#undef MK_MATRIX
#undef MK_VECTOR
    return MK_OK;
}

static size_t mk_range_largest_tensor(const mk_hparams *hp) {
    size_t n = 0;
    for (int k = 0; k < MK_TENSOR_KIND_COUNT; k++)
        if (mk_tensor_elems(hp, (mk_tensor_kind)k) > n) n = mk_tensor_elems(hp, (mk_tensor_kind)k);
    return n;
}

static mk_status mk_range_load(mk_range *r) {
    mk_carver sizing = {0, NULL};
    MK_TRY(mk_range_weights(r, &sizing, NULL));
    r->weight_bytes = sizing.offset;
    MK_TRY(r->backend->ops->alloc(r->backend, r->weight_bytes, &r->weight_arena));
    /* One tensor is staged on the host at a time (dequantized F32), then uploaded. */
    float *staging = malloc(mk_range_largest_tensor(&r->hp) * sizeof(float));
    if (!staging) return mk_fail(MK_ERR_OUT_OF_MEMORY, "range: out of memory for weight staging");
    mk_carver loading = {0, r->weight_arena};
    const mk_status s = mk_range_weights(r, &loading, staging);
    free(staging);
    if (s == MK_OK) MK_TRY(r->backend->ops->synchronize(r->backend));
    return s;
}

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
    a->logits = mk_carve(c, mk_role_owns_final_head(r->role) ? hp->vocab * sizeof(float) : 0);
    a->ids = mk_carve(c, rows * sizeof(int32_t));
    a->pos = mk_carve(c, rows * sizeof(int32_t));
    a->token = mk_carve(c, sizeof(int32_t));
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

    mk_range *r = calloc(1, sizeof *r);
    if (!r) return mk_fail(MK_ERR_OUT_OF_MEMORY, "range: out of memory");
    r->model = model;
    r->hp = model->hp;
    r->start = start;
    r->end = end;
    r->role = role;
    r->max_context = max_context;
    r->max_rows = max_rows;
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
    if (s == MK_OK) s = r->backend->ops->reserve(r->backend, max_rows, max_context, &r->hp);
    if (s == MK_OK) s = mk_range_load(r);
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
    r->graphs = r->graphs && s == MK_OK && b->ops->step_begin;
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
        if (r->step) r->backend->ops->step_destroy(r->backend, r->step);
        if (r->tail_stage) r->backend->ops->host_release(r->backend, r->tail_stage);
        if (r->weight_arena) r->backend->ops->release(r->backend, r->weight_arena);
        if (r->act_arena) r->backend->ops->release(r->backend, r->act_arena);
        mk_backend_destroy(r->backend);
    }
    free(r->layers);
    free(r->host_positions);
    free(r);
}

/* ============================================================== sequences == */

static size_t mk_kv_slab_elems(const mk_range *r) { return r->max_context * r->hp.n_kv_heads * r->hp.head_dim; }
static size_t mk_kv_elem_size(const mk_range *r) { return mk_dtype_size(mk_backend_kv_dtype(r->backend)); }

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

void mk_tail_output_free(mk_tail_output *t) {
    if (!t) return;
    free(t->logits);
    free(t->token_ids);
    free(t);
}

/* ============================================================== contract == */

/* Which kind of input the range's role takes (token ids or a boundary). */
static mk_status mk_check_input_kind(const mk_range *r, const int32_t *ids, size_t n_tokens, bool has_boundary) {
    const char *role = mk_role_name(r->role);
    if (mk_role_owns_embedding(r->role)) {
        if (has_boundary)
            return mk_fail(MK_ERR_HEAD_OWNS_EMBEDDING,
                           "%s range refuses a boundary bundle: head owns token embedding and accepts token ids",
                           role);
        if (!ids || n_tokens == 0)
            return mk_fail(MK_ERR_EMPTY_INPUT, "%s range requires at least one token id", role);
        for (size_t i = 0; i < n_tokens; i++)
            if (ids[i] < 0 || (size_t)ids[i] >= r->hp.vocab)
                return mk_fail(MK_ERR_TOKEN_OUT_OF_RANGE, "token id %d at index %zu is outside the vocabulary (%zu)",
                               ids[i], i, r->hp.vocab);
        return MK_OK;
    }
    if (ids || n_tokens)
        return mk_fail(MK_ERR_BYPASS_EMBEDDING,
                       "%s range refuses token ids: middle and tail ranges bypass token embedding", role);
    if (!has_boundary)
        return mk_fail(MK_ERR_BUNDLE_REQUIRED, "%s range must receive the named boundary bundle '%s'", role,
                       MK_RESIDUAL_TENSOR_NAME);
    return MK_OK;
}

/* The rows of one forward fit the activation arena and the sequence's KV cache. */
static mk_status mk_check_rows(const mk_range *r, const mk_sequence *seq, size_t rows) {
    /* the context first: a prompt longer than it is the error a caller can act on */
    if (seq->length + rows > r->max_context)
        return mk_fail(MK_ERR_CONTEXT_OVERFLOW, "sequence of %zu positions plus %zu rows exceeds max_context %zu",
                       seq->length, rows, r->max_context);
    if (rows > r->max_rows)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "forward of %zu rows exceeds this range's max_batch_tokens %zu", rows,
                       r->max_rows);
    return MK_OK;
}

/* The one check of a boundary header against this range and sequence. Transports call it
 * before they accept a payload; the executor calls it for every boundary it consumes. */
mk_status mk_range_check_boundary(const mk_range *r, const mk_sequence *seq, const mk_boundary_header *h) {
    mk_clear_error();
    if (!r || !seq || !h) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_range_check_boundary: NULL argument");
    if (seq->range != r) return mk_fail(MK_ERR_INVALID_ARGUMENT, "sequence belongs to another range");
    MK_TRY(mk_check_input_kind(r, NULL, 0, true));
    if (h->normalized)
        return mk_fail(MK_ERR_NORMALIZED_BUNDLE,
                       "boundary bundle is marked normalized: the seam carries the UNNORMALIZED residual stream");
    if (h->schema_version != MK_BOUNDARY_SCHEMA_VERSION)
        return mk_fail(MK_ERR_SCHEMA_VERSION, "bundle schema version %u is not the supported version %u",
                       h->schema_version, MK_BOUNDARY_SCHEMA_VERSION);
    if (h->architecture != MK_PROTOCOL_ARCH_DENSE)
        return mk_fail(MK_ERR_ARCHITECTURE_MISMATCH,
                       "bundle architecture type %d is not dense: it is not executable by the dense-llama adapter",
                       (int)h->architecture);
    mk_architecture arch;
    MK_TRY(mk_certified_architecture(h->adapter, &arch));
    if (strcmp(h->tensor_name, arch.boundary_tensor_name) != 0)
        return mk_fail(MK_ERR_TENSOR_NAME, "boundary tensor is named '%.32s', expected '%s'", h->tensor_name,
                       arch.boundary_tensor_name);
    if (strcmp(h->boundary_point, MK_BOUNDARY_POINT) != 0)
        return mk_fail(MK_ERR_BOUNDARY_POINT, "incompatible dense residual boundary schema '%.32s'", h->boundary_point);
    if (h->next_layer != r->start)
        return mk_fail(MK_ERR_SEAM_MISMATCH,
                       "seam mismatch: this range starts at layer %lld but the bundle was cut before layer %lld",
                       (long long)r->start, (long long)h->next_layer);
    if (strncmp(h->recipe_digest, r->digest, sizeof h->recipe_digest) != 0)
        return mk_fail(MK_ERR_RECIPE_DIGEST, "bundle recipe digest %.16s... does not match this range's %.16s...",
                       h->recipe_digest, r->digest);
    if (h->hidden != r->hp.hidden)
        return mk_fail(MK_ERR_HIDDEN_WIDTH, "bundle hidden width %zu does not match the model's %zu", h->hidden,
                       r->hp.hidden);
    if (h->batch != 1) return mk_fail(MK_ERR_SHAPE, "bundle batch %zu: a sequence carries batch 1", h->batch);
    if (h->dtype != MK_DTYPE_F32)
        return mk_fail(MK_ERR_DTYPE, "bundle residual dtype %s is not f32", mk_dtype_name(h->dtype));
    if (h->rows == 0) return mk_fail(MK_ERR_EMPTY_INPUT, "bundle carries no rows");
    if (h->position < 0 || (size_t)h->position != seq->length)
        return mk_fail(MK_ERR_POSITIONS_SHAPE,
                       "bundle position %lld at row 0 does not continue the sequence (expected %zu)",
                       (long long)h->position, seq->length);
    return mk_check_rows(r, seq, h->rows);
}

/* A host bundle: the header check, then its arrays (positions row by row, finite values). */
static mk_status mk_check_bundle(const mk_range *r, const mk_sequence *seq, const mk_bundle *bundle) {
    if (!bundle->residual || !bundle->positions || bundle->h.rows == 0)
        return mk_fail(MK_ERR_EMPTY_INPUT, "bundle carries no rows");
    mk_boundary_header h = bundle->h;
    h.position = (int64_t)seq->length; /* the rows are checked one by one below */
    MK_TRY(mk_range_check_boundary(r, seq, &h));
    for (size_t i = 0; i < bundle->h.rows; i++)
        if (bundle->positions[i] < 0 || (size_t)bundle->positions[i] != seq->length + i)
            return mk_fail(MK_ERR_POSITIONS_SHAPE,
                           "bundle position %d at row %zu does not continue the sequence (expected %zu)",
                           bundle->positions[i], i, seq->length + i);
    size_t bad = 0;
    if (mk_floats_nonfinite(bundle->residual, bundle->h.rows * bundle->h.hidden, &bad))
        return mk_fail(MK_ERR_NONFINITE, "boundary residual value %zu (row %zu) is NaN or infinite", bad,
                       bad / bundle->h.hidden);
    return MK_OK;
}

/* =============================================================== forward == */

/* Runs one op (MK_TRY) and charges its host time to family f of the range's profile. */
#define MK_OP(r, f, call)                                                  \
    do {                                                                   \
        const double mk_op_t0_ = mk_op_profile_clock(&(r)->profile);       \
        MK_TRY(call);                                                      \
        mk_op_profile_add(&(r)->profile, (f), mk_op_t0_);                  \
    } while (0)

/* One layer. Residual adds are fused into the norm that follows them: the mlp output of
 * layer l stays in a->proj and is added by layer l+1's attention norm, or by a plain add
 * after the range's last layer (its raw residual is what leaves the range). The fused op
 * performs the same float operations in the same order, so results are unchanged. */
static mk_status mk_run_layer(mk_range *r, mk_sequence *seq, size_t layer_index, size_t rows, bool last) {
    const mk_hparams *hp = &r->hp;
    mk_backend *b = r->backend;
    const mk_backend_ops *ops = b->ops;
    const mk_layer_weights *w = &r->layers[layer_index];
    const mk_activations *a = &r->act;
    const size_t q_dim = hp->n_heads * hp->head_dim, kv_dim = hp->n_kv_heads * hp->head_dim;
    const size_t past = seq->length;
    const size_t slab = mk_kv_slab_elems(r) * mk_kv_elem_size(r);
    uint8_t *k_cache = (uint8_t *)seq->kv_arena + (2 * layer_index) * slab;     /* [ctx, kv_dim] KV dtype */
    uint8_t *v_cache = (uint8_t *)seq->kv_arena + (2 * layer_index + 1) * slab; /* [ctx, kv_dim] KV dtype */

    /* attention block */
    if (layer_index == 0)
        MK_OP(r, MK_OPF_NORM, ops->rmsnorm(b, a->xn, a->x, w->attn_norm, rows, hp->hidden, hp->rms_eps));
    else
        MK_OP(r, MK_OPF_NORM, ops->add_rmsnorm(b, a->x, a->xn, a->proj, w->attn_norm, rows, hp->hidden, hp->rms_eps));
    if (ops->matmul_shared) {
        float *const y[3] = {a->q, a->k, a->v};
        const void *const wqkv[3] = {w->wq, w->wk, w->wv};
        const size_t out[3] = {q_dim, kv_dim, kv_dim};
        MK_OP(r, MK_OPF_QKV, ops->matmul_shared(b, 3, y, wqkv, out, a->xn, rows, hp->hidden));
    } else {
        MK_OP(r, MK_OPF_QKV, ops->matmul(b, a->q, a->xn, w->wq, rows, hp->hidden, q_dim));
        MK_OP(r, MK_OPF_QKV, ops->matmul(b, a->k, a->xn, w->wk, rows, hp->hidden, kv_dim));
        MK_OP(r, MK_OPF_QKV, ops->matmul(b, a->v, a->xn, w->wv, rows, hp->hidden, kv_dim));
    }
    /* The fused RoPE + cache write stores rows in the backend's KV dtype (one launch). */
    if (ops->rope_kv) {
        MK_OP(r, MK_OPF_ROPE_KV,
              ops->rope_kv(b, a->q, a->k, a->v, k_cache, v_cache, a->pos, past, rows, hp->n_heads,
                           hp->n_kv_heads, hp->head_dim, hp->rope_theta, hp->rope_layout));
    } else {
        MK_OP(r, MK_OPF_ROPE_KV,
              ops->rope(b, a->q, a->pos, rows, hp->n_heads, hp->head_dim, hp->rope_theta, hp->rope_layout));
        MK_OP(r, MK_OPF_ROPE_KV,
              ops->rope(b, a->k, a->pos, rows, hp->n_kv_heads, hp->head_dim, hp->rope_theta, hp->rope_layout));
        if (ops->kv_store) {
            MK_OP(r, MK_OPF_ROPE_KV, ops->kv_store(b, k_cache, past, a->k, rows, kv_dim));
            MK_OP(r, MK_OPF_ROPE_KV, ops->kv_store(b, v_cache, past, a->v, rows, kv_dim));
        } else {
            MK_OP(r, MK_OPF_ROPE_KV,
                  ops->copy(b, k_cache + past * kv_dim * sizeof(float), a->k, rows * kv_dim * sizeof(float)));
            MK_OP(r, MK_OPF_ROPE_KV,
                  ops->copy(b, v_cache + past * kv_dim * sizeof(float), a->v, rows * kv_dim * sizeof(float)));
        }
    }
    MK_OP(r, MK_OPF_ATTENTION,
          ops->attention(b, a->att, a->q, k_cache, v_cache, a->pos, rows, past, hp->n_heads, hp->n_kv_heads,
                         hp->head_dim));
    MK_OP(r, MK_OPF_ATTN_OUT, ops->matmul(b, a->proj, a->att, w->wo, rows, q_dim, hp->hidden));

    /* mlp block */
    MK_OP(r, MK_OPF_NORM, ops->add_rmsnorm(b, a->x, a->xn, a->proj, w->ffn_norm, rows, hp->hidden, hp->rms_eps));
    if (ops->matmul_swiglu) {
        MK_OP(r, MK_OPF_GATE_UP,
              ops->matmul_swiglu(b, a->gate, a->up, a->xn, w->w_gate, w->w_up, rows, hp->hidden, hp->intermediate));
    } else {
        MK_OP(r, MK_OPF_GATE_UP, ops->matmul(b, a->gate, a->xn, w->w_gate, rows, hp->hidden, hp->intermediate));
        MK_OP(r, MK_OPF_GATE_UP, ops->matmul(b, a->up, a->xn, w->w_up, rows, hp->hidden, hp->intermediate));
        MK_OP(r, MK_OPF_GATE_UP, ops->swiglu(b, a->gate, a->gate, a->up, rows * hp->intermediate));
    }
    MK_OP(r, MK_OPF_DOWN, ops->matmul(b, a->proj, a->gate, w->w_down, rows, hp->intermediate, hp->hidden));
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
 * (mk_range_forward's fresh one). */
static mk_status mk_fill_bundle(mk_range *r, const mk_sequence *seq, size_t rows, const int32_t *positions,
                                mk_bundle *bundle) {
    MK_TRY(r->backend->ops->download(r->backend, bundle->residual, r->act.x, rows * r->hp.hidden * sizeof(float)));
    memcpy(bundle->positions, positions, rows * sizeof(int32_t));
    mk_emit_header(r, seq, rows, &bundle->h);
    return MK_OK;
}

static mk_status mk_emit_bundle(mk_range *r, const mk_sequence *seq, size_t rows, const int32_t *positions,
                                mk_bundle **out) {
    mk_bundle *bundle;
    MK_TRY(mk_bundle_create(1, rows, r->hp.hidden, &bundle));
    const mk_status s = mk_fill_bundle(r, seq, rows, positions, bundle);
    if (s != MK_OK) {
        mk_bundle_free(bundle);
        return s;
    }
    *out = bundle;
    return MK_OK;
}

/* Tail-only pruning: final norm and lm_head on the last row alone, then the sample. */
static mk_status mk_tail_compute(mk_range *r, size_t rows) {
    const mk_hparams *hp = &r->hp;
    mk_backend *b = r->backend;
    const mk_activations *a = &r->act;
    const float *last = a->x + (rows - 1) * hp->hidden;
    MK_OP(r, MK_OPF_LM_HEAD, b->ops->rmsnorm(b, a->xn, last, r->output_norm, 1, hp->hidden, hp->rms_eps));
    MK_OP(r, MK_OPF_LM_HEAD, b->ops->matmul(b, a->logits, a->xn, r->lm_head, 1, hp->hidden, hp->vocab));
    MK_OP(r, MK_OPF_SAMPLE, b->ops->argmax(b, a->token, a->logits, 1, hp->vocab));
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

static mk_status mk_emit_tail(mk_range *r, const mk_sampling_contract *sampling, mk_tail_output **out) {
    const mk_hparams *hp = &r->hp;
    mk_tail_output *t = calloc(1, sizeof *t);
    if (!t) return mk_fail(MK_ERR_OUT_OF_MEMORY, "tail output: out of memory");
    t->batch = 1;
    t->vocab = hp->vocab;
    t->sampling = *sampling;
    /* The token was sampled on the backend (argmax): token_only brings back its 4 bytes alone. */
    t->logits = r->token_only ? NULL : malloc(hp->vocab * sizeof(float));
    t->token_ids = malloc(sizeof(int32_t));
    mk_status s = (t->logits || r->token_only) && t->token_ids ? MK_OK
                                                                : mk_fail(MK_ERR_OUT_OF_MEMORY, "tail output: out of memory");
    if (s == MK_OK) s = mk_tail_download(r, t->logits, t->token_ids);
    if (s != MK_OK) {
        mk_tail_output_free(t);
        return s;
    }
    *out = t;
    return MK_OK;
}

/* Argument checks shared by both forward entries. */
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
static mk_status mk_forward_device(mk_range *r, mk_sequence *seq, size_t rows, const void *in, void *out) {
    mk_backend *b = r->backend;
    const mk_activations *a = &r->act;
    const size_t residual_bytes = rows * r->hp.hidden * sizeof(float);
    if (in) MK_TRY(b->ops->copy(b, a->x, in, residual_bytes));
    if (mk_role_owns_embedding(r->role))
        MK_OP(r, MK_OPF_EMBED, b->ops->embed(b, a->x, r->token_embd, a->ids, rows, r->hp.hidden, r->hp.vocab));
    const size_t n_layers = (size_t)(r->end - r->start + 1);
    for (size_t l = 0; l < n_layers; l++) MK_TRY(mk_run_layer(r, seq, l, rows, l + 1 == n_layers));
    if (mk_role_owns_final_head(r->role)) return mk_tail_compute(r, rows);
    if (out) MK_TRY(b->ops->copy(b, out, a->x, residual_bytes));
    return MK_OK;
}

/* A decode step as the range's captured graph: recorded on first use, and again when the
 * sequence's KV cache or a boundary lives elsewhere than the recorded one (one step is kept
 * per range). A step that cannot be recorded runs op by op, with graphs off from then on. */
static mk_status mk_forward_step(mk_range *r, mk_sequence *seq, const void *in, void *out) {
    mk_backend *b = r->backend;
    const mk_step_key key = {seq->kv_arena, in, out};
    if (r->step && (key.kv_arena != r->step_key.kv_arena || key.in_payload != r->step_key.in_payload ||
                    key.out_payload != r->step_key.out_payload)) {
        b->ops->step_destroy(b, r->step);
        r->step = NULL;
    }
    if (!r->step) {
        void *step = NULL;
        mk_status s = b->ops->step_begin(b, seq->length + 1);
        if (s == MK_OK) {
            s = mk_forward_device(r, seq, 1, in, out);
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
            return mk_forward_device(r, seq, 1, in, out);
        }
        r->step = step;
        r->step_key = key;
    }
    return b->ops->step_launch(b, r->step, seq->length + 1);
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
    return mk_forward_device(r, seq, rows, in, out);
}

mk_status mk_range_forward(mk_range *r, mk_sequence *seq, const int32_t *token_ids, size_t n_tokens,
                           const mk_bundle *bundle, const mk_sampling_contract *sampling, mk_bundle **out_bundle,
                           mk_tail_output **out_tail) {
    mk_clear_error();
    mk_sampling_contract contract;
    MK_TRY(mk_forward_args(r, seq, out_bundle != NULL, out_tail, sampling, &contract));
    MK_TRY(mk_check_input_kind(r, token_ids, n_tokens, bundle != NULL));
    const size_t rows = bundle ? bundle->h.rows : n_tokens;
    if (bundle) MK_TRY(mk_check_bundle(r, seq, bundle));
    else MK_TRY(mk_check_rows(r, seq, rows));
    if (bundle)
        MK_TRY(r->backend->ops->upload(r->backend, r->act.x, bundle->residual, rows * r->hp.hidden * sizeof(float)));
    MK_TRY(mk_forward_run(r, seq, token_ids, rows, NULL, NULL));
    if (mk_role_owns_final_head(r->role)) MK_TRY(mk_emit_tail(r, &contract, out_tail));
    else MK_TRY(mk_emit_bundle(r, seq, rows, r->host_positions, out_bundle));
    seq->length += rows;
    seq->steps++;
    return MK_OK;
}

/* The scheduler's step path: mk_range_forward_boundary's checks and layers, the tail's
 * logits and token written into buffers the caller owns (a preallocated activation slot),
 * so a step allocates nothing. The boundaries stay in backend memory. */
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
    MK_TRY(mk_check_input_kind(r, token_ids, n_tokens, in != NULL));
    const size_t rows = in ? in->h.rows : n_tokens;
    if (in) MK_TRY(mk_range_check_boundary(r, seq, &in->h));
    else MK_TRY(mk_check_rows(r, seq, rows));
    MK_TRY(mk_forward_run(r, seq, token_ids, rows, in ? in->payload : NULL, tail ? NULL : out->payload));
    if (tail) MK_TRY(mk_tail_download(r, r->token_only ? NULL : out_logits, out_token));
    else mk_emit_header(r, seq, rows, &out->h);
    seq->length += rows;
    seq->steps++;
    return MK_OK;
}

/* ============================================================= boundaries == */

mk_status mk_boundary_create(mk_range *r, mk_boundary **out) {
    mk_clear_error();
    if (!r || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_boundary_create: NULL argument");
    *out = NULL;
    mk_boundary *bd = calloc(1, sizeof *bd);
    if (!bd) return mk_fail(MK_ERR_OUT_OF_MEMORY, "boundary: out of memory");
    bd->range = r;
    bd->capacity_rows = r->max_rows;
    mk_boundary_header_defaults(&bd->h);
    bd->h.hidden = r->hp.hidden;
    void *payload = NULL;
    const mk_status s = r->backend->ops->alloc(r->backend, r->max_rows * r->hp.hidden * sizeof(float), &payload);
    if (s != MK_OK) {
        free(bd);
        return s;
    }
    bd->payload = payload;
    *out = bd;
    return MK_OK;
}

void mk_boundary_free(mk_boundary *bd) {
    if (!bd) return; /* no mk_clear_error: failure paths free after recording their message */
    bd->range->backend->ops->release(bd->range->backend, bd->payload);
    free(bd);
}

const mk_boundary_header *mk_boundary_header_of(const mk_boundary *bd) {
    return bd ? &bd->h : NULL;
}

mk_range *mk_boundary_range(const mk_boundary *bd) {
    return bd ? bd->range : NULL;
}

mk_status mk_boundary_read(const mk_boundary *bd, float *residual, size_t capacity_floats) {
    mk_clear_error();
    if (!bd || !residual) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_boundary_read: NULL argument");
    const size_t n = bd->h.rows * bd->h.hidden;
    if (n > capacity_floats)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_boundary_read: %zu floats needed, buffer holds %zu", n,
                       capacity_floats);
    mk_backend *b = bd->range->backend;
    return b->ops->download(b, residual, bd->payload, n * sizeof(float));
}

mk_status mk_range_forward_boundary(mk_range *r, mk_sequence *seq, const int32_t *token_ids, size_t n_tokens,
                                    const mk_boundary *in, const mk_sampling_contract *sampling, mk_boundary *out,
                                    mk_tail_output **out_tail) {
    mk_clear_error();
    mk_sampling_contract contract;
    MK_TRY(mk_forward_args(r, seq, out != NULL, out_tail, sampling, &contract));
    if ((in && in->range != r) || (out && out->range != r))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "boundary belongs to another range");
    MK_TRY(mk_check_input_kind(r, token_ids, n_tokens, in != NULL));
    const size_t rows = in ? in->h.rows : n_tokens;
    if (in) MK_TRY(mk_range_check_boundary(r, seq, &in->h));
    else MK_TRY(mk_check_rows(r, seq, rows));
    /* The residual stays in backend memory: copies on the range's stream. */
    const bool tail = mk_role_owns_final_head(r->role);
    MK_TRY(mk_forward_run(r, seq, token_ids, rows, in ? in->payload : NULL, tail ? NULL : out->payload));
    if (tail) MK_TRY(mk_emit_tail(r, &contract, out_tail));
    else mk_emit_header(r, seq, rows, &out->h);
    seq->length += rows;
    seq->steps++;
    return MK_OK;
}
