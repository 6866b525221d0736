/* A range's weights: one arena, carved per the tensor schema, loaded one tensor at a time
 * through host staging (dequantized F32, or the stored format in native mode). */
#include <stdlib.h>

#include "model/tensor_schema.h"
#include "mk_error.h"
#include "range/range_impl.h"

/* ================================================================ weights == */

/* Native weight mode: a matrix kept in the format its source stores (or F32 for a source
 * without one), as the backend lays it out. */
static mk_status mk_range_native_matrix(mk_range *r, mk_carver *c, mk_weight *dst, const char *name, float *staging) {
    mk_backend *b = r->backend;
    if (!b->ops->native_weight_bytes)
        return mk_fail(MK_ERR_DTYPE, "%s backend has no native weight mode", b->ops->name);
    const size_t rows = dst->rows, cols = dst->cols;
    uint32_t type = 0; /* F32 */
    const void *src = NULL;
    size_t src_bytes = 0;
    const bool stored = mk_model_tensor_stored(r->model, name, rows * cols, &type, &src, &src_bytes);
    if (!stored) type = 0;
    const size_t bytes = b->ops->native_weight_bytes(b, type, rows, cols);
    if (!bytes)
        return mk_fail(MK_ERR_DTYPE, "%s backend cannot keep tensor '%s' [%zu, %zu] in its stored format",
                       b->ops->name, name, rows, cols);
    dst->data = mk_carve(c, bytes);
    if (!c->base) return MK_OK;
    if (stored) MK_TRY(mk_model_check_finite(name, type, src, src_bytes)); /* as mk_model_load_tensor does */
    if (!stored) {
        MK_TRY(mk_model_load_tensor(r->model, name, staging, rows * cols));
        src = staging;
        src_bytes = rows * cols * sizeof(float);
    }
    return b->ops->upload_native_weight(b, dst, type, src, src_bytes);
}

/* Carve (or, on the second pass, load) every weight the range owns. */
static mk_status mk_range_weights(mk_range *r, mk_carver *c, float *staging) {
    const mk_hparams *hp = &r->hp;
    const size_t welem = mk_backend_weight_elem_size(r->backend);
    mk_backend *b = r->backend;
    const bool loading = c->base != NULL;
    const bool native = b->config.weight_dtype == MK_DTYPE_NATIVE;

#define MK_MATRIX(dst, name, n_rows, n_cols)                                           \
    do {                                                                              \
        (dst).rows = (n_rows);                                                        \
        (dst).cols = (n_cols);                                                        \
        if (native) MK_TRY(mk_range_native_matrix(r, c, &(dst), (name), staging));    \
        else {                                                                        \
            (dst).data = mk_carve(c, (dst).rows * (dst).cols * welem);                \
            if (loading) {                                                            \
                MK_TRY(mk_model_load_tensor(r->model, (name), staging, (dst).rows * (dst).cols)); \
                MK_TRY(b->ops->upload_weight(b, &(dst), staging));                    \
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
        if (tied) r->lm_head = r->token_embd; /* loaded above: data and format */
        else MK_TENSOR(r->lm_head, MK_TENSOR_OUTPUT, 0);
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

mk_status mk_range_load(mk_range *r) {
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
