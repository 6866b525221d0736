/* Models backed by a GGUF file: the architecture is certified before any weight is read,
 * hyper-parameters come from the llama.* keys, and tensors are dequantized one at a time
 * when a range loads them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/model.h"
#include "mk_error.h"

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

mk_status mk_model_gguf_load_tensor(const mk_model *m, const char *name, float *out, size_t n) {
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
