/* One stage of a placed pipeline: a worker thread that owns one range. It takes the next
 * micro-batch from its inbox, runs the range's forward for that sequence's slot into the
 * item's preallocated buffers, and hands the boundary to the next stage (or, as the tail,
 * reports the token). It waits only on its own inbox: no barrier across stages. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "protocol/boundary.h"
#include "mk_error.h"
#include "range/range.h"
#include "sched/sched.h"

static uint64_t mk_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t mk_thread_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static bool mk_worker_is_head(const mk_sched_worker *st) { return st->index == 0; }
static bool mk_worker_is_tail(const mk_sched_worker *st) { return st->index + 1 == st->sched->n_workers; }

/* The injected fault (tests): this step fails, and with `dies` every later one. */
static mk_status mk_worker_fault(mk_sched_worker *st) {
    if (st->dead) return mk_fail(MK_ERR_INTERNAL, "%s", st->dead_reason);
    const size_t step = st->attempts++;
    if (!st->fault_armed || step != st->fault_step) return MK_OK;
    snprintf(st->dead_reason, sizeof st->dead_reason, "worker %zu is down: injected failure at its step %zu",
             st->index, step);
    if (st->fault_dies) st->dead = true;
    return mk_fail(MK_ERR_INTERNAL, "worker %zu: injected failure at its step %zu", st->index, step);
}

/* A failed step fails the sequence it belongs to, with the stage and its range named and
 * why (the thread's error, or `why` where the caller kept it: retiring one item clears it). */
static void mk_worker_fail_item_why(mk_sched_worker *st, mk_sched_item *item, mk_status status, const char *why) {
    char error[256];
    snprintf(error, sizeof error, "worker %zu (layers %lld-%lld): %.190s", st->index,
             (long long)mk_range_start(st->range), (long long)mk_range_end(st->range), why);
    mk_sched_retire(st->sched, item, MK_SEQ_FAILED, status, error);
}

static void mk_worker_fail_item(mk_sched_worker *st, mk_sched_item *item, mk_status status) {
    char why[256];
    snprintf(why, sizeof why, "%s", mk_last_error());
    mk_worker_fail_item_why(st, item, status, why);
}

bool mk_sched_item_fits(const mk_sched_item *item, void *arg) {
    mk_batch_room *room = arg;
    if (item->kind == MK_ITEM_STOP || room->rows + item->n_tokens > room->max_rows) return false;
    room->rows += item->n_tokens;
    return true;
}

/* Item k's entry in a step: its slot's sequence, its input (token ids at the head, else the
 * boundary received into ins[k]) and its outputs. */
static mk_forward_entry mk_worker_entry(const mk_sched_worker *st, mk_sched_item *item, size_t k) {
    const bool head = mk_worker_is_head(st), tail = mk_worker_is_tail(st);
    return (mk_forward_entry){.seq = st->seqs[item->slot],
                              .token_ids = head ? item->tokens : NULL,
                              .n_tokens = head ? item->n_tokens : 0,
                              .in = head ? NULL : st->ins[k],
                              .out = tail ? NULL : item->out[st->index],
                              .logits = tail ? item->logits : NULL,
                              .token = tail ? &item->token : NULL};
}

/* One step over one or several items (continuous batching): one forward, each item with
 * its own sequence slot, input boundary (ins[k]) and outputs; a failure fails every item of
 * the step. One item is exactly the forward of one sequence. */
static mk_status mk_worker_step(mk_sched_worker *st, mk_sched_item **items, size_t n) {
    MK_TRY(mk_worker_fault(st));
    mk_forward_entry entries[MK_MAX_BATCH_SEQUENCES];
    for (size_t k = 0; k < n; k++) entries[k] = mk_worker_entry(st, items[k], k);
    const uint64_t t0 = mk_now_ns(), c0 = mk_thread_cpu_ns();
    const mk_status s = mk_range_forward_batch(st->range, entries, n);
    const uint64_t t1 = mk_now_ns(), c1 = mk_thread_cpu_ns();
    mk_worker_stats *stats = &st->stats;
    if (stats->steps == 0) stats->first_ns = t0;
    stats->steps++;
    stats->busy_ns += t1 - t0;
    stats->cpu_ns += c1 - c0;
    stats->last_ns = t1;
    for (size_t k = 0; k < n && st->timeline_len < st->timeline_cap; k++)
        st->timeline[st->timeline_len++] = (mk_timeline_record){
            .seq_id = items[k]->req->id, .start_ns = t0, .end_ns = t1, .rows = (uint32_t)items[k]->n_tokens};
    return s;
}

/* Before a step: a received boundary taken off the seam (into `in`). A new sequence's slot
 * was reset, with its KV blocks promised, when it was admitted (pipeline_sched.c). */
static mk_status mk_worker_prepare(mk_sched_worker *st, mk_sched_item *item, mk_boundary *in) {
    return mk_worker_is_head(st) ? MK_OK : mk_sched_link_recv(st->in_link, item, st->seqs[item->slot], in);
}

/* After a step: the boundary on to the next stage, or the token reported. */
static void mk_worker_finish(mk_sched_worker *st, mk_sched_item *item, mk_status s) {
    if (s == MK_OK && !mk_worker_is_tail(st)) s = mk_sched_link_send(st->out_link, item, item->out[st->index]);
    if (s != MK_OK) mk_worker_fail_item(st, item, s);
    else if (mk_worker_is_tail(st)) mk_sched_emit(st->sched, item);
}

void *mk_worker_main(void *arg) {
    mk_sched_worker *st = arg;
    const bool head = mk_worker_is_head(st);
    mk_queue *q = head ? st->inbox : &st->in_link->q;
    for (;;) {
        mk_sched_item *item = mk_queue_pop(q);
        if (item->kind == MK_ITEM_STOP) break;
        mk_status s = mk_worker_prepare(st, item, st->in);
        if (st->max_batch <= 1) { /* one item per step: the forward of one sequence */
            if (s == MK_OK) s = mk_worker_step(st, &item, 1);
            mk_worker_finish(st, item, s);
            continue;
        }
        /* Continuous batching: every item already waiting joins this step while it fits;
         * an item whose receive failed, or whose entry the forward would refuse (a prompt
         * past the context, an id outside the vocabulary), fails alone. */
        mk_sched_item *items[MK_MAX_BATCH_SEQUENCES];
        size_t n = 0;
        mk_batch_room room = {item->n_tokens, mk_range_max_rows(st->range)};
        for (;;) {
            if (s == MK_OK) {
                const mk_forward_entry e = mk_worker_entry(st, item, n);
                s = mk_range_check_batch_entry(st->range, &e, n);
            }
            if (s != MK_OK) {
                room.rows -= item->n_tokens; /* its rows are not in the step: another's may be */
                mk_worker_fail_item(st, item, s);
            } else {
                items[n++] = item;
            }
            if (n == st->max_batch || !(item = mk_queue_pop_if(q, mk_sched_item_fits, &room))) break;
            s = mk_worker_prepare(st, item, head ? NULL : st->ins[n]); /* item n's boundary: ins[n] */
        }
        if (n == 0) continue;
        s = mk_worker_step(st, items, n);
        if (s != MK_OK) { /* the step itself failed: every item of it, each told why */
            char why[256];
            snprintf(why, sizeof why, "%s", mk_last_error());
            for (size_t k = 0; k < n; k++) mk_worker_fail_item_why(st, items[k], s, why);
            continue;
        }
        for (size_t k = 0; k < n; k++) mk_worker_finish(st, items[k], s);
    }
    return NULL;
}
