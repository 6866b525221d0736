/* The dense-llama tensor schema (see tensor_schema.h): names and shapes, one table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tensor_schema.h"

static const mk_tensor_schema mk_dense_llama_schema[MK_TENSOR_KIND_COUNT] = {
    [MK_TENSOR_TOKEN_EMBD] = {"token_embd.weight", false, MK_DIM_VOCAB, MK_DIM_HIDDEN},
    [MK_TENSOR_OUTPUT_NORM] = {"output_norm.weight", false, MK_DIM_ONE, MK_DIM_HIDDEN},
    [MK_TENSOR_OUTPUT] = {"output.weight", false, MK_DIM_VOCAB, MK_DIM_HIDDEN},
    [MK_TENSOR_ATTN_NORM] = {"attn_norm.weight", true, MK_DIM_ONE, MK_DIM_HIDDEN},
    [MK_TENSOR_ATTN_Q] = {"attn_q.weight", true, MK_DIM_Q, MK_DIM_HIDDEN},
    [MK_TENSOR_ATTN_K] = {"attn_k.weight", true, MK_DIM_KV, MK_DIM_HIDDEN},
    [MK_TENSOR_ATTN_V] = {"attn_v.weight", true, MK_DIM_KV, MK_DIM_HIDDEN},
    [MK_TENSOR_ATTN_OUTPUT] = {"attn_output.weight", true, MK_DIM_HIDDEN, MK_DIM_Q},
    [MK_TENSOR_FFN_NORM] = {"ffn_norm.weight", true, MK_DIM_ONE, MK_DIM_HIDDEN},
    [MK_TENSOR_FFN_GATE] = {"ffn_gate.weight", true, MK_DIM_FF, MK_DIM_HIDDEN},
    [MK_TENSOR_FFN_UP] = {"ffn_up.weight", true, MK_DIM_FF, MK_DIM_HIDDEN},
    [MK_TENSOR_FFN_DOWN] = {"ffn_down.weight", true, MK_DIM_HIDDEN, MK_DIM_FF},
};

const mk_tensor_schema *mk_tensor_schema_of(mk_tensor_kind kind) {
    return (unsigned)kind < MK_TENSOR_KIND_COUNT ? &mk_dense_llama_schema[kind] : NULL;
}

bool mk_tensor_is_vector(mk_tensor_kind kind) { return mk_dense_llama_schema[kind].rows == MK_DIM_ONE; }

size_t mk_tensor_dim_size(const mk_hparams *hp, mk_tensor_dim dim) {
    switch (dim) {
        case MK_DIM_ONE: return 1;
        case MK_DIM_HIDDEN: return hp->hidden;
        case MK_DIM_VOCAB: return hp->vocab;
        case MK_DIM_Q: return hp->n_heads * hp->head_dim;
        case MK_DIM_KV: return hp->n_kv_heads * hp->head_dim;
        case MK_DIM_FF: return hp->intermediate;
    }
    return 0;
}

size_t mk_tensor_elems(const mk_hparams *hp, mk_tensor_kind kind) {
    const mk_tensor_schema *s = &mk_dense_llama_schema[kind];
    return mk_tensor_dim_size(hp, s->rows) * mk_tensor_dim_size(hp, s->cols);
}

const char *mk_tensor_name(mk_tensor_kind kind, int64_t layer, char *buf, size_t cap) {
    const mk_tensor_schema *s = &mk_dense_llama_schema[kind];
    if (s->per_layer) snprintf(buf, cap, "blk.%lld.%s", (long long)layer, s->name);
    else snprintf(buf, cap, "%s", s->name);
    return buf;
}

bool mk_tensor_parse(const char *name, size_t n_layers, mk_tensor_kind *kind, int64_t *layer) {
    const char *part = name;
    long long l = -1;
    if (strncmp(name, "blk.", 4) == 0) {
        char *end = NULL;
        l = strtoll(name + 4, &end, 10);
        if (end == name + 4 || *end != '.' || l < 0 || (unsigned long long)l >= n_layers) return false;
        part = end + 1;
    }
    for (int k = 0; k < MK_TENSOR_KIND_COUNT; k++) {
        const mk_tensor_schema *s = &mk_dense_llama_schema[k];
        if (s->per_layer == (l >= 0) && strcmp(part, s->name) == 0) {
            *kind = (mk_tensor_kind)k;
            *layer = l;
            return true;
        }
    }
    return false;
}
