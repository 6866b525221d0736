/* The public seam API: construction of seam ends for each transport, and the one
 * receive path that runs the boundary contract between header and payload. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/options.h"
#include "net/io.h"
#include "protocol/bundle_codec.h"
#include "mk_error.h"
#include "seam/seam.h"

/* One table: kind <-> name. */
static const struct {
    mk_seam_kind kind;
    const char *name;
} mk_seam_kinds[] = {{MK_SEAM_LOCAL, "local"}, {MK_SEAM_WIRE, "wire"}, {MK_SEAM_UNIX, "unix"}, {MK_SEAM_TCP, "tcp"},
                    {MK_SEAM_NCCL, "nccl"}};

mk_status mk_seam_kind_from_name(const char *name, mk_seam_kind *out) {
    mk_clear_error();
    for (size_t i = 0; name && out && i < sizeof mk_seam_kinds / sizeof *mk_seam_kinds; i++)
        if (strcmp(name, mk_seam_kinds[i].name) == 0) {
            *out = mk_seam_kinds[i].kind;
            return MK_OK;
        }
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "unknown seam '%s' (local, wire, unix, tcp, nccl)", name ? name : "(null)");
}

const char *mk_seam_kind_name(mk_seam_kind kind) {
    for (size_t i = 0; i < sizeof mk_seam_kinds / sizeof *mk_seam_kinds; i++)
        if (mk_seam_kinds[i].kind == kind) return mk_seam_kinds[i].name;
    return "unknown";
}

mk_seam_options mk_seam_options_default(mk_seam_kind kind) {
    mk_seam_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.kind = kind;
    o.connect_timeout_ms = 5000;
    o.io_timeout_ms = 30000;
    return o;
}

static double mk_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool mk_is_stream(mk_seam_kind kind) { return kind == MK_SEAM_UNIX || kind == MK_SEAM_TCP; }

/* TLS runs inside the stream transports only: asked of another, nothing would be encrypted. */
mk_status mk_seam_check_tls(const mk_seam_options *opt) {
    if (!opt->tls.enabled) return MK_OK;
    if (!mk_is_stream(opt->kind))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "seam TLS protects the unix and tcp seams only; the %s seam %s",
                       mk_seam_kind_name(opt->kind),
                       opt->kind == MK_SEAM_NCCL ? "is not encrypted" : "never leaves the process (nothing to encrypt)");
    return mk_tls_check(&opt->tls);
}

static mk_status mk_seam_new(const mk_seam_options *opt, mk_range *range, bool sender, mk_seam **out) {
    MK_TRY(mk_seam_check_tls(opt));
    mk_seam *s = calloc(1, sizeof *s);
    if (!s) return mk_fail(MK_ERR_OUT_OF_MEMORY, "seam: out of memory");
    s->kind = opt->kind;
    s->range = range;
    s->sender = sender;
    s->options = *opt;
    s->options.address = NULL; /* not kept: the caller owns the string */
    *out = s;
    return MK_OK;
}

void mk_seam_free(mk_seam *s) {
    if (!s) return;
    if (s->ops) s->ops->destroy(s);
    free(s);
}

/* ================================================================ in process == */

/* The caller's options by their struct_size (fields an older caller lacks keep their defaults). */
static mk_status mk_seam_take_options(const mk_seam_options *given, mk_seam_options *o) {
    *o = mk_seam_options_default(0);
    return mk_options_take(o, sizeof *o, MK_SEAM_OPTIONS_V1_SIZE, given, "mk_seam_options");
}

mk_status mk_seam_pair(const mk_seam_options *given, mk_range *sender, mk_range *receiver, mk_seam **send_end,
                       mk_seam **recv_end) {
    mk_clear_error();
    if (!given || !sender || !receiver || !send_end || !recv_end)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_pair: NULL argument");
    *send_end = *recv_end = NULL;
    mk_seam_options taken;
    MK_TRY(mk_seam_take_options(given, &taken));
    const mk_seam_options *opt = &taken;
    mk_seam *tx = NULL, *rx = NULL;
    MK_TRY(mk_seam_new(opt, sender, true, &tx));
    mk_status s = mk_seam_new(opt, receiver, false, &rx);
    if (s == MK_OK) {
        if (mk_is_stream(opt->kind)) {
            tx->options.address = opt->address; /* used while connecting only */
            s = mk_seam_stream_pair(tx, rx);
            tx->options.address = NULL;
        } else if (opt->kind == MK_SEAM_LOCAL) {
            s = mk_seam_local_pair(tx, rx);
        } else if (opt->kind == MK_SEAM_WIRE) {
            s = mk_seam_wire_pair(tx, rx);
        } else if (opt->kind == MK_SEAM_NCCL) {
            s = mk_seam_nccl_pair(tx, rx);
        } else {
            s = mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_pair: unknown seam kind %d", (int)opt->kind);
        }
    }
    if (s != MK_OK) {
        mk_seam_free(tx);
        mk_seam_free(rx);
        return s;
    }
    *send_end = tx;
    *recv_end = rx;
    return MK_OK;
}

/* ============================================================ across processes == */

struct mk_seam_listener {
    mk_seam_options options;
    int fd;
    char address[300];
};

static mk_status mk_check_stream(const mk_seam_options *opt, const char *who) {
    if (!mk_is_stream(opt->kind) && opt->kind != MK_SEAM_NCCL)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s: only the unix, tcp and nccl seams cross processes, not '%s'", who,
                       mk_seam_kind_name(opt->kind));
    if (opt->kind == MK_SEAM_NCCL && (!opt->address || !*opt->address))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "%s: the nccl seam across processes needs an address (the id file)", who);
    return mk_seam_check_tls(opt);
}

mk_status mk_seam_listen(const mk_seam_options *given, mk_seam_listener **out) {
    mk_clear_error();
    if (!given || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_listen: NULL argument");
    *out = NULL;
    mk_seam_options taken;
    MK_TRY(mk_seam_take_options(given, &taken));
    const mk_seam_options *opt = &taken;
    MK_TRY(mk_check_stream(opt, "mk_seam_listen"));
    mk_seam_listener *l = calloc(1, sizeof *l);
    if (!l) return mk_fail(MK_ERR_OUT_OF_MEMORY, "seam: out of memory");
    l->options = *opt;
    l->options.address = NULL;
    if (opt->kind == MK_SEAM_NCCL) {
        /* No socket: the unique id goes to the file the sender reads. */
        l->fd = -1;
        const int n = snprintf(l->address, sizeof l->address, "%s", opt->address);
        mk_status s = n < 0 || (size_t)n >= sizeof l->address
                          ? mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_listen: id file path too long")
                          : mk_seam_nccl_publish(l->address);
        if (s != MK_OK) {
            free(l);
            return s;
        }
        *out = l;
        return MK_OK;
    }
    const mk_status s = mk_socket_listen(opt->kind, opt->address, &l->fd, l->address, sizeof l->address);
    if (s != MK_OK) {
        free(l);
        return s;
    }
    *out = l;
    return MK_OK;
}

const char *mk_seam_listener_address(const mk_seam_listener *l) {
    return l ? l->address : "";
}

void mk_seam_listener_free(mk_seam_listener *l) {
    if (!l) return;
    if (l->fd >= 0) close(l->fd);
    if (l->options.kind == MK_SEAM_UNIX || l->options.kind == MK_SEAM_NCCL) (void)unlink(l->address);
    free(l);
}

/* One NCCL end across processes: the seam, then its join through the id file. */
static mk_status mk_seam_nccl_end(const mk_seam_options *opt, const char *id_path, mk_range *range, bool sender,
                                  mk_seam **out) {
    mk_seam *s = NULL;
    MK_TRY(mk_seam_new(opt, range, sender, &s));
    const mk_status st = mk_seam_nccl_join(s, id_path);
    if (st != MK_OK) {
        mk_seam_free(s);
        return st;
    }
    *out = s;
    return MK_OK;
}

mk_status mk_seam_nccl_end_with_id(const mk_seam_options *opt, const unsigned char *id, size_t len, mk_range *range,
                                   bool sender, mk_seam **out) {
    mk_seam *s = NULL;
    MK_TRY(mk_seam_new(opt, range, sender, &s));
    const mk_status st = mk_seam_nccl_join_id(s, id, len);
    if (st != MK_OK) {
        mk_seam_free(s);
        return st;
    }
    *out = s;
    return MK_OK;
}

mk_status mk_seam_accept(mk_seam_listener *l, mk_range *receiver, mk_seam **out) {
    mk_clear_error();
    if (!l || !receiver || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_accept: NULL argument");
    *out = NULL;
    if (l->options.kind == MK_SEAM_NCCL) return mk_seam_nccl_end(&l->options, l->address, receiver, false, out);
    const int64_t deadline = mk_deadline_ms(l->options.connect_timeout_ms, 5000);
    int fd = -1;
    MK_TRY(mk_socket_accept(l->fd, deadline, &fd));
    mk_seam *s = NULL;
    mk_status st = mk_seam_new(&l->options, receiver, false, &s);
    if (st != MK_OK) {
        close(fd);
        return st;
    }
    st = mk_seam_stream_end(s, fd, true, deadline);
    if (st != MK_OK) {
        mk_seam_free(s);
        return st;
    }
    *out = s;
    return MK_OK;
}

/* How long one connection may take to prove itself before the listener drops it: long
 * enough for a TLS handshake across a slow link, a quarter of the whole wait at most (a
 * few silent strangers cannot use it up). */
#define MK_SEAM_TICKET_MS 2000
static int64_t mk_ticket_budget_ms(int connect_timeout_ms) {
    const int64_t quarter = (connect_timeout_ms > 0 ? connect_timeout_ms : 5000) / 4;
    return quarter < 250 ? 250 : quarter > MK_SEAM_TICKET_MS ? MK_SEAM_TICKET_MS : quarter;
}

/* One accepted connection: its TLS handshake (tls: the listener's context, or NULL) and its
 * ticket, by conn_deadline. */
static mk_status mk_seam_check_ticket(int fd, SSL_CTX *tls, const char *ticket, int64_t conn_deadline, mk_io *io) {
    *io = (mk_io){.fd = fd, .ssl = NULL};
    if (tls) {
        MK_TRY(mk_tls_attach(io, tls, true));
        MK_TRY(mk_tls_handshake(io, NULL, conn_deadline));
    }
    const size_t tag = sizeof MK_SEAM_TICKET_TAG - 1;
    char got[sizeof MK_SEAM_TICKET_TAG - 1 + MK_SEAM_TICKET_BYTES];
    MK_TRY(mk_io_read(io, got, sizeof got, conn_deadline, "seam ticket"));
    unsigned diff = 0; /* constant time: the ticket is the run's secret */
    for (size_t i = 0; i < MK_SEAM_TICKET_BYTES; i++) diff |= (unsigned char)got[tag + i] ^ (unsigned char)ticket[i];
    if (memcmp(got, MK_SEAM_TICKET_TAG, tag) != 0)
        return mk_fail(MK_ERR_FRAME, "its first bytes are not a meshkern seam ticket");
    if (diff) return mk_fail(MK_ERR_AUTH, "a seam ticket of another run");
    return MK_OK;
}

mk_status mk_seam_accept_ticketed(mk_seam_listener *l, mk_range *receiver, const char *ticket,
                                  void (*log)(void *user, const char *line), void *user, mk_seam **out) {
    mk_clear_error();
    if (!l || !receiver || !ticket || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_accept_ticketed: NULL argument");
    if (strlen(ticket) != MK_SEAM_TICKET_BYTES)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_accept_ticketed: a ticket has %d characters", MK_SEAM_TICKET_BYTES);
    *out = NULL;
    if (l->options.kind == MK_SEAM_NCCL) return mk_seam_accept(l, receiver, out);
    const int64_t deadline = mk_deadline_ms(l->options.connect_timeout_ms, 5000);
    /* one TLS context for every connection: a broken key or certificate fails here, at once,
     * not as every connection dropped */
    SSL_CTX *tls = NULL;
    if (l->options.tls.enabled) MK_TRY(mk_tls_context(&l->options.tls, true, &tls));
    size_t dropped = 0;
    char last[300] = "";
    for (;;) {
        int fd = -1;
        mk_status st = mk_socket_accept(l->fd, deadline, &fd);
        if (st != MK_OK) mk_tls_context_free(tls);
        if (st == MK_ERR_PEER_TIMEOUT && dropped)
            return mk_fail(st, "seam: no peer with this run's ticket connected before the deadline (dropped %zu "
                               "connection(s); the last: %s)", dropped, last);
        if (st != MK_OK) return st;
        char peer[INET6_ADDRSTRLEN + 16];
        mk_socket_peer_name(fd, "a local peer", peer, sizeof peer);
        const int64_t mine = mk_now_ms() + mk_ticket_budget_ms(l->options.connect_timeout_ms);
        mk_io io;
        st = mk_seam_check_ticket(fd, tls, ticket, mine < deadline ? mine : deadline, &io);
        if (st != MK_OK) {
            snprintf(last, sizeof last, "%s: %s", peer, mk_last_error());
            if (log) {
                char line[800];
                snprintf(line, sizeof line, "seam listener at %s: dropped %s", l->address, last);
                log(user, line);
            }
            mk_io_close(&io);
            mk_clear_error();
            dropped++;
            continue;
        }
        mk_seam *s = NULL;
        st = mk_seam_new(&l->options, receiver, false, &s);
        if (st == MK_OK) st = mk_seam_stream_adopt(s, io, tls);
        else mk_io_close(&io), mk_tls_context_free(tls);
        if (st != MK_OK) {
            mk_seam_free(s);
            return st;
        }
        *out = s;
        return MK_OK;
    }
}

mk_status mk_seam_send_ticket(mk_seam *s, const char *ticket) {
    if (!ticket || strlen(ticket) != MK_SEAM_TICKET_BYTES)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_send_ticket: a ticket has %d characters", MK_SEAM_TICKET_BYTES);
    char bytes[sizeof MK_SEAM_TICKET_TAG - 1 + MK_SEAM_TICKET_BYTES];
    memcpy(bytes, MK_SEAM_TICKET_TAG, sizeof MK_SEAM_TICKET_TAG - 1);
    memcpy(bytes + sizeof MK_SEAM_TICKET_TAG - 1, ticket, MK_SEAM_TICKET_BYTES);
    return mk_seam_stream_write_raw(s, bytes, sizeof bytes);
}

mk_status mk_seam_connect(const mk_seam_options *given, mk_range *sender, mk_seam **out) {
    mk_clear_error();
    if (!given || !sender || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_connect: NULL argument");
    *out = NULL;
    mk_seam_options taken;
    MK_TRY(mk_seam_take_options(given, &taken));
    const mk_seam_options *opt = &taken;
    MK_TRY(mk_check_stream(opt, "mk_seam_connect"));
    if (opt->kind == MK_SEAM_NCCL) return mk_seam_nccl_end(opt, opt->address, sender, true, out);
    const int64_t deadline = mk_deadline_ms(opt->connect_timeout_ms, 5000);
    int fd = -1;
    MK_TRY(mk_socket_connect(opt->kind, opt->address, deadline, &fd));
    mk_seam *s = NULL;
    mk_status st = mk_seam_new(opt, sender, true, &s);
    if (st != MK_OK) {
        close(fd);
        return st;
    }
    st = mk_seam_stream_end(s, fd, false, deadline);
    if (st != MK_OK) {
        mk_seam_free(s);
        return st;
    }
    *out = s;
    return MK_OK;
}

/* ========================================================== send and receive == */

mk_status mk_seam_stage_rows(mk_backend *be, const mk_boundary *const *b, size_t n, void *staging, int32_t *positions,
                             const void **rows, const mk_boundary_header **h) {
    size_t row = 0;
    for (size_t k = 0; k < n; k++) {
        const size_t hidden = b[k]->h.hidden, bytes = b[k]->h.rows * hidden * sizeof(float);
        rows[k] = b[k]->payload;
        if (!be->ops->host_addressable) {
            rows[k] = (char *)staging + row * hidden * sizeof(float);
            MK_TRY(be->ops->download_async(be, (void *)rows[k], b[k]->payload, bytes));
        }
        for (size_t i = 0; i < b[k]->h.rows; i++) positions[row + i] = (int32_t)(b[k]->h.position + (int64_t)i);
        row += b[k]->h.rows;
        h[k] = &b[k]->h;
    }
    return be->ops->synchronize(be); /* the rows are complete */
}

mk_status mk_seam_send_batch(mk_seam *s, const mk_boundary *const *b, size_t n) {
    mk_clear_error();
    if (!s || !b) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_send: NULL argument");
    if (!s->sender) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_send: this is a receiving end");
    if (n == 0 || n > MK_MAX_BATCH_SEQUENCES)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_send: a batch carries 1 to %d boundaries, not %zu",
                       MK_MAX_BATCH_SEQUENCES, n);
    const mk_boundary_header *h[MK_MAX_BATCH_SEQUENCES] = {0}; /* (gcc -O3 cannot see n >= 1 fills it) */
    size_t rows = 0;
    for (size_t k = 0; k < n; k++) {
        if (!b[k]) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_send: boundary %zu is NULL", k);
        if (b[k]->range != s->range) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_send: the boundary is not this range's");
        if (b[k]->h.rows == 0) return mk_fail(MK_ERR_EMPTY_INPUT, "mk_seam_send: the boundary is empty");
        h[k] = &b[k]->h;
        rows += b[k]->h.rows;
    }
    MK_TRY(mk_bundle_batch_check(h, n));
    /* The receiver takes at most its own max_batch_tokens rows a message (as this range does). */
    if (rows > mk_range_max_rows(s->range))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_send: a batch of %zu rows exceeds max_batch_tokens %zu", rows,
                       mk_range_max_rows(s->range));
    const double t0 = mk_seconds();
    const mk_status st = s->ops->send(s, b, n);
    s->seconds += mk_seconds() - t0;
    return st;
}

mk_status mk_seam_send(mk_seam *s, const mk_boundary *b) {
    mk_clear_error();
    return mk_seam_send_batch(s, &b, 1);
}

mk_status mk_seam_send_wait(mk_seam *s) {
    mk_clear_error();
    if (!s || !s->sender) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_send_wait: not a sending end");
    const double t0 = mk_seconds();
    const mk_status st = s->ops->send_wait(s);
    s->seconds += mk_seconds() - t0;
    return st;
}

typedef struct seam_contract_args {
    const mk_range *range;
    const mk_sequence *seq;
} seam_contract_args;

static mk_status seam_contract(void *user, const mk_boundary_header *h, const mk_sequence **checked_for) {
    const seam_contract_args *a = user;
    MK_TRY(mk_range_check_boundary(a->range, a->seq, h));
    *checked_for = a->seq;
    return MK_OK;
}

/* One entry's contract, run by the transports that receive header and payload together. */
typedef struct seam_noted_entry {
    mk_seam_entry_contract contract;
    void *user;
    size_t k;
    const mk_sequence *seq;
} seam_noted_entry;

static mk_status seam_noted_entry_check(void *user, const mk_boundary_header *h) {
    seam_noted_entry *n = user;
    n->seq = NULL;
    return n->contract(n->user, n->k, h, &n->seq);
}

static void seam_stamp(mk_boundary *into, const mk_sequence *seq) {
    if (!seq) return;
    into->checked_seq = seq;
    into->checked_length = mk_sequence_length(seq);
}

/* The receive path: the contract on each entry's header, then its payload. The stage
 * runtime passes a contract that also picks the sequence the header's request id names. */
mk_status mk_seam_recv_batch_with(mk_seam *s, mk_seam_entry_contract contract, void *user, mk_boundary *const *into,
                                  size_t cap, size_t *n, mk_status *entry_status, char (*errors)[MK_SEAM_ENTRY_ERROR]) {
    *n = 0;
    if (s->sender) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_recv: this is a sending end");
    if (cap == 0 || cap > MK_MAX_BATCH_SEQUENCES)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_recv: room for 1 to %d boundaries, not %zu",
                       MK_MAX_BATCH_SEQUENCES, cap);
    for (size_t k = 0; k < cap; k++) {
        if (!into[k] || into[k]->range != s->range)
            return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_recv: boundary %zu is not this range's", k);
        into[k]->h.rows = 0;
        into[k]->checked_seq = NULL;
    }
    const double t0 = mk_seconds();
    mk_status st;
    if (s->ops->recv_checked) {
        /* The transport takes each entry's header and payload in one exchange; the contract
         * still runs here, on the header, before the transport posts the payload receive.
         * A refusal there ends the exchange (and the transport), so it is the message's. */
        size_t k = 0, more = 0;
        do {
            if (k == cap) {
                st = mk_fail(MK_ERR_SHAPE, "a batch of more than the %zu entries this receiver takes (%zu more came)",
                             cap, more);
                break;
            }
            seam_noted_entry noted = {contract, user, k, NULL};
            st = s->ops->recv_checked(s, seam_noted_entry_check, &noted, into[k], &more);
            if (st != MK_OK) {
                into[k]->h.rows = 0;
                break;
            }
            entry_status[k] = MK_OK;
            seam_stamp(into[k], noted.seq);
            k++;
        } while (more > 0);
        if (st == MK_OK) *n = k;
        else
            for (size_t j = 0; j < k; j++) { /* nothing of a failed message is accepted */
                into[j]->h.rows = 0;
                into[j]->checked_seq = NULL;
            }
        s->seconds += mk_seconds() - t0;
        return st;
    }
    mk_boundary_header h[MK_MAX_BATCH_SEQUENCES];
    size_t got = 0;
    st = s->ops->recv_header(s, h, cap, &got);
    if (st != MK_OK) {
        s->seconds += mk_seconds() - t0;
        return st;
    }
    /* Each entry on its own: the contract once on its header (nothing of its payload is
     * accepted before), then its payload. A refused entry leaves the others standing. */
    for (size_t k = 0; k < got; k++) {
        const mk_sequence *seq = NULL;
        mk_clear_error();
        mk_status e = contract(user, k, &h[k], &seq);
        if (e == MK_OK) {
            into[k]->h = h[k];
            e = s->ops->recv_payload(s, k, into[k]);
        }
        entry_status[k] = e;
        if (e != MK_OK) {
            into[k]->h.rows = 0;
            if (errors) snprintf(errors[k], MK_SEAM_ENTRY_ERROR, "%s", mk_last_error());
        } else {
            seam_stamp(into[k], seq);
        }
    }
    *n = got;
    s->seconds += mk_seconds() - t0;
    return MK_OK;
}

/* The single-sequence receive as a batch of room 1: the entry's own failure is the call's. */
typedef struct seam_single {
    mk_seam_contract contract;
    void *user;
} seam_single;

static mk_status seam_single_check(void *user, size_t k, const mk_boundary_header *h, const mk_sequence **checked_for) {
    (void)k;
    const seam_single *a = user;
    return a->contract(a->user, h, checked_for);
}

mk_status mk_seam_recv_with(mk_seam *s, mk_seam_contract contract, void *user, mk_boundary *into) {
    if (into->range != s->range) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_recv: the boundary is not this range's");
    seam_single single = {contract, user};
    size_t n = 0;
    mk_status entry = MK_OK;
    char error[1][MK_SEAM_ENTRY_ERROR];
    MK_TRY(mk_seam_recv_batch_with(s, seam_single_check, &single, &into, 1, &n, &entry, error));
    if (entry != MK_OK) return mk_fail(entry, "%s", error[0]);
    return MK_OK;
}

typedef struct seam_route_args {
    const mk_range *range;
    mk_seam_route route;
    void *user;
} seam_route_args;

static mk_status seam_route_contract(void *user, size_t k, const mk_boundary_header *h, const mk_sequence **checked_for) {
    const seam_route_args *a = user;
    const mk_sequence *seq = a->route(a->user, h);
    if (!seq) return mk_fail(MK_ERR_INVALID_ARGUMENT, "batch entry %zu: no sequence for request id '%.64s'", k, h->request_id);
    MK_TRY(mk_range_check_boundary(a->range, seq, h));
    *checked_for = seq;
    return MK_OK;
}

mk_status mk_seam_recv_batch(mk_seam *s, mk_seam_route route, void *user, mk_boundary *const *into, size_t capacity,
                             size_t *n_received, mk_status *entry_status) {
    mk_clear_error();
    if (!s || !route || !into || !n_received || !entry_status)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_recv_batch: NULL argument");
    *n_received = 0;
    seam_route_args args = {s->range, route, user};
    char errors[MK_MAX_BATCH_SEQUENCES][MK_SEAM_ENTRY_ERROR];
    MK_TRY(mk_seam_recv_batch_with(s, seam_route_contract, &args, into, capacity, n_received, entry_status, errors));
    mk_clear_error();
    for (size_t k = 0; k < *n_received; k++)
        if (entry_status[k] != MK_OK) {
            (void)mk_fail(entry_status[k], "%s", errors[k]); /* the first refused entry's reason */
            break;
        }
    return MK_OK;
}

mk_status mk_seam_recv(mk_seam *s, const mk_sequence *seq, mk_boundary *into) {
    mk_clear_error();
    if (!s || !seq || !into) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_recv: NULL argument");
    /* before anything is received: refused later, the message would be lost with it */
    if (mk_sequence_range(seq) != s->range)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_seam_recv: the sequence is not this receiving range's");
    seam_contract_args args = {s->range, seq};
    return mk_seam_recv_with(s, seam_contract, &args, into);
}

size_t mk_seam_bytes(const mk_seam *s) {
    return s ? s->bytes : 0;
}

double mk_seam_seconds(const mk_seam *s) {
    return s ? s->seconds : 0.0;
}
