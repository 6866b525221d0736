/* Models backed by a GGUF file: the architecture is certified before any weight is read,
 * hyper-parameters come from the dense-llama `<arch>.*` keys (the one place that knows their
 * names; model/gguf.c is the generic container reader), and tensors are dequantized one at a
 * time when a range loads them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/model.h"
#include "model/tensor_schema.h"
#include "mk_error.h"

/* ======================================================== hyper-parameters == */

#define HP_CAP ((uint64_t)1 << 24) /* no dimension of a dense llama comes near this */

/* `<arch>.<suffix>` as a positive integer <= HP_CAP. */
static mk_status hp_u64(const mk_gguf *g, const char *arch, const char *suffix, bool required, uint64_t *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (mk_gguf_find_key(g, key) < 0) {
        if (required) return mk_fail(MK_ERR_GGUF_MISSING, "gguf: required key '%s' is missing", key);
        return MK_OK; /* keep the default in *out */
    }
    uint64_t v;
    if (mk_gguf_get_u64(g, key, &v) != MK_OK)
        return mk_fail(MK_ERR_GGUF_HPARAMS, "gguf: '%s' must be a non-negative integer", key);
    if (v == 0 || v > HP_CAP)
        return mk_fail(MK_ERR_GGUF_HPARAMS, "gguf: '%s' = %llu is out of range (1..%llu)", key,
                       (unsigned long long)v, (unsigned long long)HP_CAP);
    *out = v;
    return MK_OK;
}

static mk_status hp_f32(const mk_gguf *g, const char *arch, const char *suffix, bool required, float *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (mk_gguf_find_key(g, key) < 0) {
        if (required) return mk_fail(MK_ERR_GGUF_MISSING, "gguf: required key '%s' is missing", key);
        return MK_OK;
    }
    float v;
    if (mk_gguf_get_f32(g, key, &v) != MK_OK)
        return mk_fail(MK_ERR_GGUF_HPARAMS, "gguf: '%s' must be a number", key);
    if (!(v > 0.0f) || v > 1e30f)
        return mk_fail(MK_ERR_GGUF_HPARAMS, "gguf: '%s' = %g must be positive and finite", key, (double)v);
    *out = v;
    return MK_OK;
}

/* Tensor `name` must exist with exactly the given dims (n_dims 1 or 2). */
static mk_status check_shape(const mk_gguf *g, const char *name, uint32_t n_dims, uint64_t d0, uint64_t d1) {
    const mk_gguf_tensor_info *t = mk_gguf_find_tensor(g, name);
    if (!t) return mk_fail(MK_ERR_GGUF_MISSING, "gguf: required tensor '%s' is missing", name);
    bool ok = t->n_dims == n_dims && t->dims[0] == d0 && (n_dims < 2 || t->dims[1] == d1);
    if (!ok) {
        if (n_dims == 1)
            return mk_fail(MK_ERR_GGUF_HPARAMS, "gguf: tensor '%s' has %u dims [%llu, %llu, ...], expected [%llu]",
                           name, t->n_dims, (unsigned long long)t->dims[0], (unsigned long long)t->dims[1],
                           (unsigned long long)d0);
        return mk_fail(MK_ERR_GGUF_HPARAMS, "gguf: tensor '%s' has %u dims [%llu, %llu, ...], expected [%llu, %llu]",
                       name, t->n_dims, (unsigned long long)t->dims[0], (unsigned long long)t->dims[1],
                       (unsigned long long)d0, (unsigned long long)d1);
    }
    return MK_OK;
}

/* The tensor `kind` (of `layer`) must have its schema's shape under hp. */
static mk_status check_tensor(const mk_gguf *g, const mk_hparams *hp, mk_tensor_kind kind, int64_t layer, char *name,
                              size_t cap) {
    const mk_tensor_schema *ts = mk_tensor_schema_of(kind);
    mk_tensor_name(kind, layer, name, cap);
    const uint64_t cols = mk_tensor_dim_size(hp, ts->cols), rows = mk_tensor_dim_size(hp, ts->rows);
    if (mk_tensor_is_vector(kind)) return check_shape(g, name, 1, cols, 0);
    return check_shape(g, name, 2, cols, rows);
}

mk_status mk_gguf_read_hparams(const mk_gguf *g, mk_hparams *hp, char *arch, size_t arch_cap) {
    mk_clear_error();
    if (!g || !hp) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_gguf_read_hparams: NULL argument");
    char a[64];
    MK_TRY(mk_gguf_architecture(g, a, sizeof a));
    if (arch) {
        if (arch_cap <= strlen(a))
            return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_gguf_read_hparams: architecture '%s' does not fit %zu bytes",
                           a, arch_cap);
        memcpy(arch, a, strlen(a) + 1);
    }

    uint64_t ctx = 0, hidden = 0, layers = 0, ff = 0, heads = 0, kv_heads = 0, rope_dims = 0, vocab = 0;
    float theta = 10000.0f, eps = 0.0f;
    MK_TRY(hp_u64(g, a, "context_length", true, &ctx));
    MK_TRY(hp_u64(g, a, "embedding_length", true, &hidden));
    MK_TRY(hp_u64(g, a, "block_count", true, &layers));
    MK_TRY(hp_u64(g, a, "feed_forward_length", true, &ff));
    MK_TRY(hp_u64(g, a, "attention.head_count", true, &heads));
    kv_heads = heads;
    MK_TRY(hp_u64(g, a, "attention.head_count_kv", false, &kv_heads));
    MK_TRY(hp_f32(g, a, "rope.freq_base", false, &theta));
    MK_TRY(hp_f32(g, a, "attention.layer_norm_rms_epsilon", true, &eps));

    if (hidden % heads != 0)
        return mk_fail(MK_ERR_GGUF_HPARAMS, "gguf: %s.embedding_length %llu is not divisible by head_count %llu", a,
                       (unsigned long long)hidden, (unsigned long long)heads);
    if (heads % kv_heads != 0)
        return mk_fail(MK_ERR_GGUF_HPARAMS, "gguf: %s.attention.head_count %llu is not divisible by head_count_kv %llu",
                       a, (unsigned long long)heads, (unsigned long long)kv_heads);
    const uint64_t head_dim = hidden / heads;
    rope_dims = head_dim;
    MK_TRY(hp_u64(g, a, "rope.dimension_count", false, &rope_dims));
    if (rope_dims != head_dim)
        return mk_fail(MK_ERR_GGUF_HPARAMS,
                       "gguf: %s.rope.dimension_count %llu differs from head_dim %llu (partial RoPE is not supported)", a,
                       (unsigned long long)rope_dims, (unsigned long long)head_dim);

    /* vocabulary: explicit key, else the tokenizer's token list, else the embedding */
    char name[96];
    const mk_gguf_tensor_info *embd = mk_gguf_find_tensor(g, mk_tensor_name(MK_TENSOR_TOKEN_EMBD, 0, name, sizeof name));
    if (!embd) return mk_fail(MK_ERR_GGUF_MISSING, "gguf: required tensor '%s' is missing", name);
    MK_TRY(hp_u64(g, a, "vocab_size", false, &vocab));
    if (vocab == 0) {
        size_t n;
        mk_gguf_value_type et;
        if (mk_gguf_get_array_info(g, "tokenizer.ggml.tokens", &et, &n) == MK_OK && n > 0) vocab = n;
        else if (embd->n_dims == 2) vocab = embd->dims[1];
    }
    if (vocab == 0 || vocab > HP_CAP)
        return mk_fail(MK_ERR_GGUF_HPARAMS, "gguf: cannot determine a valid vocabulary size");

    mk_hparams h;
    memset(&h, 0, sizeof h);
    h.vocab = (size_t)vocab;
    h.hidden = (size_t)hidden;
    h.n_layers = (size_t)layers;
    h.n_heads = (size_t)heads;
    h.n_kv_heads = (size_t)kv_heads;
    h.head_dim = (size_t)head_dim;
    h.intermediate = (size_t)ff;
    h.rms_eps = eps;
    h.rope_theta = theta;
    h.rope_layout = MK_ROPE_ADJACENT_PAIRS;
    h.tied_embeddings = mk_gguf_find_tensor(g, mk_tensor_name(MK_TENSOR_OUTPUT, 0, name, sizeof name)) == NULL;
    h.max_context = (size_t)ctx;

    /* tensor shapes, from the tensor schema: GGUF lists dims fastest first, so a
     * [rows, cols] = [out, in] weight is {cols, rows} and a vector is {cols} */
    for (int k = 0; k < MK_TENSOR_KIND_COUNT; k++) {
        const mk_tensor_kind kind = (mk_tensor_kind)k;
        if (mk_tensor_schema_of(kind)->per_layer || (kind == MK_TENSOR_OUTPUT && h.tied_embeddings)) continue;
        MK_TRY(check_tensor(g, &h, kind, 0, name, sizeof name));
    }
    for (uint64_t l = 0; l < layers; l++)
        for (int k = 0; k < MK_TENSOR_KIND_COUNT; k++)
            if (mk_tensor_schema_of((mk_tensor_kind)k)->per_layer)
                MK_TRY(check_tensor(g, &h, (mk_tensor_kind)k, (int64_t)l, name, sizeof name));
    *hp = h;
    return MK_OK;
}

/* =================================================================== model == */

/* Identity: hyper-parameters, then every tensor's name, type, shape and content. */
static mk_status mk_gguf_digest(const mk_gguf *g, const mk_hparams *hp, char out[MK_DIGEST_HEX_LEN + 1]) {
    mk_sha256 *ctx;
    MK_TRY(mk_sha256_begin(&ctx));
    mk_sha256_update(ctx, "meshkern-gguf-v1;", 17);
    mk_sha256_hparams(ctx, hp);
    for (size_t i = 0; i < mk_gguf_tensor_count(g); i++) {
        const mk_gguf_tensor_info *t = mk_gguf_tensor_at(g, i);
        char header[256];
        const int n = snprintf(header, sizeof header, "%s type=%u dims=%llu,%llu,%llu,%llu bytes=%zu;", t->name,
                               t->type, (unsigned long long)t->dims[0], (unsigned long long)t->dims[1],
                               (unsigned long long)t->dims[2], (unsigned long long)t->dims[3], t->n_bytes);
        mk_sha256_update(ctx, header, (size_t)n);
        mk_sha256_update(ctx, t->data, t->n_bytes);
    }
    mk_sha256_finish(ctx, out);
    return MK_OK;
}

mk_status mk_model_open_gguf(const char *path, mk_model **out) {
    mk_clear_error();
    if (!path || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_model_open_gguf: NULL argument");
    *out = NULL;
    mk_gguf *g = NULL;
    MK_TRY(mk_gguf_open(path, &g));
    mk_model *m = calloc(1, sizeof *m);
    mk_status s = m ? MK_OK : mk_fail(MK_ERR_OUT_OF_MEMORY, "model: out of memory");
    if (s == MK_OK) {
        m->gguf = g;
        s = mk_gguf_architecture(g, m->architecture, sizeof m->architecture);
    }
    /* Fail closed before any hyper-parameter or weight is interpreted. */
    if (s == MK_OK) s = mk_certified_architecture(m->architecture, NULL);
    char arch[64];
    if (s == MK_OK) s = mk_gguf_read_hparams(g, &m->hp, arch, sizeof arch);
    if (s == MK_OK) s = mk_hparams_validate(&m->hp);
    if (s == MK_OK) s = mk_gguf_digest(g, &m->hp, m->digest);
    if (s != MK_OK) {
        if (m) m->gguf = NULL;
        free(m);
        mk_gguf_close(g);
        return s;
    }
    *out = m;
    return MK_OK;
}

void mk_model_gguf_close(mk_model *m) {
    mk_gguf_close(m->gguf);
    m->gguf = NULL;
}

bool mk_model_gguf_has_tensor(const mk_model *m, const char *name) { return mk_gguf_find_tensor(m->gguf, name) != NULL; }

mk_status mk_model_check_finite(const char *name, uint32_t ggml_type, const void *data, size_t bytes) {
    if (mk_gguf_check_finite(ggml_type, data, bytes) == MK_OK) return MK_OK;
    char why[256];
    snprintf(why, sizeof why, "%s", mk_last_error());
    return mk_fail(MK_ERR_NONFINITE, "tensor '%s': %s", name, why);
}

mk_status mk_model_gguf_load_tensor(const mk_model *m, const char *name, float *out, size_t n) {
    const mk_gguf_tensor_info *t = mk_gguf_find_tensor(m->gguf, name);
    if (t) MK_TRY(mk_model_check_finite(name, t->type, t->data, t->n_bytes));
    return mk_gguf_tensor_to_f32(m->gguf, name, out, n);
}

bool mk_model_gguf_tensor_stored(const mk_model *m, const char *name, size_t n, uint32_t *ggml_type,
                                 const void **data, size_t *bytes) {
    const mk_gguf_tensor_info *t = mk_gguf_find_tensor(m->gguf, name);
    if (!t || t->n_elements != n) return false;
    *ggml_type = t->type;
    *data = t->data;
    *bytes = t->n_bytes;
    return true;
}

size_t mk_model_stored_tensor_count(const mk_model *m) { return m && m->gguf ? mk_gguf_tensor_count(m->gguf) : 0; }

bool mk_model_stored_tensor_at(const mk_model *m, size_t index, mk_model_stored_info *out) {
    const mk_gguf_tensor_info *t = m && m->gguf ? mk_gguf_tensor_at(m->gguf, index) : NULL;
    if (!t) return false;
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->type_name = mk_ggml_type_name(t->type);
    out->n_dims = t->n_dims;
    _Static_assert(sizeof out->dims / sizeof *out->dims == MK_GGUF_MAX_DIMS, "one dims array");
    memcpy(out->dims, t->dims, sizeof out->dims);
    out->bytes = t->n_bytes;
    return true;
}
