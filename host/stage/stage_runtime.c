/* The stage runtime: one range per process (include/meshkern.h, "stage processes").
 *
 * Rank 0 (the head) admits up to max_sequences requests, runs their prefills and decode
 * steps and sends each boundary to rank 1; the middle ranks receive, forward and send on;
 * the last rank samples greedily and returns a TailResult to rank 0 over its control
 * connection, and rank 0 feeds the token back in. Continuous batching: each rank's step
 * runs every request ready for it in one forward (rank 0: new prompts and returned tokens;
 * the others: the boundaries waiting on the seam), and a step's boundaries go to the next
 * rank as one batch message. Every boundary names its request; every rank keeps one
 * sequence per live request (slots.c).
 *
 * Failure: every wait polls the data it expects and the control connection together,
 * with the deadline timeout_ms. A closed connection is MK_ERR_PEER_LOST, a silent peer
 * MK_ERR_PEER_TIMEOUT, a refused boundary the contract's status, each naming the rank and
 * the step. A rank that fails tells rank 0 (ABORT); rank 0 fails every request in flight,
 * reports each one, and sends ABORT (status, message, the requests in flight) to every
 * rank, which report those requests too and stop. A dead rank 0 is seen by all as a
 * closed control connection.
 *
 * This file: the options, the join (rendezvous, range and seams), the beat thread and the
 * entry points; stage_head.c is rank 0, stage_member.c the other ranks, stage_send.c what
 * both use (request ids, polling, injected faults, sends). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mk_error.h"
#include "core/mk_size.h"
#include "core/options.h"
#include "model/model.h"
#include "stage/stage.h"

mk_stage_options mk_stage_options_default(void) {
    mk_stage_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.range = mk_range_options_default();
    o.world = 2;
    o.seam = MK_SEAM_TCP;
    o.timeout_ms = MK_STAGE_DEFAULT_TIMEOUT_MS;
    o.max_sequences = 8;
    o.max_new_tokens = 16;
    return o;
}

void mk_stage_nccl_ids_free(mk_stage_nccl_ids *ids) { free(ids); }

int mk_stage_rank(const mk_stage *st) {
    return st ? st->rank : -1;
}

const mk_range *mk_stage_range(const mk_stage *st) {
    return st ? st->range : NULL;
}

/* The wall clock, which every rank of a node shares: a boundary's hop time is its receipt
 * on one rank less its send on another. */
int64_t mk_wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* =============================================================== beats == */

static void *mk_beat_main(void *arg) {
    mk_stage *st = arg;
    pthread_mutex_lock(&st->beat_mu);
    while (!st->beat_stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        const long ns = until.tv_nsec + (long)(st->beat_ms % 1000) * 1000000L;
        until.tv_sec += st->beat_ms / 1000 + ns / 1000000000L;
        until.tv_nsec = ns % 1000000000L;
        (void)pthread_cond_timedwait(&st->beat_cv, &st->beat_mu, &until);
        if (st->beat_stop || !st->busy) continue;
        const int64_t deadline = mk_deadline_ms(st->beat_ms, st->beat_ms);
        for (int k = st->rank == 0 ? 1 : 0; k < (st->rank == 0 ? st->world : 1); k++)
            if (st->ctl[k].fd >= 0 && mk_ctl_send(&st->ctl[k], MK_CTL_BUSY, NULL, 0, deadline) == MK_OK) st->beats++;
    }
    pthread_mutex_unlock(&st->beat_mu);
    return NULL;
}

/* The beat thread runs while the stage serves. */
static mk_status mk_beat_start(mk_stage *st) {
    st->beat_ms = st->timeout_ms / 8 > 0 ? st->timeout_ms / 8 : 1;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    const int cv = pthread_cond_init(&st->beat_cv, &attr);
    pthread_condattr_destroy(&attr);
    if (cv != 0 || pthread_mutex_init(&st->beat_mu, NULL) != 0)
        return mk_fail(MK_ERR_INTERNAL, "stage: cannot make the beat thread's lock");
    st->beat_stop = st->busy = false;
    if (pthread_create(&st->beat_thread, NULL, mk_beat_main, st) != 0) {
        pthread_cond_destroy(&st->beat_cv);
        pthread_mutex_destroy(&st->beat_mu);
        return mk_fail(MK_ERR_INTERNAL, "stage: cannot start the beat thread");
    }
    st->beat_started = true;
    return MK_OK;
}

static void mk_beat_stop(mk_stage *st) {
    if (!st->beat_started) return;
    pthread_mutex_lock(&st->beat_mu);
    st->beat_stop = true;
    pthread_cond_signal(&st->beat_cv);
    pthread_mutex_unlock(&st->beat_mu);
    pthread_join(st->beat_thread, NULL);
    pthread_cond_destroy(&st->beat_cv);
    pthread_mutex_destroy(&st->beat_mu);
    st->beat_started = false;
}

/* Around a step's compute and a boundary's send: beats go out meanwhile. Clearing waits
 * for a beat being written, so the caller's next control message cannot interleave. */
void mk_stage_busy(mk_stage *st, bool busy) {
    if (!st->beat_started) return;
    pthread_mutex_lock(&st->beat_mu);
    st->busy = busy;
    pthread_mutex_unlock(&st->beat_mu);
}

/* ================================================================= join == */

/* What every rank must agree on: the stage protocol (v2: the welcome hands out the seam
 * ticket and seams open with it; a v1 rank would be dropped at the seam as a stranger, so it
 * is refused at its hello), the model's identity, the weight and KV modes, the cuts, the
 * world and the seam transport (under MPI the nccl seam adds a broadcast every rank must
 * take part in). */
static mk_status mk_stage_digest_of(const mk_model *model, const mk_stage_options *o, const int64_t *cuts,
                                    char digest[MK_DIGEST_HEX_LEN + 1]) {
    char text[2048];
    int n = snprintf(text, sizeof text, "meshkern-stage-v2;model=%s;weights=%s;kv=%s;seam=%s;world=%d;cuts=",
                     mk_model_digest(model), mk_dtype_name(o->range.backend.weight_dtype),
                     mk_dtype_name(o->range.backend.kv_dtype ? o->range.backend.kv_dtype : MK_DTYPE_F32),
                     mk_seam_kind_name(o->seam), o->world);
    for (int i = 0; i + 1 < o->world && n > 0 && (size_t)n < sizeof text; i++)
        n += snprintf(text + n, sizeof text - (size_t)n, "%lld,", (long long)cuts[i]);
    if (n < 0 || (size_t)n >= sizeof text) return mk_fail(MK_ERR_INTERNAL, "stage digest text too long");
    mk_sha256 *ctx = NULL;
    MK_TRY(mk_sha256_begin(&ctx));
    mk_sha256_update(ctx, text, (size_t)n);
    mk_sha256_finish(ctx, digest);
    return MK_OK;
}

/* The cuts (given or balanced) and the digest of a stage. */
mk_status mk_stage_plan(const mk_model *model, const mk_stage_options *o, int64_t *cuts,
                        char digest[MK_DIGEST_HEX_LEN + 1]) {
    if (o->split_auto) MK_TRY(mk_split_auto(model, (size_t)o->world, cuts, NULL));
    else memcpy(cuts, o->cuts, ((size_t)o->world - 1) * sizeof *cuts);
    MK_TRY(mk_cuts_to_spans(cuts, (size_t)o->world - 1, mk_model_hparams(model)->n_layers, MK_STAGE_MAX_WORLD, NULL));
    return mk_stage_digest_of(model, o, cuts, digest);
}

static mk_status mk_stage_check_options(const mk_model *model, const mk_stage_options *o) {
    if (o->world < 2 || o->world > MK_STAGE_MAX_WORLD || o->rank < 0 || o->rank >= o->world)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "stage rank %d of world %d: need 0 <= rank < world, 2 <= world <= %d",
                       o->rank, o->world, MK_STAGE_MAX_WORLD);
    if (!o->split_auto && o->n_cuts != (size_t)o->world - 1)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "%zu cuts for a world of %d ranks (one range per rank: %d cuts)", o->n_cuts,
                       o->world, o->world - 1);
    if (!o->split_auto && !o->cuts) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_stage_join: NULL cuts");
    if (!o->rendezvous || !*o->rendezvous) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_stage_join: no rendezvous address");
    if (o->tls.enabled) {
        mk_seam_options so = mk_seam_options_default(o->seam);
        so.tls = o->tls;
        MK_TRY(mk_seam_check_tls(&so)); /* unix and tcp seams only, a consistent choice */
    }
    if (o->timeout_ms < 0)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "stage timeout_ms %d is negative (0: the default, %d)", o->timeout_ms,
                       MK_STAGE_DEFAULT_TIMEOUT_MS);
    if (o->seam != MK_SEAM_TCP && o->seam != MK_SEAM_UNIX && o->seam != MK_SEAM_NCCL)
        return mk_fail(MK_ERR_UNSUPPORTED, "stage seams are tcp, unix or nccl, not '%s'", mk_seam_kind_name(o->seam));
    if (o->seam == MK_SEAM_NCCL && o->range.backend.kind != MK_BACKEND_CUDA)
        return mk_fail(MK_ERR_UNSUPPORTED, "the nccl seam joins cuda ranges: use the cuda backend");
    if (o->n_stop && !o->stop_ids) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_stage_join: NULL stop ids");
    return MK_OK;
}

static mk_status mk_stage_build(mk_stage *st) {
    mk_layer_span spans[MK_STAGE_MAX_WORLD];
    MK_TRY(mk_cuts_to_spans(st->cuts, (size_t)st->world - 1, mk_model_hparams(st->model)->n_layers, MK_STAGE_MAX_WORLD,
                            spans));
    const int64_t start = spans[st->rank].start, end = spans[st->rank].end;
    mk_range_options ro = st->o.range;
    ro.max_context = st->max_context;
    ro.max_batch_tokens = st->max_rows;
    /* Continuous batching: a step carries every request ready for it (an nccl receive
     * cannot be polled for the next boundary, so one at a time there). */
    st->max_batch = st->max_sequences;
    if (st->max_batch > MK_MAX_BATCH_SEQUENCES) st->max_batch = MK_MAX_BATCH_SEQUENCES;
    if (st->max_batch > st->max_context) st->max_batch = st->max_context;
    if (ro.max_batch_tokens < st->max_batch) ro.max_batch_tokens = st->max_batch;
    ro.max_batch_sequences = st->max_batch;
    /* Every rank's KV pool holds the same number of blocks (rank 0 admits by its own pool,
     * so the others must hold what it promised): blocks, never bytes (a rank's block size in
     * bytes follows its layers); by default one full context per request in flight. */
    if (ro.kv_pool_bytes && !ro.kv_pool_blocks)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "a stage run sizes its KV pools in blocks (kv_pool_blocks), the same "
                       "count on every rank; bytes would give ranks of more layers fewer blocks");
    if (!ro.kv_pool_blocks) {
        const size_t block = ro.kv_block_size ? ro.kv_block_size : 16;
        ro.kv_pool_blocks = st->max_sequences * ((st->max_context + block - 1) / block);
    }
    /* The last rank (after rank 0) sends back the sampled token alone: it never needs the
     * logits on the host, so its forward brings back 4 bytes and allocates nothing. */
    if (st->rank > 0 && st->rank + 1 == st->world) ro.token_only = true;
    MK_TRY(mk_range_create(st->model, start, end, &ro, &st->range));
    st->ins = calloc(st->max_batch, sizeof *st->ins);
    st->outs = calloc(st->max_batch, sizeof *st->outs);
    if (!st->ins || !st->outs) return mk_fail(MK_ERR_OUT_OF_MEMORY, "stage: out of memory for %zu boundaries", st->max_batch);
    for (size_t k = 0; k < st->max_batch; k++) {
        if (st->rank > 0) MK_TRY(mk_boundary_create(st->range, &st->ins[k]));
        if (st->rank + 1 < st->world) MK_TRY(mk_boundary_create(st->range, &st->outs[k]));
    }
    st->in = st->ins[0];
    st->out = st->outs[0];
    MK_TRY(mk_slots_init(&st->slots, st->range, st->max_sequences));
    /* The next rank's listener takes the connection in its backlog before it accepts, so
     * connecting first and accepting second cannot deadlock along the chain. */
    mk_seam_options so = mk_seam_options_default(st->o.seam);
    so.connect_timeout_ms = st->timeout_ms;
    so.io_timeout_ms = 2 * st->timeout_ms; /* a receive waits as long as the idle deadline */
    so.tls = st->o.tls;
    if (st->o.seam == MK_SEAM_NCCL) {
        /* Each join waits for its peer: rank r joins r + 1 first, then r - 1, so the chain
         * completes from the last rank back. */
        if (st->rank + 1 < st->world) {
            const mk_status s = mk_seam_nccl_end_with_id(&so, st->nccl_next, sizeof st->nccl_next, st->range, true,
                                                         &st->to_next);
            if (s != MK_OK) return mk_stage_wrap(s, "rank %d: no NCCL communicator with rank %d", st->rank, st->rank + 1);
        }
        if (st->rank > 0) {
            const mk_status s = mk_seam_nccl_end_with_id(&so, st->nccl_prev, sizeof st->nccl_prev, st->range, false,
                                                         &st->from_prev);
            if (s != MK_OK) return mk_stage_wrap(s, "rank %d: no NCCL communicator with rank %d", st->rank, st->rank - 1);
        }
        return MK_OK;
    }
    if (st->rank + 1 < st->world) {
        so.address = st->next_address;
        mk_status s = mk_seam_connect(&so, st->range, &st->to_next);
        if (s == MK_OK) s = mk_seam_send_ticket(st->to_next, st->seam_ticket);
        if (s != MK_OK) return mk_stage_wrap(s, "rank %d: cannot connect to rank %d at %s", st->rank, st->rank + 1,
                                       st->next_address);
    }
    if (st->rank > 0) {
        const mk_status s = mk_seam_accept_ticketed(st->listener, st->range, st->seam_ticket, st->o.log, st->o.log_user,
                                                    &st->from_prev);
        if (s != MK_OK) return mk_stage_wrap(s, "rank %d: rank %d did not connect", st->rank, st->rank - 1);
        mk_seam_listener_free(st->listener);
        st->listener = NULL;
    }
    return MK_OK;
}

mk_status mk_stage_join(const mk_model *model, const mk_stage_options *given, mk_stage **out) {
    mk_clear_error();
    if (!out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_stage_join: NULL out");
    *out = NULL;
    if (!model || !given) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_stage_join: NULL argument");
    /* The caller's struct by its struct_size: fields an older caller lacks keep their defaults. */
    mk_stage_options taken = mk_stage_options_default();
    MK_TRY(mk_options_take(&taken, sizeof taken, MK_STAGE_OPTIONS_V1_SIZE, given, "mk_stage_options"));
    const mk_stage_options *o = &taken;
    MK_TRY(mk_stage_check_options(model, o));
    mk_stage *st = calloc(1, sizeof *st);
    if (!st) return mk_fail(MK_ERR_OUT_OF_MEMORY, "stage: out of memory");
    for (size_t i = 0; i < MK_STAGE_MAX_WORLD; i++) st->ctl[i] = (mk_io){.fd = -1, .ssl = NULL};
    st->model = model;
    st->o = *o;
    st->counts.base_ns = mk_wall_ns();
    st->o.rendezvous = NULL; /* the caller's string: used during the join only */
    st->rank = o->rank;
    st->world = o->world;
    st->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : MK_STAGE_DEFAULT_TIMEOUT_MS;
    const mk_hparams *hp = mk_model_hparams(model);
    st->max_context = o->range.max_context ? o->range.max_context : (hp->max_context < 4096 ? hp->max_context : 4096);
    st->max_rows = o->range.max_batch_tokens ? o->range.max_batch_tokens : st->max_context;
    st->max_sequences = o->max_sequences ? o->max_sequences : 8;
    mk_status s = MK_OK;
    if (o->n_stop) {
        st->stop = mk_alloc_array(o->n_stop, sizeof *st->stop, "stage: stop ids");
        if (!st->stop) s = MK_ERR_OUT_OF_MEMORY;
        else memcpy(st->stop, o->stop_ids, o->n_stop * sizeof *st->stop);
    }
    st->o.stop_ids = NULL;
    st->o.nccl_ids = NULL; /* the caller's: read by the rendezvous during the join only */
    st->o.cuts = NULL; /* the caller's: copied into st->cuts by mk_stage_plan */
    if (s == MK_OK) s = mk_stage_plan(model, o, st->cuts, st->digest);
    if (s == MK_OK) s = mk_fault_read(st->rank, &st->fault);
    if (s == MK_OK && o->tls.enabled) s = mk_tls_context(&o->tls, st->rank == 0, &st->tls); /* the key, the files */
    if (s == MK_OK) {
        st->o.rendezvous = o->rendezvous;
        st->o.nccl_ids = o->nccl_ids;
        s = mk_stage_rendezvous(st);
        st->o.rendezvous = NULL;
        st->o.nccl_ids = NULL;
    }
    if (s == MK_OK) {
        s = mk_stage_build(st);
        if (s != MK_OK && st->rank != 0) {
            char message[512];
            snprintf(message, sizeof message, "%s", mk_last_error());
            mk_ctl_abort(&st->ctl[0], s, message); /* rank 0 is waiting for this rank to be ready */
            mk_fail(s, "%s", message);
        }
    }
    if (s == MK_OK) s = mk_stage_ready(st);
    /* the caller's strings: used during the join only (the contexts hold the key and files) */
    st->o.tls.psk_hex = st->o.tls.psk_identity = st->o.tls.cert_file = st->o.tls.key_file = st->o.tls.ca_file = NULL;
    if (s != MK_OK) {
        char message[512];
        snprintf(message, sizeof message, "%s", mk_last_error());
        mk_stage_free(st);
        return mk_fail(s, "%s", message);
    }
    *out = st;
    return MK_OK;
}

void mk_stage_free(mk_stage *st) {
    if (!st) return;
    mk_beat_stop(st);
    mk_seam_free(st->to_next);
    mk_seam_free(st->from_prev);
    mk_seam_listener_free(st->listener);
    mk_slots_free(&st->slots);
    for (size_t k = 0; k < st->max_batch; k++) {
        if (st->ins) mk_boundary_free(st->ins[k]);
        if (st->outs) mk_boundary_free(st->outs[k]);
    }
    free(st->ins);
    free(st->outs);
    mk_range_free(st->range);
    for (size_t i = 0; i < MK_STAGE_MAX_WORLD; i++) mk_io_close(&st->ctl[i]);
    mk_tls_context_free(st->tls);
    free(st->peer_counts);
    free(st->stop);
    free(st);
}


mk_status mk_stage_serve(mk_stage *st, const mk_stage_request *requests, size_t n_requests, mk_stage_report_fn report,
                         void *user) {
    mk_clear_error();
    if (!st) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_stage_serve: NULL stage");
    if (st->rank != 0 && n_requests) return mk_fail(MK_ERR_INVALID_ARGUMENT, "rank %d takes no requests (rank 0 does)", st->rank);
    if (st->rank == 0 && n_requests && !requests) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_stage_serve: NULL requests");
    MK_TRY(mk_beat_start(st));
    const mk_status s = st->rank == 0 ? mk_stage_serve_list(st, requests, n_requests, report, user)
                                      : mk_stage_serve_member(st, report, user);
    mk_beat_stop(st);
    return s;
}

mk_status mk_stage_serve_source(mk_stage *st, const mk_stage_source *given) {
    mk_clear_error();
    if (!st || !given) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_stage_serve_source: NULL argument");
    if (st->rank != 0) return mk_fail(MK_ERR_INVALID_ARGUMENT, "rank %d takes no requests (rank 0 does)", st->rank);
    mk_stage_source src = {0};
    MK_TRY(mk_options_take(&src, sizeof src, sizeof src, given, "mk_stage_source"));
    if (!src.take) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_stage_serve_source: no take callback");
    if (st->o.seam == MK_SEAM_NCCL)
        return mk_fail(MK_ERR_UNSUPPORTED, "a live source needs a tcp or unix seam: an nccl receive cannot wait while "
                       "rank 0 is idle");
    MK_TRY(mk_beat_start(st));
    const mk_status s = mk_stage_serve_head(st, &src, MK_OK);
    mk_beat_stop(st);
    return s;
}

mk_status mk_stage_live(const mk_stage *st, mk_stage_live_stats *out) {
    mk_clear_error();
    if (!st || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_stage_live: NULL argument");
    out->steps = __atomic_load_n(&st->live_steps, __ATOMIC_RELAXED);
    out->busy_seconds = (double)__atomic_load_n(&st->live_busy_ns, __ATOMIC_RELAXED) * 1e-9;
    out->bytes_sent = __atomic_load_n(&st->live_bytes, __ATOMIC_RELAXED);
    out->forwards = __atomic_load_n(&st->live_forwards, __ATOMIC_RELAXED);
    out->messages_sent = __atomic_load_n(&st->live_messages, __ATOMIC_RELAXED);
    return MK_OK;
}

mk_status mk_stage_hop_stats(const mk_stage *st, size_t seam, mk_stage_hop *out) {
    mk_clear_error();
    if (!st || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_stage_hop_stats: NULL argument");
    if (st->rank != 0 || !st->peer_counts || seam + 1 >= (size_t)st->world)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "seam %zu: rank 0 has the figures of seams 0..%d after a finished run "
                       "(this is rank %d)", seam, st->world - 2, st->rank);
    const mk_stage_counts *tx = &st->peer_counts[seam], *rx = &st->peer_counts[seam + 1];
    if (!tx->known || !rx->known)
        return mk_fail(MK_ERR_PEER_LOST, "rank %zu sent no seam figures with its goodbye", tx->known ? seam + 1 : seam);
    if (tx->sent != rx->received)
        return mk_fail(MK_ERR_INTERNAL, "seam %zu: rank %zu sent %llu boundaries, rank %zu received %llu", seam, seam,
                       (unsigned long long)tx->sent, seam + 1, (unsigned long long)rx->received);
    *out = (mk_stage_hop){0};
    out->boundaries = (size_t)rx->received;
    out->bytes = rx->received_bytes;
    out->seam_seconds = tx->send_seconds + rx->recv_seconds;
    /* sum(receipt - send) = sum(receipt - base_rx) - sum(send - base_tx) + n (base_rx - base_tx) */
    const double n = (double)rx->received;
    const double total_ns = (double)(rx->received_ns - tx->sent_ns) + n * (double)(rx->base_ns - tx->base_ns);
    out->latency_s = rx->received ? total_ns / n * 1e-9 : 0.0;
    return MK_OK;
}
