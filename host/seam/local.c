/* The local transport: both ends in one process. The payload goes device-to-device from
 * the sender's boundary buffer into the receiver's (same or another device; a memcpy on
 * the cpu backend), ordered on the two ranges' streams; the host never touches it. */
#include <stdlib.h>

#include "mk_error.h"
#include "seam/seam.h"

typedef struct mk_local_link {
    int refs;                  /* both ends share the link */
    /* the sender's boundaries, until received (their headers) and copied (each payload) */
    const mk_boundary *posted[MK_MAX_BATCH_SEQUENCES];
    size_t n_posted;
} mk_local_link;

static mk_status local_send(mk_seam *s, const mk_boundary *const *b, size_t n) {
    mk_local_link *link = s->impl;
    for (size_t k = 0; k < n; k++) link->posted[k] = b[k];
    link->n_posted = n;
    return MK_OK;
}

static mk_status local_send_wait(mk_seam *s) { return MK_OK; }

static mk_status local_recv_header(mk_seam *s, mk_boundary_header *h, size_t cap, size_t *n) {
    mk_local_link *link = s->impl;
    const size_t posted = link->n_posted;
    link->n_posted = 0; /* each send is received once */
    if (posted == 0) return mk_fail(MK_ERR_INVALID_ARGUMENT, "local seam: nothing was sent");
    if (posted > cap)
        return mk_fail(MK_ERR_SHAPE, "a batch of %zu entries is more than the %zu this receiver takes", posted, cap);
    for (size_t k = 0; k < posted; k++) h[k] = link->posted[k]->h;
    *n = posted;
    return MK_OK;
}

static mk_status local_recv_payload(mk_seam *s, size_t k, mk_boundary *into) {
    mk_local_link *link = s->impl;
    const mk_boundary *from = link->posted[k];
    const size_t bytes = from->h.rows * from->h.hidden * sizeof(float);
    mk_backend *dst = mk_range_backend(into->range), *src = mk_range_backend(from->range);
    MK_TRY(dst->ops->copy_from_peer(dst, into->payload, src, from->payload, bytes));
    s->bytes += bytes;
    return MK_OK;
}

static void local_destroy(mk_seam *s) {
    mk_local_link *link = s->impl;
    if (link && --link->refs == 0) free(link);
}

static const mk_seam_ops mk_local_ops = {
    .name = "local",
    .send = local_send,
    .send_wait = local_send_wait,
    .recv_header = local_recv_header,
    .recv_payload = local_recv_payload,
    .destroy = local_destroy,
};

mk_status mk_seam_local_pair(mk_seam *tx, mk_seam *rx) {
    const mk_backend *a = mk_range_backend(tx->range), *b = mk_range_backend(rx->range);
    if (a->ops != b->ops)
        return mk_fail(MK_ERR_UNSUPPORTED, "local seam: a %s range cannot copy into a %s range; use the wire",
                       a->ops->name, b->ops->name);
    mk_local_link *link = calloc(1, sizeof *link);
    if (!link) return mk_fail(MK_ERR_OUT_OF_MEMORY, "local seam: out of memory");
    link->refs = 2;
    tx->impl = rx->impl = link;
    tx->ops = rx->ops = &mk_local_ops;
    return MK_OK;
}
