/* How stage processes meet without MPI: rank 0 listens at the rendezvous address, every
 * other rank connects and says hello (rank, world, stage digest, where its seam listens).
 * Rank 0 takes every connection at once (one poll loop) and checks each hello as it
 * comes: a connection that is not a rank of this run (no hello, garbage, over the limit,
 * silent past its hello deadline, a rank out of range, another world or stage digest, a
 * rank taken already) is dropped and logged with its peer address, and a hello's sender
 * is told why (a rank on another model file, weight mode, cuts, seam or meshkern version exits
 * naming it).
 * Rank 0 waits for the real ranks until its deadline; if one never joins, every rank gets
 * the refusal (ABORT) naming the ranks missing and the connections dropped. Otherwise each
 * rank gets its welcome: the run's limits and the next rank's seam address. The
 * connection stays open: it carries results, the ready barrier, bye and abort. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mk_error.h"
#include "stage/stage.h"

/* NCCL unique ids (and the seam ticket) travel in the welcome as hex ("-": none). */
static void mk_hex(const unsigned char *bytes, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", bytes[i]);
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

/* Rank 0 meets the ranks with one poll() loop over the listener, every connection that has
 * not said hello yet and every rank that has: no connection can hold up another. Anyone
 * who can reach the port can connect (a readiness probe, a port scan, a rank of another
 * run), so a connection that closes, sends what is not a hello, announces more than the
 * limit, stays silent past its hello deadline, or says hello as a rank this run cannot
 * take (out of range, another world or stage digest, a rank already joined) is dropped:
 * logged with its peer address, told why when it sent a hello (a misconfigured rank then
 * exits naming the cause), and rank 0 waits on for the real ranks until its own deadline.
 * Its failure then names the ranks that never joined and the connections dropped. */

#define MK_RDV_MAX_PENDING 64 /* connections without a complete hello; beyond, the oldest is dropped */
#define MK_RDV_HELLO_MS 2000  /* a connection's hello must be complete this long after its accept */

typedef struct mk_pending {
    mk_io io;          /* fd -1: a free entry; ssl: under TLS */
    bool handshaking;  /* TLS: the handshake is not done yet */
    short events;      /* TLS: what the handshake waits for */
    char peer[80];     /* "HOST:PORT" of the other end */
    int64_t deadline;  /* its hello must be complete by then */
    int64_t since;     /* accepted at (ms) */
    size_t have;       /* bytes of buf read so far */
    uint8_t buf[MK_CTL_HEADER_BYTES + MK_CTL_MAX_BODY + 1];
} mk_pending;

typedef struct mk_rdv {
    mk_stage *st;
    mk_hello hello[MK_STAGE_MAX_WORLD];
    char joined_from[MK_STAGE_MAX_WORLD][80];
    int joined;                 /* ranks joined besides 0 */
    mk_pending *pend;           /* [MK_RDV_MAX_PENDING] */
    size_t n_dropped;
    char dropped[1024];         /* "peer (why); ..." for the failure message */
    mk_status claim_status;     /* the first dropped hello that claimed a rank still missing */
    int claim_rank;
    char claim_message[512];
    SSL_CTX *tls;               /* server end of every connection, under TLS */
} mk_rdv;

static uint32_t mk_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void mk_rdv_log(const mk_stage *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mk_rdv_log(const mk_stage *st, const char *fmt, ...) {
    if (!st->o.log) return;
    char line[768];
    va_list args;
    va_start(args, fmt);
    vsnprintf(line, sizeof line, fmt, args);
    va_end(args);
    st->o.log(st->o.log_user, line);
}

/* Drop a pending connection: logged with why, kept for the failure message in brief
 * (NULL: why), and a hello's sender is told why (best effort, without waiting: the ABORT
 * is what the socket buffer takes now). */
static void mk_rdv_drop(mk_rdv *r, mk_pending *p, mk_status told, const char *brief, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void mk_rdv_drop(mk_rdv *r, mk_pending *p, mk_status told, const char *brief, const char *fmt, ...) {
    char why[600];
    va_list args;
    va_start(args, fmt);
    vsnprintf(why, sizeof why, fmt, args);
    va_end(args);
    mk_rdv_log(r->st, "rendezvous: dropped %s: %s", p->peer, why);
    const size_t used = strlen(r->dropped);
    if (used + 1 < sizeof r->dropped)
        snprintf(r->dropped + used, sizeof r->dropped - used, "%s%s %s", r->n_dropped ? ", " : "", p->peer,
                 brief ? brief : why);
    r->n_dropped++;
    if (told != MK_OK) {
        uint8_t frame[MK_CTL_HEADER_BYTES + MK_CTL_MAX_BODY];
        const int n = snprintf((char *)frame + MK_CTL_HEADER_BYTES, MK_CTL_MAX_BODY, "%d %s", (int)told, why);
        const uint32_t len = n < 0 ? 0u : (uint32_t)n >= MK_CTL_MAX_BODY ? MK_CTL_MAX_BODY - 1 : (uint32_t)n;
        const uint32_t head[3] = {MK_CTL_MAGIC, MK_CTL_ABORT, len};
        for (int i = 0; i < 12; i++) frame[i] = (uint8_t)(head[i / 4] >> (8 * (i % 4)));
        size_t written = 0;
        (void)mk_io_write_now(&p->io, frame, MK_CTL_HEADER_BYTES + len, &written, "abort");
    }
    mk_io_close(&p->io);
    mk_clear_error();
}

/* The verdict on the first n bytes a connection sent: a parser of untrusted input, apart
 * from the sockets (tests/fuzz/fuzz_control.c drives it with arbitrary bytes). */
void mk_hello_judge(const mk_stage *st, const uint8_t *bytes, size_t n, mk_hello_judgement *j) {
    memset(j, 0, sizeof *j);
    j->verdict = MK_HELLO_MORE;
    j->need = MK_CTL_HEADER_BYTES;
    if (n < MK_CTL_HEADER_BYTES) return;
    const uint32_t magic = mk_le32(bytes), type = mk_le32(bytes + 4), len = mk_le32(bytes + 8);
    j->verdict = MK_HELLO_DROP;
    if (magic != MK_CTL_MAGIC) {
        snprintf(j->why, sizeof j->why, "not a meshkern control message (magic 0x%08x)", magic);
        return;
    }
    if (type != MK_CTL_HELLO) {
        snprintf(j->why, sizeof j->why, "a control message of type %u where a hello belongs", type);
        return;
    }
    if (len > MK_CTL_MAX_BODY) {
        snprintf(j->why, sizeof j->why, "a hello of %u bytes announced (limit %u)", len, MK_CTL_MAX_BODY);
        return;
    }
    j->need = MK_CTL_HEADER_BYTES + len;
    if (n < j->need) {
        j->verdict = MK_HELLO_MORE;
        return;
    }
    char body[MK_CTL_MAX_BODY + 1];
    memcpy(body, bytes + MK_CTL_HEADER_BYTES, len);
    body[len] = '\0';
    mk_hello h;
    memset(&h, 0, sizeof h);
    char extra = 0;
    if (memchr(body, '\0', len) || sscanf(body, "%d %d %64s %299s %c", &h.rank, &h.world, h.digest, h.address, &extra) != 4) {
        snprintf(j->why, sizeof j->why, "a hello that does not parse: '%.60s'", body);
        return;
    }
    j->told = MK_ERR_INVALID_ARGUMENT; /* from here on it is a hello: its sender is told why */
    if (h.rank < 1 || h.rank >= st->world) {
        snprintf(j->brief, sizeof j->brief, "claimed rank %d of world %d", h.rank, h.world);
        snprintf(j->why, sizeof j->why, "a rank joined as rank %d of world %d; this run has ranks 1..%d besides 0", h.rank,
                 h.world, st->world - 1);
        return;
    }
    j->hello = h;
    if (h.world != st->world) {
        j->claim = MK_ERR_INVALID_ARGUMENT;
        snprintf(j->brief, sizeof j->brief, "claimed rank %d with world %d", h.rank, h.world);
        snprintf(j->why, sizeof j->why, "rank %d runs with world %d, rank 0 with %d: refused at startup", h.rank, h.world,
                 st->world);
    } else if (strcmp(h.digest, st->digest) != 0) {
        j->claim = MK_ERR_RECIPE_DIGEST;
        snprintf(j->brief, sizeof j->brief, "claimed rank %d with another stage digest", h.rank);
        snprintf(j->why, sizeof j->why,
                 "rank %d's stage digest %.16s... differs from rank 0's %.16s... (another model file, weight mode, "
                 "cuts, seam or meshkern version): refused at startup, before any request",
                 h.rank, h.digest, st->digest);
    } else if (st->ctl[h.rank].fd >= 0) {
        j->duplicate = true;
        snprintf(j->brief, sizeof j->brief, "claimed rank %d, joined already", h.rank);
        snprintf(j->why, sizeof j->why, "rank %d joined twice", h.rank);
    } else {
        j->verdict = MK_HELLO_JOIN;
        j->told = MK_OK;
    }
    if (j->claim != MK_OK) j->told = j->claim;
}

/* p's complete hello: joined, or dropped with the reason. */
static void mk_rdv_hello(mk_rdv *r, mk_pending *p, const mk_hello_judgement *j) {
    mk_stage *st = r->st;
    const mk_hello h = j->hello;
    if (j->verdict == MK_HELLO_DROP && j->duplicate) {
        mk_rdv_drop(r, p, j->told, j->brief, "%s (first from %s)", j->why, r->joined_from[h.rank]);
        return;
    }
    if (j->verdict == MK_HELLO_DROP) {
        if (j->claim != MK_OK && r->claim_status == MK_OK) {
            r->claim_status = j->claim; /* the likelier story of a missing rank than silence */
            r->claim_rank = h.rank;
            snprintf(r->claim_message, sizeof r->claim_message, "%s", j->why);
        }
        mk_rdv_drop(r, p, j->told, j->brief[0] ? j->brief : NULL, "%s", j->why);
        return;
    }
    st->ctl[h.rank] = p->io;
    r->hello[h.rank] = h;
    snprintf(r->joined_from[h.rank], sizeof r->joined_from[h.rank], "%s", p->peer);
    r->joined++;
    mk_rdv_log(st, "rendezvous: rank %d joined from %s (%d of %d)%s", h.rank, p->peer, r->joined, st->world - 1,
               p->io.ssl ? ", TLS" : "");
    p->io = (mk_io){.fd = -1, .ssl = NULL};
}

/* Read what p has sent, without waiting, and judge it once a header, then the whole hello,
 * is in. Under TLS the handshake comes first, step by step in the same poll loop. */
static void mk_rdv_read(mk_rdv *r, mk_pending *p) {
    if (p->handshaking) {
        bool done = false;
        if (mk_tls_handshake_step(&p->io, &done, &p->events) != MK_OK) {
            mk_rdv_drop(r, p, MK_OK, "no TLS with this run's key", "the TLS handshake failed: %s", mk_last_error());
            return;
        }
        if (!done) return;
        p->handshaking = false;
    }
    mk_hello_judgement j;
    for (;;) {
        mk_hello_judge(r->st, p->buf, p->have, &j);
        if (j.verdict != MK_HELLO_MORE) break;
        size_t got = 0;
        const mk_status s = mk_io_read_now(&p->io, p->buf + p->have, j.need - p->have, &got, "hello");
        p->have += got;
        if (s == MK_ERR_PEER_CLOSED) {
            if (p->have == 0) mk_rdv_drop(r, p, MK_OK, NULL, "closed without a word");
            else mk_rdv_drop(r, p, MK_OK, NULL, "closed after %zu of the %zu bytes of its hello", p->have, j.need);
            return;
        }
        if (s != MK_OK) {
            mk_rdv_drop(r, p, MK_OK, NULL, "reading its hello failed: %s", mk_last_error());
            return;
        }
        if (got == 0) return; /* nothing more for now */
    }
    mk_rdv_hello(r, p, &j);
}

/* Take every connection waiting at the listener. */
static mk_status mk_rdv_accept(mk_rdv *r, int lfd, int64_t deadline) {
    for (;;) {
        const int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (mk_accept_error_is_transient(errno)) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return MK_OK;
            return mk_fail(MK_ERR_IO, "rendezvous: accept failed: %s", strerror(errno));
        }
        /* A free entry, or the oldest pending connection makes room. */
        mk_pending *p = NULL, *oldest = NULL;
        for (size_t i = 0; i < MK_RDV_MAX_PENDING && !p; i++) {
            mk_pending *q = &r->pend[i];
            if (q->io.fd < 0) p = q;
            else if (!oldest || q->since < oldest->since) oldest = q;
        }
        if (!p) {
            mk_rdv_drop(r, oldest, MK_OK, NULL, "no hello while %d later connections waited", MK_RDV_MAX_PENDING);
            p = oldest;
        }
        p->io = (mk_io){.fd = fd, .ssl = NULL};
        p->have = 0;
        p->handshaking = false;
        p->events = POLLIN;
        p->since = mk_now_ms();
        const int64_t hello_by = p->since + (r->st->timeout_ms < MK_RDV_HELLO_MS ? r->st->timeout_ms : MK_RDV_HELLO_MS);
        p->deadline = hello_by < deadline ? hello_by : deadline;
        mk_socket_peer_name(fd, "an unknown peer", p->peer, sizeof p->peer);
        if (r->tls) {
            if (mk_tls_attach(&p->io, r->tls, true) != MK_OK) {
                mk_rdv_drop(r, p, MK_OK, NULL, "no TLS session: %s", mk_last_error());
                continue;
            }
            p->handshaking = true;
            mk_rdv_read(r, p); /* the first step: the client hello may be there already */
        }
    }
}

/* A rank that joined, then closed (or spoke out of turn) before its welcome. */
static mk_status mk_rdv_check_joined(mk_rdv *r, int k) {
    char byte;
    ssize_t got = recv(r->st->ctl[k].fd, &byte, 1, MSG_PEEK);
    if (got > 0 && r->st->ctl[k].ssl) { /* a TLS record: a close_notify, or data */
        size_t n = 0;
        got = mk_io_read_now(&r->st->ctl[k], &byte, 1, &n, "message") == MK_ERR_PEER_CLOSED ? 0 : n > 0 ? 1 : -1;
        mk_clear_error();
        if (got < 0) errno = EAGAIN;
    }
    if (got > 0) return mk_fail(MK_ERR_FRAME, "rank %d (from %s) sent a message before its welcome", k, r->joined_from[k]);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return MK_OK;
    return mk_fail(MK_ERR_PEER_LOST, "rank %d (from %s) joined, then closed its connection before the welcome", k,
                   r->joined_from[k]);
}

/* Wait for every rank until the deadline; the failure names the missing and the dropped. */
static mk_status mk_rdv_gather(mk_rdv *r, int lfd, const char *bound, int64_t deadline) {
    mk_stage *st = r->st;
    while (r->joined < st->world - 1) {
        struct pollfd pfd[1 + MK_RDV_MAX_PENDING + MK_STAGE_MAX_WORLD];
        int who[1 + MK_RDV_MAX_PENDING + MK_STAGE_MAX_WORLD]; /* >= 0: pending entry; < 0: -rank */
        nfds_t n = 0;
        int64_t wake = deadline;
        const int64_t now = mk_now_ms();
        pfd[n] = (struct pollfd){.fd = lfd, .events = POLLIN};
        who[n++] = 0;
        for (size_t i = 0; i < MK_RDV_MAX_PENDING; i++) {
            mk_pending *p = &r->pend[i];
            if (p->io.fd < 0) continue;
            if (now >= p->deadline) {
                if (p->have) mk_rdv_drop(r, p, MK_OK, NULL, "sent %zu bytes of a hello, then nothing within %lld ms", p->have,
                                         (long long)(p->deadline - p->since));
                else mk_rdv_drop(r, p, MK_OK, NULL, "said nothing within %lld ms", (long long)(p->deadline - p->since));
                continue;
            }
            if (p->deadline < wake) wake = p->deadline;
            pfd[n] = (struct pollfd){.fd = p->io.fd, .events = p->handshaking ? p->events : POLLIN};
            who[n++] = (int)i;
        }
        for (int k = 1; k < st->world; k++)
            if (st->ctl[k].fd >= 0) {
                pfd[n] = (struct pollfd){.fd = st->ctl[k].fd, .events = POLLIN};
                who[n++] = -k;
            }
        if (now >= deadline) break;
        const int64_t left = wake - now;
        const int ready = poll(pfd, n, (int)(left > 60000 ? 60000 : left));
        if (ready < 0 && errno != EINTR) return mk_fail(MK_ERR_IO, "rendezvous: poll failed: %s", strerror(errno));
        for (nfds_t i = 1; ready > 0 && i < n; i++) {
            if (!pfd[i].revents) continue;
            if (who[i] >= 0 && r->pend[who[i]].io.fd == pfd[i].fd) mk_rdv_read(r, &r->pend[who[i]]);
            else if (who[i] < 0) MK_TRY(mk_rdv_check_joined(r, -who[i]));
        }
        if (ready > 0 && pfd[0].revents) MK_TRY(mk_rdv_accept(r, lfd, deadline));
    }
    if (r->joined == st->world - 1) return MK_OK;
    char missing[256] = "";
    for (int k = 1; k < st->world; k++)
        if (st->ctl[k].fd < 0) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %d", k);
    char dropped[1100] = "";
    if (r->n_dropped) snprintf(dropped, sizeof dropped, "; dropped %zu connection(s): %s", r->n_dropped, r->dropped);
    /* A missing rank that said hello as another stage is the likelier story than silence. */
    if (r->claim_status != MK_OK && st->ctl[r->claim_rank].fd < 0)
        return mk_fail(r->claim_status, "%s; rendezvous at %s: rank(s)%s did not join within %d ms%s", r->claim_message,
                       bound, missing, st->timeout_ms, dropped);
    return mk_fail(MK_ERR_PEER_TIMEOUT, "rendezvous at %s: rank(s)%s did not join within %d ms%s", bound, missing,
                   st->timeout_ms, dropped);
}

/* Bound to loopback: only this host can reach it. */
static bool mk_is_loopback(const char *address) {
    return strncmp(address, "127.", 4) == 0 || strncmp(address, "[::1]", 5) == 0 || address[0] == '/';
}

/* The run's seam ticket: 16 random bytes as hex, from the kernel's generator. */
static mk_status mk_draw_ticket(char out[MK_SEAM_TICKET_BYTES + 1]) {
    unsigned char raw[MK_SEAM_TICKET_BYTES / 2];
    size_t have = 0;
    while (have < sizeof raw) {
        const ssize_t n = getrandom(raw + have, sizeof raw - have, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return mk_fail(MK_ERR_IO, "getrandom failed: %s", strerror(errno));
        have += (size_t)n;
    }
    mk_hex(raw, sizeof raw, out);
    return MK_OK;
}

static mk_status mk_rendezvous_root(mk_stage *st, int64_t deadline) {
    int lfd = -1;
    char bound[300];
    MK_TRY(mk_socket_listen(MK_SEAM_TCP, st->o.rendezvous, &lfd, bound, sizeof bound));
    if (!st->tls && !mk_is_loopback(bound))
        mk_rdv_log(st, "rendezvous at %s: not loopback and no TLS: whoever reaches it with the model file can take a "
                       "rank's place (--tls-psk or --tls-cert/--tls-key/--tls-ca protects it)", bound);
    mk_rdv *r = calloc(1, sizeof *r);
    mk_pending *pend = calloc(MK_RDV_MAX_PENDING, sizeof *pend);
    mk_status s = r && pend ? MK_OK : mk_fail(MK_ERR_OUT_OF_MEMORY, "rendezvous: out of memory");
    if (s == MK_OK) {
        r->st = st;
        r->pend = pend;
        for (size_t i = 0; i < MK_RDV_MAX_PENDING; i++) pend[i].io = (mk_io){.fd = -1, .ssl = NULL};
        r->tls = st->tls;
        s = mk_rdv_gather(r, lfd, bound, deadline);
    }
    close(lfd); /* later connections are refused by the kernel */
    for (size_t i = 0; pend && i < MK_RDV_MAX_PENDING; i++)
        mk_io_close(&pend[i].io);
    free(pend);
    mk_hello hello[MK_STAGE_MAX_WORLD];
    memset(hello, 0, sizeof hello);
    if (r) memcpy(hello, r->hello, sizeof hello);
    free(r);
    if (s != MK_OK) {
        char message[1600];
        snprintf(message, sizeof message, "%s", mk_last_error());
        mk_abort_all(st, s, message);
        return mk_fail(s, "%s", message);
    }
    snprintf(st->next_address, sizeof st->next_address, "%s", hello[1].address);
    s = mk_draw_ticket(st->seam_ticket);
    if (s != MK_OK) {
        char message[512];
        snprintf(message, sizeof message, "rank 0 could not draw the seam ticket: %s", mk_last_error());
        mk_abort_all(st, s, message);
        return mk_fail(s, "%s", message);
    }
    /* nccl seams: unless the launcher broadcast them (MPI), rank 0 makes the unique id of
     * every seam's communicator (seam k joins rank k and k + 1) and hands each rank the two
     * it needs in the welcome. */
    static const char none[] = "-";
    char ids[MK_STAGE_MAX_WORLD][2 * MK_SEAM_NCCL_ID_BYTES + 1];
    for (int k = 0; k + 1 < st->world; k++) snprintf(ids[k], sizeof ids[k], "%s", none);
    if (st->o.seam == MK_SEAM_NCCL && st->o.nccl_ids) {
        memcpy(st->nccl_next, st->o.nccl_ids->next, sizeof st->nccl_next); /* MPI_Bcast'ed: the welcome has none */
    } else if (st->o.seam == MK_SEAM_NCCL) {
        for (int k = 0; s == MK_OK && k + 1 < st->world; k++) {
            unsigned char id[MK_SEAM_NCCL_ID_BYTES];
            s = mk_seam_nccl_id_new(id, sizeof id);
            if (s == MK_OK) mk_hex(id, sizeof id, ids[k]);
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
        const int n = snprintf(body, sizeof body, "%zu %zu %zu %s %s %s %s", st->max_context, st->max_rows,
                               st->max_sequences, k + 1 < st->world ? hello[k + 1].address : "-", ids[k - 1],
                               k + 1 < st->world ? ids[k] : none, st->seam_ticket);
        s = mk_ctl_send(&st->ctl[k], MK_CTL_WELCOME, body, (size_t)n, deadline);
        if (s != MK_OK) s = mk_stage_wrap(s, "rank 0 could not welcome rank %d", k);
    }
    return s;
}

/* ======================================================== other ranks == */

/* Unix seams listen at MK_STAGE_SOCKET_DIR/meshkern-stage-PID-rankR.sock until the
 * previous rank has connected (the listener then goes, and its file with it). A rank
 * killed before that cannot remove its file: every unix stage that starts removes the ones
 * whose process is gone (sockets of this user only). */
#define MK_STAGE_SOCKET_DIR "/tmp"

static void mk_sweep_stale_sockets(const mk_stage *st) {
    DIR *d = opendir(MK_STAGE_SOCKET_DIR);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        int pid = 0, rank = 0;
        char name[96];
        if (sscanf(e->d_name, "meshkern-stage-%d-rank%d.sock", &pid, &rank) != 2 || pid <= 0 || pid == (int)getpid())
            continue;
        snprintf(name, sizeof name, "meshkern-stage-%d-rank%d.sock", pid, rank);
        if (strcmp(name, e->d_name) != 0) continue; /* exactly the name a stage gives its socket */
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours to ask) */
        char path[300];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", MK_STAGE_SOCKET_DIR, e->d_name);
        if (lstat(path, &sb) != 0 || !S_ISSOCK(sb.st_mode) || sb.st_uid != geteuid()) continue;
        if (unlink(path) == 0) mk_rdv_log(st, "removed %s, left by a stage process that is gone", path);
    }
    closedir(d);
}

/* Where this rank's seam listens: on the interface that reaches rank 0 (TCP), or a
 * socket path of this process (unix). */
static mk_status mk_listen_seam(mk_stage *st) {
    if (st->o.seam == MK_SEAM_NCCL) return MK_OK; /* the communicators join by the ids rank 0 hands out */
    char address[300];
    if (st->o.seam == MK_SEAM_UNIX) {
        snprintf(address, sizeof address, "%s/meshkern-stage-%d-rank%d.sock", MK_STAGE_SOCKET_DIR, (int)getpid(),
                 st->rank);
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
    so.tls = st->o.tls;
    MK_TRY(mk_seam_listen(&so, &st->listener));
    const char *bound = mk_seam_listener_address(st->listener);
    mk_rdv_log(st, "seam listener at %s", bound);
    if (!st->tls && !mk_is_loopback(bound))
        mk_rdv_log(st, "seam listener at %s: not loopback and no TLS: whoever reaches it can feed this rank "
                       "(--tls-psk or --tls-cert/--tls-key/--tls-ca protects it)", bound);
    return MK_OK;
}

static mk_status mk_rendezvous_join(mk_stage *st, int64_t deadline) {
    int fd = -1;
    mk_status s = mk_socket_connect(MK_SEAM_TCP, st->o.rendezvous, deadline, &fd);
    if (s != MK_OK) return mk_stage_wrap(s, "rank %d: no rendezvous at %s", st->rank, st->o.rendezvous);
    st->ctl[0].fd = fd;
    if (st->tls) {
        MK_TRY(mk_tls_attach(&st->ctl[0], st->tls, false));
        s = mk_tls_handshake(&st->ctl[0], NULL, deadline);
        if (s != MK_OK)
            return mk_stage_wrap(s, "rank %d: no TLS with rank 0 at %s (another key or CA, or rank 0 without TLS)", st->rank,
                                 st->o.rendezvous);
    }
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
    char ticket[MK_SEAM_TICKET_BYTES + 2] = "";
    if (type != MK_CTL_WELCOME ||
        sscanf(body, "%zu %zu %zu %299s %256s %256s %33s", &st->max_context, &st->max_rows, &st->max_sequences, next,
               prev_id, next_id, ticket) != 7 ||
        st->max_context == 0 || st->max_rows == 0 || st->max_sequences == 0 || strlen(ticket) != MK_SEAM_TICKET_BYTES)
        return mk_fail(MK_ERR_FRAME, "rank 0 sent no usable welcome (type %d)", (int)type);
    if (st->o.seam == MK_SEAM_NCCL && st->o.nccl_ids) {
        memcpy(st->nccl_prev, st->o.nccl_ids->prev, sizeof st->nccl_prev);
        memcpy(st->nccl_next, st->o.nccl_ids->next, sizeof st->nccl_next);
    } else if (st->o.seam == MK_SEAM_NCCL && (!mk_unhex(prev_id, st->nccl_prev) ||
                                       (st->rank + 1 < st->world && !mk_unhex(next_id, st->nccl_next))))
        return mk_fail(MK_ERR_FRAME, "rank 0 sent rank %d no usable NCCL unique ids", st->rank);
    memcpy(st->seam_ticket, ticket, sizeof st->seam_ticket);
    n = snprintf(st->next_address, sizeof st->next_address, "%s", strcmp(next, "-") == 0 ? "" : next);
    (void)n;
    if (st->o.seam != MK_SEAM_NCCL && st->rank + 1 < st->world && !st->next_address[0])
        return mk_fail(MK_ERR_FRAME, "rank 0 gave rank %d no address of rank %d", st->rank, st->rank + 1);
    return MK_OK;
}

mk_status mk_stage_rendezvous(mk_stage *st) {
    const int64_t deadline = mk_deadline_ms(st->timeout_ms, 30000);
    if (st->o.seam == MK_SEAM_UNIX) mk_sweep_stale_sockets(st);
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
