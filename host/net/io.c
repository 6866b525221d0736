/* Sockets and deadline-bound reads and writes for the stream transport. Everything is
 * non-blocking underneath: poll() waits, never longer than the deadline left. */
#include "net/io.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "mk_error.h"

int64_t mk_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t mk_deadline_ms(int timeout_ms, int default_ms) { return mk_now_ms() + (timeout_ms > 0 ? timeout_ms : default_ms); }

/* Wait for `events` on fd until the deadline: MK_OK when ready. */
static mk_status mk_wait_fd(int fd, short events, int64_t deadline, const char *what) {
    for (;;) {
        const int64_t left = deadline - mk_now_ms();
        if (left <= 0) return mk_fail(MK_ERR_PEER_TIMEOUT, "seam: the peer did not %s the %s before the deadline",
                                      events & POLLOUT ? "accept" : "send", what);
        struct pollfd p = {.fd = fd, .events = events};
        const int n = poll(&p, 1, (int)(left > 1000000 ? 1000000 : left));
        if (n > 0) return MK_OK; /* readable, writable, or an error/hangup the next call reports */
        if (n < 0 && errno != EINTR) return mk_fail(MK_ERR_IO, "seam: poll failed: %s", strerror(errno));
    }
}

/* ============================================================== plaintext == */

/* Read n bytes; with no_wait, stop where the socket has nothing more (*got_out says how far). */
static mk_status mk_plain_read(mk_io *io, uint8_t *p, size_t n, int64_t deadline, const char *what, size_t *got_out,
                               bool no_wait) {
    size_t got = 0;
    while (got < n) {
        const ssize_t r = recv(io->fd, p + got, n - got, 0);
        if (r > 0) {
            got += (size_t)r;
            if (got_out) *got_out = got;
        } else if (r == 0) {
            return mk_fail(MK_ERR_PEER_CLOSED, "seam: the peer closed the connection after %zu of %zu bytes of the %s",
                           got, n, what);
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (no_wait) return MK_OK;
            MK_TRY(mk_wait_fd(io->fd, POLLIN, deadline, what));
        } else if (errno == ECONNRESET) {
            return mk_fail(MK_ERR_PEER_CLOSED, "seam: the peer reset the connection after %zu of %zu bytes of the %s",
                           got, n, what);
        } else if (errno != EINTR) {
            return mk_fail(MK_ERR_IO, "seam: reading the %s failed: %s", what, strerror(errno));
        }
    }
    return MK_OK;
}

/* Write n bytes; with no_wait, stop where the socket would block (*put says how far). */
static mk_status mk_plain_write(mk_io *io, const uint8_t *p, size_t n, int64_t deadline, const char *what,
                                size_t *put_out, bool no_wait) {
    size_t put = 0;
    while (put < n) {
        const ssize_t w = send(io->fd, p + put, n - put, MSG_NOSIGNAL);
        if (w >= 0) {
            put += (size_t)w;
            if (put_out) *put_out = put;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (no_wait) return MK_OK;
            MK_TRY(mk_wait_fd(io->fd, POLLOUT, deadline, what));
        } else if (errno == EPIPE || errno == ECONNRESET) {
            return mk_fail(MK_ERR_PEER_CLOSED, "seam: the peer closed the connection after %zu of %zu bytes of the %s",
                           put, n, what);
        } else if (errno != EINTR) {
            return mk_fail(MK_ERR_IO, "seam: writing the %s failed: %s", what, strerror(errno));
        }
    }
    return MK_OK;
}

/* ==================================================================== TLS == */

/* SSL_write reaches write(2), which raises SIGPIPE on a closed peer: the library must not
 * kill its host, so the signal is blocked around TLS calls and a pending one consumed. */
typedef struct mk_sigpipe_guard {
    sigset_t old;
    bool was_pending;
} mk_sigpipe_guard;

static void mk_sigpipe_block(mk_sigpipe_guard *g) {
    sigset_t pipe_set, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigpending(&pending);
    g->was_pending = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &g->old);
}

static void mk_sigpipe_restore(mk_sigpipe_guard *g) {
    sigset_t pipe_set, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigpending(&pending);
    if (!g->was_pending && sigismember(&pending, SIGPIPE)) {
        const struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

static mk_status mk_tls_io(mk_io *io, uint8_t *p, size_t n, bool writing, int64_t deadline, const char *what,
                           size_t *done_out, bool no_wait) {
    size_t done = 0;
    mk_sigpipe_guard guard;
    mk_sigpipe_block(&guard);
    mk_status s = MK_OK;
    while (s == MK_OK && done < n) {
        size_t moved = 0;
        ERR_clear_error();
        const int ok = writing ? SSL_write_ex(io->ssl, p + done, n - done, &moved)
                               : SSL_read_ex(io->ssl, p + done, n - done, &moved);
        if (ok) {
            done += moved;
            if (done_out) *done_out = done;
            continue;
        }
        const int err = SSL_get_error(io->ssl, ok);
        if (no_wait && (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE)) break;
        if (err == SSL_ERROR_WANT_READ) s = mk_wait_fd(io->fd, POLLIN, deadline, what);
        else if (err == SSL_ERROR_WANT_WRITE) s = mk_wait_fd(io->fd, POLLOUT, deadline, what);
        else if (err == SSL_ERROR_ZERO_RETURN || err == SSL_ERROR_SYSCALL ||
                 (err == SSL_ERROR_SSL && ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING))
            s = mk_fail(MK_ERR_PEER_CLOSED, "seam: the peer closed the TLS connection after %zu of %zu bytes of the %s",
                        done, n, what);
        else {
            char text[160];
            ERR_error_string_n(ERR_peek_error(), text, sizeof text);
            s = mk_fail(MK_ERR_IO, "seam: TLS %s of the %s failed: %s", writing ? "write" : "read", what, text);
        }
    }
    mk_sigpipe_restore(&guard);
    return s;
}

/* ================================================================ streams == */

mk_status mk_io_read(mk_io *io, void *buf, size_t n, int64_t deadline, const char *what) {
    return io->ssl ? mk_tls_io(io, buf, n, false, deadline, what, NULL, false)
                   : mk_plain_read(io, buf, n, deadline, what, NULL, false);
}

mk_status mk_io_read_live(mk_io *io, void *buf, size_t n, int64_t deadline, int stall_ms, const char *what) {
    uint8_t *p = buf;
    size_t got = 0;
    int64_t moved_at = mk_now_ms();
    while (got < n) {
        size_t piece = 0;
        MK_TRY(mk_io_read_now(io, p + got, n - got, &piece, what));
        const int64_t now = mk_now_ms();
        if (piece) {
            got += piece;
            moved_at = now;
            continue;
        }
        const int64_t until = moved_at + stall_ms < deadline ? moved_at + stall_ms : deadline;
        if (now >= until || mk_wait_fd(io->fd, POLLIN, until, what) != MK_OK) {
            if (until == deadline) return mk_fail(MK_ERR_PEER_TIMEOUT, "seam: the peer did not send the %s before the "
                                                  "deadline (%zu of %zu bytes came)", what, got, n);
            return mk_fail(MK_ERR_PEER_TIMEOUT, "seam: the peer stalled in the %s: nothing for %d ms after %zu of %zu bytes",
                           what, stall_ms, got, n);
        }
    }
    return MK_OK;
}

mk_status mk_io_write(mk_io *io, const void *buf, size_t n, int64_t deadline, const char *what) {
    return io->ssl ? mk_tls_io(io, (uint8_t *)(uintptr_t)buf, n, true, deadline, what, NULL, false)
                   : mk_plain_write(io, buf, n, deadline, what, NULL, false);
}

mk_status mk_io_read_now(mk_io *io, void *buf, size_t n, size_t *got, const char *what) {
    *got = 0;
    return io->ssl ? mk_tls_io(io, buf, n, false, 0, what, got, true) : mk_plain_read(io, buf, n, 0, what, got, true);
}

mk_status mk_io_write_now(mk_io *io, const void *buf, size_t n, size_t *written, const char *what) {
    *written = 0;
    return io->ssl ? mk_tls_io(io, (uint8_t *)(uintptr_t)buf, n, true, 0, what, written, true)
                   : mk_plain_write(io, buf, n, 0, what, written, true);
}

void mk_io_close(mk_io *io) {
    if (io->ssl) {
        SSL_free(io->ssl);
        io->ssl = NULL;
    }
    if (io->fd >= 0) close(io->fd);
    io->fd = -1;
}

/* ================================================================ sockets == */

static mk_status mk_nonblocking(int fd) {
    const int flags = fcntl(fd, F_GETFL, 0);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
        return mk_fail(MK_ERR_IO, "seam: cannot make a socket non-blocking: %s", strerror(errno));
    return MK_OK;
}

/* Large socket buffers and no Nagle delay: a frame is written in one go and a decode
 * step's small frame must not wait for an ACK. */
static void mk_tune(int fd, mk_seam_kind kind) {
    const int one = 1, buf = 4 << 20;
    if (kind == MK_SEAM_TCP) (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

/* "HOST:PORT" (HOST empty or absent = loopback) into a resolved IPv4/IPv6 address. */
static mk_status mk_resolve(const char *address, bool passive, struct sockaddr_storage *out, socklen_t *len) {
    char host[256] = "127.0.0.1", port[16] = "0";
    const char *colon = address ? strrchr(address, ':') : NULL;
    if (address && colon) {
        const size_t hl = (size_t)(colon - address);
        if (hl >= sizeof host || strlen(colon + 1) >= sizeof port)
            return mk_fail(MK_ERR_CONNECT, "seam: address '%s' is too long", address);
        if (hl) {
            memcpy(host, address, hl);
            host[hl] = '\0';
        }
        if (host[0] == '[') { /* [v6]:port */
            memmove(host, host + 1, strlen(host));
            char *close_br = strchr(host, ']');
            if (close_br) *close_br = '\0';
        }
        snprintf(port, sizeof port, "%s", colon + 1);
    } else if (address && *address) {
        return mk_fail(MK_ERR_CONNECT, "seam: TCP address '%s' is not HOST:PORT", address);
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};
    struct addrinfo *res = NULL;
    const int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0 || !res)
        return mk_fail(MK_ERR_CONNECT, "seam: cannot resolve '%s': %s", address ? address : "", gai_strerror(rc));
    memcpy(out, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return MK_OK;
}

static mk_status mk_unix_address(const char *path, struct sockaddr_un *sun) {
    memset(sun, 0, sizeof *sun);
    sun->sun_family = AF_UNIX;
    if (!path || !*path || strlen(path) >= sizeof sun->sun_path)
        return mk_fail(MK_ERR_CONNECT, "seam: Unix socket path '%s' is empty or too long", path ? path : "");
    memcpy(sun->sun_path, path, strlen(path) + 1);
    return MK_OK;
}

/* The socket address of a Unix path or a TCP HOST:PORT (passive: for a listener). */
static mk_status mk_socket_address(mk_seam_kind kind, const char *address, bool passive, struct sockaddr_storage *ss,
                                   socklen_t *len) {
    if (kind != MK_SEAM_UNIX) return mk_resolve(address, passive, ss, len);
    struct sockaddr_un sun;
    MK_TRY(mk_unix_address(address, &sun));
    memcpy(ss, &sun, sizeof sun);
    *len = sizeof sun;
    return MK_OK;
}

mk_status mk_socket_listen(mk_seam_kind kind, const char *address, int *out_fd, char *bound, size_t bound_cap) {
    struct sockaddr_storage ss;
    socklen_t len = 0;
    MK_TRY(mk_socket_address(kind, address, true, &ss, &len));
    const int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return mk_fail(MK_ERR_IO, "seam: socket() failed: %s", strerror(errno));
    const int one = 1;
    if (kind == MK_SEAM_TCP) (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    /* A deep backlog: a listener may be flooded (a port scan, strangers at a rendezvous)
     * before its accept loop runs (rank 0 plans and loads after it listens); past a full
     * backlog the kernel drops a SYN and the real peer retries only after a second or more. */
    if (bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, SOMAXCONN) != 0) {
        const int e = errno;
        close(fd);
        return mk_fail(MK_ERR_CONNECT, "seam: cannot listen on '%s': %s", address ? address : "127.0.0.1:0", strerror(e));
    }
    const mk_status s = mk_nonblocking(fd);
    if (s != MK_OK) {
        close(fd);
        return s;
    }
    if (kind == MK_SEAM_UNIX) {
        snprintf(bound, bound_cap, "%s", address);
    } else {
        struct sockaddr_storage got;
        socklen_t gl = sizeof got;
        char host[INET6_ADDRSTRLEN] = "?";
        getsockname(fd, (struct sockaddr *)&got, &gl);
        const bool v6 = got.ss_family == AF_INET6;
        const void *addr = v6 ? (const void *)&((struct sockaddr_in6 *)&got)->sin6_addr
                              : (const void *)&((struct sockaddr_in *)&got)->sin_addr;
        inet_ntop(got.ss_family, addr, host, sizeof host);
        const unsigned port = ntohs(v6 ? ((struct sockaddr_in6 *)&got)->sin6_port : ((struct sockaddr_in *)&got)->sin_port);
        snprintf(bound, bound_cap, v6 ? "[%s]:%u" : "%s:%u", host, port);
    }
    *out_fd = fd;
    return MK_OK;
}

void mk_socket_peer_name(int fd, const char *unknown, char *out, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char host[INET6_ADDRSTRLEN] = "?";
    snprintf(out, cap, "%s", unknown);
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0 || (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)) return;
    const bool v6 = ss.ss_family == AF_INET6;
    inet_ntop(ss.ss_family, v6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                               : (const void *)&((struct sockaddr_in *)&ss)->sin_addr, host, sizeof host);
    snprintf(out, cap, v6 ? "[%s]:%u" : "%s:%u", host,
             (unsigned)ntohs(v6 ? ((struct sockaddr_in6 *)&ss)->sin6_port : ((struct sockaddr_in *)&ss)->sin_port));
}

bool mk_accept_error_is_transient(int e) {
    /* accept(2): Linux passes errors already pending on the new connection up through
     * accept; for TCP these are to be retried like EAGAIN (the listener is fine) */
    return e == EINTR || e == ECONNABORTED || e == EPROTO || e == ENETDOWN || e == ENOPROTOOPT || e == EHOSTDOWN ||
           e == ENONET || e == EHOSTUNREACH || e == EOPNOTSUPP || e == ENETUNREACH;
}

mk_status mk_socket_accept(int listen_fd, int64_t deadline, int *out_fd) {
    for (;;) {
        const int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            struct sockaddr_storage ss;
            socklen_t len = sizeof ss;
            getsockname(fd, (struct sockaddr *)&ss, &len);
            mk_tune(fd, ss.ss_family == AF_UNIX ? MK_SEAM_UNIX : MK_SEAM_TCP);
            *out_fd = fd;
            return MK_OK;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            const mk_status s = mk_wait_fd(listen_fd, POLLIN, deadline, "connection");
            if (s != MK_OK) return mk_fail(MK_ERR_PEER_TIMEOUT, "seam: no peer connected before the deadline");
        } else if (!mk_accept_error_is_transient(errno)) {
            return mk_fail(MK_ERR_IO, "seam: accept failed: %s", strerror(errno));
        }
    }
}

mk_status mk_socket_connect(mk_seam_kind kind, const char *address, int64_t deadline, int *out_fd) {
    struct sockaddr_storage ss;
    socklen_t len = 0;
    if (kind != MK_SEAM_UNIX && (!address || !strchr(address, ':')))
        return mk_fail(MK_ERR_CONNECT, "seam: TCP address '%s' is not HOST:PORT", address ? address : "");
    MK_TRY(mk_socket_address(kind, address, false, &ss, &len));
    /* A listener may not be up yet: retry refused connects until the deadline. */
    for (;;) {
        const int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) return mk_fail(MK_ERR_IO, "seam: socket() failed: %s", strerror(errno));
        mk_tune(fd, kind);
        int rc = connect(fd, (struct sockaddr *)&ss, len);
        if (rc != 0 && errno == EINPROGRESS) {
            if (mk_wait_fd(fd, POLLOUT, deadline, "connection") != MK_OK) {
                close(fd);
                return mk_fail(MK_ERR_PEER_TIMEOUT, "seam: connecting to '%s' passed the deadline", address);
            }
            int err = 0;
            socklen_t el = sizeof err;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
            rc = err ? -1 : 0;
            errno = err;
        }
        if (rc == 0) {
            *out_fd = fd;
            return MK_OK;
        }
        const int e = errno;
        close(fd);
        if (e != ECONNREFUSED && e != ENOENT && e != EAGAIN && e != EINTR)
            return mk_fail(MK_ERR_CONNECT, "seam: cannot connect to '%s': %s", address, strerror(e));
        if (mk_now_ms() + 20 >= deadline)
            return mk_fail(MK_ERR_CONNECT, "seam: nobody listens at '%s' (%s) before the deadline", address, strerror(e));
        struct timespec pause = {0, 20 * 1000000};
        nanosleep(&pause, NULL);
    }
}

mk_status mk_socket_pair(int fds[2]) {
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0)
        return mk_fail(MK_ERR_IO, "seam: socketpair failed: %s", strerror(errno));
    mk_tune(fds[0], MK_SEAM_UNIX);
    mk_tune(fds[1], MK_SEAM_UNIX);
    return MK_OK;
}
