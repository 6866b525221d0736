/* Internal to the placed pipeline (host/sched/): the bounded queue between stages, the
 * seam hand-off (link.c), the micro-batch item, the stage worker and the cut chooser.
 *
 * Threads: one worker per stage. A stage's range, its KV caches and its statistics are
 * touched only by its worker (and by create/free while no worker runs); an item is owned
 * by exactly one stage at a time and changes hands only through a queue, whose mutex
 * orders the writes of one stage before the reads of the next. Requests and the slot
 * bookkeeping are guarded by mk_sched.mu. */
#ifndef MK_SCHED_INTERNAL_H
#define MK_SCHED_INTERNAL_H

#include <pthread.h>

#include "meshkern.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================== queue == */

struct mk_sched_item;

/* Bounded FIFO of items (mutex + condvar). Capacity is the number of items that can ever
 * be in flight, so a push never waits: a stage never blocks on its downstream neighbour,
 * only on its own empty inbox. */
typedef struct mk_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct mk_sched_item **ring; /* [cap] */
    size_t cap, head, count;
} mk_queue;

mk_status mk_queue_init(mk_queue *q, size_t cap);
void mk_queue_destroy(mk_queue *q);
mk_status mk_queue_push(mk_queue *q, struct mk_sched_item *item);
struct mk_sched_item *mk_queue_pop(mk_queue *q); /* waits while empty */
/* The front item without waiting, if there is one and take(front, arg) says so; else NULL. */
struct mk_sched_item *mk_queue_pop_if(mk_queue *q, bool (*take)(const struct mk_sched_item *, void *), void *arg);

/* =================================================================== item == */

typedef enum mk_item_kind {
    MK_ITEM_PREFILL = 1, /* a new sequence's prompt: every stage resets its slot's cache */
    MK_ITEM_DECODE = 2,  /* one token */
    MK_ITEM_STOP = 3,    /* the worker exits */
} mk_item_kind;

typedef struct mk_sched_request mk_sched_request;

/* One micro-batch in flight: one step of the sequence in slot `slot`. Its buffers are
 * preallocated: out[i] is stage i's output boundary (in stage i's backend memory) for this
 * slot, kept until the next stage has taken it (or, on a FIFO transport, sent it); the
 * tail's logits and token. */
typedef struct mk_sched_item {
    mk_item_kind kind;
    size_t slot;
    mk_sched_request *req;
    const int32_t *tokens; /* [n_tokens]: the prompt (or its next chunk), or &next_token */
    size_t n_tokens;
    size_t prompt_done;    /* prompt tokens of the chunks before this one */
    int32_t next_token;
    mk_boundary **out;       /* [n_workers - 1] */
    float *logits;           /* [vocab] tail output */
    int32_t token;
} mk_sched_item;

/* ============================================================= stage link == */

/* The seam between stage i and i + 1: the ONE place a boundary is handed over. The queue
 * says which item comes next; a transport of host/seam/ carries its boundary from the
 * sender's backend into the receiver's (and runs the boundary contract on the header
 * before the payload is accepted). FIFO transports (unix, tcp: one connection; nccl: one
 * communicator) carry the boundaries in the queue's order through one pair of ends; the
 * in-process ones (local, wire) hold one posted boundary per pair, so there is a pair per
 * sequence slot. Sender ends are used by stage i's thread only, receiver ends by stage
 * i + 1's. */
typedef struct mk_sched_link {
    mk_queue q;
    mk_seam_kind kind;
    bool fifo;
    size_t n_pairs;
    mk_seam **tx, **rx; /* [n_pairs] */
    /* receiver's thread only: boundaries taken; the injected cut (tests) closes the
     * receiving ends once cut_after were taken, as when that stage's process dies */
    size_t taken, cut_after;
    bool cut_armed, cut;
} mk_sched_link;

/* Join `sender` (stage i's range) and `receiver` with the transport `kind`, n_slots items. */
mk_status mk_sched_link_init(mk_sched_link *link, mk_seam_kind kind, mk_range *sender, mk_range *receiver,
                             size_t n_slots);
/* The ends and the queue; call after the workers stopped, before the ranges are freed. */
void mk_sched_link_destroy(mk_sched_link *link);
/* Hand item (whose boundary `out`, of the sending range, is filled) to the next stage. On
 * failure nothing reached the queue: the caller fails the item. */
mk_status mk_sched_link_send(mk_sched_link *link, mk_sched_item *item, const mk_boundary *out);
/* Control items (stop) pass without a boundary. */
mk_status mk_sched_link_send_control(mk_sched_link *link, mk_sched_item *item);
/* The next item (waits while there is none). */
mk_sched_item *mk_sched_link_take(mk_sched_link *link);
/* The boundary of a step item just taken, received into `into` (a boundary of the
 * receiving range) for the slot's sequence `seq`. Called once for every step item taken,
 * even one that will fail, so a FIFO transport stays in step. */
mk_status mk_sched_link_recv(mk_sched_link *link, const mk_sched_item *item, const mk_sequence *seq,
                             mk_boundary *into);
/* Bytes the receiving ends took so far. */
size_t mk_sched_link_bytes(const mk_sched_link *link);

/* ================================================================== stage == */

typedef struct mk_timeline_record {
    uint64_t seq_id;
    uint64_t start_ns, end_ns;
    uint32_t rows;
} mk_timeline_record;

typedef struct mk_sched_worker {
    struct mk_sched *sched;
    size_t index;
    mk_range *range;
    mk_sequence **seqs;     /* [n_slots] KV cache per sequence slot */
    mk_queue *inbox;        /* stage 0: admissions and feedback; others: in_link's queue */
    mk_sched_link *in_link; /* NULL for stage 0 */
    mk_sched_link *out_link; /* NULL for the tail */
    mk_boundary *in;        /* the received boundary (stages after the head): ins[0] */
    mk_boundary **ins;      /* [max_batch]: a step's received boundaries, one per item */
    size_t max_batch;       /* items one step takes (its range's max_batch_sequences) */
    pthread_t thread;
    bool started;
    double share;
    /* fault injection (tests): fail the step numbered fault_step (0-based); dies = every
     * later step fails too, as when a device is lost */
    bool fault_armed, fault_dies, dead;
    size_t fault_step;
    size_t attempts;        /* steps begun since creation or reset (the fault's clock) */
    char dead_reason[160];
    /* statistics (worker only) */
    mk_worker_stats stats;
    mk_timeline_record *timeline; /* [timeline_cap] */
    size_t timeline_cap, timeline_len;
} mk_sched_worker;

void *mk_worker_main(void *arg);

/* Queued items join a worker's step while they fit: not the stop item, and the step's rows
 * stay within the range's (every stage sees an item's rows: its prompt, or one token).
 * A mk_queue_pop_if test over a mk_batch_room (rows so far; grown by the item taken). */
typedef struct mk_batch_room {
    size_t rows, max_rows;
} mk_batch_room;
bool mk_sched_item_fits(const mk_sched_item *item, void *arg);

/* ============================================================== scheduler == */

struct mk_sched_request {
    uint64_t id;
    mk_seq_state state;
    mk_status status;
    bool stopped;
    bool cancelled;     /* mk_sched_cancel: retire at the next token */
    bool released;      /* mk_sched_release: freed when it retires */
    int32_t *prompt;    /* [n_prompt] */
    size_t n_prompt;
    int32_t *stop_ids;  /* [n_stop] */
    size_t n_stop;
    int32_t *tokens;    /* [max_new] generated */
    size_t n_tokens, max_new;
    char error[256];
    mk_sched_request *next_pending;
};

struct mk_sched {
    const mk_model *model;
    size_t n_workers, n_slots, vocab;
    size_t prefill_chunk; /* prompt rows per step (mk_sched_options.prefill_chunk), 0 = all */
    mk_sched_worker *workers; /* [n_workers] */
    mk_sched_link *links;   /* [n_workers - 1] */
    mk_queue inbox0;
    mk_sched_item *items;   /* [n_slots] */
    mk_sched_item stop_items[1]; /* the one stop item every inbox receives at shutdown */
    mk_sched_token_fn on_token;
    void *user;

    pthread_mutex_t mu;
    pthread_cond_t done_cv;
    mk_sched_request **requests; /* [n_requests], index = id - 1 */
    size_t n_requests, cap_requests, n_unfinished;
    mk_sched_request *pending_head, *pending_tail;
    size_t *free_slots; /* stack [n_slots] */
    size_t n_free;
};

/* A sequence leaves its slot (done or failed); a queued one takes it, or the slot is
 * freed. Called by any stage's worker. */
void mk_sched_retire(struct mk_sched *sched, mk_sched_item *item, mk_seq_state state, mk_status status,
                     const char *error);
/* The tail's token: recorded, reported, and the sequence continues or retires. */
void mk_sched_emit(struct mk_sched *sched, mk_sched_item *item);

/* Test hook: worker `worker` fails its step number `step` (counted from 0 since creation
 * or mk_sched_reset_stats); with dies, every later step on it fails too. Call before
 * submitting. */
mk_status mk_sched_inject_fault(mk_sched *sched, size_t worker, size_t step, bool dies);
/* Test hook: the receiving ends of seam `seam` close after taking `after` boundaries (its
 * stage lost its connection: the sender's writes fail, later receives report the closed
 * end). Call before submitting. */
mk_status mk_sched_inject_seam_cut(mk_sched *sched, size_t seam, size_t after);

/* ============================================================ cut chooser == */

/* Contiguous ranges of n_layers layers (cost layer_cost[l]) into n_ranges ranges, the head
 * stage adding head_extra and the tail tail_extra, minimising the largest range cost (ties:
 * the earliest cuts). cuts [n_ranges - 1] receive the last layer of each range but the last. */
mk_status mk_choose_cuts(const double *layer_cost, size_t n_layers, double head_extra, double tail_extra,
                         size_t n_ranges, int64_t *cuts);

/* The per-layer cost [n_layers] and the head's and tail's extra (split_auto.c). */
mk_status mk_split_costs(const mk_model *model, double *layer_cost, double *head_extra, double *tail_extra);

#ifdef __cplusplus
}
#endif
#endif
