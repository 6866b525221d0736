/* The placed pipeline's public face: build the stages (ranges on their devices, KV and
 * activation slots), admit sequences into free slots (continuous admission: a finished
 * sequence's slot goes to the next queued one), collect tokens and statuses. The worker
 * loop is worker.c, the seam hand-off link.c, the cut chooser split_auto.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cores.h"
#include "core/options.h"
#include "mk_error.h"
#include "core/mk_size.h"
#include "range/range.h"
#include "sched/sched.h"
#include "seam/seam.h"

#define MK_SCHED_DEFAULT_SEQUENCES 8

mk_sched_options mk_sched_options_default(void) {
    mk_sched_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.range = mk_range_options_default();
    o.max_sequences = MK_SCHED_DEFAULT_SEQUENCES;
    o.seam = 0; /* the placement rule (mk_sched_link_kind) */
    return o;
}

/* Fields past the caller's struct_size (an older header) keep their defaults. */
static mk_status mk_sched_read_options(const mk_sched_options *given, mk_sched_options *o) {
    *o = mk_sched_options_default();
    if (!given) return MK_OK;
    return mk_options_take(o, sizeof *o, MK_SCHED_OPTIONS_V1_SIZE, given, "mk_sched_options");
}

/* ============================================================ per-range cost == */

static mk_status mk_sched_shares(mk_sched *s, const mk_layer_span *spans) {
    const size_t n_layers = mk_model_hparams(s->model)->n_layers;
    double *cost = malloc(n_layers * sizeof *cost);
    if (!cost) return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory");
    double head = 0, tail = 0, total = 0;
    const mk_status st = mk_split_costs(s->model, cost, &head, &tail);
    if (st == MK_OK) {
        size_t layer = 0;
        for (size_t i = 0; i < s->n_workers; i++) {
            const size_t end = (size_t)spans[i].end;
            double c = (i == 0 ? head : 0) + (i + 1 == s->n_workers ? tail : 0);
            for (; layer <= end; layer++) c += cost[layer];
            s->workers[i].share = c;
            total += c;
        }
        for (size_t i = 0; i < s->n_workers; i++) s->workers[i].share /= total;
    }
    free(cost);
    return st;
}

/* ================================================================= create == */

/* Each slot's item: stage i's output boundary for every seam, the tail's logits. */
static mk_status mk_sched_items(mk_sched *s) {
    s->items = calloc(s->n_slots, sizeof *s->items);
    s->free_slots = calloc(s->n_slots, sizeof *s->free_slots);
    if (!s->items || !s->free_slots) return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory");
    for (size_t i = 0; i < s->n_slots; i++) {
        mk_sched_item *it = &s->items[i];
        it->slot = i;
        s->free_slots[s->n_free++] = s->n_slots - 1 - i; /* slot 0 is taken first */
        it->logits = malloc(s->vocab * sizeof(float));
        it->out = calloc(s->n_workers, sizeof *it->out);
        if (!it->logits || !it->out) return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory for a slot");
        for (size_t k = 0; k + 1 < s->n_workers; k++) MK_TRY(mk_boundary_create(s->workers[k].range, &it->out[k]));
    }
    s->stop_items[0].kind = MK_ITEM_STOP;
    return MK_OK;
}

/* The placement rule for the seam between ranges a and b: NCCL between cuda ranges on
 * distinct devices where the build has it, else a local device-to-device copy (a memcpy
 * on the cpu backend). An explicit choice is taken as given. */
static mk_status mk_sched_place_link(mk_sched *s, size_t i, mk_seam_kind asked) {
    mk_range *a = s->workers[i].range, *b = s->workers[i + 1].range;
    mk_sched_link *link = &s->links[i];
    if (asked) return mk_sched_link_init(link, asked, a, b, s->n_slots);
    const mk_backend_config *ca = &mk_range_backend(a)->config, *cb = &mk_range_backend(b)->config;
    if (ca->kind == MK_BACKEND_CUDA && cb->kind == MK_BACKEND_CUDA && ca->device != cb->device) {
        const mk_status st = mk_sched_link_init(link, MK_SEAM_NCCL, a, b, s->n_slots);
        if (st != MK_ERR_UNSUPPORTED) return st; /* joined, or a real failure */
        mk_sched_link_destroy(link);
    }
    return mk_sched_link_init(link, MK_SEAM_LOCAL, a, b, s->n_slots);
}

static mk_status mk_sched_build(mk_sched *s, const mk_sched_options *o, const mk_layer_span *spans) {
    s->workers = calloc(s->n_workers, sizeof *s->workers);
    s->links = calloc(s->n_workers > 1 ? s->n_workers - 1 : 1, sizeof *s->links);
    if (!s->workers || !s->links) return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory");
    size_t inbox_cap;
    if (!mk_size_add(s->n_slots, 1, &inbox_cap))
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: %zu sequences in flight overflow the inbox", s->n_slots);
    MK_TRY(mk_queue_init(&s->inbox0, inbox_cap));
    for (size_t i = 0; i < s->n_workers; i++) {
        mk_sched_worker *st = &s->workers[i];
        st->sched = s;
        st->index = i;
        st->inbox = i == 0 ? &s->inbox0 : &s->links[i - 1].q;
        st->in_link = i == 0 ? NULL : &s->links[i - 1];
        st->out_link = i + 1 < s->n_workers ? &s->links[i] : NULL;
        mk_range_options ro = o->range;
        ro.backend.device = o->devices ? o->devices[i] : (int)i;
        /* Every stage computes at once: the cores are shared out, not each taken whole. */
        if (ro.backend.kind == MK_BACKEND_CPU && ro.backend.threads == 0) {
            const size_t share = mk_core_count() / s->n_workers;
            ro.backend.threads = share ? share : 1;
        }
        /* Stage threads post work on each other's streams (a peer copy records an event on
         * the neighbour's stream and makes it wait) while a stage may be recording its
         * decode step: the cuda backend makes the copy wait for the recording to end (its
         * stream lock), so every stage records and replays its steps. */
        /* A step of max_batch_sequences decode rows fits the activations: as many rows as
         * sequences (a context shorter than that bounds both) */
        const size_t ctx = ro.max_context ? ro.max_context : 0;
        if (ctx && ro.max_batch_sequences > ctx) ro.max_batch_sequences = ctx;
        if (ro.max_batch_sequences > 1 && ro.max_batch_tokens && ro.max_batch_tokens < ro.max_batch_sequences)
            ro.max_batch_tokens = ro.max_batch_sequences;
        MK_TRY(mk_range_create(s->model, spans[i].start, spans[i].end, &ro, &st->range));
        st->max_batch = mk_range_max_seqs(st->range);
        st->seqs = calloc(s->n_slots, sizeof *st->seqs);
        if (!st->seqs) return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory");
        for (size_t k = 0; k < s->n_slots; k++) MK_TRY(mk_sequence_open(st->range, &st->seqs[k]));
        if (i > 0) {
            st->ins = calloc(st->max_batch, sizeof *st->ins);
            if (!st->ins) return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory");
            for (size_t k = 0; k < st->max_batch; k++) MK_TRY(mk_boundary_create(st->range, &st->ins[k]));
            st->in = st->ins[0];
        }
        if (o->timeline_capacity) {
            st->timeline = calloc(o->timeline_capacity, sizeof *st->timeline);
            if (!st->timeline) return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory for the timeline");
            st->timeline_cap = o->timeline_capacity;
        }
    }
    for (size_t i = 0; i + 1 < s->n_workers; i++) MK_TRY(mk_sched_place_link(s, i, o->seam));
    MK_TRY(mk_sched_shares(s, spans));
    MK_TRY(mk_sched_items(s));
    for (size_t i = 0; i < s->n_workers; i++) {
        if (pthread_create(&s->workers[i].thread, NULL, mk_worker_main, &s->workers[i]) != 0)
            return mk_fail(MK_ERR_INTERNAL, "pipeline: cannot start worker %zu", i);
        s->workers[i].started = true;
    }
    return MK_OK;
}

mk_status mk_sched_create(const mk_model *model, const mk_sched_options *options, mk_sched **out) {
    mk_clear_error();
    if (!model || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sched_create: NULL argument");
    *out = NULL;
    mk_sched_options o;
    MK_TRY(mk_sched_read_options(options, &o));
    const size_t n_layers = mk_model_hparams(model)->n_layers;
    size_t n_workers = o.split_auto ? (o.n_workers ? o.n_workers : o.n_devices ? o.n_devices : 1) : o.n_cuts + 1;
    if (n_workers == 0 || n_workers > n_layers)
        return mk_fail(MK_ERR_INVALID_RANGE,
                       "a pipeline of %zu workers over %zu layers: each worker's range needs a layer",
                       n_workers, n_layers);
    if (o.n_devices && o.n_devices != n_workers)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "%zu devices for %zu workers: give one device per worker", o.n_devices,
                       n_workers);
    if (o.n_devices && !o.devices) return mk_fail(MK_ERR_INVALID_ARGUMENT, "n_devices set but devices is NULL");
    if (o.max_sequences == 0) return mk_fail(MK_ERR_INVALID_ARGUMENT, "max_sequences must be at least 1");
    if (!o.split_auto && o.n_cuts && !o.cuts) return mk_fail(MK_ERR_INVALID_ARGUMENT, "n_cuts set but cuts is NULL");
    int64_t *cuts = calloc(n_workers, sizeof *cuts);
    if (!cuts) return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory");
    mk_layer_span *spans = calloc(n_workers, sizeof *spans); /* [n_workers] */
    if (!spans) {
        free(cuts);
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory");
    }
    mk_status st = o.split_auto ? mk_split_auto(model, n_workers, cuts, NULL) : MK_OK;
    if (!o.split_auto && o.n_cuts) memcpy(cuts, o.cuts, o.n_cuts * sizeof *cuts);
    if (st == MK_OK) st = mk_cuts_to_spans(cuts, n_workers - 1, n_layers, n_layers, spans);
    free(cuts);
    mk_sched *s = st == MK_OK ? calloc(1, sizeof *s) : NULL;
    if (st == MK_OK && !s) st = mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory");
    if (st == MK_OK) {
        s->model = model;
        s->n_workers = n_workers;
        s->n_slots = o.max_sequences;
        s->prefill_chunk = o.prefill_chunk;
        s->vocab = mk_model_hparams(model)->vocab;
        s->on_token = o.on_token;
        s->user = o.user;
        pthread_mutex_init(&s->mu, NULL);
        pthread_cond_init(&s->done_cv, NULL);
        st = mk_sched_build(s, &o, spans);
        if (st != MK_OK) mk_sched_free(s);
    }
    free(spans);
    if (st != MK_OK) return st;
    *out = s;
    return MK_OK;
}

/* ================================================================== free == */

static void mk_sched_request_free(mk_sched_request *r) {
    if (!r) return;
    free(r->prompt);
    free(r->stop_ids);
    free(r->tokens);
    free(r);
}

/* A released request nobody reads any more: its record freed and its id forgotten. Under s->mu. */
static void mk_sched_forget(mk_sched *s, mk_sched_request *r) {
    s->requests[r->id - 1] = NULL;
    mk_sched_request_free(r);
}

void mk_sched_free(mk_sched *s) {
    if (!s) return;
    /* Every worker receives the stop item; producers never wait, so all exit. */
    if (s->workers) {
        for (size_t i = 0; i < s->n_workers; i++) {
            if (!s->workers[i].started) continue;
            if (i == 0) (void)mk_queue_push(&s->inbox0, s->stop_items);
            else (void)mk_sched_link_send_control(&s->links[i - 1], s->stop_items);
        }
        for (size_t i = 0; i < s->n_workers; i++)
            if (s->workers[i].started) pthread_join(s->workers[i].thread, NULL);
        /* The seams and boundaries use their ranges' backends: they go first. */
        for (size_t i = 0; s->links && i + 1 < s->n_workers; i++) mk_sched_link_destroy(&s->links[i]);
        if (s->items)
            for (size_t i = 0; i < s->n_slots; i++) {
                mk_sched_item *it = &s->items[i];
                for (size_t k = 0; it->out && k + 1 < s->n_workers; k++) mk_boundary_free(it->out[k]);
                free(it->out);
                free(it->logits);
            }
        for (size_t i = 0; i < s->n_workers; i++) {
            mk_sched_worker *st = &s->workers[i];
            for (size_t k = 0; st->ins && k < st->max_batch; k++) mk_boundary_free(st->ins[k]);
            free(st->ins);
            if (st->seqs)
                for (size_t k = 0; k < s->n_slots; k++) mk_sequence_close(st->seqs[k]);
            free(st->seqs);
            free(st->timeline);
            mk_range_free(st->range);
        }
    }
    mk_queue_destroy(&s->inbox0);
    for (size_t i = 0; i < s->n_requests; i++) mk_sched_request_free(s->requests[i]);
    free(s->requests);
    free(s->items);
    free(s->free_slots);
    free(s->links);
    free(s->workers);
    pthread_cond_destroy(&s->done_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

size_t mk_sched_worker_count(const mk_sched *s) { return s ? s->n_workers : 0; }
const mk_range *mk_sched_worker_range(const mk_sched *s, size_t i) {
    return s && i < s->n_workers ? s->workers[i].range : NULL;
}
double mk_sched_worker_share(const mk_sched *s, size_t i) {
    return s && i < s->n_workers ? s->workers[i].share : 0.0;
}

mk_seam_kind mk_sched_seam_kind(const mk_sched *s, size_t i) {
    return s && i + 1 < s->n_workers ? s->links[i].kind : (mk_seam_kind)0;
}

size_t mk_sched_seam_bytes(const mk_sched *s, size_t i) {
    return s && i + 1 < s->n_workers ? mk_sched_link_bytes(&s->links[i]) : 0;
}

/* ============================================================= admission == */

/* The prompt rows of the step after `done` of them went through. */
static size_t mk_sched_chunk(const mk_sched *s, const mk_sched_request *req, size_t done) {
    return mk_prefill_rows(req->n_prompt - done, s->prefill_chunk);
}

/* Point a slot's item at the first step of `req` (called under s->mu). */
static void mk_sched_start(const mk_sched *s, mk_sched_item *item, mk_sched_request *req) {
    item->kind = MK_ITEM_PREFILL;
    item->req = req;
    item->prompt_done = 0;
    item->tokens = req->prompt;
    item->n_tokens = mk_sched_chunk(s, req, 0);
    req->state = MK_SEQ_RUNNING;
}

/* KV positions a request may fill: its prompt and every token but the last (saturating:
 * max_new may be "as many as the context holds"; the reservation caps it at the context). */
static size_t mk_sched_positions(size_t n_prompt, size_t max_new) {
    size_t positions;
    return mk_size_add(n_prompt, max_new - 1, &positions) ? positions : SIZE_MAX;
}

/* The admission rule: a request enters a slot only with every stage's KV blocks for its
 * whole run promised (mk_sequence_reserve), so a running sequence never fails for want of a
 * block. A free slot's sequences are empty (new, or reset when their request retired) and
 * touched by no worker. Under s->mu. false, nothing held: the pools cannot promise that much
 * now. */
static bool mk_sched_reserve(mk_sched *s, size_t slot, const mk_sched_request *r) {
    for (size_t i = 0; i < s->n_workers; i++) {
        mk_sequence *seq = s->workers[i].seqs[slot];
        if (mk_sequence_reserve(seq, mk_sched_positions(r->n_prompt, r->max_new)) != MK_OK) {
            for (size_t j = 0; j <= i; j++) (void)mk_sequence_reset(s->workers[j].seqs[slot]);
            mk_clear_error();
            return false;
        }
    }
    return true;
}

/* Queued requests into free slots, first come first served (the head waits for blocks and
 * the ones behind it wait too: no request is passed over for ever), at most `cap`. The items
 * to push once s->mu is released go to admitted[]. Under s->mu. */
static size_t mk_sched_admit(mk_sched *s, mk_sched_item **admitted, size_t cap) {
    size_t n = 0;
    while (n < cap && s->n_free && s->pending_head &&
           mk_sched_reserve(s, s->free_slots[s->n_free - 1], s->pending_head)) {
        mk_sched_request *r = s->pending_head;
        s->pending_head = r->next_pending;
        if (!s->pending_head) s->pending_tail = NULL;
        mk_sched_item *item = &s->items[s->free_slots[--s->n_free]];
        mk_sched_start(s, item, r);
        admitted[n++] = item;
    }
    return n;
}

/* Admit whoever can enter now, release s->mu (held on entry), then hand the admitted items
 * to the head stage outside the lock (its inbox is never full: one item per slot). */
static void mk_sched_admit_unlock(mk_sched *s) {
    enum { MK_ADMIT_BATCH = 8 };
    mk_sched_item *admitted[MK_ADMIT_BATCH];
    size_t n = mk_sched_admit(s, admitted, MK_ADMIT_BATCH);
    pthread_mutex_unlock(&s->mu);
    while (n) {
        for (size_t i = 0; i < n; i++) (void)mk_queue_push(&s->inbox0, admitted[i]);
        if (n < MK_ADMIT_BATCH) break;
        pthread_mutex_lock(&s->mu);
        n = mk_sched_admit(s, admitted, MK_ADMIT_BATCH);
        pthread_mutex_unlock(&s->mu);
    }
}

/* A request no pool could ever hold (more blocks than a stage's pool has): refused at once. */
static mk_status mk_sched_fits_pools(const mk_sched *s, size_t positions) {
    for (size_t i = 0; i < s->n_workers; i++) {
        const mk_status f = mk_range_kv_fits(s->workers[i].range, positions);
        if (f != MK_OK) {
            char why[300];
            snprintf(why, sizeof why, "%s", mk_last_error());
            return mk_fail(f, "stage %zu: %s", i, why);
        }
    }
    return MK_OK;
}

mk_status mk_sched_submit(mk_sched *s, const int32_t *prompt, size_t n_prompt, size_t max_new, const int32_t *stop_ids,
                          size_t n_stop, uint64_t *seq_id) {
    mk_clear_error();
    if (!s || !prompt || !seq_id || (n_stop && !stop_ids))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sched_submit: NULL argument");
    if (n_prompt == 0) return mk_fail(MK_ERR_EMPTY_INPUT, "a sequence needs at least one prompt token");
    if (max_new == 0) return mk_fail(MK_ERR_INVALID_ARGUMENT, "a sequence must be allowed at least one token");
    /* here, not at the step: a bad id found by the batched forward fails every sequence in it */
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || (size_t)prompt[i] >= s->vocab)
            return mk_fail(MK_ERR_TOKEN_OUT_OF_RANGE, "prompt token %zu is id %d, outside the vocabulary (%zu)", i,
                           prompt[i], s->vocab);
    const mk_range *head = s->workers[0].range;
    if (n_prompt > mk_range_max_rows(head))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "prompt of %zu tokens exceeds the pipeline's max_batch_tokens %zu",
                       n_prompt, mk_range_max_rows(head));
    MK_TRY(mk_sched_fits_pools(s, mk_sched_positions(n_prompt, max_new)));
    mk_sched_request *r = calloc(1, sizeof *r);
    if (!r) return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory");
    /* At most max_context tokens come out of a sequence (each but the last takes a KV
     * position), whatever max_new asks: the buffer is sized by the smaller. */
    const size_t n_max = max_new < mk_range_max_context(head) ? max_new : mk_range_max_context(head);
    r->prompt = mk_alloc_array(n_prompt, sizeof *r->prompt, "pipeline: a prompt");
    r->stop_ids = r->prompt ? mk_alloc_array(n_stop, sizeof *r->stop_ids, "pipeline: stop ids") : NULL;
    r->tokens = r->stop_ids ? mk_alloc_array(n_max, sizeof *r->tokens, "pipeline: a sequence's tokens") : NULL;
    if (!r->tokens) {
        free(r->prompt);
        free(r->stop_ids);
        free(r);
        return MK_ERR_OUT_OF_MEMORY;
    }
    memcpy(r->prompt, prompt, n_prompt * sizeof *prompt);
    if (n_stop) memcpy(r->stop_ids, stop_ids, n_stop * sizeof *stop_ids);
    r->n_prompt = n_prompt;
    r->n_stop = n_stop;
    r->max_new = max_new;
    r->state = MK_SEQ_QUEUED;

    pthread_mutex_lock(&s->mu);
    if (mk_grow_array(&s->requests, &s->cap_requests, s->n_requests + 1, sizeof *s->requests, 64,
                      "pipeline request table") != MK_OK) {
        pthread_mutex_unlock(&s->mu);
        free(r->prompt);
        free(r->stop_ids);
        free(r->tokens);
        free(r);
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory for the request table");
    }
    s->requests[s->n_requests++] = r;
    r->id = s->n_requests;
    s->n_unfinished++;
    if (s->pending_tail) s->pending_tail->next_pending = r;
    else s->pending_head = r;
    s->pending_tail = r;
    *seq_id = r->id;
    mk_sched_admit_unlock(s);
    return MK_OK;
}

void mk_sched_retire(mk_sched *s, mk_sched_item *item, mk_seq_state state, mk_status status, const char *error) {
    pthread_mutex_lock(&s->mu);
    mk_sched_request *r = item->req;
    if (error) {
        strncpy(r->error, error, sizeof r->error - 1);
        r->error[sizeof r->error - 1] = '\0';
    }
    r->status = status;
    r->state = state;
    s->n_unfinished--;
    if (r->released) mk_sched_forget(s, r); /* nobody will read it: no item points at it after this */
    item->req = NULL;
    /* its blocks back to every stage's pool, then whoever waits for a slot or for blocks */
    for (size_t i = 0; i < s->n_workers; i++) (void)mk_sequence_reset(s->workers[i].seqs[item->slot]);
    s->free_slots[s->n_free++] = item->slot;
    pthread_cond_broadcast(&s->done_cv);
    mk_sched_admit_unlock(s);
}

void mk_sched_emit(mk_sched *s, mk_sched_item *item) {
    mk_sched_request *r = item->req;
    if (item->kind == MK_ITEM_PREFILL && item->prompt_done + item->n_tokens < r->n_prompt) {
        /* A prompt chunk before the last: its token is not the answer's first. The next
         * chunk goes behind the steps already queued (decode rows of the others first). */
        pthread_mutex_lock(&s->mu);
        const bool cancelled = r->cancelled;
        pthread_mutex_unlock(&s->mu);
        if (cancelled) {
            mk_sched_retire(s, item, MK_SEQ_DONE, MK_OK, NULL);
            return;
        }
        item->prompt_done += item->n_tokens;
        item->tokens = r->prompt + item->prompt_done;
        item->n_tokens = mk_sched_chunk(s, r, item->prompt_done);
        (void)mk_queue_push(&s->inbox0, item);
        return;
    }
    const int32_t token = item->token;
    bool stop = false;
    for (size_t i = 0; i < r->n_stop; i++) stop |= r->stop_ids[i] == token;
    pthread_mutex_lock(&s->mu);
    const size_t index = r->n_tokens;
    r->tokens[r->n_tokens++] = token;
    const bool limit = r->n_tokens == r->max_new || r->cancelled;
    r->stopped = stop;
    pthread_mutex_unlock(&s->mu);
    /* Before the sequence can be seen finished: a waiter has every callback behind it. */
    if (s->on_token) s->on_token(s->user, r->id, index, token, item->logits, s->vocab);
    if (stop || limit) {
        mk_sched_retire(s, item, MK_SEQ_DONE, MK_OK, NULL);
        return;
    }
    item->kind = MK_ITEM_DECODE;
    item->next_token = token;
    item->tokens = &item->next_token;
    item->n_tokens = 1;
    (void)mk_queue_push(&s->inbox0, item);
}

/* ============================================================== collect == */

/* The refusal of an id that names no live sequence (never submitted, or released). */
static mk_status mk_sched_unknown(uint64_t id) {
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "no sequence %llu in this pipeline", (unsigned long long)id);
}

static mk_sched_request *mk_sched_find(mk_sched *s, uint64_t id) {
    return id >= 1 && id <= s->n_requests ? s->requests[id - 1] : NULL;
}

mk_status mk_sched_poll(mk_sched *s, uint64_t id, mk_seq_info *info, int32_t *tokens, size_t cap) {
    mk_clear_error();
    if (!s || !info) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sched_poll: NULL argument");
    pthread_mutex_lock(&s->mu);
    mk_sched_request *r = mk_sched_find(s, id);
    if (r) {
        info->state = r->state;
        info->status = r->status;
        info->n_tokens = r->n_tokens;
        info->stopped = r->state == MK_SEQ_DONE && r->stopped;
        info->error = r->error;
        if (tokens) memcpy(tokens, r->tokens, (cap < r->n_tokens ? cap : r->n_tokens) * sizeof *tokens);
    }
    pthread_mutex_unlock(&s->mu);
    return r ? MK_OK : mk_sched_unknown(id);
}

mk_status mk_sched_wait(mk_sched *s, uint64_t id) {
    mk_clear_error();
    if (!s) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sched_wait: NULL pipeline");
    pthread_mutex_lock(&s->mu);
    mk_sched_request *r = mk_sched_find(s, id);
    while (r && r->state != MK_SEQ_DONE && r->state != MK_SEQ_FAILED) pthread_cond_wait(&s->done_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return r ? MK_OK : mk_sched_unknown(id);
}

mk_status mk_sched_cancel(mk_sched *s, uint64_t id) {
    mk_clear_error();
    if (!s) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sched_cancel: NULL pipeline");
    pthread_mutex_lock(&s->mu);
    mk_sched_request *r = mk_sched_find(s, id);
    if (r && r->state == MK_SEQ_QUEUED) { /* still waiting for a slot: unlink it */
        mk_sched_request **link = &s->pending_head, *prev = NULL;
        while (*link && *link != r) prev = *link, link = &(*link)->next_pending;
        if (*link) {
            *link = r->next_pending;
            if (s->pending_tail == r) s->pending_tail = prev;
        }
        r->cancelled = true;
        r->state = MK_SEQ_DONE;
        s->n_unfinished--;
        if (r->released) mk_sched_forget(s, r);
        pthread_cond_broadcast(&s->done_cv);
    } else if (r && r->state == MK_SEQ_RUNNING) {
        r->cancelled = true; /* the tail retires it with its next token */
    }
    mk_sched_admit_unlock(s); /* the one it was waiting behind may fit now */
    return r ? MK_OK : mk_sched_unknown(id);
}

mk_status mk_sched_release(mk_sched *s, uint64_t id) {
    mk_clear_error();
    if (!s) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sched_release: NULL pipeline");
    pthread_mutex_lock(&s->mu);
    mk_sched_request *r = mk_sched_find(s, id);
    if (r && (r->state == MK_SEQ_DONE || r->state == MK_SEQ_FAILED)) {
        mk_sched_forget(s, r);
    } else if (r) {
        r->released = true; /* freed when it retires */
    }
    pthread_mutex_unlock(&s->mu);
    return r ? MK_OK : mk_sched_unknown(id);
}

mk_status mk_sched_wait_all(mk_sched *s) {
    mk_clear_error();
    if (!s) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sched_wait_all: NULL pipeline");
    pthread_mutex_lock(&s->mu);
    while (s->n_unfinished) pthread_cond_wait(&s->done_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return MK_OK;
}

/* ============================================================ statistics == */

mk_status mk_sched_worker_stats(const mk_sched *s, size_t worker, mk_worker_stats *out) {
    mk_clear_error();
    if (!s || !out || worker >= s->n_workers)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sched_worker_stats: no worker %zu", worker);
    *out = s->workers[worker].stats;
    return MK_OK;
}

mk_status mk_sched_reset_stats(mk_sched *s) {
    mk_clear_error();
    if (!s) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sched_reset_stats: NULL pipeline");
    pthread_mutex_lock(&s->mu);
    const bool idle = s->n_unfinished == 0;
    pthread_mutex_unlock(&s->mu);
    if (!idle) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sched_reset_stats: sequences are still in flight");
    for (size_t i = 0; i < s->n_workers; i++) {
        memset(&s->workers[i].stats, 0, sizeof s->workers[i].stats);
        s->workers[i].timeline_len = 0;
        s->workers[i].attempts = 0;
    }
    return MK_OK;
}

mk_status mk_sched_inject_fault(mk_sched *s, size_t worker, size_t step, bool dies) {
    if (!s || worker >= s->n_workers) return mk_fail(MK_ERR_INVALID_ARGUMENT, "inject fault: no worker %zu", worker);
    pthread_mutex_lock(&s->mu); /* the worker reads these after taking an item: ordered by the queue */
    s->workers[worker].fault_armed = true;
    s->workers[worker].fault_step = step;
    s->workers[worker].fault_dies = dies;
    pthread_mutex_unlock(&s->mu);
    return MK_OK;
}

mk_status mk_sched_inject_seam_cut(mk_sched *s, size_t seam, size_t after) {
    if (!s || seam + 1 >= s->n_workers) return mk_fail(MK_ERR_INVALID_ARGUMENT, "inject seam cut: no seam %zu", seam);
    /* Read by the receiving stage's worker after it takes an item: ordered by the queue. */
    mk_sched_link *link = &s->links[seam];
    pthread_mutex_lock(&link->q.mu);
    link->cut_after = after;
    link->cut_armed = true;
    pthread_mutex_unlock(&link->q.mu);
    return MK_OK;
}
