/* The seam between two stages of a placed pipeline: the one place a boundary changes
 * hands, through a transport of host/seam/.
 *
 * Order. The sender posts the boundary on the transport and then pushes the item; the
 * receiver takes the item and then receives. On a FIFO transport (one socket or one
 * communicator per seam) the frames therefore arrive in the queue's order, and a stage
 * that fails a step it received still consumed that step's frame. The sender waits for
 * its previous send (mk_seam_send_wait) before it posts the next: a stream end has one
 * frame buffer and an NCCL end one pending send. That wait ends when the receiver takes
 * the previous item, which was pushed before: stage i waits on stage i + 1 only, never the
 * other way, so the chain cannot deadlock, and every wait has the transport's deadline.
 *
 * The in-process transports (local, wire) keep one posted boundary per pair of ends, so
 * each sequence slot has its own pair: an item is in one place at a time, and so is the
 * boundary posted on its pair. */
#include <stdlib.h>

#include "mk_error.h"
#include "sched/sched.h"

static bool mk_seam_is_fifo(mk_seam_kind kind) {
    return kind == MK_SEAM_UNIX || kind == MK_SEAM_TCP || kind == MK_SEAM_NCCL;
}

mk_status mk_sched_link_init(mk_sched_link *link, mk_seam_kind kind, mk_range *sender, mk_range *receiver,
                             size_t n_slots) {
    link->kind = kind;
    link->fifo = mk_seam_is_fifo(kind);
    MK_TRY(mk_queue_init(&link->q, n_slots + 1));
    const size_t n = link->fifo ? 1 : n_slots;
    link->tx = calloc(n, sizeof *link->tx);
    link->rx = calloc(n, sizeof *link->rx);
    if (!link->tx || !link->rx) return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline seam: out of memory");
    const mk_seam_options opt = mk_seam_options_default(kind);
    for (size_t i = 0; i < n; i++) {
        MK_TRY(mk_seam_pair(&opt, sender, receiver, &link->tx[i], &link->rx[i]));
        link->n_pairs = i + 1;
    }
    return MK_OK;
}

void mk_sched_link_destroy(mk_sched_link *link) {
    for (size_t i = 0; i < link->n_pairs; i++) {
        /* The sender's last frame was taken (or the receiver is gone): nothing waits long. */
        mk_seam_free(link->tx[i]);
        mk_seam_free(link->rx[i]);
    }
    free(link->tx);
    free(link->rx);
    link->tx = link->rx = NULL;
    link->n_pairs = 0;
    mk_queue_destroy(&link->q);
}

static size_t mk_link_pair(const mk_sched_link *link, const mk_sched_item *item) {
    return link->fifo ? 0 : item->slot;
}

mk_status mk_sched_link_send(mk_sched_link *link, mk_sched_item *item, const mk_boundary *out) {
    mk_seam *tx = link->tx[mk_link_pair(link, item)];
    MK_TRY(mk_seam_send_wait(tx)); /* the previous frame on this end: one in flight */
    MK_TRY(mk_seam_send(tx, out));
    return mk_queue_push(&link->q, item);
}

mk_status mk_sched_link_send_control(mk_sched_link *link, mk_sched_item *item) {
    return mk_queue_push(&link->q, item);
}

mk_sched_item *mk_sched_link_take(mk_sched_link *link) { return mk_queue_pop(&link->q); }

mk_status mk_sched_link_recv(mk_sched_link *link, const mk_sched_item *item, const mk_sequence *seq,
                             mk_boundary *into) {
    if (link->cut_armed && !link->cut && link->taken == link->cut_after) {
        /* The injected loss of this end (tests): its sockets close, the sender sees it. */
        for (size_t i = 0; i < link->n_pairs; i++) {
            mk_seam_free(link->rx[i]);
            link->rx[i] = NULL;
        }
        link->cut = true;
    }
    if (link->cut)
        return mk_fail(MK_ERR_PEER_CLOSED, "%s seam: the receiving end was closed after %zu boundaries (injected)",
                       mk_seam_kind_name(link->kind), link->taken);
    link->taken++;
    return mk_seam_recv(link->rx[mk_link_pair(link, item)], seq, into);
}

size_t mk_sched_link_bytes(const mk_sched_link *link) {
    size_t bytes = 0;
    for (size_t i = 0; i < link->n_pairs; i++) bytes += link->rx[i] ? mk_seam_bytes(link->rx[i]) : 0;
    return bytes;
}
