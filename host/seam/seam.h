/* The transport interface behind mk_seam (include/meshkern.h). One file per transport:
 * local.c, wire.c, stream.c. A receive is two steps, so the contract runs between them:
 * recv_header gives the boundary's header (nothing is accepted yet), seam.c checks it
 * with mk_range_check_boundary, and only then recv_payload moves the payload into the
 * receiving range's preallocated buffer. NCCL (header as a small send, payload
 * device-to-device) fits the same two steps. */
#ifndef MK_SEAM_H
#define MK_SEAM_H

#include "backend/backend.h"
#include "net/io.h"
#include "protocol/boundary.h"
#include "range/range.h"

/* The contract as seam.c applies it to a received header (before any payload). */
typedef mk_status (*mk_seam_check)(void *user, const mk_boundary_header *h);

typedef struct mk_seam_ops {
    const char *name;
    /* One message carrying the boundaries of n >= 1 sequences (seam.c checked them:
     * mk_bundle_batch_check). A transport that carries one per message refuses n > 1. */
    mk_status (*send)(mk_seam *s, const mk_boundary *const *b, size_t n);
    mk_status (*send_wait)(mk_seam *s);
    /* The next message, read whole: its entries' headers h[0..*n), at most cap (a message of
     * more is refused whole). Nothing of a payload is accepted yet. */
    mk_status (*recv_header)(mk_seam *s, mk_boundary_header *h, size_t cap, size_t *n);
    /* Entry k's rows of that message into `into` (into->h: entry k's accepted header). */
    mk_status (*recv_payload)(mk_seam *s, size_t k, mk_boundary *into);
    /* Instead of the two steps above, where header and payload are one exchange (NCCL, one
     * exchange per entry): receive the header, run check(user, header) and only if it passes
     * receive the payload into `into` and set into->h; *more: the entries of its batch still
     * to come. */
    mk_status (*recv_checked)(mk_seam *s, mk_seam_check check, void *user, mk_boundary *into, size_t *more);
    void (*destroy)(mk_seam *s);
} mk_seam_ops;

struct mk_seam {
    const mk_seam_ops *ops;
    mk_seam_kind kind;
    mk_range *range;  /* the range at this end */
    bool sender;
    mk_seam_options options;
    size_t bytes;     /* moved so far */
    double seconds;   /* spent in send + recv */
    void *impl;       /* the transport's state */
};

/* Transport constructors: both ends in one process (local, wire, stream) or one end of a
 * stream connection (fd connected, TLS context or NULL). */
/* The TLS options of a seam: only on the unix and tcp transports, and consistent (tls.c
 * mk_tls_check); the command line checks them before it runs anything. */
mk_status mk_seam_check_tls(const mk_seam_options *opt);
mk_status mk_seam_local_pair(mk_seam *tx, mk_seam *rx);
mk_status mk_seam_wire_pair(mk_seam *tx, mk_seam *rx);
mk_status mk_seam_stream_pair(mk_seam *tx, mk_seam *rx);
mk_status mk_seam_stream_end(mk_seam *s, int fd, bool tls_server_side, int64_t deadline);
/* NCCL (host/seam/nccl/nccl_seam.c where NCCL is linked, else nccl_absent.c refuses):
 * both ends in one process; or one end across processes, joining through the unique id
 * in the file at id_path (the receiver's listener wrote it: mk_seam_nccl_publish), within
 * connect_timeout_ms. */
mk_status mk_seam_nccl_pair(mk_seam *tx, mk_seam *rx);
mk_status mk_seam_nccl_publish(const char *id_path);
mk_status mk_seam_nccl_join(mk_seam *s, const char *id_path);
/* The same with the unique id handed over by the caller's own bootstrap (the stage
 * rendezvous, itself set up by MPI_Bcast under mpirun): a fresh id as bytes, and one end
 * joined with it. */
#define MK_SEAM_NCCL_ID_BYTES 128
mk_status mk_seam_nccl_id_new(unsigned char *id, size_t cap);
mk_status mk_seam_nccl_join_id(mk_seam *s, const unsigned char *id, size_t len);
/* One NCCL end across processes joined with such an id (seam.c). */
mk_status mk_seam_nccl_end_with_id(const mk_seam_options *opt, const unsigned char *id, size_t len, mk_range *range,
                                   bool sender, mk_seam **out);
/* The contract as a receiver states it: check the header and name the sequence it was
 * checked for (*checked_for), so the forward that consumes the boundary need not check it
 * again. */
typedef mk_status (*mk_seam_contract)(void *user, const mk_boundary_header *h, const mk_sequence **checked_for);
/* mk_seam_recv with the contract (and, for the stage runtime, the choice of sequence) in
 * contract(user, header, &seq), run before any payload is accepted. A boundary received
 * whole carries the stamp (seq, its length). A batch message of several entries is
 * refused (mk_seam_recv_batch_with takes those). */
mk_status mk_seam_recv_with(mk_seam *s, mk_seam_contract contract, void *user, mk_boundary *into);

/* The receive of a message of one or more entries (a batch): the contract runs on each
 * entry's header (contract(user, k, header, &seq)) before its payload is accepted into
 * into[k]. An entry refused (by the contract, or a payload with NaN/Inf) fails alone:
 * entry_status[k] and errors[k] (NULL: not kept) say why, into[k] stays empty, and the
 * others are received. The return is a failure only where the message itself could not
 * be read or is malformed (then *n is 0 and nothing was accepted). */
#define MK_SEAM_ENTRY_ERROR 512 /* as long as the thread's message (core/error.c) */
typedef mk_status (*mk_seam_entry_contract)(void *user, size_t k, const mk_boundary_header *h,
                                            const mk_sequence **checked_for);
mk_status mk_seam_recv_batch_with(mk_seam *s, mk_seam_entry_contract contract, void *user, mk_boundary *const *into,
                                  size_t cap, size_t *n, mk_status *entry_status, char (*errors)[MK_SEAM_ENTRY_ERROR]);
/* The host side of a send of n boundaries (host-staged transports): positions[] filled
 * (each entry's rows counting up from its position), h[k] = &b[k]->h, and rows[k] where
 * entry k's residual rows can be read on the host: its own buffer on a host backend (no
 * copy), else downloaded into staging [max_rows, hidden] at its row offset. Waits for the
 * backend: the rows are complete on return. */
mk_status mk_seam_stage_rows(mk_backend *be, const mk_boundary *const *b, size_t n, void *staging, int32_t *positions,
                             const void **rows, const mk_boundary_header **h);
/* Stream ends: the connected fd (to poll before a receive; -1 for other transports), and
 * raw bytes written on it (fault injection only: a frame that is not one). */
int mk_seam_stream_fd(const mk_seam *s);
mk_status mk_seam_stream_write_raw(mk_seam *s, const void *bytes, size_t n);
/* One stream end over a connection whose TLS session (if any) is established: io and tls
 * (the session's context, or NULL) are taken over, freed on failure too. */
mk_status mk_seam_stream_adopt(mk_seam *s, mk_io io, SSL_CTX *tls);
/* mk_seam_accept for a peer that proves it belongs: a stream listener takes connections
 * until its deadline, and the first whose first bytes (after TLS) are MK_SEAM_TICKET_TAG
 * and then the ticket (MK_SEAM_TICKET_BYTES, compared in constant time) becomes the seam.
 * Any other (a port scanner, a silent or garbled stranger, a TLS handshake that fails)
 * is dropped and logged through log(user, line), each given at most its own short
 * deadline, so one stranger cannot take the seam or stop the wait. The sender writes the
 * tag and ticket first: mk_seam_send_ticket. NCCL listeners: as mk_seam_accept. */
#define MK_SEAM_TICKET_TAG "MKSEAM01"
#define MK_SEAM_TICKET_BYTES 32
mk_status mk_seam_accept_ticketed(mk_seam_listener *l, mk_range *receiver, const char *ticket,
                                  void (*log)(void *user, const char *line), void *user, mk_seam **out);
mk_status mk_seam_send_ticket(mk_seam *s, const char *ticket);
/* Transports own impl; seam.c frees the seam itself. */

#endif
