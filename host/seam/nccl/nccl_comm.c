/* NCCL seam endpoints: bootstrap, warm-up, and the deadline-watched header + payload
 * exchange (nccl_comm.h explains the protocol). */
#include "seam/nccl/nccl_comm.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/mk_check.h"

#define MK_NCCL_MAGIC 0x484e4b4du /* "MKNH", little-endian on the wire */
#define MK_NCCL_VERSION 1u

/* ================================================================ helpers == */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t deadline_after(int ms) { return now_ns() + (int64_t)ms * 1000000; }

/* Between the polls of one wait: spin for the first MK_NCCL_SPIN_NS (a decode-sized hop
 * completes in microseconds; a fixed 50 us nap quantised every hop to ~100 us), then sleep
 * 1, 2, 4 ... MK_NCCL_NAP_MAX_NS so that a long wait yields the core. */
#define MK_NCCL_SPIN_NS 20000
#define MK_NCCL_NAP_MAX_NS 64000
typedef struct {
    int64_t start;
    long nap_ns; /* the next sleep once past the spin; 0 before the first */
} mk_nccl_poll;

static mk_nccl_poll poll_begin(void) { return (mk_nccl_poll){now_ns(), 0}; }

static void poll_pause(mk_nccl_poll *p) {
    if (now_ns() - p->start < MK_NCCL_SPIN_NS) return;
    p->nap_ns = p->nap_ns == 0 ? 1000 : p->nap_ns * 2 > MK_NCCL_NAP_MAX_NS ? MK_NCCL_NAP_MAX_NS : p->nap_ns * 2;
    const struct timespec ts = {0, p->nap_ns};
    nanosleep(&ts, NULL);
}

static void put_le(unsigned char *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* The envelope at the start of every header block. */
static void put_envelope(unsigned char *block, size_t header_bytes, size_t payload_bytes) {
    memset(block, 0, MK_NCCL_HEADER_BLOCK);
    put_le(block, MK_NCCL_MAGIC, 4);
    put_le(block + 4, MK_NCCL_VERSION, 4);
    put_le(block + 8, header_bytes, 8);
    put_le(block + 16, payload_bytes, 8);
}

/* A synchronous NCCL result as a status; asynchronous ones say more about the peer. */
static mk_status nccl_status(ncclResult_t r, int async) {
    switch (r) {
    case ncclRemoteError:
    case ncclSystemError:
        return MK_ERR_PEER_CLOSED;
    case ncclInvalidUsage:
        return async ? MK_ERR_FRAME : MK_ERR_NCCL;
    default:
        return MK_ERR_NCCL;
    }
}

/* The endpoint failed: abort the communicator so no operation of it can hang, and record
 * the failure. Later calls see a dead endpoint. */
static mk_status fail_abort(mk_nccl_ctx *ctx, mk_status status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static mk_status fail_abort(mk_nccl_ctx *ctx, mk_status status, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ctx->comm) {
        ncclCommAbort(ctx->comm);
        ctx->comm = NULL;
    }
    ctx->send_pending = 0;
    return mk_fail(status, "nccl seam rank %d: %s", ctx->rank, msg);
}

/* The communicator's error text, copied before an abort invalidates it. */
static void comm_message(mk_nccl_ctx *ctx, char *buf, size_t cap) {
    const char *m = ctx->comm ? ncclGetLastError(ctx->comm) : NULL;
    snprintf(buf, cap, "%s", m && *m ? m : "no detail");
}

static mk_status check_alive(mk_nccl_ctx *ctx) {
    if (!ctx) return mk_fail(MK_ERR_INVALID_ARGUMENT, "nccl seam: NULL endpoint");
    if (!ctx->comm)
        return mk_fail(MK_ERR_PEER_CLOSED, "nccl seam rank %d: the endpoint was aborted after an earlier failure",
                       ctx->rank);
    return MK_OK;
}

/* After a (group of) NCCL call(s) on a non-blocking communicator: ncclInProgress means the
 * operations are still being enqueued; poll until they are, within the deadline. */
static mk_status settle(mk_nccl_ctx *ctx, ncclResult_t r, int64_t deadline, const char *what) {
    char why[256];
    mk_nccl_poll poll = poll_begin();
    while (r == ncclInProgress) {
        if (now_ns() > deadline)
            return fail_abort(ctx, MK_ERR_PEER_TIMEOUT, "%s was not enqueued within %d ms; communicator aborted", what,
                              ctx->deadline_ms);
        poll_pause(&poll);
        if (ncclCommGetAsyncError(ctx->comm, &r) != ncclSuccess) r = ncclInternalError;
    }
    if (r == ncclSuccess) return MK_OK;
    comm_message(ctx, why, sizeof why);
    return fail_abort(ctx, nccl_status(r, 0), "%s: %s (%s)", what, ncclGetErrorString(r), why);
}

/* Poll the event recorded after an operation and the communicator's asynchronous error
 * until the operation completed, failed, or the deadline passed (then abort). */
static mk_status wait_event(mk_nccl_ctx *ctx, cudaEvent_t ev, int64_t deadline, const char *what) {
    char why[256];
    mk_nccl_poll poll = poll_begin();
    for (;;) {
        const cudaError_t e = cudaEventQuery(ev);
        ncclResult_t a = ncclSuccess;
        if (ncclCommGetAsyncError(ctx->comm, &a) != ncclSuccess) a = ncclInternalError;
        if (a != ncclSuccess && a != ncclInProgress) {
            comm_message(ctx, why, sizeof why);
            return fail_abort(ctx, nccl_status(a, 1), "%s failed: %s (%s); communicator aborted", what,
                              ncclGetErrorString(a), why);
        }
        if (e == cudaSuccess && a == ncclSuccess) return MK_OK;
        if (e != cudaSuccess && e != cudaErrorNotReady) {
            (void)cudaGetLastError();
            return fail_abort(ctx, MK_ERR_CUDA, "%s: cudaEventQuery: %s", what, cudaGetErrorString(e));
        }
        if (now_ns() > deadline)
            return fail_abort(ctx, MK_ERR_PEER_TIMEOUT, "%s did not complete within %d ms; communicator aborted",
                              what, ctx->deadline_ms);
        poll_pause(&poll);
    }
}

/* Wait until a non-blocking communicator finished initializing. */
/* An asynchronous failure here is NCCL refusing the communicator itself (e.g. two ranks of
 * one communicator on one GPU, or ranks that disagree on the rank count): MK_ERR_NCCL with
 * NCCL's own text, not a frame error (no peer sent anything yet). */
static mk_status wait_ready(mk_nccl_ctx *ctx, int64_t deadline) {
    char why[256];
    mk_nccl_poll poll = poll_begin();
    for (;;) {
        ncclResult_t a = ncclSuccess;
        if (ncclCommGetAsyncError(ctx->comm, &a) != ncclSuccess) a = ncclInternalError;
        if (a == ncclSuccess) return MK_OK;
        if (a != ncclInProgress) {
            comm_message(ctx, why, sizeof why);
            return fail_abort(ctx, nccl_status(a, 0),
                              "NCCL refused the communicator at init (rank %d of %d): %s (%s); NCCL refuses, "
                              "among others, two ranks of one communicator on one GPU",
                              ctx->rank, ctx->nranks, ncclGetErrorString(a), why);
        }
        if (now_ns() > deadline)
            return fail_abort(ctx, MK_ERR_PEER_TIMEOUT,
                              "communicator init (rank %d of %d) not complete within %d ms (every rank must join); "
                              "aborted",
                              ctx->rank, ctx->nranks, ctx->deadline_ms);
        poll_pause(&poll);
    }
}

/* ============================================================== endpoints == */

static mk_status alloc_resources(mk_nccl_ctx *ctx, cudaStream_t stream) {
    MK_CUDA_CHECK(cudaSetDevice(ctx->device));
    if (stream) {
        ctx->stream = stream;
    } else {
        MK_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
        ctx->owns_stream = 1;
    }
    MK_CUDA_CHECK(cudaEventCreateWithFlags(&ctx->send_done, cudaEventDisableTiming));
    MK_CUDA_CHECK(cudaEventCreateWithFlags(&ctx->recv_done, cudaEventDisableTiming));
    MK_CUDA_CHECK(cudaMalloc((void **)&ctx->send_block_dev, MK_NCCL_HEADER_BLOCK));
    MK_CUDA_CHECK(cudaMalloc((void **)&ctx->recv_block_dev, MK_NCCL_HEADER_BLOCK));
    MK_CUDA_CHECK(cudaMallocHost((void **)&ctx->send_block_host, MK_NCCL_HEADER_BLOCK));
    MK_CUDA_CHECK(cudaMallocHost((void **)&ctx->recv_block_host, MK_NCCL_HEADER_BLOCK));
    return MK_OK;
}

void mk_nccl_ctx_destroy(mk_nccl_ctx *ctx) {
    if (!ctx) return;
    const int touched = ctx->comm || ctx->stream || ctx->send_done || ctx->recv_done || ctx->send_block_dev ||
                        ctx->recv_block_dev || ctx->send_block_host || ctx->recv_block_host;
    if (!touched) return;
    (void)cudaSetDevice(ctx->device);
    if (ctx->comm) {
        /* Nothing pending: finalize (flushes, lets the peers see a clean close) within the
         * deadline, then destroy; otherwise, or past it, abort. */
        int clean = 0;
        if (!ctx->send_pending) {
            ncclResult_t r = ncclCommFinalize(ctx->comm);
            const int64_t deadline = deadline_after(ctx->deadline_ms > 0 ? ctx->deadline_ms : 1000);
            mk_nccl_poll poll = poll_begin();
            while (r == ncclInProgress && now_ns() < deadline) {
                poll_pause(&poll);
                if (ncclCommGetAsyncError(ctx->comm, &r) != ncclSuccess) r = ncclInternalError;
            }
            clean = r == ncclSuccess;
        }
        if (clean) ncclCommDestroy(ctx->comm);
        else ncclCommAbort(ctx->comm);
        ctx->comm = NULL;
    }
    /* The stream's NCCL work is finished or released by the abort: wait for it before its
     * buffers go. */
    if (ctx->stream) cudaStreamSynchronize(ctx->stream);
    if (ctx->send_done) cudaEventDestroy(ctx->send_done);
    if (ctx->recv_done) cudaEventDestroy(ctx->recv_done);
    if (ctx->send_block_dev) cudaFree(ctx->send_block_dev);
    if (ctx->recv_block_dev) cudaFree(ctx->recv_block_dev);
    if (ctx->send_block_host) cudaFreeHost(ctx->send_block_host);
    if (ctx->recv_block_host) cudaFreeHost(ctx->recv_block_host);
    if (ctx->owns_stream && ctx->stream) cudaStreamDestroy(ctx->stream);
    (void)cudaGetLastError(); /* teardown reports nothing: leave no stale error */
    memset(ctx, 0, sizeof *ctx);
}

static void init_fields(mk_nccl_ctx *ctx, int nranks, int rank, int device, int deadline_ms) {
    memset(ctx, 0, sizeof *ctx);
    ctx->rank = rank;
    ctx->nranks = nranks;
    ctx->device = device;
    ctx->deadline_ms = deadline_ms;
}

static ncclConfig_t nonblocking_config(void) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    return cfg;
}

mk_status mk_nccl_init_rank(mk_nccl_ctx *ctx, int nranks, int rank, const ncclUniqueId *id, int device,
                            cudaStream_t stream, int deadline_ms) {
    if (!ctx || !id || nranks < 1 || rank < 0 || rank >= nranks || deadline_ms <= 0)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "nccl seam: init of rank %d of %d (deadline %d ms)", rank, nranks,
                       deadline_ms);
    init_fields(ctx, nranks, rank, device, deadline_ms);
    const int64_t deadline = deadline_after(deadline_ms);
    MK_CUDA_CHECK(cudaSetDevice(device));
    ncclConfig_t cfg = nonblocking_config();
    const ncclResult_t r = ncclCommInitRankConfig(&ctx->comm, nranks, *id, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        if (ctx->comm) ncclCommAbort(ctx->comm);
        ctx->comm = NULL;
        return mk_fail(MK_ERR_NCCL, "nccl seam: ncclCommInitRankConfig (rank %d of %d): %s (%s)", rank, nranks,
                       ncclGetErrorString(r), ncclGetLastError(NULL));
    }
    mk_status st = wait_ready(ctx, deadline);
    if (st == MK_OK) st = alloc_resources(ctx, stream);
    if (st != MK_OK) mk_nccl_ctx_destroy(ctx);
    return st;
}

/* ================================================================ warm-up == */

/* Enqueue (inside the caller's group) the warm-up block send / receive of one endpoint. */
static ncclResult_t post_warmup(mk_nccl_ctx *ctx, int recv_from, int send_to) {
    ncclResult_t r = ncclSuccess;
    if (send_to >= 0) r = ncclSend(ctx->send_block_dev, MK_NCCL_HEADER_BLOCK, ncclUint8, send_to, ctx->comm, ctx->stream);
    if (r == ncclSuccess && recv_from >= 0)
        r = ncclRecv(ctx->recv_block_dev, MK_NCCL_HEADER_BLOCK, ncclUint8, recv_from, ctx->comm, ctx->stream);
    return r;
}

static mk_status stage_warmup(mk_nccl_ctx *ctx) {
    MK_CUDA_CHECK(cudaSetDevice(ctx->device));
    put_envelope(ctx->send_block_host, 0, 0);
    MK_CUDA_CHECK(cudaMemcpyAsync(ctx->send_block_dev, ctx->send_block_host, MK_NCCL_HEADER_BLOCK,
                                  cudaMemcpyHostToDevice, ctx->stream));
    return MK_OK;
}

/* After the group: record, wait, and check that what arrived is a seam block. */
static mk_status finish_warmup(mk_nccl_ctx *ctx, int recv_from, int64_t deadline) {
    MK_CUDA_CHECK(cudaSetDevice(ctx->device));
    if (recv_from >= 0)
        MK_CUDA_CHECK(cudaMemcpyAsync(ctx->recv_block_host, ctx->recv_block_dev, MK_NCCL_HEADER_BLOCK,
                                      cudaMemcpyDeviceToHost, ctx->stream));
    MK_CUDA_CHECK(cudaEventRecord(ctx->recv_done, ctx->stream));
    MK_TRY(wait_event(ctx, ctx->recv_done, deadline, "warm-up exchange"));
    if (recv_from >= 0 && get_le(ctx->recv_block_host, 4) != MK_NCCL_MAGIC)
        return fail_abort(ctx, MK_ERR_FRAME, "warm-up block from rank %d is not a meshkern seam block", recv_from);
    return MK_OK;
}

mk_status mk_nccl_warmup(mk_nccl_ctx *ctx, int recv_from, int send_to) {
    MK_TRY(check_alive(ctx));
    if (recv_from >= ctx->nranks || send_to >= ctx->nranks)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "nccl seam rank %d: warm-up peers %d/%d of %d ranks", ctx->rank,
                       recv_from, send_to, ctx->nranks);
    const int64_t deadline = deadline_after(ctx->deadline_ms);
    MK_TRY(stage_warmup(ctx));
    ncclGroupStart();
    ncclResult_t r = post_warmup(ctx, recv_from, send_to);
    const ncclResult_t g = ncclGroupEnd();
    MK_TRY(settle(ctx, r != ncclSuccess ? r : g, deadline, "warm-up"));
    return finish_warmup(ctx, recv_from, deadline);
}

mk_status mk_nccl_init_all(mk_nccl_ctx *ctxs, int n, const int *devices, const cudaStream_t *streams,
                           int deadline_ms) {
    if (!ctxs || n < 1 || !devices || deadline_ms <= 0)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "nccl seam: init of %d devices (deadline %d ms)", n, deadline_ms);
    for (int i = 0; i < n; ++i) init_fields(&ctxs[i], n, i, devices[i], deadline_ms);
    const int64_t deadline = deadline_after(deadline_ms);
    ncclUniqueId id;
    MK_NCCL_CHECK(ncclGetUniqueId(&id));
    /* One thread creates every rank: NCCL needs the inits in one group. */
    ncclConfig_t cfg = nonblocking_config();
    ncclResult_t first = ncclSuccess;
    ncclGroupStart();
    for (int i = 0; i < n; ++i) {
        ncclResult_t r = cudaSetDevice(devices[i]) == cudaSuccess
                             ? ncclCommInitRankConfig(&ctxs[i].comm, n, id, i, &cfg)
                             : ncclInvalidArgument;
        if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) first = r;
    }
    const ncclResult_t g = ncclGroupEnd();
    if (first == ncclSuccess && g != ncclSuccess && g != ncclInProgress) first = g;
    mk_status st = MK_OK;
    if (first != ncclSuccess) {
        (void)cudaGetLastError();
        st = mk_fail(MK_ERR_NCCL, "nccl seam: init of %d ranks: %s (%s)", n, ncclGetErrorString(first),
                     ncclGetLastError(NULL));
    }
    for (int i = 0; st == MK_OK && i < n; ++i) st = wait_ready(&ctxs[i], deadline);
    for (int i = 0; st == MK_OK && i < n; ++i) st = alloc_resources(&ctxs[i], streams ? streams[i] : NULL);
    /* Warm-up along the chain, all ranks in one group (one thread drives them all). */
    for (int i = 0; st == MK_OK && i < n; ++i) st = stage_warmup(&ctxs[i]);
    if (st == MK_OK && n > 1) {
        ncclResult_t r = ncclSuccess;
        ncclGroupStart();
        for (int i = 0; i < n && r == ncclSuccess; ++i) r = post_warmup(&ctxs[i], i - 1, i + 1 < n ? i + 1 : -1);
        const ncclResult_t ge = ncclGroupEnd();
        for (int i = 0; st == MK_OK && i < n; ++i) st = settle(&ctxs[i], r != ncclSuccess ? r : ge, deadline, "warm-up");
        for (int i = 0; st == MK_OK && i < n; ++i) st = finish_warmup(&ctxs[i], i - 1, deadline);
    }
    if (st != MK_OK)
        for (int i = 0; i < n; ++i) {
            if (ctxs[i].comm) ncclCommAbort(ctxs[i].comm); /* release the others before waiting */
            ctxs[i].comm = NULL;
        }
    if (st != MK_OK)
        for (int i = 0; i < n; ++i) mk_nccl_ctx_destroy(&ctxs[i]);
    return st;
}

/* =============================================================== exchange == */

mk_status mk_nccl_send_post(mk_nccl_ctx *ctx, int peer, const void *header, size_t header_bytes,
                            const void *payload_dev, size_t payload_bytes) {
    MK_TRY(check_alive(ctx));
    if ((!header && header_bytes) || (!payload_dev && payload_bytes) || header_bytes > MK_NCCL_HEADER_MAX ||
        peer < 0 || peer >= ctx->nranks)
        return mk_fail(MK_ERR_INVALID_ARGUMENT,
                       "nccl seam rank %d: send to rank %d of %d: header %zu bytes (max %u), payload %zu bytes",
                       ctx->rank, peer, ctx->nranks, header_bytes, MK_NCCL_HEADER_MAX, payload_bytes);
    if (ctx->send_pending)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "nccl seam rank %d: a send is already pending (wait for it first)",
                       ctx->rank);
    const int64_t deadline = deadline_after(ctx->deadline_ms);
    MK_CUDA_CHECK(cudaSetDevice(ctx->device));
    put_envelope(ctx->send_block_host, header_bytes, payload_bytes);
    if (header_bytes) memcpy(ctx->send_block_host + MK_NCCL_ENVELOPE_BYTES, header, header_bytes);
    MK_CUDA_CHECK(cudaMemcpyAsync(ctx->send_block_dev, ctx->send_block_host, MK_NCCL_HEADER_BLOCK,
                                  cudaMemcpyHostToDevice, ctx->stream));
    /* Two operations, not one group: the header must be able to complete on its own while
     * the payload send waits for the receiver's check and its payload receive. */
    MK_TRY(settle(ctx, ncclSend(ctx->send_block_dev, MK_NCCL_HEADER_BLOCK, ncclUint8, peer, ctx->comm, ctx->stream),
                  deadline, "header send"));
    if (payload_bytes)
        MK_TRY(settle(ctx, ncclSend(payload_dev, payload_bytes, ncclUint8, peer, ctx->comm, ctx->stream), deadline,
                      "payload send"));
    MK_CUDA_CHECK(cudaEventRecord(ctx->send_done, ctx->stream));
    ctx->send_pending = 1;
    ctx->send_deadline_ns = deadline;
    return MK_OK;
}

mk_status mk_nccl_send_wait(mk_nccl_ctx *ctx) {
    MK_TRY(check_alive(ctx));
    if (!ctx->send_pending)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "nccl seam rank %d: no send pending", ctx->rank);
    MK_CUDA_CHECK(cudaSetDevice(ctx->device));
    MK_TRY(wait_event(ctx, ctx->send_done, ctx->send_deadline_ns, "send"));
    ctx->send_pending = 0;
    ctx->sent++;
    return MK_OK;
}

mk_status mk_nccl_send(mk_nccl_ctx *ctx, int peer, const void *header, size_t header_bytes, const void *payload_dev,
                       size_t payload_bytes) {
    MK_TRY(mk_nccl_send_post(ctx, peer, header, header_bytes, payload_dev, payload_bytes));
    return mk_nccl_send_wait(ctx);
}

mk_status mk_nccl_recv(mk_nccl_ctx *ctx, int peer, mk_nccl_header_check check, void *user, void *header_out,
                       size_t header_cap, size_t *header_bytes, void *payload_dev, size_t payload_cap,
                       size_t *payload_bytes) {
    MK_TRY(check_alive(ctx));
    if (!header_bytes || !payload_bytes || (!header_out && header_cap) || (!payload_dev && payload_cap) || peer < 0 ||
        peer >= ctx->nranks)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "nccl seam rank %d: receive from rank %d of %d: bad arguments",
                       ctx->rank, peer, ctx->nranks);
    *header_bytes = 0;
    *payload_bytes = 0;
    const int64_t deadline = deadline_after(ctx->deadline_ms);
    MK_CUDA_CHECK(cudaSetDevice(ctx->device));

    /* 1. The header block, to the host. */
    const ncclResult_t r = ncclRecv(ctx->recv_block_dev, MK_NCCL_HEADER_BLOCK, ncclUint8, peer, ctx->comm, ctx->stream);
    MK_TRY(settle(ctx, r, deadline, "header receive"));
    MK_CUDA_CHECK(cudaMemcpyAsync(ctx->recv_block_host, ctx->recv_block_dev, MK_NCCL_HEADER_BLOCK,
                                  cudaMemcpyDeviceToHost, ctx->stream));
    MK_CUDA_CHECK(cudaEventRecord(ctx->recv_done, ctx->stream));
    MK_TRY(wait_event(ctx, ctx->recv_done, deadline, "header receive"));

    /* 2. The envelope, then the receiver's limits, then the caller's check. */
    const unsigned char *b = ctx->recv_block_host;
    const uint64_t magic = get_le(b, 4), version = get_le(b + 4, 4);
    const uint64_t hb = get_le(b + 8, 8), pb = get_le(b + 16, 8);
    if (magic != MK_NCCL_MAGIC || version != MK_NCCL_VERSION)
        return fail_abort(ctx, MK_ERR_FRAME, "header block from rank %d: magic %08llx version %llu, want %08x version %u",
                          peer, (unsigned long long)magic, (unsigned long long)version, MK_NCCL_MAGIC,
                          MK_NCCL_VERSION);
    if (hb > MK_NCCL_HEADER_MAX || hb > header_cap)
        return fail_abort(ctx, MK_ERR_FRAME, "header from rank %d declares %llu bytes; the receiver takes at most %zu",
                          peer, (unsigned long long)hb, header_cap < MK_NCCL_HEADER_MAX ? header_cap : MK_NCCL_HEADER_MAX);
    if (pb > payload_cap)
        return fail_abort(ctx, MK_ERR_FRAME,
                          "header from rank %d declares a payload of %llu bytes; the receiver's buffer holds %zu",
                          peer, (unsigned long long)pb, payload_cap);
    if (hb) memcpy(header_out, b + MK_NCCL_ENVELOPE_BYTES, (size_t)hb);
    *header_bytes = (size_t)hb;
    if (check) {
        const mk_status st = check(user, header_out, (size_t)hb, (size_t)pb);
        if (st != MK_OK) {
            /* The check's message stays the one reported; the communicator goes. */
            if (ctx->comm) ncclCommAbort(ctx->comm);
            ctx->comm = NULL;
            ctx->send_pending = 0;
            return st;
        }
    }

    /* 3. Only now the payload, into the caller's buffer. */
    if (pb) {
        const ncclResult_t rp = ncclRecv(payload_dev, (size_t)pb, ncclUint8, peer, ctx->comm, ctx->stream);
        MK_TRY(settle(ctx, rp, deadline, "payload receive"));
        MK_CUDA_CHECK(cudaEventRecord(ctx->recv_done, ctx->stream));
        MK_TRY(wait_event(ctx, ctx->recv_done, deadline, "payload receive"));
    }
    *payload_bytes = (size_t)pb;
    ctx->received++;
    return MK_OK;
}
