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
static mk_status mk_run_layer(mk_range *r, mk_sequence *seq, size_t layer_index, size_t rows, bool last) {
    const mk_hparams *hp = &r->hp;
    mk_backend *b = r->backend;
    const mk_backend_ops *ops = b->ops;
    const mk_layer_weights *w = &r->layers[layer_index];
    const mk_activations *a = &r->act;
    const size_t kv_dim = hp->n_kv_heads * hp->head_dim;
    const size_t past = seq->length;
    const size_t slab = mk_kv_slab_elems(r) * mk_kv_elem_size(r);
    uint8_t *k_cache = (uint8_t *)seq->kv_arena + (2 * layer_index) * slab;     /* [ctx, kv_dim] KV dtype */
    uint8_t *v_cache = (uint8_t *)seq->kv_arena + (2 * layer_index + 1) * slab; /* [ctx, kv_dim] KV dtype */
    /* Where the backend multiplies these rows in 16 bits, each norm also writes its output in
     * that dtype (the products that read it find it ready); the other products' inputs
     * (attention's output, the SwiGLU) are converted into the same buffer on the way. */
    void *lowp = mk_gemm_lowp(r, rows);
    const mk_gemm_input xn = {a->xn, lowp, true};
    const mk_gemm_input att = {a->att, lowp, false};
    const mk_gemm_input gated = {a->gate, lowp, false};

    /* attention block */
    if (layer_index == 0)
        MK_OP(r, MK_OPF_NORM, ops->rmsnorm(b, a->xn, lowp, a->x, w->attn_norm, rows, hp->hidden, hp->rms_eps));
    else
        MK_OP(r, MK_OPF_NORM,
              ops->add_rmsnorm(b, a->x, a->xn, lowp, a->proj, w->attn_norm, rows, hp->hidden, hp->rms_eps));
    if (ops->matmul_shared) {
        float *const y[3] = {a->q, a->k, a->v};
        const mk_weight *const wqkv[3] = {&w->wq, &w->wk, &w->wv};
        MK_OP(r, MK_OPF_QKV, ops->matmul_shared(b, 3, y, wqkv, &xn, rows));
    } else {
        MK_OP(r, MK_OPF_QKV, ops->matmul(b, a->q, &xn, &w->wq, rows));
        MK_OP(r, MK_OPF_QKV, ops->matmul(b, a->k, &xn, &w->wk, rows));
        MK_OP(r, MK_OPF_QKV, ops->matmul(b, a->v, &xn, &w->wv, rows));
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
    MK_OP(r, MK_OPF_ATTN_OUT, ops->matmul(b, a->proj, &att, &w->wo, rows));

    /* mlp block */
    MK_OP(r, MK_OPF_NORM,
          ops->add_rmsnorm(b, a->x, a->xn, lowp, a->proj, w->ffn_norm, rows, hp->hidden, hp->rms_eps));
    if (ops->matmul_swiglu) {
        MK_OP(r, MK_OPF_GATE_UP, ops->matmul_swiglu(b, a->gate, a->up, &xn, &w->w_gate, &w->w_up, rows));
    } else {
        MK_OP(r, MK_OPF_GATE_UP, ops->matmul(b, a->gate, &xn, &w->w_gate, rows));
        MK_OP(r, MK_OPF_GATE_UP, ops->matmul(b, a->up, &xn, &w->w_up, rows));
        MK_OP(r, MK_OPF_GATE_UP, ops->swiglu(b, a->gate, a->gate, a->up, rows * hp->intermediate));
    }
    MK_OP(r, MK_OPF_DOWN, ops->matmul(b, a->proj, &gated, &w->w_down, rows));
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
    const mk_gemm_input xn = {a->xn, lowp, true};
    MK_OP(r, MK_OPF_LM_HEAD, b->ops->rmsnorm(b, a->xn, lowp, last, r->output_norm, 1, hp->hidden, hp->rms_eps));
    MK_OP(r, MK_OPF_LM_HEAD, b->ops->matmul(b, a->logits, &xn, &r->lm_head, 1));
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
static mk_status mk_forward_device(mk_range *r, mk_sequence *seq, size_t rows, const void *in, void *out) {
    mk_backend *b = r->backend;
    const mk_activations *a = &r->act;
    const size_t residual_bytes = rows * r->hp.hidden * sizeof(float);
    if (in) MK_TRY(b->ops->copy(b, a->x, in, residual_bytes));
    if (mk_role_owns_embedding(r->role))
        MK_OP(r, MK_OPF_EMBED, b->ops->embed(b, a->x, &r->token_embd, a->ids, rows));
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

/* The one forward. */
static mk_status mk_forward(mk_range *r, mk_sequence *seq, const mk_forward_io *io) {
    MK_TRY(mk_check_input_kind(r, io->token_ids, io->n_tokens, io->in != NULL));
    const size_t rows = io->in ? io->in->rows : io->n_tokens;
    if (io->in && !io->in_checked) MK_TRY(mk_check_header(r, seq, io->in));
    else if (!io->in) MK_TRY(mk_check_rows(r, seq, rows));
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

void mk_tail_output_free(mk_tail_output *t) {
    if (!t) return;
    free(t->logits);
    free(t->token_ids);
    free(t);
}

