/* A model: hyper-parameters, the advertised architecture, an identity digest, and a
 * source of named weights (seeded random or a GGUF file). A range asks the source for
 * exactly the tensors it owns, as F32, one at a time. Tensor names follow GGUF. */
#ifndef MK_MODEL_H
#define MK_MODEL_H

#include "meshkern.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mk_gguf mk_gguf;

struct mk_model {
    mk_hparams hp;
    char architecture[64];                /* as advertised: "llama", "dense-llama", ... */
    char digest[MK_DIGEST_HEX_LEN + 1];   /* identity of tensors + hyper-parameters */
    uint64_t seed;                        /* random source */
    mk_gguf *gguf;                        /* gguf source (owned), or NULL */
};

/* Whether the model carries this tensor (e.g. output.weight is absent when tied). */
bool mk_model_has_tensor(const mk_model *m, const char *name);
/* Fill out[n] with the tensor as F32; n must equal its element count. A stored tensor
 * holding NaN or Inf (mk_model_check_finite) is refused with MK_ERR_NONFINITE. */
mk_status mk_model_load_tensor(const mk_model *m, const char *name, float *out, size_t n);
/* MK_ERR_NONFINITE naming tensor `name` and its first NaN or Inf value or block scale
 * (mk_gguf_check_finite over the stored bytes); MK_OK otherwise. What the loaders run on
 * every weight before a backend sees it, so a model file with such a weight is refused at
 * load instead of running and sampling from NaN logits. */
mk_status mk_model_check_finite(const char *name, uint32_t ggml_type, const void *data, size_t bytes);
/* The tensor as its source stores it, when the source has a stored format (a GGUF file):
 * ggml type, bytes inside the model (valid while the model lives) and their count; n must
 * equal its element count. False for a source without one (random): use load_tensor. */
bool mk_model_tensor_stored(const mk_model *m, const char *name, size_t n, uint32_t *ggml_type, const void **data,
                            size_t *bytes);

/* The tensors as the source stores them, in file order (what `meshkern inspect` lists). A
 * source without a stored format (random) has none: the count is 0. */
typedef struct mk_model_stored_info {
    const char *name;      /* owned by the model */
    const char *type_name; /* the ggml type ("Q4_1", "F32", ...) */
    uint32_t n_dims;       /* 1..4 */
    uint64_t dims[4];      /* fastest first; unused = 1 */
    size_t bytes;          /* bytes of data as stored */
} mk_model_stored_info;
size_t mk_model_stored_tensor_count(const mk_model *m);
/* Tensor `index` (< the count): false past the end. */
bool mk_model_stored_tensor_at(const mk_model *m, size_t index, mk_model_stored_info *out);

/* ------------------------------------------------- a GGUF file's hyper-parameters -- */
/* (model_gguf.c, the one reader of the dense-llama keys; model/gguf.h is the generic
 * container reader.) Read the `<arch>.*` hyper-parameters (arch = general.architecture, copied to arch):
 * context_length, embedding_length, block_count, feed_forward_length,
 * attention.head_count, attention.head_count_kv (default head_count), rope.freq_base
 * (default 10000), attention.layer_norm_rms_epsilon, rope.dimension_count (default and
 * required value head_dim = embedding_length / head_count), vocab size (`<arch>.vocab_size`,
 * else the length of tokenizer.ggml.tokens, else token_embd.weight dims[1]).
 * rope_layout = MK_ROPE_ADJACENT_PAIRS; tied_embeddings = no output.weight.
 * Then checks consistency: head counts divide, and the shapes of token_embd.weight,
 * output_norm.weight, output.weight (if present) and every blk.N.* tensor of every layer
 * match. Missing keys/tensors: MK_ERR_GGUF_MISSING; inconsistency: MK_ERR_GGUF_HPARAMS.
 * Architecture certification is the caller's job. */
mk_status mk_gguf_read_hparams(const mk_gguf *g, mk_hparams *hp, char *arch, size_t arch_cap);

/* sha256 of `len` bytes as lowercase hex (65 bytes with the terminator). */
typedef struct mk_sha256 mk_sha256;
mk_status mk_sha256_begin(mk_sha256 **ctx);
void mk_sha256_update(mk_sha256 *ctx, const void *data, size_t len);
void mk_sha256_finish(mk_sha256 *ctx, char hex[MK_DIGEST_HEX_LEN + 1]); /* frees ctx */
/* Hash of the hyper-parameters in a fixed textual form. */
void mk_sha256_hparams(mk_sha256 *ctx, const mk_hparams *hp);

#ifdef __cplusplus
}
#endif
#endif
