/* The wire transport: both ends in one process, the boundary packed to TensorBundle
 * bytes (protobuf-c, straight from the residual) and decoded again in place by the frame
 * reader, as a host runtime that carries the bytes itself would do. Staging and byte
 * buffers are kept and reused across steps. */
#include <stdlib.h>
#include <string.h>

#include "protocol/bundle_codec.h"
#include "seam/frame.h"
#include "mk_error.h"
#include "seam/seam.h"

typedef struct mk_wire_link {
    int refs;
    void *staging;       /* host staging of the sender [max_rows, hidden] */
    int32_t *positions;  /* [max_rows] */
    uint8_t *bytes;      /* 64-byte aligned, reused */
    uint8_t *message;    /* the packed message inside bytes */
    size_t len, cap;
    bool sent;
    const uint8_t *rows[MK_MAX_BATCH_SEQUENCES]; /* each entry's rows in bytes, after recv_header */
} mk_wire_link;

static mk_status wire_send(mk_seam *s, const mk_boundary *const *b, size_t n) {
    mk_wire_link *link = s->impl;
    mk_backend *be = mk_range_backend(s->range);
    const void *rows[MK_MAX_BATCH_SEQUENCES];
    const mk_boundary_header *h[MK_MAX_BATCH_SEQUENCES];
    MK_TRY(mk_seam_stage_rows(be, b, n, link->staging, link->positions, rows, h));
    mk_bundle_message m;
    MK_TRY(mk_bundle_message_describe_batch(h, n, rows, link->positions, &m));
    const size_t len = mk_bundle_message_size(&m);
    if (len + MK_FRAME_ALIGN > link->cap) {
        const size_t cap = (len + 2 * MK_FRAME_ALIGN) & ~(size_t)(MK_FRAME_ALIGN - 1);
        uint8_t *grown = aligned_alloc(MK_FRAME_ALIGN, cap);
        if (!grown) return mk_fail(MK_ERR_OUT_OF_MEMORY, "wire seam: out of memory for %zu bytes", len);
        free(link->bytes);
        link->bytes = grown;
        link->cap = cap;
    }
    /* The payload lands 64-byte aligned: pack and upload copy at full speed. */
    link->message = link->bytes + mk_frame_shift(mk_bundle_message_payload_offset(&m));
    link->len = mk_bundle_message_pack(&m, link->message);
    link->sent = true;
    return MK_OK;
}

static mk_status wire_send_wait(mk_seam *s) { return MK_OK; }

static mk_status wire_recv_header(mk_seam *s, mk_boundary_header *h, size_t cap, size_t *n) {
    mk_wire_link *link = s->impl;
    if (!link->sent) return mk_fail(MK_ERR_INVALID_ARGUMENT, "wire seam: nothing was sent");
    link->sent = false;
    s->bytes += link->len;
    return mk_bundle_decode_batch(link->message, link->len, h, cap, n, link->rows);
}

static mk_status wire_recv_payload(mk_seam *s, size_t k, mk_boundary *into) {
    mk_wire_link *link = s->impl;
    MK_TRY(mk_boundary_rows_finite(link->rows[k], &into->h));
    mk_backend *be = mk_range_backend(into->range);
    return be->ops->upload(be, into->payload, link->rows[k], into->h.rows * into->h.hidden * sizeof(float));
}

static void wire_destroy(mk_seam *s) {
    mk_wire_link *link = s->impl;
    if (!link) return;
    if (s->sender && link->staging) {
        mk_backend *be = mk_range_backend(s->range);
        be->ops->host_release(be, link->staging);
        link->staging = NULL;
    }
    if (--link->refs > 0) return;
    free(link->positions);
    free(link->bytes);
    free(link);
}

static const mk_seam_ops mk_wire_ops = {
    .name = "wire",
    .send = wire_send,
    .send_wait = wire_send_wait,
    .recv_header = wire_recv_header,
    .recv_payload = wire_recv_payload,
    .destroy = wire_destroy,
};

mk_status mk_seam_wire_pair(mk_seam *tx, mk_seam *rx) {
    mk_wire_link *link = calloc(1, sizeof *link);
    if (!link) return mk_fail(MK_ERR_OUT_OF_MEMORY, "wire seam: out of memory");
    link->refs = 2;
    tx->impl = rx->impl = link;
    tx->ops = rx->ops = &mk_wire_ops;
    const size_t rows = mk_range_max_rows(tx->range), hidden = mk_range_hidden(tx->range);
    mk_backend *be = mk_range_backend(tx->range);
    link->positions = malloc(rows * sizeof(int32_t));
    if (!link->positions) return mk_fail(MK_ERR_OUT_OF_MEMORY, "wire seam: out of memory");
    if (be->ops->host_addressable) return MK_OK;
    return be->ops->host_alloc(be, rows * hidden * sizeof(float), &link->staging);
}
