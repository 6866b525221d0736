/* How stage processes meet without MPI: rank 0 listens at the rendezvous address, every
 * other rank connects and says hello (rank, world, stage digest, where its seam listens).
 * Rank 0 waits for all of them, then compares: a rank with another digest (another model
 * file, weight mode, cuts or seam), another world or a rank taken twice is refused before any
 * request, and every rank gets the refusal (ABORT) naming the rank, so all of them stop.
 * Otherwise each rank gets its welcome: the run's limits and the next rank's seam address.
 * The connection stays open: it carries results, the ready barrier, bye and abort. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mk_error.h"
#include "stage/stage.h"

typedef struct mk_hello {
    int rank, world;
    char digest[MK_DIGEST_HEX_LEN + 1];
    char address[300];
} mk_hello;

/* NCCL unique ids travel in the welcome as hex ("-": none). */
static void mk_hex(const unsigned char *id, char *out) {
    for (size_t i = 0; i < MK_SEAM_NCCL_ID_BYTES; i++) snprintf(out + 2 * i, 3, "%02x", id[i]);
}

static bool mk_unhex(const char *hex, unsigned char *id) {
    if (strlen(hex) != 2 * MK_SEAM_NCCL_ID_BYTES) return false;
    for (size_t i = 0; i < MK_SEAM_NCCL_ID_BYTES; i++) {
        unsigned v = 0;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) return false;
        id[i] = (unsigned char)v;
    }
    return true;
}

static void mk_abort_all(mk_stage *st, mk_status status, const char *message) {
    for (int k = 1; k < st->world; k++) mk_ctl_abort(&st->ctl[k], status, message);
}

/* ============================================================== rank 0 == */

static mk_status mk_gather_hello(mk_stage *st, int lfd, int64_t deadline, mk_hello *hello) {
    int fd = -1;
    mk_status s = mk_socket_accept(lfd, deadline, &fd);
    if (s != MK_OK) return s;
    mk_io io = {.fd = fd, .ssl = NULL};
    mk_ctl_type type;
    char body[MK_CTL_MAX_BODY + 1];
    size_t len;
    s = mk_ctl_recv(&io, &type, body, &len, deadline, "a joining rank");
    if (s == MK_OK && (type != MK_CTL_HELLO || sscanf(body, "%d %d %64s %299s", &hello->rank, &hello->world,
                                                      hello->digest, hello->address) != 4))
        s = mk_fail(MK_ERR_FRAME, "a joining rank sent no hello (message type %d)", (int)type);
    if (s == MK_OK && (hello->rank < 1 || hello->rank >= st->world))
        s = mk_fail(MK_ERR_INVALID_ARGUMENT, "a rank joined as rank %d of world %d; this run has ranks 1..%d besides 0",
                    hello->rank, hello->world, st->world - 1);
    if (s == MK_OK && st->ctl[hello->rank].fd >= 0)
        s = mk_fail(MK_ERR_INVALID_ARGUMENT, "rank %d joined twice", hello->rank);
    if (s != MK_OK) {
        mk_ctl_abort(&io, s, mk_last_error());
        mk_io_close(&io);
        return s;
    }
    st->ctl[hello->rank] = io;
    return MK_OK;
}

static mk_status mk_rendezvous_root(mk_stage *st, int64_t deadline) {
    int lfd = -1;
    char bound[300];
    MK_TRY(mk_socket_listen(MK_SEAM_TCP, st->o.rendezvous, &lfd, bound, sizeof bound));
    mk_hello hello[MK_STAGE_MAX_WORLD];
    memset(hello, 0, sizeof hello);
    mk_status s = MK_OK;
    for (int joined = 1; s == MK_OK && joined < st->world; joined++) {
        mk_hello h;
        s = mk_gather_hello(st, lfd, deadline, &h);
        if (s == MK_OK) hello[h.rank] = h;
    }
    close(lfd);
    if (s == MK_ERR_PEER_TIMEOUT) {
        char missing[256] = "";
        for (int k = 1; k < st->world; k++)
            if (st->ctl[k].fd < 0) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %d", k);
        s = mk_fail(MK_ERR_PEER_TIMEOUT, "rendezvous at %s: rank(s)%s did not join within %d ms", bound, missing,
                    st->timeout_ms);
    }
    /* Every rank must run the same stage: compared before any request. */
    for (int k = 1; s == MK_OK && k < st->world; k++) {
        if (hello[k].world != st->world)
            s = mk_fail(MK_ERR_INVALID_ARGUMENT, "rank %d runs with world %d, rank 0 with %d: refused at startup", k,
                        hello[k].world, st->world);
        else if (strcmp(hello[k].digest, st->digest) != 0)
            s = mk_fail(MK_ERR_RECIPE_DIGEST,
                        "rank %d's stage digest %.16s... differs from rank 0's %.16s... (another model file, weight mode, "
                        "cuts or seam): refused at startup, before any request",
                        k, hello[k].digest, st->digest);
    }
    if (s != MK_OK) {
        char message[512];
        snprintf(message, sizeof message, "%s", mk_last_error());
        mk_abort_all(st, s, message);
        return mk_fail(s, "%s", message);
    }
    snprintf(st->next_address, sizeof st->next_address, "%s", hello[1].address);
    /* nccl seams: unless the launcher broadcast them (MPI), rank 0 makes the unique id of
     * every seam's communicator (seam k joins rank k and k + 1) and hands each rank the two
     * it needs in the welcome. */
    static const char none[] = "-";
    char ids[MK_STAGE_MAX_WORLD][2 * MK_SEAM_NCCL_ID_BYTES + 1];
    for (int k = 0; k + 1 < st->world; k++) snprintf(ids[k], sizeof ids[k], "%s", none);
    if (st->o.seam == MK_SEAM_NCCL && st->o.nccl_ids_given) {
        memcpy(st->nccl_next, st->o.nccl_next, sizeof st->nccl_next); /* MPI_Bcast'ed: the welcome has none */
    } else if (st->o.seam == MK_SEAM_NCCL) {
        for (int k = 0; s == MK_OK && k + 1 < st->world; k++) {
            unsigned char id[MK_SEAM_NCCL_ID_BYTES];
            s = mk_seam_nccl_id_new(id, sizeof id);
            if (s == MK_OK) mk_hex(id, ids[k]);
            if (s == MK_OK && k == 0) memcpy(st->nccl_next, id, sizeof id);
        }
        if (s != MK_OK) {
            char message[512];
            snprintf(message, sizeof message, "rank 0 could not make the NCCL unique ids: %s", mk_last_error());
            mk_abort_all(st, s, message);
            return mk_fail(s, "%s", message);
        }
    }
    for (int k = 1; s == MK_OK && k < st->world; k++) {
        char body[MK_CTL_MAX_BODY];
        const int n = snprintf(body, sizeof body, "%zu %zu %zu %s %s %s", st->max_context, st->max_rows,
                               st->max_sequences, k + 1 < st->world ? hello[k + 1].address : "-", ids[k - 1],
                               k + 1 < st->world ? ids[k] : none);
        s = mk_ctl_send(&st->ctl[k], MK_CTL_WELCOME, body, (size_t)n, deadline);
        if (s != MK_OK) s = mk_stage_wrap(s, "rank 0 could not welcome rank %d", k);
    }
    return s;
}

/* ======================================================== other ranks == */

/* Where this rank's seam listens: on the interface that reaches rank 0 (TCP), or a
 * socket path of this process (unix). */
static mk_status mk_listen_seam(mk_stage *st) {
    if (st->o.seam == MK_SEAM_NCCL) return MK_OK; /* the communicators join by the ids rank 0 hands out */
    char address[300];
    if (st->o.seam == MK_SEAM_UNIX) {
        snprintf(address, sizeof address, "/tmp/meshkern-stage-%d-rank%d.sock", (int)getpid(), st->rank);
    } else {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        char host[INET6_ADDRSTRLEN] = "127.0.0.1";
        if (getsockname(st->ctl[0].fd, (struct sockaddr *)&ss, &len) == 0) {
            const bool v6 = ss.ss_family == AF_INET6;
            inet_ntop(ss.ss_family,
                      v6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                         : (const void *)&((struct sockaddr_in *)&ss)->sin_addr,
                      host, sizeof host);
            snprintf(address, sizeof address, v6 ? "[%s]:0" : "%s:0", host);
        } else {
            snprintf(address, sizeof address, "127.0.0.1:0");
        }
    }
    mk_seam_options so = mk_seam_options_default(st->o.seam);
    so.address = address;
    so.connect_timeout_ms = st->timeout_ms;
    so.io_timeout_ms = 2 * st->timeout_ms; /* a receive waits as long as this rank's idle deadline */
    return mk_seam_listen(&so, &st->listener);
}

static mk_status mk_rendezvous_join(mk_stage *st, int64_t deadline) {
    int fd = -1;
    mk_status s = mk_socket_connect(MK_SEAM_TCP, st->o.rendezvous, deadline, &fd);
    if (s != MK_OK) return mk_stage_wrap(s, "rank %d: no rendezvous at %s", st->rank, st->o.rendezvous);
    st->ctl[0].fd = fd;
    MK_TRY(mk_listen_seam(st));
    char body[MK_CTL_MAX_BODY + 1];
    int n = snprintf(body, sizeof body, "%d %d %s %s", st->rank, st->world, st->digest,
                     st->listener ? mk_seam_listener_address(st->listener) : "-");
    MK_TRY(mk_ctl_send(&st->ctl[0], MK_CTL_HELLO, body, (size_t)n, deadline));
    /* Rank 0 answers once every rank has joined: up to its own deadline after ours. */
    mk_ctl_type type;
    size_t len;
    s = mk_ctl_recv(&st->ctl[0], &type, body, &len, deadline + st->timeout_ms, "rank 0");
    if (s != MK_OK) return s;
    if (type == MK_CTL_ABORT) return mk_ctl_abort_status(body);
    char next[300], prev_id[2 * MK_SEAM_NCCL_ID_BYTES + 1], next_id[2 * MK_SEAM_NCCL_ID_BYTES + 1];
    if (type != MK_CTL_WELCOME ||
        sscanf(body, "%zu %zu %zu %299s %256s %256s", &st->max_context, &st->max_rows, &st->max_sequences, next, prev_id,
               next_id) != 6 ||
        st->max_context == 0 || st->max_rows == 0 || st->max_sequences == 0)
        return mk_fail(MK_ERR_FRAME, "rank 0 sent no usable welcome (type %d)", (int)type);
    if (st->o.seam == MK_SEAM_NCCL && st->o.nccl_ids_given) {
        memcpy(st->nccl_prev, st->o.nccl_prev, sizeof st->nccl_prev);
        memcpy(st->nccl_next, st->o.nccl_next, sizeof st->nccl_next);
    } else if (st->o.seam == MK_SEAM_NCCL && (!mk_unhex(prev_id, st->nccl_prev) ||
                                       (st->rank + 1 < st->world && !mk_unhex(next_id, st->nccl_next))))
        return mk_fail(MK_ERR_FRAME, "rank 0 sent rank %d no usable NCCL unique ids", st->rank);
    n = snprintf(st->next_address, sizeof st->next_address, "%s", strcmp(next, "-") == 0 ? "" : next);
    (void)n;
    if (st->o.seam != MK_SEAM_NCCL && st->rank + 1 < st->world && !st->next_address[0])
        return mk_fail(MK_ERR_FRAME, "rank 0 gave rank %d no address of rank %d", st->rank, st->rank + 1);
    return MK_OK;
}

mk_status mk_stage_rendezvous(mk_stage *st) {
    const int64_t deadline = mk_deadline_ms(st->timeout_ms, 30000);
    return st->rank == 0 ? mk_rendezvous_root(st, deadline) : mk_rendezvous_join(st, deadline);
}

/* ======================================================== ready barrier == */

mk_status mk_stage_ready(mk_stage *st) {
    const int64_t deadline = mk_deadline_ms(st->timeout_ms, 30000);
    if (st->rank != 0) return mk_ctl_send(&st->ctl[0], MK_CTL_READY, NULL, 0, deadline);
    for (int k = 1; k < st->world; k++) {
        char peer[32], body[MK_CTL_MAX_BODY + 1];
        snprintf(peer, sizeof peer, "rank %d", k);
        mk_ctl_type type;
        size_t len;
        mk_status s = mk_ctl_recv(&st->ctl[k], &type, body, &len, deadline, peer);
        if (s == MK_OK && type == MK_CTL_ABORT) s = mk_ctl_abort_status(body);
        else if (s == MK_OK && type != MK_CTL_READY)
            s = mk_fail(MK_ERR_FRAME, "rank %d sent message type %d before it was ready", k, (int)type);
        if (s != MK_OK) {
            char message[512];
            snprintf(message, sizeof message, "rank %d did not get ready: %s", k, mk_last_error());
            mk_abort_all(st, s, message);
            return mk_fail(s, "%s", message);
        }
    }
    return MK_OK;
}
