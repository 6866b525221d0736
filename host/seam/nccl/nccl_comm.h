/* NCCL seam primitives: one communicator endpoint per transport, bootstrap helpers, and a
 * header + payload exchange in which every operation has a deadline.
 *
 * Compiled against the real nccl.h and linked either with libnccl (nvcc builds) or with
 * tests/cudasim's stand-in (mk_link_nccl_seam in host/seam/nccl/CMakeLists.txt).
 *
 * The exchange. A send is a fixed-size header block (MK_NCCL_HEADER_BLOCK bytes: a small
 * envelope with magic, version and the two sizes, then the caller's header bytes) and a
 * payload taken straight from device memory, two sends posted on the endpoint's stream (not
 * grouped: the header completes while the payload send waits for the receiver). Warm-ups,
 * where one thread sends and receives, are grouped. The receiver takes the header block first, checks the envelope, checks the
 * declared payload size against its own buffer (limits come from the receiver), and hands
 * the header to the caller's check (the boundary contract) BEFORE it posts the payload
 * receive into the caller's preallocated device buffer. Any refusal aborts the
 * communicator and returns the check's status.
 *
 * Deadlines. Communicators are non-blocking. Every wait polls ncclCommGetAsyncError and an
 * event recorded after the operation on the stream; past the deadline the communicator is
 * aborted and the call returns MK_ERR_PEER_TIMEOUT. A peer that closed, aborted or exited
 * becomes MK_ERR_PEER_CLOSED; sizes the two NCCL sides disagree on (reported by the
 * cudasim stand-in; real NCCL would hang until the deadline) MK_ERR_FRAME. After a failure
 * the endpoint is dead: later calls return MK_ERR_PEER_CLOSED; only destroy remains.
 *
 * Threads. An endpoint is used by one thread at a time. Within one process one thread may
 * drive several endpoints: post a send on one (mk_nccl_send_post), receive on another
 * (mk_nccl_recv), then wait for the send (mk_nccl_send_wait). */
#ifndef MK_SEAM_NCCL_COMM_H
#define MK_SEAM_NCCL_COMM_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

#include "meshkern.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of the header block on the wire (envelope + caller header, zero padded). */
#define MK_NCCL_HEADER_BLOCK 512u
/* Envelope: magic, version, header bytes, payload bytes. */
#define MK_NCCL_ENVELOPE_BYTES 24u
/* The largest caller header. */
#define MK_NCCL_HEADER_MAX (MK_NCCL_HEADER_BLOCK - MK_NCCL_ENVELOPE_BYTES)

/* The caller's check of a received header (the boundary contract), run before the payload
 * is accepted. Returns MK_OK, or a status with its message recorded by mk_fail. */
typedef mk_status (*mk_nccl_header_check)(void *user, const void *header, size_t header_bytes,
                                          size_t payload_bytes);

typedef struct mk_nccl_ctx {
    ncclComm_t comm;        /* owned; NULL once aborted or destroyed */
    int rank, nranks;
    int device;             /* the communicator's CUDA device */
    cudaStream_t stream;    /* every operation is posted on it: the range's (borrowed) or own */
    int owns_stream;        /* created here (no stream given at init) */
    cudaEvent_t send_done;  /* owned: recorded after each posted send */
    cudaEvent_t recv_done;  /* owned: recorded after each posted receive */
    unsigned char *send_block_dev; /* owned, device [MK_NCCL_HEADER_BLOCK] */
    unsigned char *recv_block_dev; /* owned, device [MK_NCCL_HEADER_BLOCK] */
    unsigned char *send_block_host; /* owned, pinned [MK_NCCL_HEADER_BLOCK] */
    unsigned char *recv_block_host; /* owned, pinned [MK_NCCL_HEADER_BLOCK] */
    int deadline_ms;        /* per operation (bootstrap, send, receive) */
    int send_pending;       /* a send was posted and not yet waited for */
    int64_t send_deadline_ns; /* when the pending send must have completed */
    uint64_t sent, received;  /* completed exchanges (statistics) */
} mk_nccl_ctx;

/* ---- bootstrap ---------------------------------------------------------------------------- */

/* One process, several devices: a clique of n endpoints, endpoint i as rank i on
 * devices[i], posting on streams[i] (borrowed; NULL streams or a NULL entry: the endpoint
 * creates its own non-blocking stream). Non-blocking init polled against deadline_ms; then each endpoint's resources
 * and a warm-up exchange along the chain 0 -> 1 -> ... -> n-1 (NCCL connects lazily; the
 * first exchange must not fall inside a step). On failure nothing is left allocated.
 * ctxs: caller-owned array of n structs, filled here; release with mk_nccl_ctx_destroy. */
mk_status mk_nccl_init_all(mk_nccl_ctx *ctxs, int n, const int *devices, const cudaStream_t *streams,
                           int deadline_ms);

/* Several processes: this process's endpoint, rank `rank` of nranks on `device` posting on
 * `stream` (borrowed; NULL: its own), joined
 * through a unique id handed over out of band (nccl_bootstrap.c). Does not warm up: call
 * mk_nccl_warmup with this rank's neighbours afterwards. */
mk_status mk_nccl_init_rank(mk_nccl_ctx *ctx, int nranks, int rank, const ncclUniqueId *id, int device,
                            cudaStream_t stream, int deadline_ms);

/* The warm-up exchange of one endpoint: one header block from recv_from (or -1 for none)
 * and one to send_to (or -1), in one group, within the deadline. Every rank must call it
 * with matching neighbours. */
mk_status mk_nccl_warmup(mk_nccl_ctx *ctx, int recv_from, int send_to);

/* Abort if still alive, wait for the endpoint's stream, free everything; idempotent. */
void mk_nccl_ctx_destroy(mk_nccl_ctx *ctx);

/* Out-of-band hand-over of the unique id (nccl_bootstrap.c). The creator writes it to a
 * file (atomically: a temporary file renamed) or serves it on a TCP port (loopback unless
 * host says otherwise) to nranks - 1 joiners; joiners poll for the file or connect, within
 * deadline_ms (MK_ERR_PEER_TIMEOUT past it). The id is preceded by a magic; anything else
 * is refused (MK_ERR_FRAME). MPI's broadcast is the multi-node variant (a later issue). */
mk_status mk_nccl_id_create(ncclUniqueId *id);
mk_status mk_nccl_id_write_file(const char *path, const ncclUniqueId *id);
mk_status mk_nccl_id_read_file(const char *path, ncclUniqueId *id, int deadline_ms);
/* Listen on host:*port (host NULL: 127.0.0.1; *port 0: any free port, written back). */
mk_status mk_nccl_id_listen(const char *host, uint16_t *port, int *listen_fd);
/* Hand the id to `joiners` connections on listen_fd, then close it. */
mk_status mk_nccl_id_serve(int listen_fd, int joiners, const ncclUniqueId *id, int deadline_ms);
mk_status mk_nccl_id_fetch(const char *host, uint16_t port, ncclUniqueId *id, int deadline_ms);

/* ---- exchange ----------------------------------------------------------------------------- */

/* Post header + payload to rank `peer` on the endpoint's stream (the payload is read from
 * payload_dev, device memory of the endpoint's device, when the stream reaches the send).
 * header_bytes <= MK_NCCL_HEADER_MAX. One send may be pending per endpoint. */
mk_status mk_nccl_send_post(mk_nccl_ctx *ctx, int peer, const void *header, size_t header_bytes,
                            const void *payload_dev, size_t payload_bytes);
/* Wait for the pending send until its deadline (counted from the post). */
mk_status mk_nccl_send_wait(mk_nccl_ctx *ctx);
/* Post and wait. */
mk_status mk_nccl_send(mk_nccl_ctx *ctx, int peer, const void *header, size_t header_bytes,
                       const void *payload_dev, size_t payload_bytes);

/* Receive from rank `peer`: the header into header_out (capacity header_cap; its length in
 * *header_bytes), checked by check(user, ...) before the payload is received into
 * payload_dev (device memory of the endpoint's device, capacity payload_cap; the received
 * length in *payload_bytes). Complete (payload on the device, stream order) on MK_OK. */
mk_status mk_nccl_recv(mk_nccl_ctx *ctx, int peer, mk_nccl_header_check check, void *user, void *header_out,
                       size_t header_cap, size_t *header_bytes, void *payload_dev, size_t payload_cap,
                       size_t *payload_bytes);

#ifdef __cplusplus
}
#endif
#endif
