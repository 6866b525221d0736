/* The dense-llama tensor schema: every tensor a model carries, with its GGUF name and its
 * shape in terms of the hyper-parameters. The one table of this knowledge, read by the GGUF
 * reader (shape checks), the random model (element counts) and the range executor (what a
 * range loads). */
#ifndef MK_TENSOR_SCHEMA_H
#define MK_TENSOR_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meshkern.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mk_tensor_kind {
    /* global */
    MK_TENSOR_TOKEN_EMBD,
    MK_TENSOR_OUTPUT_NORM,
    MK_TENSOR_OUTPUT, /* absent when the embeddings are tied */
    /* per layer ("blk.N.<name>") */
    MK_TENSOR_ATTN_NORM,
    MK_TENSOR_ATTN_Q,
    MK_TENSOR_ATTN_K,
    MK_TENSOR_ATTN_V,
    MK_TENSOR_ATTN_OUTPUT,
    MK_TENSOR_FFN_NORM,
    MK_TENSOR_FFN_GATE,
    MK_TENSOR_FFN_UP,
    MK_TENSOR_FFN_DOWN,
    MK_TENSOR_KIND_COUNT
} mk_tensor_kind;

/* A dimension, as a function of the hyper-parameters. */
typedef enum mk_tensor_dim {
    MK_DIM_ONE,    /* 1: the row count of a vector */
    MK_DIM_HIDDEN, /* hidden */
    MK_DIM_VOCAB,  /* vocab */
    MK_DIM_Q,      /* n_heads * head_dim */
    MK_DIM_KV,     /* n_kv_heads * head_dim */
    MK_DIM_FF,     /* intermediate */
} mk_tensor_dim;

typedef struct mk_tensor_schema {
    const char *name;   /* GGUF name; for per-layer tensors the part after "blk.N." */
    bool per_layer;
    mk_tensor_dim rows; /* row-major [rows, cols] = [out, in]; GGUF lists dims as {cols, rows} */
    mk_tensor_dim cols;
} mk_tensor_schema;

/* The schema of one kind. A tensor whose rows are MK_DIM_ONE is a vector (a norm weight:
 * kept in F32); every other tensor is a matrix (kept in the range's weight dtype). */
const mk_tensor_schema *mk_tensor_schema_of(mk_tensor_kind kind);
bool mk_tensor_is_vector(mk_tensor_kind kind);
size_t mk_tensor_dim_size(const mk_hparams *hp, mk_tensor_dim dim);
size_t mk_tensor_elems(const mk_hparams *hp, mk_tensor_kind kind);
/* The full name of `kind` (in `layer` for a per-layer kind) into buf[cap]; returns buf. */
const char *mk_tensor_name(mk_tensor_kind kind, int64_t layer, char *buf, size_t cap);
/* Parse a full name of a model with n_layers layers; false if it names no schema tensor. */
bool mk_tensor_parse(const char *name, size_t n_layers, mk_tensor_kind *kind, int64_t *layer);

#ifdef __cplusplus
}
#endif
#endif
