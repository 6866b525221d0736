/* The boundary object: a range's residual rows in its backend's memory, with the header
 * that describes them; what a seam moves and a forward reads or writes. */
#include <stdlib.h>

#include <string.h>

#include "mk_error.h"
#include "protocol/boundary.h"
#include "range/range_impl.h"

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

mk_status mk_boundary_set_request(mk_boundary *bd, const char *request_id, uint64_t step) {
    mk_clear_error();
    if (!bd || !request_id) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_boundary_set_request: NULL argument");
    const size_t n = strlen(request_id);
    if (n >= sizeof bd->h.request_id)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "request id of %zu bytes: a boundary holds at most %zu", n,
                       sizeof bd->h.request_id - 1);
    memcpy(bd->h.request_id, request_id, n + 1);
    bd->h.step = step;
    return MK_OK;
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
