/* The boundary contract: the one place it is written. Transports run it on a received
 * header before they accept a payload (mk_range_check_boundary); the forward pass runs it
 * on whatever boundary was not checked on arrival (forward.c). */
#include <string.h>

#include "mk_error.h"
#include "protocol/boundary.h"
#include "range/range_impl.h"

mk_status mk_check_input_kind(const mk_range *r, const int32_t *ids, size_t n_tokens, bool has_boundary) {
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

mk_status mk_check_rows(const mk_range *r, const mk_sequence *seq, size_t rows) {
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
    return mk_check_header(r, seq, h);
}

mk_status mk_range_check_boundary_shared(const mk_range *r, const mk_boundary_header *h) {
    MK_TRY(mk_check_input_kind(r, NULL, 0, true));
    if (h->normalized)
        return mk_fail(MK_ERR_NORMALIZED_BUNDLE,
                       "boundary bundle is marked normalized: the seam carries the UNNORMALIZED residual stream");
    /* an entry of a batch (schema 2) is one sequence's boundary as much as a schema 1 one */
    if (h->schema_version != MK_BOUNDARY_SCHEMA_VERSION && h->schema_version != MK_BOUNDARY_BATCH_SCHEMA_VERSION)
        return mk_fail(MK_ERR_SCHEMA_VERSION, "bundle schema version %u is not a supported version (%u, or %u for a batch)",
                       h->schema_version, MK_BOUNDARY_SCHEMA_VERSION, MK_BOUNDARY_BATCH_SCHEMA_VERSION);
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
    return MK_OK;
}

/* The shared part, then what is the sequence's own: its rows and where they start. */
mk_status mk_check_header(const mk_range *r, const mk_sequence *seq, const mk_boundary_header *h) {
    if (seq->range != r) return mk_fail(MK_ERR_INVALID_ARGUMENT, "sequence belongs to another range");
    MK_TRY(mk_range_check_boundary_shared(r, h));
    if (h->rows == 0) return mk_fail(MK_ERR_EMPTY_INPUT, "bundle carries no rows");
    if (h->position < 0 || (size_t)h->position != seq->length)
        return mk_fail(MK_ERR_POSITIONS_SHAPE,
                       "bundle position %lld at row 0 does not continue the sequence (expected %zu)",
                       (long long)h->position, seq->length);
    return mk_check_rows(r, seq, h->rows);
}

mk_status mk_check_bundle(const mk_range *r, const mk_sequence *seq, const mk_bundle *bundle) {
    if (!bundle->residual || !bundle->positions || bundle->h.rows == 0)
        return mk_fail(MK_ERR_EMPTY_INPUT, "bundle carries no rows");
    mk_boundary_header h = bundle->h;
    h.position = (int64_t)seq->length; /* the rows are checked one by one below */
    MK_TRY(mk_check_header(r, seq, &h));
    for (size_t i = 0; i < bundle->h.rows; i++)
        if (bundle->positions[i] < 0 || (size_t)bundle->positions[i] != seq->length + i)
            return mk_fail(MK_ERR_POSITIONS_SHAPE,
                           "bundle position %d at row %zu does not continue the sequence (expected %zu)",
                           bundle->positions[i], i, seq->length + i);
    return mk_boundary_rows_finite(bundle->residual, &bundle->h);
}
