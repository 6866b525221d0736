/* The seam between two stages of a placed pipeline: the one place a boundary changes
 * hands. local: the bundle itself (the receiving range uploads it); wire: the bundle is
 * packed to protobuf bytes in the item's preallocated buffer by the sender and unpacked
 * by the receiver, as between mesh peers.
 *
 * The seam transports (host/seam/: mk_boundary kept in backend memory, local
 * device-to-device copy, unix/tcp streams, TLS, NCCL) are on main now but not yet plugged
 * in here: that is the next step. Then send/recv/release become calls into the transport
 * and mk_stage_link holds the transport instead of the seam kind; the stage worker does
 * not change. */
#include "mk_error.h"
#include "sched.h"

mk_status mk_stage_link_init(mk_stage_link *link, mk_sched_seam seam, size_t cap) {
    if (seam != MK_SCHED_SEAM_LOCAL && seam != MK_SCHED_SEAM_WIRE)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "unknown pipeline seam %d", (int)seam);
    link->seam = seam;
    link->bytes = 0;
    return mk_queue_init(&link->q, cap);
}

void mk_stage_link_destroy(mk_stage_link *link) { mk_queue_destroy(&link->q); }

mk_status mk_stage_link_send(mk_stage_link *link, mk_sched_item *item, mk_bundle *out) {
    item->in = out;
    if (link->seam == MK_SCHED_SEAM_WIRE) {
        MK_TRY(mk_bundle_pack_to(out, item->wire, item->wire_cap, &item->wire_len));
        link->bytes += item->wire_len;
        item->in = NULL; /* the receiver sees only the bytes */
    }
    return mk_queue_push(&link->q, item);
}

mk_status mk_stage_link_send_control(mk_stage_link *link, mk_sched_item *item) {
    item->in = NULL;
    return mk_queue_push(&link->q, item);
}

mk_status mk_stage_link_recv(mk_stage_link *link, mk_sched_item **out) {
    mk_sched_item *item = mk_queue_pop(&link->q);
    *out = item;
    if (item->kind == MK_ITEM_STOP || link->seam != MK_SCHED_SEAM_WIRE) return MK_OK;
    item->received = NULL;
    MK_TRY(mk_bundle_unpack(item->wire, item->wire_len, &item->received));
    item->in = item->received;
    return MK_OK;
}

void mk_stage_link_release(mk_stage_link *link, mk_sched_item *item) {
    mk_bundle_free(item->received);
    item->received = NULL;
    item->in = NULL;
}
