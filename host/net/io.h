/* Byte streams with deadlines for the stream transport: a connected socket, plaintext or
 * inside TLS 1.3. Every call takes an absolute deadline (CLOCK_MONOTONIC ms) and returns
 * within it; partial reads and writes, EINTR and EAGAIN are handled here. A peer that
 * closes is MK_ERR_PEER_CLOSED, a silent one MK_ERR_PEER_TIMEOUT. */
#ifndef MK_SEAM_IO_H
#define MK_SEAM_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meshkern.h"

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

typedef struct mk_io {
    int fd;     /* non-blocking, owned */
    SSL *ssl;   /* NULL = plaintext; owned */
} mk_io;

int64_t mk_now_ms(void);
/* now + timeout (timeout <= 0 = the default given). */
int64_t mk_deadline_ms(int timeout_ms, int default_ms);

/* Read exactly n bytes. `what` names the data in messages ("frame header"). On a close
 * after some bytes, the message says how many of n arrived. */
mk_status mk_io_read(mk_io *io, void *buf, size_t n, int64_t deadline, const char *what);
mk_status mk_io_write(mk_io *io, const void *buf, size_t n, int64_t deadline, const char *what);
/* mk_io_read for data that follows at the link's speed once it has begun (a frame's body
 * after its header): it fails when nothing arrives for stall_ms, however long the whole
 * read may take while bytes keep coming (and at the deadline). */
mk_status mk_io_read_live(mk_io *io, void *buf, size_t n, int64_t deadline, int stall_ms, const char *what);
/* Read what has arrived, without waiting: *got bytes (maybe fewer than n, maybe 0); a
 * close is MK_ERR_PEER_CLOSED (with *got the bytes before it). */
mk_status mk_io_read_now(mk_io *io, void *buf, size_t n, size_t *got, const char *what);
/* Write what the socket takes now, without waiting: *written bytes (maybe fewer than n). */
mk_status mk_io_write_now(mk_io *io, const void *buf, size_t n, size_t *written, const char *what);
void mk_io_close(mk_io *io);

/* Sockets. Addresses: a path (unix) or "HOST:PORT" (tcp; HOST may be empty = 127.0.0.1).
 * listen: bound and listening before return, non-blocking; *bound gets the actual
 * address (port 0 resolved). accept/connect wait until the deadline. */
mk_status mk_socket_listen(mk_seam_kind kind, const char *address, int *out_fd, char *bound, size_t bound_cap);
mk_status mk_socket_accept(int listen_fd, int64_t deadline, int *out_fd);
/* "HOST:PORT" (IPv6: "[HOST]:PORT") of a connected socket's other end; `unknown` where it
 * has none to name (a unix socket, a peer gone). */
void mk_socket_peer_name(int fd, const char *unknown, char *out, size_t cap);
/* An accept error that concerns only the connection it would have returned (retry). */
bool mk_accept_error_is_transient(int e);
mk_status mk_socket_connect(mk_seam_kind kind, const char *address, int64_t deadline, int *out_fd);
/* A connected Unix socketpair (both ends non-blocking). */
mk_status mk_socket_pair(int fds[2]);

/* TLS 1.3 (tls.c). The options alone: a pre-shared key or certificates (not both), an
 * identity only with a key, a certificate with its key and a CA. */
mk_status mk_tls_check(const mk_seam_tls *tls);
/* A context per end: server (the receiving end) or client (sending); checks the options,
 * the key's length (32 to 64 bytes) and loads the files. */
mk_status mk_tls_context(const mk_seam_tls *tls, bool server, SSL_CTX **out);
void mk_tls_context_free(SSL_CTX *ctx);
/* Attach TLS to io->fd (io->ssl set); the handshake runs in mk_tls_handshake. */
mk_status mk_tls_attach(mk_io *io, SSL_CTX *ctx, bool server);
/* Drive the handshake of one end (another process holds the other) or of both ends of
 * an in-process pair (b may be NULL), until done or the deadline. A peer without the key
 * or certificate, or a plaintext peer, is MK_ERR_AUTH. */
mk_status mk_tls_handshake(mk_io *a, mk_io *b, int64_t deadline);
/* One step of a handshake driven by the caller's own poll loop: *done, or the events to
 * wait for; a refusal is MK_ERR_AUTH. */
mk_status mk_tls_handshake_step(mk_io *io, bool *done, short *events);

#endif
