/* How NCCL peers find each other without MPI: the unique id created by one process and
 * handed to the others out of band, through a file or a TCP connection, each within a
 * deadline. What moves the residual is nccl_comm.c; this file only introduces the peers.
 *
 * Both carriers send the id behind an 8-byte magic, so a stray file or connection is
 * refused (MK_ERR_FRAME) instead of becoming a communicator that never forms. The id is
 * not secret-grade material, but whoever holds it can join the clique: the socket binds to
 * loopback unless told otherwise, and the file is created mode 0600. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/mk_check.h"
#include "seam/nccl/nccl_comm.h"

static const unsigned char id_magic[8] = {'m', 'k', 'n', 'c', 'c', 'l', 'i', 'd'};
#define ID_RECORD (sizeof id_magic + sizeof(ncclUniqueId))

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
    const struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void pack_record(unsigned char *rec, const ncclUniqueId *id) {
    memcpy(rec, id_magic, sizeof id_magic);
    memcpy(rec + sizeof id_magic, id, sizeof *id);
}

static mk_status unpack_record(const unsigned char *rec, ncclUniqueId *id, const char *where) {
    if (memcmp(rec, id_magic, sizeof id_magic) != 0)
        return mk_fail(MK_ERR_FRAME, "nccl bootstrap: %s does not hold a meshkern NCCL unique id", where);
    memcpy(id, rec + sizeof id_magic, sizeof *id);
    return MK_OK;
}

mk_status mk_nccl_id_create(ncclUniqueId *id) {
    if (!id) return mk_fail(MK_ERR_INVALID_ARGUMENT, "nccl bootstrap: NULL id");
    MK_NCCL_CHECK(ncclGetUniqueId(id));
    return MK_OK;
}

/* ================================================================== file == */

mk_status mk_nccl_id_write_file(const char *path, const ncclUniqueId *id) {
    if (!path || !id) return mk_fail(MK_ERR_INVALID_ARGUMENT, "nccl bootstrap: NULL path or id");
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "nccl bootstrap: path too long");
    unsigned char rec[ID_RECORD];
    pack_record(rec, id);
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return mk_fail(MK_ERR_IO, "nccl bootstrap: cannot create %s: %s", tmp, strerror(errno));
    const ssize_t w = write(fd, rec, sizeof rec);
    const int closed = close(fd);
    /* Readers see the file only once it is whole: written under another name, renamed. */
    if (w != (ssize_t)sizeof rec || closed != 0 || rename(tmp, path) != 0) {
        const int e = errno;
        unlink(tmp);
        return mk_fail(MK_ERR_IO, "nccl bootstrap: cannot write %s: %s", path, strerror(e));
    }
    return MK_OK;
}

mk_status mk_nccl_id_read_file(const char *path, ncclUniqueId *id, int deadline_ms) {
    if (!path || !id || deadline_ms <= 0) return mk_fail(MK_ERR_INVALID_ARGUMENT, "nccl bootstrap: bad arguments");
    const int64_t deadline = now_ms() + deadline_ms;
    for (;;) {
        const int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            unsigned char rec[ID_RECORD];
            const ssize_t r = read(fd, rec, sizeof rec);
            close(fd);
            if (r != (ssize_t)sizeof rec)
                return mk_fail(MK_ERR_FRAME, "nccl bootstrap: %s holds %zd bytes, a unique id record is %zu", path, r,
                               (size_t)ID_RECORD);
            return unpack_record(rec, id, path);
        }
        if (errno != ENOENT) return mk_fail(MK_ERR_IO, "nccl bootstrap: cannot open %s: %s", path, strerror(errno));
        if (now_ms() >= deadline)
            return mk_fail(MK_ERR_PEER_TIMEOUT, "nccl bootstrap: no unique id appeared at %s within %d ms", path,
                           deadline_ms);
        sleep_ms(5);
    }
}

/* ================================================================ socket == */

static mk_status parse_host(const char *host, struct sockaddr_in *a, uint16_t port) {
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    if (!host) {
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        return MK_OK;
    }
    if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "nccl bootstrap: '%s' is not an IPv4 address", host);
    return MK_OK;
}

/* Wait for fd to become ready for ev until the absolute deadline (ms). */
static int ready(int fd, short ev, int64_t deadline) {
    for (;;) {
        const int64_t left = deadline - now_ms();
        if (left <= 0) return 0;
        struct pollfd p = {fd, ev, 0};
        const int r = poll(&p, 1, (int)(left < 1000 ? left : 1000));
        if (r > 0) return 1;
        if (r < 0 && errno != EINTR) return 0;
    }
}

mk_status mk_nccl_id_listen(const char *host, uint16_t *port, int *listen_fd) {
    if (!port || !listen_fd) return mk_fail(MK_ERR_INVALID_ARGUMENT, "nccl bootstrap: NULL port or fd");
    *listen_fd = -1;
    struct sockaddr_in a;
    MK_TRY(parse_host(host, &a, *port));
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return mk_fail(MK_ERR_IO, "nccl bootstrap: socket: %s", strerror(errno));
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 64) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        const int e = errno;
        close(fd);
        return mk_fail(MK_ERR_IO, "nccl bootstrap: cannot listen on %s:%u: %s", host ? host : "127.0.0.1",
                       (unsigned)*port, strerror(e));
    }
    *port = ntohs(a.sin_port);
    *listen_fd = fd;
    return MK_OK;
}

/* A non-blocking connect bounded by the deadline (a remote host that drops packets would
 * otherwise hold a blocking connect for minutes). */
static int connected(int fd, const struct sockaddr_in *a, int64_t deadline) {
    if (connect(fd, (const struct sockaddr *)a, sizeof *a) == 0) return 1;
    if (errno != EINPROGRESS && errno != EINTR) return 0;
    if (!ready(fd, POLLOUT, deadline)) return 0;
    int err = 0;
    socklen_t len = sizeof err;
    return getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
}

static int write_all(int fd, const unsigned char *p, size_t n, int64_t deadline) {
    while (n > 0) {
        if (!ready(fd, POLLOUT, deadline)) return 0;
        const ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (w <= 0) return 0;
        p += w;
        n -= (size_t)w;
    }
    return 1;
}

mk_status mk_nccl_id_serve(int listen_fd, int joiners, const ncclUniqueId *id, int deadline_ms) {
    if (listen_fd < 0 || !id || joiners < 0 || deadline_ms <= 0) {
        if (listen_fd >= 0) close(listen_fd);
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "nccl bootstrap: bad arguments to serve");
    }
    const int64_t deadline = now_ms() + deadline_ms;
    unsigned char rec[ID_RECORD];
    pack_record(rec, id);
    mk_status st = MK_OK;
    for (int served = 0; served < joiners && st == MK_OK;) {
        if (!ready(listen_fd, POLLIN, deadline)) {
            st = mk_fail(MK_ERR_PEER_TIMEOUT, "nccl bootstrap: %d of %d joiners fetched the unique id within %d ms",
                         served, joiners, deadline_ms);
            break;
        }
        const int c = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) continue; /* EINTR, a connection reset before accept: keep serving */
        if (write_all(c, rec, sizeof rec, deadline)) ++served;
        close(c);
    }
    close(listen_fd);
    return st;
}

mk_status mk_nccl_id_fetch(const char *host, uint16_t port, ncclUniqueId *id, int deadline_ms) {
    if (!id || deadline_ms <= 0 || port == 0) return mk_fail(MK_ERR_INVALID_ARGUMENT, "nccl bootstrap: bad arguments");
    struct sockaddr_in a;
    MK_TRY(parse_host(host, &a, port));
    const int64_t deadline = now_ms() + deadline_ms;
    for (;;) {
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) return mk_fail(MK_ERR_IO, "nccl bootstrap: socket: %s", strerror(errno));
        if (connected(fd, &a, deadline)) {
            unsigned char rec[ID_RECORD];
            size_t got = 0;
            while (got < sizeof rec && ready(fd, POLLIN, deadline)) {
                const ssize_t r = recv(fd, rec + got, sizeof rec - got, MSG_DONTWAIT);
                if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
                if (r <= 0) break;
                got += (size_t)r;
            }
            close(fd);
            if (got == sizeof rec) return unpack_record(rec, id, "the bootstrap connection");
            if (now_ms() >= deadline)
                return mk_fail(MK_ERR_PEER_TIMEOUT, "nccl bootstrap: the unique id did not arrive within %d ms",
                               deadline_ms);
            return mk_fail(MK_ERR_PEER_CLOSED, "nccl bootstrap: the server closed after %zu of %zu bytes", got,
                           (size_t)ID_RECORD);
        }
        close(fd);
        /* Not listening yet: the creator may start after us. Retry until the deadline. */
        if (now_ms() >= deadline)
            return mk_fail(MK_ERR_PEER_TIMEOUT, "nccl bootstrap: no unique id served at %s:%u within %d ms",
                           host ? host : "127.0.0.1", (unsigned)port, deadline_ms);
        sleep_ms(5);
    }
}
