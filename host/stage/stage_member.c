/* The stage runtime's other ranks (see stage_runtime.c): receive a step's boundaries,
 * forward them and send them on; the last rank samples and returns each token to rank 0. */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mk_error.h"
#include "model/model.h"
#include "stage/stage.h"

typedef struct mk_member_route {
    mk_stage *st;
    mk_sequence *seq;
    bool end;         /* the end-of-run marker (refused, so no payload is taken) */
    bool rank_fault;  /* refused for what every entry shares: the sending rank's fault, the run's end */
    char id[64];      /* the entry's request id, as it came */
} mk_member_route;

static mk_status mk_member_control(mk_stage *st, int64_t deadline, bool *bye);

/* A pool (or every slot) found full on this rank: rank 0 admitted the request once another
 * finished, and that FINISHED travels on the control connection while the request's
 * boundary came down the seam. Read rank 0's next control message (a FINISHED frees blocks
 * and slots): MK_OK, try again; otherwise the run is over (rank 0's bye, abort or loss),
 * with the full pool's message kept. */
static mk_status mk_member_await_finished(mk_stage *st) {
    char why[512];
    snprintf(why, sizeof why, "%s", mk_last_error());
    bool bye = false;
    MK_TRY(mk_member_control(st, mk_deadline_ms(st->timeout_ms, MK_STAGE_DEFAULT_TIMEOUT_MS), &bye));
    if (bye) return mk_fail(MK_ERR_KV_POOL_FULL, "%s (rank 0 ended the run)", why);
    return MK_OK;
}

/* The contract on entry k of a received message (routes[k] notes the outcome): first what
 * every entry shares (the model, the cut: a failure there is the sending rank's), then the
 * sequence its request id names and that sequence's own rows (a failure there is that
 * request's alone). */
static mk_status mk_member_check(void *user, size_t k, const mk_boundary_header *h, const mk_sequence **checked_for) {
    mk_member_route *r = &((mk_member_route *)user)[k];
    snprintf(r->id, sizeof r->id, "%s", h->request_id);
    if (strcmp(h->request_id, MK_STAGE_END_ID) == 0) {
        r->end = true;
        return mk_fail(MK_ERR_EMPTY_INPUT, "end of run");
    }
    const mk_status shared = mk_range_check_boundary_shared(r->st->range, h);
    if (shared != MK_OK) {
        r->rank_fault = true;
        return shared;
    }
    const bool fresh = h->step == 0 && h->position == 0;
    mk_status s = mk_slots_get(&r->st->slots, h->request_id, fresh, &r->seq);
    while (s == MK_ERR_KV_POOL_FULL) {
        const mk_status c = mk_member_await_finished(r->st);
        if (c != MK_OK) {
            r->rank_fault = true; /* rank 0 gone, aborting or done: not this entry's doing */
            return c;
        }
        s = mk_slots_get(&r->st->slots, h->request_id, fresh, &r->seq);
    }
    MK_TRY(s);
    MK_TRY(mk_range_check_boundary(r->st->range, r->seq, h));
    *checked_for = r->seq;
    return MK_OK;
}

/* An entry this rank refused for its own fields: rank 0 hears which request and why, and
 * fails that request alone (telling every rank it is over). */
static mk_status mk_member_refuse(mk_stage *st, const char *id, mk_status status, const char *why) {
    char body[MK_CTL_MAX_BODY];
    const int n = snprintf(body, sizeof body, "%d %s rank %d refused the boundary of %s from rank %d: %.900s", (int)status,
                           id[0] ? id : "-", st->rank, id, st->rank - 1, why);
    const mk_status s = mk_ctl_send(&st->ctl[0], MK_CTL_REFUSED, body, (size_t)n,
                                    mk_deadline_ms(st->timeout_ms, MK_STAGE_DEFAULT_TIMEOUT_MS));
    if (s == MK_ERR_PEER_CLOSED) return mk_fail(MK_ERR_PEER_LOST, "rank %d lost rank 0 refusing %s", st->rank, id);
    return s;
}

/* The last rank: the sampled token back to rank 0 as a TailResult. */
static mk_status mk_tail_send(mk_stage *st, const char *id, int32_t token, bool more) {
    const uint64_t step = st->steps++;
    if (mk_fault_due(&st->fault, step, MK_FAULT_EXIT)) _exit(3);
    if (mk_fault_due(&st->fault, step, MK_FAULT_SILENT)) return mk_stage_go_silent(st, step);
    const int64_t deadline = mk_deadline_ms(st->timeout_ms, MK_STAGE_DEFAULT_TIMEOUT_MS);
    if (mk_fault_due(&st->fault, step, MK_FAULT_CORRUPT_HEADER)) {
        static const char junk[32] = "this is not a control message...";
        return mk_io_write(&st->ctl[0], junk, sizeof junk, deadline, "raw bytes");
    }
    char digest[MK_DIGEST_HEX_LEN + 1];
    snprintf(digest, sizeof digest, "%s", mk_range_recipe_digest(st->range));
    if (mk_fault_due(&st->fault, step, MK_FAULT_OTHER_DIGEST)) mk_other_digest(digest);
    const mk_request_identity identity = {id, digest, "none", "0", "off", MK_PROTOCOL_ARCH_DENSE};
    const mk_sampling_params greedy = {0.0f, 1.0f, 0, 0};
    uint8_t *bytes = NULL;
    size_t len = 0;
    if (mk_fault_due(&st->fault, step, MK_FAULT_STRAY_RESULT)) { /* one more of the step, for nobody */
        const mk_request_identity stray = {"req-999999", digest, "none", "0", "off", MK_PROTOCOL_ARCH_DENSE};
        MK_TRY(mk_tail_result_pack_token(&stray, &greedy, token, &bytes, &len));
        const mk_status s = mk_ctl_send(&st->ctl[0], MK_CTL_RESULT_MORE, bytes, len, deadline);
        mk_buffer_free(bytes);
        MK_TRY(s);
    }
    MK_TRY(mk_tail_result_pack_token(&identity, &greedy, token, &bytes, &len));
    const mk_status s = mk_ctl_send(&st->ctl[0], more ? MK_CTL_RESULT_MORE : MK_CTL_RESULT, bytes, len, deadline);
    mk_buffer_free(bytes);
    if (s == MK_ERR_PEER_CLOSED) return mk_fail(MK_ERR_PEER_LOST, "rank %d lost rank 0 sending the result of %s", st->rank, id);
    return s;
}

/* One step of a rank after rank 0: the boundary that arrived and every other already
 * waiting on the seam (up to max_batch, within the step's rows), one forward, each
 * boundary passed on (or, at the last rank, each token returned). The end-of-run marker
 * ends the step's receiving; the step still runs. */
/* A member's forward of entries [k0, k1). Rank 0 admitted their requests with blocks promised
 * on every rank, but a finished request's FINISHED travels on the control connection while
 * the next request's boundary comes down the seam: a pool found full waits for rank 0's
 * control messages (FINISHED frees blocks) and tries again, within the deadline. */
static mk_status mk_member_forward(mk_stage *st, mk_forward_entry *entries, size_t n) {
    mk_stage_busy(st, true);
    mk_stage_fault_busy(st, n);
    mk_status s = mk_range_forward_batch(st->range, entries, n);
    mk_stage_busy(st, false); /* before any control message of this thread's (a PONG) */
    while (s == MK_ERR_KV_POOL_FULL) {
        MK_TRY(mk_member_await_finished(st));
        mk_stage_busy(st, true);
        s = mk_range_forward_batch(st->range, entries, n); /* nothing ran: the same forward again */
        mk_stage_busy(st, false);
    }
    return s;
}

static mk_status mk_member_step(mk_stage *st, bool *end) {
    mk_member_route route[MK_MAX_BATCH_SEQUENCES];
    mk_forward_entry entries[MK_MAX_BATCH_SEQUENCES];
    mk_boundary *outs[MK_MAX_BATCH_SEQUENCES];
    int32_t token[MK_MAX_BATCH_SEQUENCES];
    char id[MK_MAX_BATCH_SEQUENCES][64];
    const bool tail = st->rank + 1 == st->world;
    size_t n = 0, taken = 0, rows = 0; /* n: entries accepted; taken: buffers used (refused ones too) */
    for (;;) {
        mk_status status[MK_MAX_BATCH_SEQUENCES];
        char errors[MK_MAX_BATCH_SEQUENCES][MK_SEAM_ENTRY_ERROR];
        size_t got = 0;
        for (size_t k = taken; k < st->max_batch; k++) route[k] = (mk_member_route){st, NULL, false, false, ""};
        mk_status s = mk_seam_recv_batch_with(st->from_prev, mk_member_check, &route[taken], &st->ins[taken],
                                              st->max_batch - taken, &got, status, errors);
        if (s != MK_OK && route[taken].end) { /* nccl: the marker is refused with its header */
            *end = true;
            break;
        }
        if (s == MK_ERR_PEER_CLOSED && taken == 0) return s; /* told apart from a clean end by the caller */
        if (s != MK_OK)
            return mk_stage_wrap(s, "rank %d refused the boundary from rank %d (its step %llu here)", st->rank,
                                 st->rank - 1, (unsigned long long)st->steps);
        for (size_t k = taken; k < taken + got; k++) {
            const mk_member_route *r = &route[k];
            if (r->end) {
                *end = true;
                continue;
            }
            if (status[k - taken] != MK_OK && r->rank_fault)
                return mk_stage_wrap(mk_fail(status[k - taken], "%s", errors[k - taken]),
                                     "rank %d refused the boundary from rank %d (its step %llu here)", st->rank,
                                     st->rank - 1, (unsigned long long)st->steps);
            st->counts.received++; /* it crossed the seam, refused or not */
            st->counts.received_ns += mk_wall_ns() - st->counts.base_ns;
            if (status[k - taken] != MK_OK) { /* this request's own lie: it fails alone */
                MK_TRY(mk_member_refuse(st, r->id, status[k - taken], errors[k - taken]));
                continue;
            }
            snprintf(id[n], sizeof id[n], "%s", st->ins[k]->h.request_id);
            rows += st->ins[k]->h.rows;
            outs[n] = tail ? NULL : st->outs[k];
            entries[n] = (mk_forward_entry){.seq = r->seq, .in = st->ins[k], .out = outs[n],
                                            .token = tail ? &token[n] : NULL};
            n++;
        }
        taken += got;
        if (*end) break;
        /* another message already here joins the step (a frame started is read whole) */
        struct pollfd p = {.fd = mk_seam_stream_fd(st->from_prev), .events = POLLIN};
        if (taken == st->max_batch || rows >= st->max_rows || p.fd < 0 || poll(&p, 1, 0) <= 0) break;
    }
    /* The boundaries taken run in forwards of at most the step's rows (the last one taken
     * may not fit with the others: it runs in a forward of its own); each forward's outputs
     * go on together. */
    for (size_t k0 = 0; k0 < n;) {
        size_t k1 = k0 + 1, r = entries[k0].in->h.rows;
        while (k1 < n && r + entries[k1].in->h.rows <= st->max_rows) r += entries[k1++].in->h.rows;
        const mk_status s = mk_member_forward(st, entries + k0, k1 - k0);
        if (s != MK_OK)
            return mk_stage_wrap(s, "rank %d: %s at step %llu", st->rank, id[k0], (unsigned long long)st->steps);
        if (tail)
            for (size_t k = k0; k < k1; k++) MK_TRY(mk_tail_send(st, id[k], token[k], k + 1 < n));
        else
            MK_TRY(mk_stage_send_batch(st, outs + k0, id + k0, k1 - k0));
        k0 = k1;
    }
    return MK_OK;
}

/* A control message from rank 0 mid-run: bye (done), abort (failed), or nothing usable. */
static mk_status mk_member_control(mk_stage *st, int64_t deadline, bool *bye) {
    mk_ctl_type type;
    char body[MK_CTL_MAX_BODY + 1];
    size_t len;
    MK_TRY(mk_ctl_recv(&st->ctl[0], &type, body, &len, deadline, "rank 0"));
    if (type == MK_CTL_BYE) {
        *bye = true;
        return MK_OK;
    }
    if (type == MK_CTL_PING) {
        const mk_status s = mk_ctl_send(&st->ctl[0], MK_CTL_PONG, NULL, 0, deadline);
        if (s == MK_ERR_PEER_CLOSED)
            return mk_stage_wrap(MK_ERR_PEER_LOST, "rank %d lost rank 0 answering its ping", st->rank);
        return s;
    }
    if (type == MK_CTL_BUSY) return MK_OK; /* rank 0 is computing: the wait starts again */
    if (type == MK_CTL_FINISHED) { /* a request is over: its blocks back to this rank's pool */
        body[len] = '\0';
        mk_slots_release(&st->slots, body);
        return MK_OK;
    }
    if (type == MK_CTL_ABORT) {
        char *nl = strchr(body, '\n');
        if (nl) {
            *nl = '\0';
            snprintf(st->abort_requests, sizeof st->abort_requests, "%s", nl + 1);
        }
        return mk_ctl_abort_status(body);
    }
    return mk_fail(MK_ERR_FRAME, "rank 0 sent control message type %d mid-run", (int)type);
}

static mk_status mk_member_serve(mk_stage *st) {
    for (;;) {
        const int fds[2] = {st->ctl[0].fd, mk_seam_stream_fd(st->from_prev)};
        int ready = -1;
        /* Rank 0 watches the results and names a silent rank within 1.25 deadlines; this
         * rank waits twice the deadline, which only passes when rank 0 itself is silent. */
        const int64_t deadline = mk_deadline_ms(2 * st->timeout_ms, 2 * MK_STAGE_DEFAULT_TIMEOUT_MS);
        MK_TRY(mk_poll_in(fds, 2, deadline, &ready));
        if (ready < 0)
            return mk_fail(MK_ERR_PEER_TIMEOUT, "rank %d: neither a boundary from rank %d nor a word from rank 0 within "
                           "%d ms (after step %llu): rank 0 is silent", st->rank, st->rank - 1, 2 * st->timeout_ms,
                           (unsigned long long)st->steps);
        bool bye = false;
        if (ready == 0) {
            MK_TRY(mk_member_control(st, deadline, &bye));
            if (bye) return MK_OK;
            continue;
        }
        bool end = false;
        const mk_status s = mk_member_step(st, &end);
        if (s != MK_ERR_PEER_CLOSED) {
            MK_TRY(s);
            continue;
        }
        /* The previous rank went away: after a bye from rank 0 that is the end of the run;
         * otherwise rank 0 says why (or has gone too). Messages queued before the bye (a
         * FINISHED, a relayed BUSY) are read on the way to it. */
        char why[512];
        snprintf(why, sizeof why, "%s", mk_last_error());
        const int64_t until = mk_deadline_ms(st->timeout_ms, MK_STAGE_DEFAULT_TIMEOUT_MS);
        mk_status c = MK_OK;
        while (c == MK_OK && !bye) c = mk_member_control(st, until, &bye);
        if (c == MK_OK && bye) return MK_OK;
        if (c != MK_OK && c != MK_ERR_PEER_TIMEOUT) return c;
        return mk_fail(MK_ERR_PEER_LOST, "rank %d lost rank %d (the previous stage) after step %llu: %s", st->rank,
                       st->rank - 1, (unsigned long long)st->steps, why);
    }
}

/* nccl seams cannot be polled beside the control connection: control is read whenever it
 * has something before each receive, and a receive waits up to the idle deadline. The run
 * ends with the marker: passed on (or, at the last rank, reported done), then rank 0's bye. */
static mk_status mk_member_serve_nccl(mk_stage *st) {
    for (;;) {
        struct pollfd p = {.fd = st->ctl[0].fd, .events = POLLIN};
        bool bye = false, end = false;
        const int64_t deadline = mk_deadline_ms(st->timeout_ms, MK_STAGE_DEFAULT_TIMEOUT_MS);
        if (poll(&p, 1, 0) > 0) {
            MK_TRY(mk_member_control(st, deadline, &bye));
            if (bye) return MK_OK;
            continue;
        }
        const mk_status s = mk_member_step(st, &end);
        if (s != MK_OK) {
            /* rank 0 may know better (an abort naming the cause) */
            char why[512];
            snprintf(why, sizeof why, "%s", mk_last_error());
            if (poll(&p, 1, 0) > 0) {
                const mk_status c = mk_member_control(st, deadline, &bye);
                if (c != MK_OK) return c;
            }
            return mk_fail(s, "%s", why);
        }
        if (!end) continue;
        if (st->rank + 1 < st->world) MK_TRY(mk_stage_send(st, MK_STAGE_END_ID));
        else MK_TRY(mk_ctl_send(&st->ctl[0], MK_CTL_DONE, NULL, 0, deadline));
        while (!bye) MK_TRY(mk_member_control(st, deadline, &bye));
        return MK_OK;
    }
}

/* After the bye: this rank's seam figures to rank 0 (mk_stage_hop_stats). */
static mk_status mk_member_send_counts(mk_stage *st) {
    mk_stage_counts *c = &st->counts;
    c->received_bytes = st->from_prev ? mk_seam_bytes(st->from_prev) : 0;
    c->send_seconds = st->to_next ? mk_seam_seconds(st->to_next) : 0.0;
    c->recv_seconds = st->from_prev ? mk_seam_seconds(st->from_prev) : 0.0;
    char body[MK_CTL_MAX_BODY];
    const int n = snprintf(body, sizeof body, "%lld %llu %lld %llu %lld %zu %.9g %.9g", (long long)c->base_ns,
                           (unsigned long long)c->sent, (long long)c->sent_ns, (unsigned long long)c->received,
                           (long long)c->received_ns, c->received_bytes, c->send_seconds, c->recv_seconds);
    return mk_ctl_send(&st->ctl[0], MK_CTL_STATS, body, (size_t)n,
                       mk_deadline_ms(st->timeout_ms, MK_STAGE_DEFAULT_TIMEOUT_MS));
}

mk_status mk_stage_serve_member(mk_stage *st, mk_stage_report_fn report, void *user) {
    char *requests = st->abort_requests;
    const size_t cap = sizeof st->abort_requests;
    requests[0] = '\0';
    mk_status s = st->o.seam == MK_SEAM_NCCL ? mk_member_serve_nccl(st) : mk_member_serve(st);
    if (s == MK_OK) {
        /* the run is done either way: figures rank 0 does not get are only missing there */
        (void)mk_member_send_counts(st);
        mk_clear_error();
        return MK_OK;
    }
    char message[512];
    snprintf(message, sizeof message, "%s", mk_last_error());
    if (!requests[0]) {
        /* This rank failed first (or lost rank 0): tell rank 0, which fails the requests in
         * flight and answers with their list (beats and pings before it are passed over). */
        mk_ctl_abort(&st->ctl[0], s, message);
        const int64_t deadline = mk_deadline_ms(st->timeout_ms / 2, MK_STAGE_DEFAULT_TIMEOUT_MS / 2);
        bool bye = false;
        while (mk_member_control(st, deadline, &bye) == MK_OK && !bye && !requests[0]) {
        }
    }
    /* Every rank reports the requests of the failed run: rank 0's list, or, when rank 0 is
     * gone, the requests this rank holds a sequence of (some may have finished). */
    char why[640];
    snprintf(why, sizeof why, "%s", message);
    if (!requests[0]) {
        size_t n = 0;
        for (size_t k = 0; k < st->slots.n; k++) {
            const size_t i = mk_request_index(st->slots.slot[k].request_id);
            if (i != (size_t)-1 && n + 24 < cap) n += (size_t)snprintf(requests + n, cap - n, "%zu ", i);
        }
        snprintf(why, sizeof why, "%s (rank 0 sent no list: a request this rank held)", message);
    }
    for (const char *p = requests; report && *p;) {
        char *end = NULL;
        const unsigned long long i = strtoull(p, &end, 10);
        if (end == p) break;
        const mk_stage_report rep = {(size_t)i, s, why, NULL, 0, false};
        report(user, &rep);
        p = end;
        while (*p == ' ') p++;
    }
    return mk_fail(s, "%s", message);
}
