/* The NCCL seam transport (MK_SEAM_NCCL) on the primitives of nccl_comm.h: the boundary
 * header encoded into the 512-byte header block, the contract (seam.c's check) run on it
 * before the payload receive is posted into the receiving range's preallocated device
 * buffer, the payload device-to-device on the ranges' own streams.
 *
 * In one process a pair is a two-rank communicator (rank 0 the sender's device, rank 1 the
 * receiver's) made by the one-process bootstrap; NCCL refuses two ranks on one GPU, so the
 * two ranges must sit on distinct devices. One thread drives both ends without deadlock:
 * mk_seam_send only posts (header and payload sends queue on the sender's stream), the
 * receive completes them, mk_seam_send_wait then finds the send done. Across processes
 * each end is rank 0 (sender) or 1 (receiver) of its own communicator, joined through the
 * unique id in a file. */
#include "seam/nccl/nccl_seam.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mk_error.h"
#include "seam/nccl/nccl_comm.h"
#include "seam/seam.h"

#define MK_NCCL_HEADER_TAG 0x32484b4du /* "MKH2": 1 had no count of the entries to come */

/* ========================================================== header coding == */

static unsigned char *put(unsigned char *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) p[i] = (unsigned char)(v >> (8 * i));
    return p + bytes;
}

static const unsigned char *get(const unsigned char *p, uint64_t *v, int bytes) {
    *v = 0;
    for (int i = 0; i < bytes; ++i) *v |= (uint64_t)p[i] << (8 * i);
    return p + bytes;
}

static unsigned char *put_str(unsigned char *p, const char *s, size_t field) {
    memset(p, 0, field);
    memcpy(p, s, strnlen(s, field - 1));
    return p + field;
}

/* A string field must end within itself: a peer's unterminated bytes are refused. */
static const unsigned char *get_str(const unsigned char *p, char *s, size_t field, bool *ok) {
    if (memchr(p, 0, field) == NULL) *ok = false;
    memcpy(s, p, field);
    s[field - 1] = '\0';
    return p + field;
}

void mk_nccl_header_encode(const mk_boundary_header *h, unsigned more, unsigned char out[MK_NCCL_BOUNDARY_HEADER_BYTES]) {
    unsigned char *p = out;
    p = put(p, MK_NCCL_HEADER_TAG, 4);
    p = put(p, h->schema_version, 4);
    p = put(p, (uint64_t)h->architecture, 4);
    p = put_str(p, h->adapter, sizeof h->adapter);
    p = put_str(p, h->tensor_name, sizeof h->tensor_name);
    p = put_str(p, h->boundary_point, sizeof h->boundary_point);
    p = put(p, (uint64_t)h->next_layer, 8);
    p = put(p, h->normalized ? 1u : 0u, 1);
    p = put_str(p, h->recipe_digest, sizeof h->recipe_digest);
    p = put_str(p, h->request_id, sizeof h->request_id);
    p = put(p, h->batch, 8);
    p = put(p, h->rows, 8);
    p = put(p, h->hidden, 8);
    p = put(p, (uint64_t)h->dtype, 4);
    p = put(p, h->step, 8);
    p = put(p, (uint64_t)h->position, 8);
    (void)put(p, more, 2);
}

mk_status mk_nccl_header_decode(const unsigned char *in, size_t bytes, mk_boundary_header *h, unsigned *more) {
    if (bytes != MK_NCCL_BOUNDARY_HEADER_BYTES)
        return mk_fail(MK_ERR_FRAME, "nccl seam: a boundary header is %u bytes, the peer sent %zu",
                       MK_NCCL_BOUNDARY_HEADER_BYTES, bytes);
    memset(h, 0, sizeof *h);
    uint64_t v = 0;
    bool ok = true;
    const unsigned char *p = get(in, &v, 4);
    if (v != MK_NCCL_HEADER_TAG) return mk_fail(MK_ERR_FRAME, "nccl seam: the header block holds no boundary header");
    p = get(p, &v, 4);
    h->schema_version = (uint32_t)v;
    p = get(p, &v, 4);
    h->architecture = (mk_protocol_arch)v;
    p = get_str(p, h->adapter, sizeof h->adapter, &ok);
    p = get_str(p, h->tensor_name, sizeof h->tensor_name, &ok);
    p = get_str(p, h->boundary_point, sizeof h->boundary_point, &ok);
    p = get(p, &v, 8);
    h->next_layer = (int64_t)v;
    p = get(p, &v, 1);
    h->normalized = v != 0;
    p = get_str(p, h->recipe_digest, sizeof h->recipe_digest, &ok);
    p = get_str(p, h->request_id, sizeof h->request_id, &ok);
    p = get(p, &v, 8);
    h->batch = (size_t)v;
    p = get(p, &v, 8);
    h->rows = (size_t)v;
    p = get(p, &v, 8);
    h->hidden = (size_t)v;
    p = get(p, &v, 4);
    h->dtype = (mk_dtype)v;
    p = get(p, &v, 8);
    h->step = v;
    p = get(p, &v, 8);
    h->position = (int64_t)v;
    (void)get(p, &v, 2);
    if (!ok) return mk_fail(MK_ERR_FRAME, "nccl seam: a string of the boundary header is not terminated");
    if (v >= MK_MAX_BATCH_SEQUENCES)
        return mk_fail(MK_ERR_FRAME, "nccl seam: a header says %llu entries of its batch follow; a batch holds %d",
                       (unsigned long long)v, MK_MAX_BATCH_SEQUENCES);
    if (more) *more = (unsigned)v;
    return MK_OK;
}

/* ============================================================== transport == */

/* Shared by the two ends of an in-process pair (n = 2: ctx[0] sends, ctx[1] receives), or
 * one end's own (n = 1). */
typedef struct mk_nccl_link {
    int refs;
    int n;
    mk_nccl_ctx ctx[2];
} mk_nccl_link;

enum { MK_SENDER_RANK = 0, MK_RECEIVER_RANK = 1 };

static mk_nccl_ctx *end_ctx(mk_seam *s) {
    mk_nccl_link *link = s->impl;
    return link->n == 2 && !s->sender ? &link->ctx[1] : &link->ctx[0];
}

/* The primitives select their device; the caller's current device is restored, as the
 * cuda backend does. */
static int current_device(void) {
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess) (void)cudaGetLastError();
    return d;
}

static void restore_device(int d) {
    if (cudaSetDevice(d) != cudaSuccess) (void)cudaGetLastError();
}

/* A batch crosses as one exchange per entry, each header saying how many follow. An
 * exchange completes when the receiver takes it, so each entry's send waits for the one
 * before; the last stays pending (mk_seam_send_wait). In one process one thread drives both
 * ends and cannot wait for itself: there a message is one sequence. */
static mk_status nccl_send(mk_seam *s, const mk_boundary *const *batch, size_t n) {
    mk_nccl_link *link = s->impl;
    if (n != 1 && link->n == 2)
        return mk_fail(MK_ERR_UNSUPPORTED,
                       "nccl seam: in one process a message is one sequence (one thread drives both ends); send the "
                       "%zu boundaries one by one", n);
    const int dev = current_device();
    mk_status st = MK_OK;
    for (size_t k = 0; k < n && st == MK_OK; k++) {
        const mk_boundary *b = batch[k];
        unsigned char header[MK_NCCL_BOUNDARY_HEADER_BYTES];
        mk_nccl_header_encode(&b->h, (unsigned)(n - 1 - k), header);
        const size_t bytes = b->h.batch * b->h.rows * b->h.hidden * sizeof(float);
        if (k > 0) st = mk_nccl_send_wait(end_ctx(s));
        if (st == MK_OK) st = mk_nccl_send_post(end_ctx(s), MK_RECEIVER_RANK, header, sizeof header, b->payload, bytes);
        if (st == MK_OK) s->bytes += bytes;
    }
    restore_device(dev);
    return st;
}

static mk_status nccl_send_wait(mk_seam *s) {
    mk_nccl_ctx *ctx = end_ctx(s);
    if (!ctx->send_pending) return MK_OK; /* nothing posted (or a failure already reported) */
    const int dev = current_device();
    const mk_status st = mk_nccl_send_wait(ctx);
    restore_device(dev);
    return st;
}

static mk_status nccl_recv_header(mk_seam *s, mk_boundary_header *h, size_t cap, size_t *n) {
    (void)s;
    (void)h;
    (void)cap;
    (void)n;
    return mk_fail(MK_ERR_INTERNAL, "nccl seam: header and payload are received together");
}

static mk_status nccl_recv_payload(mk_seam *s, size_t k, mk_boundary *into) {
    (void)s;
    (void)k;
    (void)into;
    return mk_fail(MK_ERR_INTERNAL, "nccl seam: header and payload are received together");
}

typedef struct recv_check_args {
    mk_seam_check check;
    void *user;
    mk_boundary_header h;
    unsigned more;
} recv_check_args;

/* Run by the primitives between the header block and the payload receive: decode, the
 * contract (seam.c's), then the declared payload against the header's own shape. */
static mk_status header_check(void *user, const void *header, size_t header_bytes, size_t payload_bytes) {
    recv_check_args *a = user;
    MK_TRY(mk_nccl_header_decode(header, header_bytes, &a->h, &a->more));
    MK_TRY(a->check(a->user, &a->h));
    const mk_boundary_header *h = &a->h;
    const size_t want = h->batch * h->rows * h->hidden * sizeof(float); /* bounded by the contract */
    if (payload_bytes != want)
        return mk_fail(MK_ERR_FRAME,
                       "nccl seam: header and payload sizes disagree: the header describes %zu x %zu x %zu floats "
                       "(%zu bytes), the payload is %zu bytes; communicator aborted",
                       h->batch, h->rows, h->hidden, want, payload_bytes);
    return MK_OK;
}

static mk_status nccl_recv_checked(mk_seam *s, mk_seam_check check, void *user, mk_boundary *into, size_t *more) {
    recv_check_args args = {check, user, {0}, 0};
    unsigned char header[MK_NCCL_BOUNDARY_HEADER_BYTES];
    size_t header_bytes = 0, payload_bytes = 0;
    const size_t cap = into->capacity_rows * mk_range_hidden(into->range) * sizeof(float);
    const int dev = current_device();
    const mk_status st = mk_nccl_recv(end_ctx(s), MK_SENDER_RANK, header_check, &args, header, sizeof header,
                                      &header_bytes, into->payload, cap, &payload_bytes);
    restore_device(dev);
    if (st != MK_OK) return st;
    into->h = args.h;
    *more = args.more;
    s->bytes += payload_bytes;
    return MK_OK;
}

static void nccl_destroy(mk_seam *s) {
    mk_nccl_link *link = s->impl;
    if (!link || --link->refs > 0) return;
    const int dev = current_device();
    /* Each rank finalizes within its deadline (aborts past it, or with a send pending), then
     * waits for its stream (the range's) and frees its blocks: the ranges outlive their seams. */
    for (int i = 0; i < link->n; ++i) mk_nccl_ctx_destroy(&link->ctx[i]);
    restore_device(dev);
    free(link);
}

static const mk_seam_ops mk_nccl_ops = {
    .name = "nccl",
    .send = nccl_send,
    .send_wait = nccl_send_wait,
    .recv_header = nccl_recv_header,
    .recv_payload = nccl_recv_payload,
    .recv_checked = nccl_recv_checked,
    .destroy = nccl_destroy,
};

/* A range's device and stream, or a clear refusal when it has none (cpu). */
static mk_status range_place(const mk_range *range, const char *which, int *device, cudaStream_t *stream) {
    mk_backend *b = mk_range_backend(range);
    void *native = b->ops->native_stream ? b->ops->native_stream(b) : NULL;
    if (!native)
        return mk_fail(MK_ERR_UNSUPPORTED, "nccl seam: the %s range is on the %s backend; NCCL needs the cuda backend",
                       which, b->ops->name);
    *device = b->config.device;
    *stream = (cudaStream_t)native;
    return MK_OK;
}

static int timeout_or(int ms, int fallback) { return ms > 0 ? ms : fallback; }

mk_status mk_seam_nccl_pair(mk_seam *tx, mk_seam *rx) {
    int devices[2];
    cudaStream_t streams[2];
    MK_TRY(range_place(tx->range, "sending", &devices[0], &streams[0]));
    MK_TRY(range_place(rx->range, "receiving", &devices[1], &streams[1]));
    if (devices[0] == devices[1])
        return mk_fail(MK_ERR_UNSUPPORTED,
                       "nccl seam: both ranges are on cuda device %d; NCCL refuses two ranks on one GPU, so place the "
                       "ranges on distinct devices (e.g. --devices 0,1), or use the local seam",
                       devices[0]);
    mk_nccl_link *link = calloc(1, sizeof *link);
    if (!link) return mk_fail(MK_ERR_OUT_OF_MEMORY, "nccl seam: out of memory");
    const int dev = current_device();
    const mk_status st = mk_nccl_init_all(link->ctx, 2, devices, streams, timeout_or(tx->options.connect_timeout_ms, 5000));
    restore_device(dev);
    if (st != MK_OK) {
        free(link);
        return st;
    }
    for (int i = 0; i < 2; ++i) link->ctx[i].deadline_ms = timeout_or(tx->options.io_timeout_ms, 30000);
    link->n = 2;
    link->refs = 2;
    tx->impl = rx->impl = link;
    tx->ops = rx->ops = &mk_nccl_ops;
    return MK_OK;
}

mk_status mk_seam_nccl_publish(const char *id_path) {
    ncclUniqueId id;
    MK_TRY(mk_nccl_id_create(&id));
    return mk_nccl_id_write_file(id_path, &id);
}

mk_status mk_seam_nccl_id_new(unsigned char *id, size_t cap) {
    if (cap < sizeof(ncclUniqueId)) return mk_fail(MK_ERR_INTERNAL, "nccl seam: an id needs %zu bytes", sizeof(ncclUniqueId));
    ncclUniqueId u;
    MK_TRY(mk_nccl_id_create(&u));
    memcpy(id, &u, sizeof u);
    return MK_OK;
}

mk_status mk_seam_nccl_join_id(mk_seam *s, const unsigned char *id_bytes, size_t len) {
    if (len != sizeof(ncclUniqueId))
        return mk_fail(MK_ERR_FRAME, "nccl seam: a unique id is %zu bytes, not %zu", sizeof(ncclUniqueId), len);
    int device = 0;
    cudaStream_t stream = NULL;
    MK_TRY(range_place(s->range, s->sender ? "sending" : "receiving", &device, &stream));
    const int connect_ms = timeout_or(s->options.connect_timeout_ms, 5000);
    ncclUniqueId id;
    memcpy(&id, id_bytes, sizeof id);
    mk_nccl_link *link = calloc(1, sizeof *link);
    if (!link) return mk_fail(MK_ERR_OUT_OF_MEMORY, "nccl seam: out of memory");
    link->n = 1;
    link->refs = 1;
    const int dev = current_device();
    const int rank = s->sender ? MK_SENDER_RANK : MK_RECEIVER_RANK;
    mk_status st = mk_nccl_init_rank(&link->ctx[0], 2, rank, &id, device, stream, connect_ms);
    /* The first exchange at setup, not inside a step (NCCL connects lazily). */
    if (st == MK_OK)
        st = s->sender ? mk_nccl_warmup(&link->ctx[0], -1, MK_RECEIVER_RANK)
                       : mk_nccl_warmup(&link->ctx[0], MK_SENDER_RANK, -1);
    if (st != MK_OK) {
        mk_nccl_ctx_destroy(&link->ctx[0]);
        restore_device(dev);
        free(link);
        return st;
    }
    restore_device(dev);
    link->ctx[0].deadline_ms = timeout_or(s->options.io_timeout_ms, 30000);
    s->impl = link;
    s->ops = &mk_nccl_ops;
    return MK_OK;
}

mk_status mk_seam_nccl_join(mk_seam *s, const char *id_path) {
    ncclUniqueId id;
    MK_TRY(mk_nccl_id_read_file(id_path, &id, timeout_or(s->options.connect_timeout_ms, 5000)));
    return mk_seam_nccl_join_id(s, (const unsigned char *)&id, sizeof id);
}
