/* The stage runtime's rank 0 (the head; see stage_runtime.c): admits requests, runs their
 * prefills and decode steps, sends each step's boundaries to rank 1 and takes the tokens the
 * last rank returns, over the control connections. */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mk_error.h"
#include "core/mk_size.h"
#include "model/model.h"
#include "range/range.h"
#include "stage/stage.h"

/* A request in flight: its admission number names it on every rank ("req-<number>"). */
typedef struct mk_head_entry {
    bool used;
    size_t number;
    mk_stage_arrival a;  /* a.prompt: the copy below */
    int32_t *prompt;     /* [a.n_prompt], copied at admission */
    int32_t *tokens;     /* [cap] */
    size_t n, cap;       /* cap: its token limit, or fewer where its KV fills first */
    size_t limit;        /* the token limit asked for */
    bool ready;          /* its next rows wait for a step: the prompt (n == 0) or its last token */
    size_t prompt_done;  /* prompt tokens of the chunks sent before (o.prefill_chunk) */
    size_t step_rows;    /* rows of its step in flight */
    bool reserved;       /* its slot holds the KV blocks of its whole run (admitted only then) */
} mk_head_entry;

typedef struct mk_head {
    mk_stage *st;
    const mk_stage_source *src;
    mk_head_entry *entry;   /* [max_sequences] */
    size_t admitted, in_flight;
    bool closed;            /* the source said so: no more admissions */
    int64_t deadline;       /* a result is due by then (0: none awaited) */
    bool more;              /* the last result said more of its step follow */
    size_t *late, n_late;   /* fault late_finished: [max_sequences] numbers whose FINISHED waits */
} mk_head;

/* Every other rank hears that request `number` is over: its blocks go back to their pools. */
static void mk_head_tell_finished(mk_stage *st, size_t number) {
    char id[32];
    snprintf(id, sizeof id, "req-%zu", number);
    const int64_t deadline = mk_deadline_ms(st->timeout_ms, MK_STAGE_DEFAULT_TIMEOUT_MS);
    for (int k = 1; k < st->world; k++)
        (void)mk_ctl_send(&st->ctl[k], MK_CTL_FINISHED, id, strlen(id), deadline); /* a lost rank shows elsewhere */
    mk_clear_error();
}

/* The FINISHED messages the fault held back, 100 ms after a step's boundaries went out (or
 * at the end): the next request's prefill surely reaches the other ranks first. */
static void mk_head_tell_late(mk_head *h) {
    if (h->n_late) usleep(100000);
    for (size_t i = 0; i < h->n_late; i++) mk_head_tell_finished(h->st, h->late[i]);
    h->n_late = 0;
}

/* The rows of a request's next step: its last token, or its prompt's next chunk. */
static size_t mk_head_rows(const mk_stage *st, const mk_head_entry *e) {
    return e->n ? 1 : mk_prefill_rows(e->a.n_prompt - e->prompt_done, st->o.prefill_chunk);
}

/* One step of rank 0: the ready requests' rows (decode rows first, then prompts, within
 * the step's rows and requests) through this rank's range in one forward, then each
 * boundary on to rank 1. The others stay ready for the next step. */
static mk_status mk_head_step_ready(mk_head *h) {
    mk_stage *st = h->st;
    mk_head_entry *pick[MK_MAX_BATCH_SEQUENCES];
    size_t n = 0, rows = 0;
    for (int prompts = 0; prompts < 2; prompts++)
        for (size_t k = 0; k < st->max_sequences && n < st->max_batch; k++) {
            mk_head_entry *e = &h->entry[k];
            if (!e->used || !e->ready || !e->reserved || (e->n == 0) != (prompts == 1)) continue;
            const size_t r = mk_head_rows(st, e);
            if (n > 0 && rows + r > st->max_rows) continue; /* next step */
            pick[n++] = e;
            rows += r;
        }
    if (n == 0) return MK_OK;
    mk_forward_entry entries[MK_MAX_BATCH_SEQUENCES];
    char id[MK_MAX_BATCH_SEQUENCES][64];
    for (size_t k = 0; k < n; k++) {
        mk_head_entry *e = pick[k];
        snprintf(id[k], sizeof id[k], "req-%zu", e->number);
        mk_sequence *seq = NULL;
        MK_TRY(mk_slots_get(&st->slots, id[k], false, &seq)); /* its slot: made when its blocks were reserved */
        e->step_rows = mk_head_rows(st, e);
        entries[k] = (mk_forward_entry){.seq = seq,
                                        .token_ids = e->n == 0 ? e->prompt + e->prompt_done : &e->tokens[e->n - 1],
                                        .n_tokens = e->step_rows,
                                        .out = st->outs[k]};
        e->ready = false;
    }
    mk_stage_busy(st, true);
    mk_stage_fault_busy(st, n);
    const int64_t t0 = mk_wall_ns();
    const mk_status s = mk_range_forward_batch(st->range, entries, n);
    __atomic_fetch_add(&st->live_busy_ns, (uint64_t)(mk_wall_ns() - t0), __ATOMIC_RELAXED);
    __atomic_fetch_add(&st->live_forwards, 1, __ATOMIC_RELAXED);
    mk_stage_busy(st, false);
    if (s != MK_OK) return mk_stage_wrap(s, "rank 0: %s%s at step %llu", id[0], n > 1 ? " and others" : "",
                                         (unsigned long long)st->steps);
    MK_TRY(mk_stage_send_batch(st, st->outs, id, n));
    mk_head_tell_late(h);
    __atomic_store_n(&st->live_bytes, (uint64_t)mk_seam_bytes(st->to_next), __ATOMIC_RELAXED);
    __atomic_store_n(&st->live_steps, st->steps, __ATOMIC_RELAXED);
    return MK_OK;
}

/* The request's end: its slot and KV go (here and, told so, on every other rank), its report
 * goes out. */
static void mk_head_finish(mk_head *h, mk_head_entry *e, mk_status status, const char *error, bool stopped) {
    char id[64];
    snprintf(id, sizeof id, "req-%zu", e->number);
    mk_slots_release(&h->st->slots, id);
    const mk_fault *f = &h->st->fault;
    if (e->reserved) { /* it reached the other ranks: they hold a sequence for it */
        if (f->kind == MK_FAULT_LATE_FINISHED && h->st->steps >= f->step && h->late && h->n_late < h->st->max_sequences)
            h->late[h->n_late++] = e->number;
        else
            mk_head_tell_finished(h->st, e->number);
    }
    if (h->src->report) {
        const mk_stage_report rep = {(size_t)e->a.tag, status, error ? error : "", e->tokens, e->n, stopped};
        h->src->report(h->src->user, &rep);
    }
    free(e->tokens);
    free(e->prompt);
    *e = (mk_head_entry){0};
    h->in_flight--;
}

/* KV positions a request may fill on rank 0: its prompt and every token but the last. */
static size_t mk_head_positions(const mk_head_entry *e) { return e->a.n_prompt + e->cap - 1; }

/* The admission rule (as the in-process scheduler's): a request's first step waits until
 * rank 0's pool promises the blocks of its whole run, oldest request first; so a running
 * request never fails for want of a block. Its slot is made here. */
static mk_status mk_head_reserve(mk_head *h) {
    mk_stage *st = h->st;
    for (;;) {
        mk_head_entry *oldest = NULL;
        for (size_t k = 0; k < st->max_sequences; k++) {
            mk_head_entry *e = &h->entry[k];
            if (e->used && !e->reserved && (!oldest || e->number < oldest->number)) oldest = e;
        }
        if (!oldest) return MK_OK;
        char id[32];
        snprintf(id, sizeof id, "req-%zu", oldest->number);
        mk_sequence *seq = NULL;
        MK_TRY(mk_slots_get(&st->slots, id, true, &seq));
        if (mk_sequence_reserve(seq, mk_head_positions(oldest)) != MK_OK) {
            mk_slots_release(&st->slots, id); /* waits for a finishing request's blocks */
            mk_clear_error();
            return MK_OK;
        }
        oldest->reserved = true;
    }
}

/* A request the stage cannot take fails alone, before it reaches any rank. */
static bool mk_head_refuse(mk_head *h, const mk_stage_arrival *a) {
    const mk_stage *st = h->st;
    char why[200];
    mk_status s = MK_OK;
    const size_t limit = a->max_new_tokens ? a->max_new_tokens : st->o.max_new_tokens;
    const size_t positions = a->n_prompt + (limit < st->max_context ? limit : st->max_context) - 1;
    if (!a->prompt || a->n_prompt == 0) {
        s = MK_ERR_EMPTY_INPUT;
        snprintf(why, sizeof why, "request %llu has no prompt tokens", (unsigned long long)a->tag);
    } else if (a->n_prompt > st->max_rows || a->n_prompt >= st->max_context) {
        s = MK_ERR_CONTEXT_OVERFLOW;
        snprintf(why, sizeof why, "request %llu: a prompt of %zu tokens; this run takes at most %zu (context %zu)",
                 (unsigned long long)a->tag, a->n_prompt,
                 st->max_rows < st->max_context - 1 ? st->max_rows : st->max_context - 1, st->max_context);
    } else if ((s = mk_range_kv_fits(st->range, positions)) != MK_OK) {
        snprintf(why, sizeof why, "request %llu: rank 0: %s", (unsigned long long)a->tag, mk_last_error());
        mk_clear_error();
    }
    if (s == MK_OK) return false;
    if (h->src->report) {
        const mk_stage_report rep = {(size_t)a->tag, s, why, NULL, 0, false};
        h->src->report(h->src->user, &rep);
    }
    return true;
}

/* Admit from the source while there is room: each new request's prefill goes out now. */
static mk_status mk_head_admit(mk_head *h) {
    mk_stage *st = h->st;
    while (!h->closed && h->in_flight < st->max_sequences) {
        mk_stage_arrival a = {0};
        if (!h->src->take(h->src->user, &a)) {
            h->closed = h->src->closed && h->src->closed(h->src->user);
            break;
        }
        if (mk_head_refuse(h, &a)) continue;
        mk_head_entry *e = h->entry;
        while (e->used) e++; /* in_flight < max_sequences: one is free */
        const size_t limit = a.max_new_tokens ? a.max_new_tokens : st->o.max_new_tokens;
        /* every token but the last takes a KV position after the prompt's */
        const size_t room = st->max_context - a.n_prompt + 1;
        e->cap = limit < room ? limit : room;
        e->limit = limit;
        e->tokens = mk_alloc_array(e->cap, sizeof(int32_t), "stage: a request's tokens");
        e->prompt = mk_alloc_array(a.n_prompt, sizeof(int32_t), "stage: a request's prompt");
        if (!e->tokens || !e->prompt) {
            free(e->tokens);
            free(e->prompt);
            *e = (mk_head_entry){0};
            return MK_ERR_OUT_OF_MEMORY;
        }
        memcpy(e->prompt, a.prompt, a.n_prompt * sizeof(int32_t)); /* the source's: valid during take only */
        e->used = e->ready = true;
        e->number = h->admitted++;
        e->a = a;
        e->a.prompt = e->prompt;
        h->in_flight++;
    }
    return MK_OK;
}

/* A TailResult from the last rank: the token of one request's step. */
static mk_status mk_head_result(mk_head *h, const char *body, size_t len) {
    mk_stage *st = h->st;
    const int last = st->world - 1;
    mk_tail_result_info info;
    mk_status s = mk_tail_result_validate((const uint8_t *)body, len, &info);
    if (s != MK_OK) return mk_stage_wrap(s, "rank %d sent an invalid tail result", last);
    if (strcmp(info.runtime_recipe_digest, mk_range_recipe_digest(st->range)) != 0)
        return mk_fail(MK_ERR_RECIPE_DIGEST, "rank %d sent a result of recipe %.16s..., this run's is %.16s...: refused",
                       last, info.runtime_recipe_digest, mk_range_recipe_digest(st->range));
    const size_t number = mk_request_index(info.request_id);
    mk_head_entry *e = NULL;
    for (size_t k = 0; k < st->max_sequences && !e; k++)
        if (h->entry[k].used && h->entry[k].number == number) e = &h->entry[k];
    if (!e || e->ready) {
        /* A request no step of which is out (never admitted, over already, or its token for
         * this step came already): a lying entry upstream, not this run's fault. Dropped,
         * logged; every rank frees what it holds for that id; the run goes on. */
        if (st->o.log) {
            char line[256];
            snprintf(line, sizeof line, "dropped rank %d's result for '%.64s': %s", last, info.request_id,
                     e ? "no step of it is out (a second result, or one before its step)" : "not a request in flight");
            st->o.log(st->o.log_user, line);
        }
        if (!e) {
            const int64_t deadline = mk_deadline_ms(st->timeout_ms, MK_STAGE_DEFAULT_TIMEOUT_MS);
            for (int k = 1; k < st->world; k++)
                (void)mk_ctl_send(&st->ctl[k], MK_CTL_FINISHED, info.request_id, strlen(info.request_id), deadline);
        }
        mk_clear_error();
        return MK_OK;
    }
    h->deadline = 0; /* a result taken: the wait for the next starts again */
    const mk_hparams *hp = mk_model_hparams(st->model);
    if (info.kind != MK_TAIL_OUTPUT_TOKEN || info.token_id < 0 || (size_t)info.token_id >= hp->vocab)
        return mk_fail(MK_ERR_TAIL_RESULT, "rank %d sent no token id within the vocabulary for %s", last, info.request_id);
    const int32_t token = (int32_t)info.token_id;
    if (e->n == 0 && e->prompt_done + e->step_rows < e->a.n_prompt) {
        /* a prompt chunk before the last: its token is not the answer's first */
        e->prompt_done += e->step_rows;
        e->ready = true;
        return MK_OK;
    }
    if (e->n == e->cap) /* cannot happen: the step before would have overflowed the context */
        return mk_fail(MK_ERR_CONTEXT_OVERFLOW, "%s: more than %zu tokens", info.request_id, e->cap);
    e->tokens[e->n++] = token;
    bool stop = false;
    for (size_t k = 0; k < st->o.n_stop; k++) stop |= st->stop[k] == token;
    const bool cut = h->src->on_token && !h->src->on_token(h->src->user, e->a.tag, token);
    if (!stop && !cut && e->n == e->cap && e->cap < e->limit) {
        /* the context is full before the token limit: this request fails alone, its tokens kept */
        char why[400];
        snprintf(why, sizeof why, "%.64s: the context of %zu positions is full after %zu tokens (%zu asked for)",
                 info.request_id, st->max_context, e->n, e->limit);
        mk_head_finish(h, e, MK_ERR_CONTEXT_OVERFLOW, why, false);
        return MK_OK;
    }
    if (stop || cut || e->n == e->cap) {
        mk_head_finish(h, e, MK_OK, NULL, stop);
        return MK_OK; /* the loop admits into the free place */
    }
    e->ready = true; /* its token goes in with the next step */
    return MK_OK;
}

/* Rank k refused a request's entry of a batch ("status request-id message"): that request
 * fails alone with the status, its slot and blocks freed on every rank; the run goes on. */
static mk_status mk_head_refused(mk_head *h, int k, const char *body) {
    const mk_status status = mk_ctl_abort_status(body); /* the same "status message" form, checked */
    char why[MK_CTL_MAX_BODY + 1];
    snprintf(why, sizeof why, "%s", mk_last_error());
    mk_clear_error();
    if (status == MK_OK || status == MK_ERR_FRAME) /* no usable status: the rank's message is not one */
        return mk_fail(MK_ERR_FRAME, "rank %d sent a refusal without a status: %.200s", k, why);
    char id[64] = "";
    if (sscanf(why, "%63s", id) != 1) return mk_fail(MK_ERR_FRAME, "rank %d sent a refusal naming no request", k);
    const size_t number = mk_request_index(id);
    for (size_t i = 0; i < h->st->max_sequences; i++) {
        mk_head_entry *e = &h->entry[i];
        if (e->used && e->number == number) {
            mk_head_finish(h, e, status, why + strlen(id) + (why[strlen(id)] == ' '), false);
            return MK_OK;
        }
    }
    return MK_OK; /* not in flight (failed already): nothing more to end */
}

/* No result came in time: ask every rank whether it is alive, so the message names the
 * silent one rather than the last rank rank 0 happened to wait for. */
static mk_status mk_head_diagnose(mk_head *h) {
    mk_stage *st = h->st;
    const int quarter = st->timeout_ms / 4 > 250 ? st->timeout_ms / 4 : 250;
    const int64_t deadline = mk_deadline_ms(quarter, quarter);
    bool answered[MK_STAGE_MAX_WORLD] = {false};
    for (int k = 1; k < st->world; k++) (void)mk_ctl_send(&st->ctl[k], MK_CTL_PING, NULL, 0, deadline);
    for (;;) {
        int fds[MK_STAGE_MAX_WORLD], who[MK_STAGE_MAX_WORLD], n = 0, ready = -1;
        for (int k = 1; k < st->world; k++)
            if (!answered[k]) {
                fds[n] = st->ctl[k].fd;
                who[n++] = k;
            }
        if (n == 0) break;
        MK_TRY(mk_poll_in(fds, (size_t)n, deadline, &ready));
        if (ready < 0) {
            return mk_fail(MK_ERR_PEER_TIMEOUT,
                           "rank %d is silent: no result reached rank 0 within %d ms (step %llu, %zu requests in flight) "
                           "and rank %d did not answer within %d ms more",
                           who[0], st->timeout_ms, (unsigned long long)st->steps, h->in_flight, who[0], quarter);
        }
        const int k = who[ready];
        char peer[32], body[MK_CTL_MAX_BODY + 1];
        snprintf(peer, sizeof peer, "rank %d", k);
        mk_ctl_type type;
        size_t len;
        MK_TRY(mk_ctl_recv(&st->ctl[k], &type, body, &len, deadline, peer));
        if (type == MK_CTL_ABORT) return mk_ctl_abort_status(body);
        /* a busy rank's beat answers too; a late result is dropped: the run fails anyway */
        if (type == MK_CTL_PONG || type == MK_CTL_BUSY) answered[k] = true;
    }
    return mk_fail(MK_ERR_PEER_TIMEOUT,
                   "no result from rank %d within %d ms (step %llu, %zu requests in flight), though every rank answers",
                   st->world - 1, st->timeout_ms, (unsigned long long)st->steps, h->in_flight);
}

/* The next control message of rank k (it has one coming), acted on. */
static mk_status mk_head_read(mk_head *h, int k) {
    mk_stage *st = h->st;
    char peer[32], body[MK_CTL_MAX_BODY + 1];
    snprintf(peer, sizeof peer, "rank %d", k);
    mk_ctl_type type;
    size_t len;
    const mk_status s =
        mk_ctl_recv(&st->ctl[k], &type, body, &len, mk_deadline_ms(st->timeout_ms, MK_STAGE_DEFAULT_TIMEOUT_MS), peer);
    if (s != MK_OK) return mk_stage_wrap(s, "rank 0 at step %llu", (unsigned long long)st->steps);
    if (type == MK_CTL_ABORT) return mk_ctl_abort_status(body);
    /* a word from a rank (a beat, a result taken, a refusal): the wait for a result starts
     * again; a result dropped (mk_head_result) does not restart it */
    if (type != MK_CTL_RESULT && type != MK_CTL_RESULT_MORE) h->deadline = 0;
    if (type == MK_CTL_BUSY) {
        /* rank k is computing: the wait starts again, and the ranks waiting for its output
         * hear it from rank 0 (their deadline watches rank 0) */
        const int64_t deadline = mk_deadline_ms(st->timeout_ms, MK_STAGE_DEFAULT_TIMEOUT_MS);
        for (int j = 1; j < st->world; j++)
            if (j != k) (void)mk_ctl_send(&st->ctl[j], MK_CTL_BUSY, NULL, 0, deadline);
        mk_clear_error();
        return MK_OK;
    }
    if ((type == MK_CTL_RESULT || type == MK_CTL_RESULT_MORE) && k == st->world - 1) {
        h->more = type == MK_CTL_RESULT_MORE;
        return mk_head_result(h, body, len);
    }
    if (type == MK_CTL_REFUSED) return mk_head_refused(h, k, body);
    return mk_fail(MK_ERR_FRAME, "rank %d sent control message type %d mid-run", k, (int)type);
}

/* Wait for the next control message on any rank's connection and act on it, or for the
 * source's wake-up. With requests in flight a result is due within the deadline; idle, rank
 * 0 waits as long as the source is quiet, beating so the others know it is alive. */
static mk_status mk_head_wait(mk_head *h) {
    mk_stage *st = h->st;
    int fds[MK_STAGE_MAX_WORLD + 1];
    for (int k = 1; k < st->world; k++) fds[k - 1] = st->ctl[k].fd;
    size_t n = (size_t)st->world - 1;
    const bool wake = !h->closed && h->src->wake_fd >= 0;
    if (wake) fds[n++] = h->src->wake_fd;
    int ready = -1;
    const bool idle = h->in_flight == 0;
    if (idle) h->deadline = 0;
    else if (!h->deadline) h->deadline = mk_deadline_ms(st->timeout_ms, MK_STAGE_DEFAULT_TIMEOUT_MS);
    /* idle without a descriptor to wait on: ask the source again in 20 ms */
    const int64_t until = idle ? (wake ? INT64_MAX : mk_deadline_ms(20, 20)) : h->deadline;
    if (idle) mk_stage_busy(st, true); /* beats while idle: the others' waits see rank 0 alive */
    const mk_status polled = mk_poll_in(fds, n, until, &ready);
    if (idle) mk_stage_busy(st, false);
    MK_TRY(polled);
    if (ready < 0) return idle ? MK_OK : mk_head_diagnose(h);
    if (wake && ready == (int)n - 1) return MK_OK; /* news from the source: the loop admits */
    return mk_head_read(h, ready + 1);
}

/* Every result already waiting on the last rank's connection, taken without waiting: they
 * join the next step together. */
static mk_status mk_head_take_waiting(mk_head *h) {
    const int last = h->st->world - 1;
    for (;;) {
        struct pollfd p = {.fd = h->st->ctl[last].fd, .events = POLLIN};
        if (h->in_flight == 0 || poll(&p, 1, 0) <= 0) return MK_OK;
        MK_TRY(mk_head_read(h, last));
    }
}

/* The source's cancels (mk_stage_source.cancelled), asked of every request with no step
 * running (ready: a request waiting for blocks is too): a prompt's chunks stop at the one
 * that ran, a waiting request never reserves. A request whose step is running is asked
 * once its result is in (until then a rank may still hold its rows). */
static void mk_head_drop_cancelled(mk_head *h) {
    if (!h->src->cancelled) return;
    for (size_t k = 0; k < h->st->max_sequences; k++) {
        mk_head_entry *e = &h->entry[k];
        if (e->used && e->ready && h->src->cancelled(h->src->user, e->a.tag))
            mk_head_finish(h, e, MK_OK, NULL, false);
    }
}

static mk_status mk_head_serve(mk_head *h) {
    for (;;) {
        mk_head_drop_cancelled(h); /* first: the places it frees are admitted into now */
        MK_TRY(mk_head_admit(h));
        MK_TRY(mk_head_reserve(h));
        MK_TRY(mk_head_step_ready(h));
        if (h->closed && h->in_flight == 0) return MK_OK;
        bool ready = false; /* requests left for the next step (over the step's rows): no wait; one that
                               waits for blocks waits for a result (a finishing request frees them) */
        for (size_t k = 0; k < h->st->max_sequences && !ready; k++)
            ready = h->entry[k].used && h->entry[k].ready && h->entry[k].reserved;
        if (ready) continue;
        /* a step's results come together: wait for the rest of one begun */
        do MK_TRY(mk_head_wait(h));
        while (h->more && h->in_flight > 0);
        MK_TRY(mk_head_take_waiting(h));
    }
}

/* nccl seams: the end-of-run marker down the chain, and the last rank's word that it came
 * through; only then may the communicators go (every rank has read the marker). */
static mk_status mk_head_end_marker(mk_stage *st) {
    MK_TRY(mk_stage_send(st, MK_STAGE_END_ID));
    const int last = st->world - 1;
    const int64_t deadline = mk_deadline_ms(st->timeout_ms, MK_STAGE_DEFAULT_TIMEOUT_MS);
    for (;;) {
        char peer[32], body[MK_CTL_MAX_BODY + 1];
        snprintf(peer, sizeof peer, "rank %d", last);
        mk_ctl_type type;
        size_t len;
        MK_TRY(mk_ctl_recv(&st->ctl[last], &type, body, &len, deadline, peer));
        if (type == MK_CTL_DONE) return MK_OK;
        if (type == MK_CTL_ABORT) return mk_ctl_abort_status(body);
    }
}

/* After the bye: every rank's seam figures (a rank that sends none leaves its unknown; the
 * run itself is done). */
static void mk_head_gather_counts(mk_stage *st, int64_t deadline) {
    st->peer_counts = calloc((size_t)st->world, sizeof *st->peer_counts);
    if (!st->peer_counts) return;
    mk_stage_counts *own = &st->peer_counts[0];
    *own = st->counts;
    own->known = true;
    own->send_seconds = mk_seam_seconds(st->to_next);
    for (int k = 1; k < st->world; k++) {
        char peer[32], body[MK_CTL_MAX_BODY + 1];
        snprintf(peer, sizeof peer, "rank %d", k);
        mk_ctl_type type = MK_CTL_PONG;
        size_t len = 0;
        while ((type == MK_CTL_PONG || type == MK_CTL_BUSY) &&
               mk_ctl_recv(&st->ctl[k], &type, body, &len, deadline, peer) == MK_OK)
            if (type == MK_CTL_STATS) {
                mk_stage_counts *c = &st->peer_counts[k];
                long long base = 0, sent_ns = 0, received_ns = 0;
                unsigned long long sent = 0, received = 0;
                c->known = sscanf(body, "%lld %llu %lld %llu %lld %zu %lg %lg", &base, &sent, &sent_ns, &received,
                                  &received_ns, &c->received_bytes, &c->send_seconds, &c->recv_seconds) == 8;
                c->base_ns = base, c->sent = sent, c->sent_ns = sent_ns, c->received = received;
                c->received_ns = received_ns;
            }
    }
    mk_clear_error(); /* a rank without figures fails mk_stage_hop_stats, not the finished run */
}

/* Rank 0's run over a source; `pre`: a failure found before it (the run fails at once). */
mk_status mk_stage_serve_head(mk_stage *st, const mk_stage_source *src, mk_status pre) {
    mk_head h = {.st = st, .src = src};
    mk_status s = pre;
    if (s == MK_OK && st->o.max_new_tokens == 0) s = mk_fail(MK_ERR_INVALID_ARGUMENT, "max_new_tokens is 0");
    if (s == MK_OK && (!(h.entry = calloc(st->max_sequences, sizeof *h.entry)) ||
                       !(h.late = calloc(st->max_sequences, sizeof *h.late))))
        s = mk_fail(MK_ERR_OUT_OF_MEMORY, "stage: out of memory for %zu requests in flight", st->max_sequences);
    if (s == MK_OK) s = mk_head_serve(&h);
    const int64_t deadline = mk_deadline_ms(st->timeout_ms, MK_STAGE_DEFAULT_TIMEOUT_MS);
    if (s == MK_OK && st->o.seam == MK_SEAM_NCCL && h.admitted > 0) s = mk_head_end_marker(st);
    if (s == MK_OK) {
        mk_head_tell_late(&h);
        for (int k = 1; k < st->world; k++) (void)mk_ctl_send(&st->ctl[k], MK_CTL_BYE, NULL, 0, deadline);
        mk_head_gather_counts(st, deadline);
    } else {
        /* Every request in flight fails with this status, and every rank is told which. */
        char message[512], body[MK_CTL_MAX_BODY];
        snprintf(message, sizeof message, "%s", mk_last_error());
        int n = snprintf(body, sizeof body, "%d %s\n", (int)s, message);
        for (size_t k = 0; h.entry && k < st->max_sequences && n > 0 && (size_t)n < sizeof body - 32; k++)
            if (h.entry[k].used) n += snprintf(body + n, sizeof body - (size_t)n, "%zu ", h.entry[k].number);
        for (int k = 1; k < st->world; k++)
            if (st->ctl[k].fd >= 0)
                (void)mk_ctl_send(&st->ctl[k], MK_CTL_ABORT, body, strlen(body), mk_deadline_ms(500, 500));
        for (size_t k = 0; h.entry && k < st->max_sequences; k++)
            if (h.entry[k].used) mk_head_finish(&h, &h.entry[k], s, message, false);
        mk_fail(s, "%s", message);
    }
    free(h.entry);
    free(h.late);
    return s;
}

/* mk_stage_serve's fixed list as a source: admitted in order, so a request's admission
 * number is its index (the other ranks' reports name it by that). */
typedef struct mk_list_source {
    const mk_stage_request *req;
    size_t n, next;
    mk_stage_report_fn report;
    void *user;
} mk_list_source;

static bool mk_list_take(void *user, mk_stage_arrival *a) {
    mk_list_source *l = user;
    if (l->next == l->n) return false;
    *a = (mk_stage_arrival){l->req[l->next].prompt, l->req[l->next].n_prompt, 0, l->next};
    l->next++;
    return true;
}

static bool mk_list_closed(void *user) { return ((mk_list_source *)user)->next == ((mk_list_source *)user)->n; }

static void mk_list_report(void *user, const mk_stage_report *r) {
    mk_list_source *l = user;
    if (l->report) l->report(l->user, r);
}

mk_status mk_stage_serve_list(mk_stage *st, const mk_stage_request *req, size_t n_req, mk_stage_report_fn report,
                              void *user) {
    mk_list_source l = {req, n_req, 0, report, user};
    const mk_stage_source src = {sizeof src, mk_list_take, NULL, mk_list_report, mk_list_closed, -1, &l, NULL};
    /* A list with an unusable request fails before any starts, as a whole. */
    mk_status pre = MK_OK;
    for (size_t i = 0; pre == MK_OK && i < n_req; i++)
        if (!req[i].prompt || req[i].n_prompt == 0) pre = mk_fail(MK_ERR_EMPTY_INPUT, "request %zu has no prompt tokens", i);
    const mk_status s = mk_stage_serve_head(st, &src, pre);
    if (s != MK_OK) {
        char message[512];
        snprintf(message, sizeof message, "%s", mk_last_error());
        for (size_t i = l.next; report && i < n_req; i++) {
            char why[600];
            snprintf(why, sizeof why, "never started: %s", message);
            const mk_stage_report rep = {i, s, why, NULL, 0, false};
            report(user, &rep);
        }
        mk_fail(s, "%s", message);
    }
    return s;
}
