/* The stream transport: a boundary, or a batch of several sequences' boundaries, as one
 * framed TensorBundle (schema 1, or 2 with an entry per sequence) over a Unix or TCP
 * socket, optionally inside TLS 1.3.
 *
 * Send (calling thread): device -> pinned staging (async copy on the range's stream, then
 * a wait), positions from the header, TensorBundle packed straight from the staging
 * buffer into the pinned frame buffer behind a 16-byte frame header. What the socket
 * takes at once is written by the caller; the rest by the seam's own I/O thread, so the
 * caller can go on (and, in one process, receive it). Receive: frame header (magic, version, length <= this range's limit),
 * body into a pinned buffer sized for the limit once, decoded in place (no payload
 * copy), header validated by seam.c, payload checked finite and uploaded.
 *
 * Once a frame is cut short or over the limit the byte stream is out of step: the end
 * is broken and every later call reports the first failure. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "protocol/bundle_codec.h"
#include "seam/frame.h"
#include "net/io.h"
#include "mk_error.h"
#include "seam/seam.h"

#define MK_DEFAULT_IO_MS 30000

typedef struct mk_stream {
    mk_io io;
    SSL_CTX *tls;
    mk_backend *backend;  /* of this end's range: staging buffers come from it */
    int io_timeout_ms;
    /* sending end */
    void *staging;        /* pinned [max_rows, hidden] f32 */
    int32_t *positions;   /* [max_rows] */
    uint8_t *frame;       /* pinned: frame header + body */
    size_t frame_cap;
    bool thread_started;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool pending, quit;
    const uint8_t *job;   /* the frame inside `frame` (shifted for alignment) */
    size_t job_len;
    mk_status job_status;
    char job_error[512];
    /* receiving end */
    uint8_t *body;        /* pinned [limit] */
    uint64_t limit;
    const uint8_t *rows[MK_MAX_BATCH_SEQUENCES]; /* each entry's rows in body, after recv_header */
    size_t hidden;
    /* a failure that left the stream out of step */
    mk_status broken;
    char broken_error[512];
} mk_stream;

static mk_status mk_stream_break(mk_stream *st, mk_status s) {
    st->broken = s;
    snprintf(st->broken_error, sizeof st->broken_error, "%s", mk_last_error());
    return s;
}

static mk_status mk_stream_check_broken(const mk_stream *st) {
    if (st->broken == MK_OK) return MK_OK;
    return mk_fail(st->broken, "%s (seam unusable since)", st->broken_error);
}

/* ============================================================ I/O thread == */

static void *mk_stream_writer(void *arg) {
    mk_stream *st = arg;
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, NULL); /* this thread's writes never raise SIGPIPE */
    pthread_mutex_lock(&st->mu);
    for (;;) {
        while (!st->pending && !st->quit) pthread_cond_wait(&st->cv, &st->mu);
        if (st->quit) break;
        const size_t len = st->job_len;
        const uint8_t *frame = st->job;
        pthread_mutex_unlock(&st->mu);
        const int64_t deadline = mk_deadline_ms(st->io_timeout_ms, MK_DEFAULT_IO_MS);
        mk_clear_error();
        const mk_status s = mk_io_write(&st->io, frame, len, deadline, "frame");
        pthread_mutex_lock(&st->mu);
        st->job_status = s;
        snprintf(st->job_error, sizeof st->job_error, "%s", mk_last_error());
        st->pending = false;
        pthread_cond_broadcast(&st->cv);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

static mk_status stream_send_wait(mk_seam *s) {
    mk_stream *st = s->impl;
    MK_TRY(mk_stream_check_broken(st));
    if (!st->thread_started) return MK_OK;
    pthread_mutex_lock(&st->mu);
    while (st->pending) pthread_cond_wait(&st->cv, &st->mu);
    const mk_status status = st->job_status;
    char error[512];
    snprintf(error, sizeof error, "%s", st->job_error);
    st->job_status = MK_OK;
    pthread_mutex_unlock(&st->mu);
    if (status != MK_OK) {
        mk_fail(status, "%s", error);
        return mk_stream_break(st, status);
    }
    return MK_OK;
}

/* ================================================================== send == */

static mk_status stream_send(mk_seam *s, const mk_boundary *const *b, size_t n) {
    mk_stream *st = s->impl;
    MK_TRY(stream_send_wait(s)); /* one frame buffer: the previous write must be done */
    const void *rows[MK_MAX_BATCH_SEQUENCES];
    const mk_boundary_header *h[MK_MAX_BATCH_SEQUENCES];
    MK_TRY(mk_seam_stage_rows(st->backend, b, n, st->staging, st->positions, rows, h));
    mk_bundle_message m;
    MK_TRY(mk_bundle_message_describe_batch(h, n, rows, st->positions, &m));
    const size_t len = mk_bundle_message_size(&m);
    if (len + MK_FRAME_HEADER_BYTES + MK_FRAME_ALIGN > st->frame_cap)
        return mk_fail(MK_ERR_INTERNAL, "stream seam: a frame of %zu bytes exceeds the %zu-byte frame buffer", len,
                       st->frame_cap);
    /* Start the frame so the payload lands 64-byte aligned: the pack's copy runs at full speed. */
    const size_t offset = mk_bundle_message_payload_offset(&m);
    uint8_t *frame = st->frame + mk_frame_shift(MK_FRAME_HEADER_BYTES + offset);
    mk_frame_header_encode(frame, len, (unsigned)(offset % MK_FRAME_ALIGN));
    mk_bundle_message_pack(&m, frame + MK_FRAME_HEADER_BYTES);
    s->bytes += len + MK_FRAME_HEADER_BYTES;
    /* What the socket takes at once is written here (a decode step's frame, usually all
     * of it: no thread hand-off on the latency path); the rest goes to the I/O thread. */
    size_t written = 0;
    const mk_status now = mk_io_write_now(&st->io, frame, len + MK_FRAME_HEADER_BYTES, &written, "frame");
    if (now != MK_OK) return mk_stream_break(st, now);
    if (written == len + MK_FRAME_HEADER_BYTES) return MK_OK;
    if (!st->thread_started) {
        if (pthread_create(&st->thread, NULL, mk_stream_writer, st) != 0)
            return mk_fail(MK_ERR_INTERNAL, "stream seam: cannot start the I/O thread");
        st->thread_started = true;
    }
    pthread_mutex_lock(&st->mu);
    st->job = frame + written;
    st->job_len = len + MK_FRAME_HEADER_BYTES - written;
    st->pending = true;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    return MK_OK;
}

/* =============================================================== receive == */

static mk_status stream_recv_header(mk_seam *s, mk_boundary_header *h, size_t cap, size_t *n) {
    mk_stream *st = s->impl;
    MK_TRY(mk_stream_check_broken(st));
    const int64_t deadline = mk_deadline_ms(st->io_timeout_ms, MK_DEFAULT_IO_MS);
    uint8_t head[MK_FRAME_HEADER_BYTES];
    uint64_t len = 0;
    unsigned align = 0;
    mk_status r = mk_io_read(&st->io, head, sizeof head, deadline, "frame header");
    if (r == MK_OK) r = mk_frame_header_decode(head, st->limit, &len, &align);
    uint8_t *body = st->body + mk_frame_shift(align); /* the payload lands aligned if the hint is right */
    /* The body follows its header at the link's speed: a peer that stalls inside a frame (no
     * byte for a quarter of the wait) is found then, not at the wait's end (a stage's rank 0
     * would take the stalled receiver for the silent one first); a big frame on a slow link
     * that keeps moving is not cut. */
    const int wait_ms = st->io_timeout_ms > 0 ? st->io_timeout_ms : MK_DEFAULT_IO_MS;
    if (r == MK_OK) r = mk_io_read_live(&st->io, body, (size_t)len, deadline, wait_ms >= 4 ? wait_ms / 4 : 1, "frame body");
    if (r != MK_OK) return mk_stream_break(st, r);
    s->bytes += MK_FRAME_HEADER_BYTES + (size_t)len;
    /* The frame was read whole: a refused boundary leaves the stream in step. */
    return mk_bundle_decode_batch(body, (size_t)len, h, cap, n, st->rows);
}

static mk_status stream_recv_payload(mk_seam *s, size_t k, mk_boundary *into) {
    mk_stream *st = s->impl;
    const mk_boundary_header *h = &into->h; /* seam.c put entry k's accepted header there */
    MK_TRY(mk_boundary_rows_finite(st->rows[k], h));
    MK_TRY(st->backend->ops->upload_async(st->backend, into->payload, st->rows[k], h->rows * h->hidden * sizeof(float)));
    /* The body buffer is the next frame's: the upload out of it must be complete. */
    return st->backend->ops->synchronize(st->backend);
}

/* ============================================================= lifecycle == */

static void stream_destroy(mk_seam *s) {
    mk_stream *st = s->impl;
    if (!st) return;
    if (st->thread_started) {
        /* A write blocked on a silent peer ends now, not at its deadline. */
        if (st->io.fd >= 0) shutdown(st->io.fd, SHUT_RDWR);
        pthread_mutex_lock(&st->mu);
        st->quit = true;
        pthread_cond_broadcast(&st->cv);
        pthread_mutex_unlock(&st->mu);
        pthread_join(st->thread, NULL);
    }
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
    mk_io_close(&st->io);
    mk_tls_context_free(st->tls);
    if (st->staging) st->backend->ops->host_release(st->backend, st->staging);
    if (st->frame) st->backend->ops->host_release(st->backend, st->frame);
    if (st->body) st->backend->ops->host_release(st->backend, st->body);
    free(st->positions);
    free(st);
    s->impl = NULL;
}

static const mk_seam_ops mk_stream_ops = {
    .name = "stream",
    .send = stream_send,
    .send_wait = stream_send_wait,
    .recv_header = stream_recv_header,
    .recv_payload = stream_recv_payload,
    .destroy = stream_destroy,
};

/* The rest of an end: st (its io set) becomes s's state, buffers sized by this end's range. */
static mk_status mk_stream_fill(mk_seam *s, mk_stream *st, bool tls_server) {
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    s->impl = st;
    s->ops = &mk_stream_ops;
    st->backend = mk_range_backend(s->range);
    st->io_timeout_ms = s->options.io_timeout_ms;
    const size_t rows = mk_range_max_rows(s->range), hidden = mk_range_hidden(s->range);
    const uint64_t limit = mk_frame_limit(rows, hidden);
    if (s->sender) {
        st->frame_cap = (size_t)limit + MK_FRAME_HEADER_BYTES + MK_FRAME_ALIGN;
        st->positions = malloc(rows * sizeof(int32_t));
        if (!st->positions) return mk_fail(MK_ERR_OUT_OF_MEMORY, "stream seam: out of memory");
        if (!st->backend->ops->host_addressable)
            MK_TRY(st->backend->ops->host_alloc(st->backend, rows * hidden * sizeof(float), &st->staging));
        MK_TRY(st->backend->ops->host_alloc(st->backend, st->frame_cap, (void **)&st->frame));
    } else {
        st->limit = limit; /* the receiver's own limit, never the sender's word */
        MK_TRY(st->backend->ops->host_alloc(st->backend, (size_t)limit + MK_FRAME_ALIGN, (void **)&st->body));
    }
    if (s->options.tls.enabled && !st->io.ssl) { /* adopted ends come with their session */
        MK_TRY(mk_tls_context(&s->options.tls, tls_server, &st->tls));
        MK_TRY(mk_tls_attach(&st->io, st->tls, tls_server));
    }
    return MK_OK;
}

/* One end over a connected fd (taken over, closed on failure too): buffers sized by this
 * end's range, TLS attached (handshake left to the caller). */
static mk_status mk_stream_init(mk_seam *s, int fd, bool tls_server) {
    mk_stream *st = calloc(1, sizeof *st);
    if (!st) {
        if (fd >= 0) close(fd);
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "stream seam: out of memory");
    }
    st->io = (mk_io){.fd = fd, .ssl = NULL};
    return mk_stream_fill(s, st, tls_server);
}

mk_status mk_seam_stream_adopt(mk_seam *s, mk_io io, SSL_CTX *tls) {
    mk_stream *st = calloc(1, sizeof *st);
    if (!st) {
        mk_io_close(&io);
        mk_tls_context_free(tls);
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "stream seam: out of memory");
    }
    st->io = io;
    st->tls = tls;
    return mk_stream_fill(s, st, false);
}

int mk_seam_stream_fd(const mk_seam *s) {
    if (!s || s->ops != &mk_stream_ops || !s->impl) return -1;
    const mk_stream *st = s->impl;
    return st->io.fd;
}

mk_status mk_seam_stream_write_raw(mk_seam *s, const void *bytes, size_t n) {
    if (!s || s->ops != &mk_stream_ops || !s->impl) return mk_fail(MK_ERR_INVALID_ARGUMENT, "not a stream seam end");
    MK_TRY(stream_send_wait(s));
    mk_stream *st = s->impl;
    return mk_io_write(&st->io, bytes, n, mk_deadline_ms(st->io_timeout_ms, MK_DEFAULT_IO_MS), "raw bytes");
}

mk_status mk_seam_stream_end(mk_seam *s, int fd, bool tls_server_side, int64_t deadline) {
    MK_TRY(mk_stream_init(s, fd, tls_server_side));
    mk_stream *st = s->impl;
    if (st->io.ssl) MK_TRY(mk_tls_handshake(&st->io, NULL, deadline));
    return MK_OK;
}

mk_status mk_seam_stream_pair(mk_seam *tx, mk_seam *rx) {
    const int64_t deadline = mk_deadline_ms(tx->options.connect_timeout_ms, 5000);
    int fds[2] = {-1, -1};
    if (tx->kind == MK_SEAM_UNIX && !tx->options.address) {
        MK_TRY(mk_socket_pair(fds));
    } else {
        /* A listener of our own: loopback unless the address names another interface. */
        int lfd = -1;
        char bound[300];
        MK_TRY(mk_socket_listen(tx->kind, tx->options.address, &lfd, bound, sizeof bound));
        mk_status s = mk_socket_connect(tx->kind, bound, deadline, &fds[0]);
        if (s == MK_OK) s = mk_socket_accept(lfd, deadline, &fds[1]);
        close(lfd);
        if (tx->kind == MK_SEAM_UNIX) (void)unlink(bound);
        if (s != MK_OK) {
            if (fds[0] >= 0) close(fds[0]);
            return s;
        }
    }
    mk_status s = mk_stream_init(tx, fds[0], false);
    fds[0] = -1;
    if (s == MK_OK) {
        s = mk_stream_init(rx, fds[1], true);
        fds[1] = -1;
    }
    if (fds[1] >= 0) close(fds[1]);
    if (s == MK_OK && tx->options.tls.enabled) {
        mk_stream *a = tx->impl, *b = rx->impl;
        s = mk_tls_handshake(&a->io, &b->io, deadline);
    }
    return s;
}
