/* Models: hyper-parameters, validation, the seeded random source and identity digests. */
#include "model/model.h"

#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mk_error.h"
#include "model/tensor_schema.h"

/* ============================================================== hparams == */

mk_hparams mk_hparams_seed_default(void) {
    mk_hparams hp = {
        .vocab = 48, .hidden = 32, .n_layers = 6, .n_heads = 4, .n_kv_heads = 4, .head_dim = 8,
        .intermediate = 64, .rms_eps = 1e-6f, .rope_theta = 10000.0f, .rope_layout = MK_ROPE_ROTATE_HALF,
        .tied_embeddings = false, .max_context = 256,
    };
    return hp;
}

mk_status mk_hparams_validate(const mk_hparams *hp) {
    mk_clear_error();
    if (!hp) return mk_fail(MK_ERR_INVALID_ARGUMENT, "hparams is NULL");
    if (!hp->vocab || !hp->hidden || !hp->n_layers || !hp->n_heads || !hp->n_kv_heads || !hp->head_dim ||
        !hp->intermediate || !hp->max_context)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "hparams: every size must be positive");
    if (hp->vocab > INT32_MAX || hp->max_context > INT32_MAX || hp->n_layers > 4096)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "hparams: vocab/context/layers out of range");
    if (hp->hidden > (1u << 20) || hp->intermediate > (1u << 22) || hp->n_heads > 1024)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "hparams: hidden/intermediate/heads out of range");
    if (hp->n_heads % hp->n_kv_heads != 0)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "hparams: %zu heads are not a multiple of %zu kv heads", hp->n_heads,
                       hp->n_kv_heads);
    if (hp->head_dim % 2 != 0 || hp->head_dim > MK_MAX_HEAD_DIM)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "hparams: head_dim %zu must be even and <= %d", hp->head_dim,
                       MK_MAX_HEAD_DIM);
    if (!(hp->rms_eps > 0.0f) || !(hp->rope_theta > 0.0f) || !isfinite(hp->rope_theta))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "hparams: rms_eps and rope_theta must be positive");
    if (hp->rope_layout != MK_ROPE_ROTATE_HALF && hp->rope_layout != MK_ROPE_ADJACENT_PAIRS)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "hparams: unknown rope layout %d", (int)hp->rope_layout);
    return MK_OK;
}

/* ================================================================ sha256 == */

struct mk_sha256 {
    EVP_MD_CTX *md;
};

mk_status mk_sha256_begin(mk_sha256 **ctx) {
    mk_sha256 *c = malloc(sizeof *c);
    if (!c) return mk_fail(MK_ERR_OUT_OF_MEMORY, "sha256: out of memory");
    c->md = EVP_MD_CTX_new();
    if (!c->md || EVP_DigestInit_ex(c->md, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(c->md);
        free(c);
        return mk_fail(MK_ERR_INTERNAL, "sha256: OpenSSL digest init failed");
    }
    *ctx = c;
    return MK_OK;
}

void mk_sha256_update(mk_sha256 *ctx, const void *data, size_t len) { EVP_DigestUpdate(ctx->md, data, len); }

void mk_sha256_finish(mk_sha256 *ctx, char hex[MK_DIGEST_HEX_LEN + 1]) {
    unsigned char raw[32];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx->md, raw, &n);
    for (unsigned i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    EVP_MD_CTX_free(ctx->md);
    free(ctx);
}

void mk_sha256_hparams(mk_sha256 *ctx, const mk_hparams *hp) {
    char text[512];
    const int n = snprintf(text, sizeof text,
                           "vocab=%zu hidden=%zu layers=%zu heads=%zu kv=%zu head_dim=%zu inter=%zu eps=%a theta=%a "
                           "rope=%d tied=%d;",
                           hp->vocab, hp->hidden, hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->head_dim,
                           hp->intermediate, (double)hp->rms_eps, (double)hp->rope_theta, (int)hp->rope_layout,
                           (int)hp->tied_embeddings);
    mk_sha256_update(ctx, text, (size_t)n);
}

/* ========================================================== random source == */

/* splitmix64: a counter-based stream, so each tensor is generated independently of the
 * others and a range can materialize its own layers alone. */
static uint64_t mk_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t mk_hash_name(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull ^ seed; /* FNV-1a over the name, keyed by the seed */
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return h;
}

static void mk_random_normal(float *out, size_t n, uint64_t stream, float mean, float stddev) {
    uint64_t state = stream;
    for (size_t i = 0; i < n; i += 2) {
        /* Box-Muller on two uniforms in (0, 1]. */
        const double u1 = ((double)(mk_splitmix64(&state) >> 11) + 1.0) / 9007199254740992.0;
        const double u2 = (double)(mk_splitmix64(&state) >> 11) / 9007199254740992.0;
        const double r = sqrt(-2.0 * log(u1));
        out[i] = (float)(mean + stddev * r * cos(2.0 * M_PI * u2));
        if (i + 1 < n) out[i + 1] = (float)(mean + stddev * r * sin(2.0 * M_PI * u2));
    }
}

/* Element count of a named tensor of the random dense-llama model (the tensor schema);
 * 0 if it has no such tensor. */
static size_t mk_random_tensor_elems(const mk_hparams *hp, const char *name, bool *is_norm) {
    mk_tensor_kind kind;
    int64_t layer;
    *is_norm = false;
    if (!mk_tensor_parse(name, hp->n_layers, &kind, &layer)) return 0;
    if (kind == MK_TENSOR_OUTPUT && hp->tied_embeddings) return 0;
    *is_norm = mk_tensor_is_vector(kind);
    return mk_tensor_elems(hp, kind);
}

mk_status mk_model_create_random(const mk_hparams *hp, uint64_t seed, const char *architecture, mk_model **out) {
    mk_clear_error();
    if (!out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_model_create_random: out is NULL");
    *out = NULL;
    MK_TRY(mk_hparams_validate(hp));
    const char *arch = architecture ? architecture : MK_DENSE_LLAMA_ADAPTER;
    /* A model may advertise an uncertified architecture; ranges over it fail closed. */
    if (strlen(arch) >= sizeof((mk_model *)0)->architecture)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "architecture name is too long");
    mk_model *m = calloc(1, sizeof *m);
    if (!m) return mk_fail(MK_ERR_OUT_OF_MEMORY, "model: out of memory");
    m->hp = *hp;
    m->seed = seed;
    snprintf(m->architecture, sizeof m->architecture, "%s", arch);
    mk_sha256 *ctx;
    const mk_status s = mk_sha256_begin(&ctx);
    if (s != MK_OK) {
        free(m);
        return s;
    }
    char seed_text[64];
    const int n = snprintf(seed_text, sizeof seed_text, "meshkern-random-v1 seed=%llu;", (unsigned long long)seed);
    mk_sha256_update(ctx, seed_text, (size_t)n);
    mk_sha256_hparams(ctx, hp);
    mk_sha256_finish(ctx, m->digest);
    *out = m;
    return MK_OK;
}

void mk_model_gguf_close(mk_model *m); /* model_gguf.c */

void mk_model_free(mk_model *m) {
    if (!m) return;
    if (m->gguf) mk_model_gguf_close(m);
    free(m);
}

const mk_hparams *mk_model_hparams(const mk_model *m) { return m ? &m->hp : NULL; }
const char *mk_model_architecture(const mk_model *m) { return m ? m->architecture : NULL; }
const char *mk_model_digest(const mk_model *m) { return m ? m->digest : NULL; }

/* ========================================================= tensor access == */

bool mk_model_gguf_has_tensor(const mk_model *m, const char *name);                       /* model_gguf.c */
mk_status mk_model_gguf_load_tensor(const mk_model *m, const char *name, float *out, size_t n); /* model_gguf.c */

bool mk_model_gguf_tensor_stored(const mk_model *m, const char *name, size_t n, uint32_t *ggml_type,
                                 const void **data, size_t *bytes); /* model_gguf.c */

bool mk_model_tensor_stored(const mk_model *m, const char *name, size_t n, uint32_t *ggml_type, const void **data,
                            size_t *bytes) {
    return m->gguf && mk_model_gguf_tensor_stored(m, name, n, ggml_type, data, bytes);
}

bool mk_model_has_tensor(const mk_model *m, const char *name) {
    if (m->gguf) return mk_model_gguf_has_tensor(m, name);
    bool is_norm;
    return mk_random_tensor_elems(&m->hp, name, &is_norm) != 0;
}

mk_status mk_model_load_tensor(const mk_model *m, const char *name, float *out, size_t n) {
    if (m->gguf) return mk_model_gguf_load_tensor(m, name, out, n);
    bool is_norm;
    const size_t expected = mk_random_tensor_elems(&m->hp, name, &is_norm);
    if (expected == 0) return mk_fail(MK_ERR_GGUF_MISSING, "random model has no tensor '%s'", name);
    if (expected != n)
        return mk_fail(MK_ERR_SHAPE, "tensor '%s' has %zu elements, caller expected %zu", name, expected, n);
    mk_random_normal(out, n, mk_hash_name(m->seed, name), is_norm ? 1.0f : 0.0f, is_norm ? 0.02f : 0.08f);
    return MK_OK;
}
