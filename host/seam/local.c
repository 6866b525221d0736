/* The local transport: both ends in one process. The payload goes device-to-device from
 * the sender's boundary buffer into the receiver's (same or another device; a memcpy on
 * the cpu backend), ordered on the two ranges' streams; the host never touches it. */
#include <stdlib.h>

#include "mk_error.h"
#include "seam/seam.h"

typedef struct mk_local_link {
    int refs;                  /* both ends share the link */
    const mk_boundary *posted; /* the sender's boundary, until received */
} mk_local_link;

static mk_status local_send(mk_seam *s, const mk_boundary *b) {
    mk_local_link *link = s->impl;
    link->posted = b;
    return MK_OK;
}

static mk_status local_send_wait(mk_seam *s) { return MK_OK; }

static mk_status local_recv_header(mk_seam *s, mk_boundary_header *h) {
    mk_local_link *link = s->impl;
    if (!link->posted) return mk_fail(MK_ERR_INVALID_ARGUMENT, "local seam: nothing was sent");
    *h = link->posted->h;
    return MK_OK;
}

static mk_status local_recv_payload(mk_seam *s, mk_boundary *into) {
    mk_local_link *link = s->impl;
    const mk_boundary *from = link->posted;
    link->posted = NULL;
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
