/* Seam benchmark: what it costs to carry the residual across a seam.
 *
 * Part 1, the encoding: for residuals [1, seq, hidden] F32 it times pack (bundle ->
 * protobuf bytes into a reused buffer, mk_bundle_pack_to) and unpack (bytes -> validated
 * bundle reused across messages, mk_bundle_unpack_into), against memcpy of the same bytes
 * between warm buffers in the same run.
 *
 * Part 2, the transports: one hop of a real boundary (a head range's output, in its
 * backend memory) to a tail range's boundary through local, wire, unix and tcp seams
 * (and tcp inside TLS 1.3), per-hop latency and payload throughput against a ceiling
 * measured in the same run: memcpy for local and wire, and for unix/tcp the raw
 * throughput of the same socket kind (one thread writes the bytes, the other reads them).
 * Sizes: one decode row of SmolLM2 (576 floats, 2.3 KB), one row of a 4096-wide model
 * (16 KB), then prefill rows up to 512 x 4096 (8 MiB).
 *
 * Part 3, batches: the decode rows of N sequences (N = 1, 8, 64) crossing one seam per
 * step, as N messages (mk_seam_send / mk_seam_recv each) and as one batch message
 * (mk_seam_send_batch / mk_seam_recv_batch: TensorBundle schema 2), per step and per row,
 * both measured in the same run; every entry checked bit for bit first.
 *
 * Median of many runs after warm-up; inputs are random model activations, and every
 * received residual is checked bit for bit before anything is timed. Results also go to
 * seam_bench.json (in $OUT if set).
 *
 *   seam_bench [cpu|cuda [SEAM]]   backend of the two ranges (default cpu); only SEAM's
 *                                  transport rows (local, wire, unix, tcp, tcp+tls) */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "meshkern.h"
#include "bench_time.h"

static int die(const char *what) {
    fprintf(stderr, "seam_bench: %s: %s\n", what, mk_last_error());
    return 1;
}

/* Runs for a payload: many for small ones (latency), fewer for large ones. */
static int runs_for(size_t bytes) { return bytes <= (64u << 10) ? 301 : bytes <= (4u << 20) ? 41 : 15; }

/* ================================================================ ceilings == */

/* memcpy between warm buffers, offset so glibc's memcpy avoids 4 KiB aliasing. */
static double memcpy_seconds(size_t bytes) {
    uint8_t *src = aligned_alloc(4096, ((bytes + 8192) + 4095) & ~(size_t)4095);
    uint8_t *dst_block = aligned_alloc(4096, ((bytes + 8192) + 4095) & ~(size_t)4095);
    uint8_t *dst = dst_block + 2048;
    for (size_t i = 0; i < bytes; i++) src[i] = (uint8_t)(i * 131u);
    memset(dst, 0, bytes);
    const int runs = runs_for(bytes);
    double *t = malloc((size_t)runs * sizeof *t);
    const int reps = bytes >= (1u << 22) ? 1 : (int)((1u << 22) / bytes);
    for (int r = -3; r < runs; r++) {
        const double t0 = now_s();
        for (int k = 0; k < reps; k++) {
            memcpy(dst, src, bytes);
            __asm__ volatile("" ::"r"(dst) : "memory");
        }
        if (r >= 0) t[r] = (now_s() - t0) / reps;
    }
    const double m = median_in_place(t, runs);
    free(t);
    free(src);
    free(dst_block);
    return m;
}

typedef struct raw_job {
    int fd;
    const uint8_t *buf;
    size_t bytes;
    int runs;
} raw_job;

static void *raw_writer(void *arg) {
    raw_job *j = arg;
    for (int r = 0; r < j->runs; r++) {
        size_t put = 0;
        while (put < j->bytes) {
            const ssize_t w = send(j->fd, j->buf + put, j->bytes - put, MSG_NOSIGNAL);
            if (w <= 0) return NULL;
            put += (size_t)w;
        }
    }
    return NULL;
}

/* A connected pair of the given kind with the transport's socket buffer sizes. */
static int raw_pair(mk_seam_kind kind, int fds[2]) {
    const int buf = 4 << 20, one = 1;
    if (kind == MK_SEAM_UNIX) {
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return -1;
    } else {
        const int l = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        if (bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 1) != 0) return -1;
        getsockname(l, (struct sockaddr *)&a, &len);
        fds[0] = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fds[0], (struct sockaddr *)&a, sizeof a) != 0) return -1;
        fds[1] = accept(l, NULL, NULL);
        close(l);
        setsockopt(fds[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(fds[1], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    for (int i = 0; i < 2; i++) {
        setsockopt(fds[i], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
        setsockopt(fds[i], SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    }
    return 0;
}

/* Raw socket: one thread writes `bytes` per run, this one reads them; per-run median. */
static double socket_seconds(mk_seam_kind kind, size_t bytes) {
    int fds[2];
    if (raw_pair(kind, fds) != 0) return 0.0;
    uint8_t *out = malloc(bytes), *in = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) out[i] = (uint8_t)i;
    const int runs = runs_for(bytes);
    double *t = malloc((size_t)runs * sizeof *t);
    raw_job job = {fds[0], out, bytes, runs + 3};
    pthread_t th;
    pthread_create(&th, NULL, raw_writer, &job);
    for (int r = -3; r < runs; r++) {
        const double t0 = now_s();
        size_t got = 0;
        while (got < bytes) {
            const ssize_t n = recv(fds[1], in + got, bytes - got, 0);
            if (n <= 0) break;
            got += (size_t)n;
        }
        if (r >= 0) t[r] = now_s() - t0;
    }
    pthread_join(th, NULL);
    const double m = median_in_place(t, runs);
    close(fds[0]);
    close(fds[1]);
    free(t);
    free(out);
    free(in);
    return m;
}

/* ============================================================ part 1: codec == */

static int bench_codec(FILE *json, int *first) {
    const size_t seqs[] = {1, 16, 128, 512, 2048};
    const size_t hiddens[] = {576, 4096, 8192};
    printf("encoding: pack (mk_bundle_pack_to) and unpack (mk_bundle_unpack_into), buffers reused\n");
    printf("%6s %6s %10s | %9s %9s %9s | %7s %7s\n", "seq", "hidden", "payload", "memcpy", "pack", "unpack", "pack%",
           "unpack%");
    printf("%6s %6s %10s | %9s %9s %9s | %7s %7s\n", "", "", "KiB", "GB/s", "GB/s", "GB/s", "of cpy", "of cpy");
    unsigned seed = 12345;
    for (size_t hi = 0; hi < sizeof hiddens / sizeof *hiddens; hi++) {
        for (size_t si = 0; si < sizeof seqs / sizeof *seqs; si++) {
            const size_t seq = seqs[si], hidden = hiddens[hi], n = seq * hidden, bytes = n * sizeof(float);
            mk_bundle *b = NULL, *back = NULL;
            if (mk_bundle_create(1, seq, hidden, &b) != MK_OK || mk_bundle_create(1, seq, hidden, &back) != MK_OK)
                return die("bundle");
            float *res = mk_bundle_residual(b);
            for (size_t i = 0; i < n; i++) res[i] = (float)(rand_r(&seed) % 20001 - 10000) * 1e-3f;
            for (size_t i = 0; i < seq; i++) mk_bundle_positions(b)[i] = (int32_t)i;
            mk_boundary_header hd = *mk_bundle_header_of(b);
            memset(hd.recipe_digest, 'a', MK_DIGEST_HEX_LEN);
            mk_bundle_set_header(b, &hd);
            /* The wire buffer placed so the payload inside the message is 64-byte aligned and
             * half a page away from the source (no 4 KiB aliasing), as for the ceiling. */
            const size_t cap = mk_bundle_packed_size(b), offset = mk_bundle_payload_offset(b);
            uint8_t *wire_block = aligned_alloc(4096, (cap + 8192) & ~(size_t)4095);
            const size_t want = ((uintptr_t)res + 2048) & 4095; /* page offset of the payload */
            uint8_t *wire = wire_block + ((want - offset % 4096 + 4096) % 4096);
            memset(wire, 0, cap);
            const int runs = runs_for(bytes);
            double *t_pack = malloc((size_t)runs * sizeof(double)), *t_unpack = malloc((size_t)runs * sizeof(double));
            const int reps = bytes >= (1u << 22) ? 1 : (int)((1u << 22) / bytes);
            for (int r = -3; r < runs; r++) {
                size_t len = 0;
                const double t0 = now_s();
                for (int k = 0; k < reps; k++)
                    if (mk_bundle_pack_to(b, wire, cap, &len) != MK_OK) return die("pack");
                const double t1 = now_s();
                for (int k = 0; k < reps; k++)
                    if (mk_bundle_unpack_into(wire, len, back) != MK_OK) return die("unpack");
                const double t2 = now_s();
                if (memcmp(mk_bundle_residual(back), res, bytes) != 0) {
                    fprintf(stderr, "seam_bench: round trip is not exact at seq %zu hidden %zu\n", seq, hidden);
                    return 1;
                }
                if (r >= 0) {
                    t_pack[r] = (t1 - t0) / reps;
                    t_unpack[r] = (t2 - t1) / reps;
                }
            }
            const double gb = (double)bytes / 1e9;
            const double cpy = gb / memcpy_seconds(bytes), pk = gb / median_in_place(t_pack, runs), un = gb / median_in_place(t_unpack, runs);
            printf("%6zu %6zu %10.1f | %9.2f %9.2f %9.2f | %6.0f%% %6.0f%%\n", seq, hidden, bytes / 1024.0, cpy, pk, un,
                   100.0 * pk / cpy, 100.0 * un / cpy);
            fprintf(json,
                    "%s  {\"part\": \"codec\", \"seq\": %zu, \"hidden\": %zu, \"payload_bytes\": %zu, \"memcpy_gbps\": %.3f, "
                    "\"pack_gbps\": %.3f, \"unpack_gbps\": %.3f}",
                    *first ? "" : ",\n", seq, hidden, bytes, cpy, pk, un);
            *first = 0;
            free(t_pack);
            free(t_unpack);
            free(wire_block);
            mk_bundle_free(b);
            mk_bundle_free(back);
        }
    }
    return 0;
}

/* ======================================================= part 2: transports == */

/* A 2-layer model of the given width whose layers cost almost nothing (one head of 8,
 * ffn 8): only the residual's size matters here. */
static mk_status wide_model(size_t hidden, mk_model **out) {
    mk_hparams hp = mk_hparams_seed_default();
    hp.hidden = hidden;
    hp.n_layers = 2;
    hp.n_heads = hp.n_kv_heads = 1;
    hp.head_dim = 8;
    hp.intermediate = 8;
    hp.vocab = 16;
    hp.max_context = 512;
    return mk_model_create_random(&hp, 99, NULL, out);
}

typedef struct hop_case {
    const char *name;
    mk_seam_kind kind;
    bool tls;
} hop_case;

/* The transports both parts measure, one table. */
static const hop_case cases[] = {{"local", MK_SEAM_LOCAL, false}, {"wire", MK_SEAM_WIRE, false},
                                 {"unix", MK_SEAM_UNIX, false},   {"tcp", MK_SEAM_TCP, false},
                                 {"tcp+tls", MK_SEAM_TCP, true}};

/* A seam of case c between the two ranges (TLS with a fixed pre-shared key). */
static mk_status open_pair(const hop_case *c, mk_range *head, mk_range *tail, mk_seam **tx, mk_seam **rx) {
    mk_seam_options so = mk_seam_options_default(c->kind);
    so.tls.enabled = c->tls;
    so.tls.psk_hex = "8f2a61c0de55aa0193b7e4f6021c9d3b5e7a8c0f1d2e3f405162738495a6b7c8";
    return mk_seam_pair(&so, head, tail, tx, rx);
}

static int bench_transports(mk_backend_kind backend, const char *only, FILE *json, int *first) {
    const size_t sizes[][2] = {{1, 576}, {1, 4096}, {16, 4096}, {128, 4096}, {512, 4096}};
    printf("\ntransports (%s backend): one hop head boundary -> tail boundary, send + receive + validate\n",
           backend == MK_BACKEND_CUDA ? "cuda" : "cpu");
    printf("%-8s %5s %6s %9s | %9s %9s | %9s %9s | %6s\n", "seam", "rows", "hidden", "payload", "hop", "hop",
           "ceiling", "", "hop%");
    printf("%-8s %5s %6s %9s | %9s %9s | %9s %9s | %6s\n", "", "", "", "KiB", "us", "GB/s", "GB/s", "(what)", "of ceil");
    mk_model *models[2] = {NULL, NULL};
    if (wide_model(576, &models[0]) != MK_OK || wide_model(4096, &models[1]) != MK_OK) return die("model");
    mk_range_options opt = mk_range_options_default();
    opt.backend = mk_backend_config_default(backend);
    opt.max_context = 512;
    for (size_t zi = 0; zi < sizeof sizes / sizeof *sizes; zi++) {
        const size_t rows = sizes[zi][0], hidden = sizes[zi][1], bytes = rows * hidden * sizeof(float);
        const mk_model *model = models[hidden == 576 ? 0 : 1];
        mk_range *head = NULL, *tail = NULL;
        mk_sequence *hs = NULL, *ts = NULL;
        mk_boundary *out = NULL, *in = NULL;
        if (mk_range_create(model, 0, 0, &opt, &head) != MK_OK || mk_range_create(model, 1, 1, &opt, &tail) != MK_OK ||
            mk_sequence_open(head, &hs) != MK_OK || mk_sequence_open(tail, &ts) != MK_OK ||
            mk_boundary_create(head, &out) != MK_OK || mk_boundary_create(tail, &in) != MK_OK)
            return die("ranges");
        int32_t *ids = malloc(rows * sizeof(int32_t));
        for (size_t i = 0; i < rows; i++) ids[i] = (int32_t)((i * 7 + 3) % 16);
        if (mk_range_forward_boundary(head, hs, ids, rows, NULL, NULL, out, NULL) != MK_OK) return die("head forward");
        float *sent = malloc(bytes), *got = malloc(bytes);
        if (mk_boundary_read(out, sent, rows * hidden) != MK_OK) return die("read");
        const double t_copy = memcpy_seconds(bytes);
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
            const hop_case *c = &cases[ci];
            if (only && strcmp(only, c->name) != 0) continue;
            mk_seam *tx = NULL, *rx = NULL;
            if (open_pair(c, head, tail, &tx, &rx) != MK_OK) return die(c->name);
            const int runs = runs_for(bytes);
            double *t = malloc((size_t)runs * sizeof *t);
            for (int r = -3; r < runs; r++) {
                const double t0 = now_s();
                if (mk_seam_send(tx, out) != MK_OK || mk_seam_recv(rx, ts, in) != MK_OK || mk_seam_send_wait(tx) != MK_OK)
                    return die(c->name);
                const double dt = now_s() - t0;
                if (r == -3) { /* validated before anything is timed */
                    if (mk_boundary_read(in, got, rows * hidden) != MK_OK || memcmp(got, sent, bytes) != 0) {
                        fprintf(stderr, "seam_bench: %s hop is not exact at %zu x %zu\n", c->name, rows, hidden);
                        return 1;
                    }
                }
                if (r >= 0) t[r] = dt;
            }
            const double hop = median_in_place(t, runs);
            const bool socket_kind = c->kind == MK_SEAM_UNIX || c->kind == MK_SEAM_TCP;
            const double ceil_s = socket_kind ? socket_seconds(c->kind, bytes) : t_copy;
            const double gb = (double)bytes / 1e9;
            const char *what = socket_kind ? (c->kind == MK_SEAM_UNIX ? "raw unix" : "raw tcp") : "memcpy";
            printf("%-8s %5zu %6zu %9.1f | %9.1f %9.2f | %9.2f %9s | %5.0f%%\n", c->name, rows, hidden, bytes / 1024.0,
                   hop * 1e6, gb / hop, gb / ceil_s, what, 100.0 * ceil_s / hop);
            fprintf(json,
                    "%s  {\"part\": \"transport\", \"seam\": \"%s\", \"rows\": %zu, \"hidden\": %zu, \"payload_bytes\": %zu, "
                    "\"hop_us\": %.2f, \"hop_gbps\": %.3f, \"ceiling\": \"%s\", \"ceiling_gbps\": %.3f}",
                    *first ? "" : ",\n", c->name, rows, hidden, bytes, hop * 1e6, gb / hop, what, gb / ceil_s);
            *first = 0;
            free(t);
            mk_seam_free(tx);
            mk_seam_free(rx);
        }
        free(sent);
        free(got);
        free(ids);
        mk_boundary_free(out);
        mk_boundary_free(in);
        mk_sequence_close(hs);
        mk_sequence_close(ts);
        mk_range_free(head);
        mk_range_free(tail);
    }
    mk_model_free(models[0]);
    mk_model_free(models[1]);
    return 0;
}

/* =================================================================== batches == */

#define MAX_BATCH 64

typedef struct batch_ends {
    mk_sequence *tail_seq[MAX_BATCH];
} batch_ends;

/* Entry "s<k>" is sequence k's. */
static const mk_sequence *route_by_index(void *user, const mk_boundary_header *h) {
    const batch_ends *e = user;
    unsigned k = 0;
    return sscanf(h->request_id, "s%u", &k) == 1 && k < MAX_BATCH ? e->tail_seq[k] : NULL;
}

static int bench_batches(mk_backend_kind backend, const char *only, FILE *json, int *first) {
    const size_t counts[] = {1, 8, 64}, widths[] = {576, 4096};
    printf("\nbatches (%s backend): N sequences' decode rows across one seam per step, N messages vs one batch\n",
           backend == MK_BACKEND_CUDA ? "cuda" : "cpu");
    printf("%-8s %6s %4s | %11s %11s | %11s %11s | %7s\n", "seam", "hidden", "N", "N messages", "per row", "1 batch",
           "per row", "speedup");
    printf("%-8s %6s %4s | %11s %11s | %11s %11s | %7s\n", "", "", "", "us/step", "us", "us/step", "us", "x");
    mk_range_options opt = mk_range_options_default();
    opt.backend = mk_backend_config_default(backend);
    opt.max_context = 512;
    opt.max_batch_sequences = MAX_BATCH;
    for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
        const size_t hidden = widths[wi];
        mk_model *model = NULL;
        if (wide_model(hidden, &model) != MK_OK) return die("model");
        mk_range *head = NULL, *tail = NULL;
        if (mk_range_create(model, 0, 0, &opt, &head) != MK_OK || mk_range_create(model, 1, 1, &opt, &tail) != MK_OK)
            return die("ranges");
        mk_sequence *head_seq[MAX_BATCH];
        mk_boundary *out[MAX_BATCH], *in[MAX_BATCH];
        batch_ends ends;
        float *sent = malloc(hidden * sizeof(float)), *got = malloc(hidden * sizeof(float));
        for (size_t k = 0; k < MAX_BATCH; k++) {
            const int32_t id = (int32_t)(k % 16);
            if (mk_sequence_open(head, &head_seq[k]) != MK_OK || mk_sequence_open(tail, &ends.tail_seq[k]) != MK_OK ||
                mk_boundary_create(head, &out[k]) != MK_OK || mk_boundary_create(tail, &in[k]) != MK_OK ||
                mk_range_forward_boundary(head, head_seq[k], &id, 1, NULL, NULL, out[k], NULL) != MK_OK)
                return die("sequences");
            char id_k[16];
            snprintf(id_k, sizeof id_k, "s%zu", k);
            if (mk_boundary_set_request(out[k], id_k, 1) != MK_OK) return die("request id");
        }
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
            const hop_case *c = &cases[ci];
            if (only && strcmp(only, c->name) != 0) continue;
            mk_seam *tx = NULL, *rx = NULL;
            if (open_pair(c, head, tail, &tx, &rx) != MK_OK) return die(c->name);
            for (size_t ni = 0; ni < sizeof counts / sizeof *counts; ni++) {
                const size_t n = counts[ni];
                const int runs = n == 64 ? 61 : 201;
                double *t_each = malloc((size_t)runs * sizeof *t_each), *t_batch = malloc((size_t)runs * sizeof *t_batch);
                for (int r = -3; r < runs; r++) {
                    double t0 = now_s();
                    for (size_t k = 0; k < n; k++)
                        if (mk_seam_send(tx, out[k]) != MK_OK || mk_seam_recv(rx, ends.tail_seq[k], in[k]) != MK_OK ||
                            mk_seam_send_wait(tx) != MK_OK)
                            return die(c->name);
                    const double each = now_s() - t0;
                    t0 = now_s();
                    size_t got_n = 0;
                    mk_status status[MAX_BATCH];
                    if (mk_seam_send_batch(tx, (const mk_boundary *const *)out, n) != MK_OK ||
                        mk_seam_recv_batch(rx, route_by_index, &ends, in, n, &got_n, status) != MK_OK ||
                        mk_seam_send_wait(tx) != MK_OK || got_n != n)
                        return die(c->name);
                    const double batch = now_s() - t0;
                    if (r == -3) /* every entry arrived whole before anything is timed */
                        for (size_t k = 0; k < n; k++)
                            if (status[k] != MK_OK || mk_boundary_read(out[k], sent, hidden) != MK_OK ||
                                mk_boundary_read(in[k], got, hidden) != MK_OK ||
                                memcmp(sent, got, hidden * sizeof(float)) != 0) {
                                fprintf(stderr, "seam_bench: %s batch entry %zu of %zu is not exact\n", c->name, k, n);
                                return 1;
                            }
                    if (r >= 0) t_each[r] = each, t_batch[r] = batch;
                }
                const double each = median_in_place(t_each, runs), batch = median_in_place(t_batch, runs);
                printf("%-8s %6zu %4zu | %11.1f %11.2f | %11.1f %11.2f | %7.2f\n", c->name, hidden, n, each * 1e6,
                       each * 1e6 / (double)n, batch * 1e6, batch * 1e6 / (double)n, each / batch);
                fprintf(json,
                        "%s  {\"part\": \"batch\", \"seam\": \"%s\", \"hidden\": %zu, \"sequences\": %zu, "
                        "\"messages_us\": %.2f, \"batch_us\": %.2f, \"speedup\": %.3f}",
                        *first ? "" : ",\n", c->name, hidden, n, each * 1e6, batch * 1e6, each / batch);
                *first = 0;
                free(t_each);
                free(t_batch);
            }
            mk_seam_free(tx);
            mk_seam_free(rx);
        }
        for (size_t k = 0; k < MAX_BATCH; k++) {
            mk_boundary_free(out[k]);
            mk_boundary_free(in[k]);
            mk_sequence_close(head_seq[k]);
            mk_sequence_close(ends.tail_seq[k]);
        }
        free(sent);
        free(got);
        mk_range_free(head);
        mk_range_free(tail);
        mk_model_free(model);
    }
    return 0;
}

int main(int argc, char **argv) {
    mk_backend_kind backend = MK_BACKEND_CPU;
    if (argc > 1 && mk_backend_kind_from_name(argv[1], &backend) != MK_OK) {
        fprintf(stderr, "usage: seam_bench [cpu|cuda [local|wire|unix|tcp|tcp+tls]]\n");
        return 2;
    }
    const char *out_dir = getenv("OUT");
    char path[4096];
    snprintf(path, sizeof path, "%s/seam_bench.json", out_dir && *out_dir ? out_dir : ".");
    FILE *json = fopen(path, "w");
    if (!json) {
        fprintf(stderr, "seam_bench: cannot write %s\n", path);
        return 1;
    }
    fprintf(json, "[\n");
    int first = 1;
    const char *only = argc > 2 ? argv[2] : NULL;
    int rc = only ? 0 : bench_codec(json, &first);
    if (rc == 0) rc = bench_transports(backend, only, json, &first);
    if (rc == 0) rc = bench_batches(backend, only, json, &first);
    fprintf(json, "\n]\n");
    fclose(json);
    if (rc == 0) printf("results: %s\n", path);
    return rc;
}
