/* The parts of the stage runtime both roles use (stage_head.c, stage_member.c): request
 * ids, polling, the injected faults and the sends of boundaries to the next rank. */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mk_error.h"
#include "seam/frame.h"
#include "stage/stage.h"

size_t mk_request_index(const char *id) {
    unsigned long long v = 0;
    return sscanf(id, "req-%llu", &v) == 1 ? (size_t)v : (size_t)-1;
}

/* A recipe digest that is not ours: the fault of a lying peer. */
void mk_other_digest(char *digest) { digest[0] = digest[0] == '0' ? '1' : '0'; }

/* Poll fds[n] for input until the deadline: *ready is the index of a readable one, or
 * -1 at the deadline. */
mk_status mk_poll_in(const int *fds, size_t n, int64_t deadline, int *ready) {
    struct pollfd p[MK_STAGE_MAX_WORLD + 1];
    for (size_t i = 0; i < n; i++) p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
    for (;;) {
        const int64_t left = deadline - mk_now_ms();
        if (left <= 0) {
            *ready = -1;
            return MK_OK;
        }
        const int k = poll(p, (nfds_t)n, (int)(left > 60000 ? 60000 : left));
        if (k < 0) continue; /* EINTR */
        for (size_t i = 0; k > 0 && i < n; i++)
            if (p[i].revents) {
                *ready = (int)i;
                return MK_OK;
            }
    }
}

/* A rank that stops answering (fault): it waits for rank 0 to give up (an abort or a
 * closed connection) or three deadlines, whichever comes first, then leaves. */
mk_status mk_stage_go_silent(mk_stage *st, uint64_t step) {
    const int64_t deadline = mk_deadline_ms(3 * st->timeout_ms, 3 * MK_STAGE_DEFAULT_TIMEOUT_MS);
    if (st->rank != 0) {
        /* Pings go unanswered; whatever arrives is read and dropped until rank 0 hangs up. */
        for (;;) {
            int fd = st->ctl[0].fd, ready = -1;
            (void)mk_poll_in(&fd, 1, deadline, &ready);
            char junk[256];
            if (ready < 0 || read(fd, junk, sizeof junk) <= 0) break;
        }
    } else {
        while (mk_now_ms() < deadline) usleep(100000);
    }
    return mk_fail(MK_ERR_PEER_TIMEOUT, "rank %d: fell silent at step %llu (fault injected)", st->rank,
                   (unsigned long long)step);
}

/* A step that computes for 3 deadlines (fault): longer than any peer waits in silence
 * (rank 0 1.25 deadlines, the others 2), but the rank is alive and busy, not silent. The
 * forward of `boundaries` makes boundaries steps..steps + boundaries - 1: the fault's step
 * is due in whichever forward makes it, however the steps were batched. */
void mk_stage_fault_busy(const mk_stage *st, size_t boundaries) {
    for (size_t k = 0; k < boundaries; k++)
        if (mk_fault_due(&st->fault, st->steps + k, MK_FAULT_BUSY)) usleep((useconds_t)st->timeout_ms * 3000u);
}

/* The faults due at `step`, that of outs[k] of the n boundaries going out together:
 * MK_OK and *dropped when junk went out instead of a frame (the rank carries on as if it
 * had sent); a silent rank's failure. The digest and the layer are the rank's, shared by
 * every entry of a batch: a lie there is in all of them; a lying entry lies about its own
 * sequence only. */
static mk_status mk_stage_inject(mk_stage *st, uint64_t step, mk_boundary *const *outs, size_t n, size_t k,
                                 bool *dropped) {
    if (mk_fault_due(&st->fault, step, MK_FAULT_EXIT)) _exit(3);
    if (mk_fault_due(&st->fault, step, MK_FAULT_SILENT)) return mk_stage_go_silent(st, step);
    if (mk_fault_due(&st->fault, step, MK_FAULT_CORRUPT_HEADER)) {
        static const char junk[32] = "this is not a frame header......";
        if (mk_seam_stream_write_raw(st->to_next, junk, sizeof junk) == MK_OK) {
            *dropped = true;
            return MK_OK;
        }
    }
    if (mk_fault_due(&st->fault, step, MK_FAULT_HALF_FRAME)) {
        uint8_t part[MK_FRAME_HEADER_BYTES + 100];
        memset(part, 0, sizeof part);
        mk_frame_header_encode(part, 1000, 0); /* 1000 bytes announced, 100 sent */
        (void)mk_seam_stream_write_raw(st->to_next, part, sizeof part);
        return mk_stage_go_silent(st, step);
    }
    if (mk_fault_due(&st->fault, step, MK_FAULT_OTHER_DIGEST))
        for (size_t j = 0; j < n; j++) mk_other_digest(outs[j]->h.recipe_digest);
    if (mk_fault_due(&st->fault, step, MK_FAULT_OTHER_LAYER))
        for (size_t j = 0; j < n; j++) outs[j]->h.next_layer += 1;
    if (mk_fault_due(&st->fault, step, MK_FAULT_LYING_ENTRY)) outs[k]->h.position += 1;
    return MK_OK;
}

/* Send one of this rank's boundaries (out, for request id) to the next rank. */
static mk_status mk_stage_send_from(mk_stage *st, mk_boundary *out, const char *id) {
    const uint64_t step = st->steps++;
    snprintf(out->h.request_id, sizeof out->h.request_id, "%s", id);
    bool dropped = false;
    MK_TRY(mk_stage_inject(st, step, &out, 1, 0, &dropped));
    if (dropped) return MK_OK;
    /* An nccl send is only posted: the previous one must have completed (the next rank
     * took it) before the boundary buffer is sent again. */
    mk_stage_busy(st, true); /* the next rank may be busy: a send that waits for it is not silence */
    mk_status s = st->o.seam == MK_SEAM_NCCL ? mk_seam_send_wait(st->to_next) : MK_OK;
    if (s == MK_OK && strcmp(id, MK_STAGE_END_ID) != 0) {
        __atomic_fetch_add(&st->live_messages, 1, __ATOMIC_RELAXED);
        st->counts.sent++;
        st->counts.sent_ns += mk_wall_ns() - st->counts.base_ns;
    }
    if (s == MK_OK) s = mk_seam_send(st->to_next, out);
    mk_stage_busy(st, false);
    if (s == MK_ERR_PEER_CLOSED)
        return mk_stage_wrap(MK_ERR_PEER_LOST, "rank %d lost rank %d (the next stage) sending step %llu of %s", st->rank,
                       st->rank + 1, (unsigned long long)step, id);
    if (s != MK_OK)
        return mk_stage_wrap(s, "rank %d: sending step %llu of %s to rank %d failed", st->rank, (unsigned long long)step,
                       id, st->rank + 1);
    return MK_OK;
}

mk_status mk_stage_send(mk_stage *st, const char *id) { return mk_stage_send_from(st, st->out, id); }

/* Send a step's boundaries (outs[k] for request ids[k]) to the next rank as one batch
 * message (on nccl one exchange per entry, each saying how many follow). Each boundary is a
 * step of this rank's count, so a fault due at any of them is injected as at a single send. */
mk_status mk_stage_send_batch(mk_stage *st, mk_boundary *const *outs, char (*ids)[64], size_t n) {
    if (n == 1) return mk_stage_send_from(st, outs[0], ids[0]);
    const uint64_t first = st->steps;
    for (size_t k = 0; k < n; k++) {
        const uint64_t step = st->steps++;
        snprintf(outs[k]->h.request_id, sizeof outs[k]->h.request_id, "%s", ids[k]);
        bool dropped = false;
        MK_TRY(mk_stage_inject(st, step, outs, n, k, &dropped));
        if (dropped) return MK_OK;
    }
    mk_stage_busy(st, true); /* the next rank may be busy: a send that waits for it is not silence */
    __atomic_fetch_add(&st->live_messages, 1, __ATOMIC_RELAXED);
    st->counts.sent += n;
    st->counts.sent_ns += (int64_t)n * (mk_wall_ns() - st->counts.base_ns);
    /* an nccl send is only posted: the previous one must have completed (see mk_stage_send_from) */
    mk_status s = st->o.seam == MK_SEAM_NCCL ? mk_seam_send_wait(st->to_next) : MK_OK;
    if (s == MK_OK) s = mk_seam_send_batch(st->to_next, (const mk_boundary *const *)outs, n);
    mk_stage_busy(st, false);
    if (s == MK_ERR_PEER_CLOSED)
        return mk_stage_wrap(MK_ERR_PEER_LOST, "rank %d lost rank %d (the next stage) sending steps %llu..%llu (%s...)",
                             st->rank, st->rank + 1, (unsigned long long)first, (unsigned long long)st->steps - 1, ids[0]);
    if (s != MK_OK)
        return mk_stage_wrap(s, "rank %d: sending steps %llu..%llu (%s...) to rank %d failed", st->rank,
                             (unsigned long long)first, (unsigned long long)st->steps - 1, ids[0], st->rank + 1);
    return MK_OK;
}

