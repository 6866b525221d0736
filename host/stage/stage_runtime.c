/* The stage runtime: one range per process (include/meshkern.h, "stage processes").
 *
 * Rank 0 (the head) admits up to max_sequences requests, runs their prefills and decode
 * steps and sends each boundary to rank 1; the middle ranks receive, forward and send on;
 * the last rank samples greedily and returns a TailResult to rank 0 over its control
 * connection, and rank 0 feeds the token back in. Continuous batching: each rank's step
 * runs every request ready for it in one forward (rank 0: new prompts and returned tokens;
 * the others: the boundaries waiting on the seam), and each boundary still travels alone. Every boundary names its request; every
 * rank keeps one sequence per live request (slots.c).
 *
 * Failure: every wait polls the data it expects and the control connection together,
 * with the deadline timeout_ms. A closed connection is MK_ERR_PEER_LOST, a silent peer
 * MK_ERR_PEER_TIMEOUT, a refused boundary the contract's status, each naming the rank and
 * the step. A rank that fails tells rank 0 (ABORT); rank 0 fails every request in flight,
 * reports each one, and sends ABORT (status, message, the requests in flight) to every
 * rank, which report those requests too and stop. A dead rank 0 is seen by all as a
 * closed control connection. */
#include <poll.h>
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

#define MK_STAGE_DEFAULT_TIMEOUT_MS 30000

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
static int64_t mk_wall_ns(void) {
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
static void mk_stage_busy(mk_stage *st, bool busy) {
    if (!st->beat_started) return;
    pthread_mutex_lock(&st->beat_mu);
    st->busy = busy;
    pthread_mutex_unlock(&st->beat_mu);
}

/* ================================================================= join == */

/* What every rank must agree on: the model's identity, the weight and KV modes, the cuts,
 * the world and the seam transport (under MPI the nccl seam adds a broadcast every rank
 * must take part in). */
static mk_status mk_stage_digest_of(const mk_model *model, const mk_stage_options *o, const int64_t *cuts,
                                    char digest[MK_DIGEST_HEX_LEN + 1]) {
    char text[2048];
    int n = snprintf(text, sizeof text, "meshkern-stage-v1;model=%s;weights=%s;kv=%s;seam=%s;world=%d;cuts=",
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
        const mk_status s = mk_seam_connect(&so, st->range, &st->to_next);
        if (s != MK_OK) return mk_stage_wrap(s, "rank %d: cannot connect to rank %d at %s", st->rank, st->rank + 1,
                                       st->next_address);
    }
    if (st->rank > 0) {
        const mk_status s = mk_seam_accept(st->listener, st->range, &st->from_prev);
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

/* ============================================================ helpers == */

static size_t mk_request_index(const char *id) {
    unsigned long long v = 0;
    return sscanf(id, "req-%llu", &v) == 1 ? (size_t)v : (size_t)-1;
}

/* A recipe digest that is not ours: the fault of a lying peer. */
static void mk_other_digest(char *digest) { digest[0] = digest[0] == '0' ? '1' : '0'; }

/* Poll fds[n] for input until the deadline: *ready is the index of a readable one, or
 * -1 at the deadline. */
static mk_status mk_poll_in(const int *fds, size_t n, int64_t deadline, int *ready) {
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
static mk_status mk_stage_go_silent(mk_stage *st, uint64_t step) {
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
static void mk_stage_fault_busy(const mk_stage *st, size_t boundaries) {
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

static mk_status mk_stage_send(mk_stage *st, const char *id) { return mk_stage_send_from(st, st->out, id); }

/* Send a step's boundaries (outs[k] for request ids[k]) to the next rank as one batch
 * message (on nccl one exchange per entry, each saying how many follow). Each boundary is a
 * step of this rank's count, so a fault due at any of them is injected as at a single send. */
static mk_status mk_stage_send_batch(mk_stage *st, mk_boundary *const *outs, char (*ids)[64], size_t n) {
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

/* ========================================================== rank 0 (head) == */

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
            const size_t r = e->n == 0 ? e->a.n_prompt : 1;
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
        entries[k] = (mk_forward_entry){.seq = seq,
                                        .token_ids = e->n == 0 ? e->prompt : &e->tokens[e->n - 1],
                                        .n_tokens = e->n == 0 ? e->a.n_prompt : 1,
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
    if (!e)
        return mk_fail(MK_ERR_TAIL_RESULT, "rank %d sent a result for '%.64s', which is not in flight", last,
                       info.request_id);
    const mk_hparams *hp = mk_model_hparams(st->model);
    if (info.kind != MK_TAIL_OUTPUT_TOKEN || info.token_id < 0 || (size_t)info.token_id >= hp->vocab)
        return mk_fail(MK_ERR_TAIL_RESULT, "rank %d sent no token id within the vocabulary for %s", last, info.request_id);
    const int32_t token = (int32_t)info.token_id;
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
    h->deadline = 0; /* a word from a rank: the wait for a result starts again */
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

static mk_status mk_head_serve(mk_head *h) {
    for (;;) {
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
static mk_status mk_stage_serve_head(mk_stage *st, const mk_stage_source *src, mk_status pre) {
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

static mk_status mk_stage_serve_list(mk_stage *st, const mk_stage_request *req, size_t n_req, mk_stage_report_fn report,
                                     void *user) {
    mk_list_source l = {req, n_req, 0, report, user};
    const mk_stage_source src = {sizeof src, mk_list_take, NULL, mk_list_report, mk_list_closed, -1, &l};
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

/* ========================================================= other ranks == */

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

static mk_status mk_stage_serve_member(mk_stage *st, mk_stage_report_fn report, void *user) {
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
