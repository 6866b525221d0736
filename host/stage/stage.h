/* Stage processes (include/meshkern.h, "stage processes"): the internal state shared by the
 * runtime's files, one job each:
 *   control.c     framed control messages over a stage's rendezvous connection
 *   rendezvous.c  how ranks meet: hello, digest comparison, welcome or refusal, ready
 *   slots.c       request id -> sequence (one KV cache per live request on this rank)
 *   fault.c       MESHKERN_FAULT: test-only misbehaviour of one rank
 *   stage_runtime.c  join, the per-rank serve loops, failure reporting */
#ifndef MK_STAGE_H
#define MK_STAGE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/boundary.h"
#include "meshkern.h"
#include "net/io.h"
#include "seam/seam.h"

/* ============================================================= control == */

/* A control message: 12-byte header (magic "MKCT", type, length; little-endian) then
 * `length` bytes, at most MK_CTL_MAX_BODY (the receiver's limit). */
#define MK_CTL_MAGIC 0x54434b4du
#define MK_CTL_HEADER_BYTES 12u
#define MK_CTL_MAX_BODY 4096u

typedef enum mk_ctl_type {
    MK_CTL_HELLO = 1,   /* rank -> 0: "rank world digest seam-address" */
    MK_CTL_WELCOME = 2, /* 0 -> rank: "max_context max_rows max_sequences next-address
                                                   nccl-id-prev nccl-id-next" (hex or "-") */
    MK_CTL_READY = 3,   /* rank -> 0: range built, seams connected */
    MK_CTL_RESULT = 4,  /* last rank -> 0: a TailResult (request id, sampled token) */
    MK_CTL_BYE = 5,     /* 0 -> rank: every request is done */
    MK_CTL_ABORT = 6,   /* either way: "status message": the run stops */
    MK_CTL_PING = 7,    /* 0 -> rank: rank 0 had no result in time; who is silent? */
    MK_CTL_PONG = 8,    /* rank -> 0: this rank is alive */
    MK_CTL_DONE = 9,    /* last rank -> 0: the end-of-run marker came through (nccl seams) */
    MK_CTL_STATS = 10,  /* rank -> 0 after bye: its seam figures (mk_stage_counts) */
    MK_CTL_BUSY = 11,   /* either way, every beat while a rank computes or sends: alive, not silent */
    MK_CTL_RESULT_MORE = 12, /* last rank -> 0: a TailResult, and more of the same step follow
                                (rank 0 takes the step's results together into its next step) */
    MK_CTL_FINISHED = 13,    /* 0 -> rank: "request-id": that request is over; its KV blocks go
                                back to the rank's pool now (its last boundary has passed every rank) */
    MK_CTL_REFUSED = 14,     /* rank -> 0: "status request-id message": this rank's contract refused that
                                request's entry of a batch (its position, rows or id lied); it fails alone */
} mk_ctl_type;
#define MK_CTL_LAST MK_CTL_REFUSED

mk_status mk_ctl_send(mk_io *io, mk_ctl_type type, const void *body, size_t len, int64_t deadline);
/* The next message from `peer` (named in errors, e.g. "rank 2"); body[MK_CTL_MAX_BODY + 1]
 * gets a NUL after the bytes. A close is MK_ERR_PEER_LOST, bad magic or length MK_ERR_FRAME. */
mk_status mk_ctl_recv(mk_io *io, mk_ctl_type *type, char *body, size_t *len, int64_t deadline, const char *peer);
/* ABORT with a status and message, best effort within a short deadline. */
void mk_ctl_abort(mk_io *io, mk_status status, const char *message);
/* Parse an ABORT body into a failure (status recorded with its message). */
mk_status mk_ctl_abort_status(const char *body);

/* The current failure message prefixed: status with "<fmt...>: <message so far>". The
 * message is copied first (mk_fail formats into the buffer mk_last_error returns). */
mk_status mk_stage_wrap(mk_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* =============================================================== slots == */

typedef struct mk_stage_slot {
    char request_id[64]; /* "" = free */
    mk_sequence *seq;    /* opened on first use, reset when reused */
} mk_stage_slot;

typedef struct mk_slots {
    mk_range *range;
    mk_stage_slot *slot;
    size_t n;
} mk_slots;

mk_status mk_slots_init(mk_slots *t, mk_range *range, size_t n);
void mk_slots_free(mk_slots *t);
/* The sequence of request `id`: with `fresh` (a prefill) a free slot, reset, or
 * MK_ERR_KV_POOL_FULL when every slot holds a request (on a rank after rank 0, a finished
 * request's FINISHED has not been read yet: the caller reads it and asks again; the slot
 * left longest is not always the finished one, since a step may carry a later request's
 * prefill before an earlier one's decode row); without, the slot already holding id, or
 * MK_ERR_POSITIONS_SHAPE. */
mk_status mk_slots_get(mk_slots *t, const char *id, bool fresh, mk_sequence **seq);
void mk_slots_release(mk_slots *t, const char *id);

/* =============================================================== fault == */

typedef enum mk_fault_kind {
    MK_FAULT_NONE = 0,
    MK_FAULT_EXIT,           /* the process exits before its step-th boundary */
    MK_FAULT_SILENT,         /* stops sending and reading (as if hung) */
    MK_FAULT_CORRUPT_HEADER, /* sends a frame header that is not one */
    MK_FAULT_OTHER_DIGEST,   /* sends a boundary (or result) of another recipe digest */
    MK_FAULT_OTHER_LAYER,    /* sends a boundary cut before another layer */
    MK_FAULT_BUSY,           /* computes 3 deadlines longer at that step (alive, not silent) */
    MK_FAULT_LYING_ENTRY,    /* sends its step-th boundary with a position one past its sequence's */
    MK_FAULT_STRAY_RESULT,   /* last rank: before its step-th result, one for a request never admitted */
    MK_FAULT_HALF_FRAME,     /* sends a frame header and a tenth of its body, then falls silent */
    MK_FAULT_LATE_FINISHED,  /* rank 0, from that step on: each FINISHED goes out 100 ms after
                                the next step's boundaries (the next request's prefill overtakes it) */
} mk_fault_kind;

typedef struct mk_fault {
    mk_fault_kind kind;
    int rank;
    uint64_t step;
} mk_fault;

/* MESHKERN_FAULT for this rank (kind NONE if unset or for another rank); a malformed
 * value is MK_ERR_INVALID_ARGUMENT. */
mk_status mk_fault_read(int rank, mk_fault *out);
bool mk_fault_due(const mk_fault *f, uint64_t step, mk_fault_kind kind);

/* =============================================================== stage == */

#define MK_STAGE_MAX_WORLD 64

/* One rank's seam figures, sent to rank 0 after the bye: boundaries sent to the next rank
 * and received from the previous one, with the sums of their wall-clock times (ns since
 * this rank's base, so that the sums stay exact in int64), and both seam ends' counters. */
typedef struct mk_stage_counts {
    bool known;
    int64_t base_ns;              /* CLOCK_REALTIME at this rank's join */
    uint64_t sent, received;
    int64_t sent_ns, received_ns; /* sums of (time - base_ns) */
    size_t received_bytes;
    double send_seconds, recv_seconds;
} mk_stage_counts;
/* The request id of the end-of-run marker on nccl seams, which cannot be polled beside the
 * control connection: rank 0 sends it down the chain once every request is done. */
#define MK_STAGE_END_ID "meshkern-end-of-run"

/* The opaque mk_stage_nccl_ids of the public header: one rank's two ids, as the launcher
 * (mk_stage_mpi_setup) handed them out; the size is the seam's (one definition). */
struct mk_stage_nccl_ids {
    unsigned char prev[MK_SEAM_NCCL_ID_BYTES], next[MK_SEAM_NCCL_ID_BYTES];
};

struct mk_stage {
    const mk_model *model;
    mk_stage_options o;
    int64_t cuts[MK_STAGE_MAX_WORLD];
    int32_t *stop;                /* [o.n_stop] */
    int rank, world;
    int timeout_ms;
    char digest[MK_DIGEST_HEX_LEN + 1]; /* model, weights, kv, cuts, world */
    size_t max_context, max_rows, max_sequences;
    /* control: rank 0 holds one connection per other rank (ctl[0] unused), the others ctl[0] */
    mk_io ctl[MK_STAGE_MAX_WORLD];
    size_t n_ctl;
    SSL_CTX *tls;                 /* o.tls enabled: this rank's end of every control connection
                                     (rank 0 the server, the others clients); the seams make their own */
    /* seams */
    mk_seam_listener *listener;   /* rank > 0: where the previous rank connects */
    char next_address[300];       /* rank < world - 1: the next rank's listener */
    /* The run's seam ticket (rank 0 draws it, the welcome hands it out over the control
     * connection): a rank's seam takes only the connection that sends it. */
    char seam_ticket[MK_SEAM_TICKET_BYTES + 1];
    /* nccl seams: the unique ids of the communicators with the previous and the next rank,
     * made by rank 0 and handed out in the welcome, or by MPI_Bcast (o.nccl_ids) */
    unsigned char nccl_prev[MK_SEAM_NCCL_ID_BYTES], nccl_next[MK_SEAM_NCCL_ID_BYTES];
    mk_seam *from_prev, *to_next;
    mk_range *range;
    mk_boundary *in, *out;        /* ins[0], outs[0] */
    mk_boundary **ins, **outs;    /* [max_batch]: a step's boundaries, one per request */
    size_t max_batch;             /* requests one step carries */
    mk_slots slots;
    char abort_requests[MK_CTL_MAX_BODY + 1]; /* rank > 0: the requests rank 0's ABORT named */
    mk_fault fault;
    uint64_t steps;               /* boundaries this rank handled */
    mk_stage_counts counts;       /* this rank's seam figures */
    mk_stage_counts *peer_counts; /* rank 0, after a finished run: [world], every rank's */
    /* Busy is not silent: while the main thread computes a step or sends a boundary, a beat
     * thread sends BUSY on each of this rank's control connections every beat_ms (an eighth
     * of the deadline), so a peer's deadline bounds silence, not work. The main thread sets
     * and clears `busy` under beat_mu, and the beat thread writes under it, so a beat never
     * interleaves with the main thread's own control messages (which it sends only while
     * not busy). A stopped process (SIGSTOP, a hang outside a step) sends no beat. */
    pthread_t beat_thread;
    pthread_mutex_t beat_mu;
    pthread_cond_t beat_cv;
    bool beat_started, beat_stop, busy;
    int beat_ms;
    uint64_t beats;               /* BUSY messages sent */
    /* rank 0's live figures (mk_stage_live), written by the serving thread, read by any:
     * __atomic builtins (the header is C++'s too, which has no _Atomic) */
    uint64_t live_steps, live_busy_ns, live_bytes, live_forwards, live_messages;
};

/* The cuts of o (given, or balanced for o->world ranks) into cuts[world - 1], checked,
 * and the stage digest every rank must share. */
mk_status mk_stage_plan(const mk_model *model, const mk_stage_options *o, int64_t *cuts,
                        char digest[MK_DIGEST_HEX_LEN + 1]);

/* rendezvous.c: rank 0's verdict on the first n bytes a connection sent it, before it is
 * any rank of this run (a control header, then a hello "rank world digest address"):
 * MORE (need: the bytes the message has, as far as known), JOIN (hello: a rank this run
 * takes, not joined yet: st->ctl[rank].fd < 0), or DROP with why (and a brief for the
 * failure message), told: the status its sender is told (MK_OK: not a hello, not told),
 * claim: set when it said hello as a rank of this run with another world or digest. */
typedef struct mk_hello {
    int rank, world;
    char digest[MK_DIGEST_HEX_LEN + 1];
    char address[300];
} mk_hello;
typedef enum mk_hello_verdict { MK_HELLO_MORE, MK_HELLO_JOIN, MK_HELLO_DROP } mk_hello_verdict;
typedef struct mk_hello_judgement {
    mk_hello_verdict verdict;
    size_t need;
    mk_hello hello;
    mk_status told, claim;
    bool duplicate;  /* DROP: a hello of a rank joined already */
    char why[512], brief[96];
} mk_hello_judgement;
void mk_hello_judge(const mk_stage *st, const uint8_t *bytes, size_t n, mk_hello_judgement *j);

/* rendezvous.c: meet the other ranks (fills ctl, next_address, max_*); then, once the
 * range and seams are up, the ready barrier. */
mk_status mk_stage_rendezvous(mk_stage *st);
mk_status mk_stage_ready(mk_stage *st);

/* The deadline of a wait when the options give none (timeout_ms 0). */
#define MK_STAGE_DEFAULT_TIMEOUT_MS 30000

/* stage_runtime.c: the wall clock every rank of a node shares (a boundary's hop time is its
 * receipt on one rank less its send on another); around a step's compute and a boundary's
 * send, the beat thread's busy flag (beats go out meanwhile; clearing waits for a beat being
 * written, so the caller's next control message cannot interleave). */
int64_t mk_wall_ns(void);
void mk_stage_busy(mk_stage *st, bool busy);

/* stage_send.c: what both roles use. The number in a request id "req-<number>" ((size_t)-1
 * for another id); a recipe digest made not ours (a lying peer's fault); poll fds[n] for
 * input until the deadline (*ready: the readable one, or -1 at the deadline); the silent and
 * busy faults; one boundary (st->out) or a step's boundaries (outs[k] for ids[k], one batch
 * message) sent to the next rank, the faults due at their steps injected. */
size_t mk_request_index(const char *id);
void mk_other_digest(char *digest);
mk_status mk_poll_in(const int *fds, size_t n, int64_t deadline, int *ready);
mk_status mk_stage_go_silent(mk_stage *st, uint64_t step);
void mk_stage_fault_busy(const mk_stage *st, size_t boundaries);
mk_status mk_stage_send(mk_stage *st, const char *id);
mk_status mk_stage_send_batch(mk_stage *st, mk_boundary *const *outs, char (*ids)[64], size_t n);

/* stage_head.c: rank 0's run over a live source (pre: a failure found before it, and the
 * run fails at once), or over a fixed list of requests. stage_member.c: the other ranks. */
mk_status mk_stage_serve_head(mk_stage *st, const mk_stage_source *src, mk_status pre);
mk_status mk_stage_serve_list(mk_stage *st, const mk_stage_request *req, size_t n_req, mk_stage_report_fn report,
                              void *user);
mk_status mk_stage_serve_member(mk_stage *st, mk_stage_report_fn report, void *user);

#endif
