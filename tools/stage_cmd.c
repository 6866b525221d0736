/* meshkern stage MODEL: one range of a pipeline whose ranges run in separate processes
 * (on one node or many). Only flag parsing and printing live here; the runtime is the
 * library's (mk_stage_join / mk_stage_serve).
 *
 *   meshkern stage MODEL --split L1,L2,...|auto --rank R --world N --rendezvous HOST:PORT
 *   mpirun -np N meshkern stage MODEL --split L1,L2,...|auto [--launcher mpi]
 *                  [--prompts FILE|-] [--max-tokens K] [--max-sequences M] [--timeout S] [--stop IDS]
 *                  [--seam tcp|unix|nccl] [--backend cpu|cuda] [--device D] [--dtype native|f32|f16|bf16]
 *                  [--kv f32|f16|bf16] [--threads N] [--speed]   (the backend options: cli_backend.c) [--text]
 *                  [--tls-psk HEX [--tls-identity ID] | --tls-cert PEM --tls-key PEM --tls-ca PEM]
 *
 * Rank 0 reads the prompts (one per line, comma-separated token ids, as run --prompts; with
 * --text one user message per line, through the model's chat template as run -p), prints
 * every sequence's tokens (or its failure; with --text the answer too), the aggregate
 * throughput and the per-hop figures. Exit
 * status: 0 when every request is done, 1 when the run failed, 2 for a usage error. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cli_text.h"
#include "serve.h"
#include "core/mk_size.h"
#include "mk_error.h"

#define MK_STAGE_MAX_LIST MK_CLI_MAX_LIST

typedef struct stage_args {
    const char *model, *prompts, *rendezvous;
    int64_t cuts[MK_STAGE_MAX_LIST];
    int32_t stop[2 * MK_STAGE_MAX_LIST]; /* --stop, then the model's end-of-generation ids */
    size_t n_stop;
    mk_stage_options o;
    mk_serve_settings serve; /* --serve HOST:PORT and the HTTP flags (rank 0) */
    bool mpi, text;
    char mpi_rendezvous[300];
} stage_args;

typedef struct stage_print {
    const mk_tokenizer *tok; /* the model's, or NULL: tokens printed as "<id>" */
    bool text;               /* --text: answers printed as text */
    const batch_prompt *prompts;
    size_t generated, failed, reported;
    int rank;
} stage_print;

static double stage_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool parse_timeout(const char *v, void *dest, char *why, size_t why_len) {
    /* seconds, at the runtime's resolution of 1 ms: less would become 0, the default */
    char *end = NULL;
    /* plain decimals (digits, one point): strtod would also take blanks, signs, hex and exponents */
    const bool plain = v[0] >= '0' && v[0] <= '9' && strspn(v, "0123456789.") == strlen(v);
    const double s = plain ? strtod(v, &end) : 0;
    if (!plain || end == v || *end || !(s >= 0.001) || s > 86400.0) {
        snprintf(why, why_len, "expected seconds from 0.001 (the resolution) to 86400");
        return false;
    }
    *(int *)dest = (int)(s * 1000.0 + 0.5);
    return true;
}

static bool parse_stage_seam(const char *v, void *dest, char *why, size_t why_len) {
    static const struct {
        const char *name;
        mk_seam_kind kind;
    } kinds[] = {{"tcp", MK_SEAM_TCP}, {"unix", MK_SEAM_UNIX}, {"nccl", MK_SEAM_NCCL}};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
        if (strcmp(v, kinds[i].name) == 0) {
            *(mk_seam_kind *)dest = kinds[i].kind;
            return true;
        }
    snprintf(why, why_len, "stage seams are tcp, unix or nccl (local and wire stay inside one process)");
    return false;
}

static bool parse_launcher(const char *v, void *dest, char *why, size_t why_len) {
    if (strcmp(v, "mpi") != 0 && strcmp(v, "rendezvous") != 0) {
        snprintf(why, why_len, "expected mpi or rendezvous");
        return false;
    }
    *(bool *)dest = strcmp(v, "mpi") == 0;
    return true;
}

/* -1 when parsed; else the exit status (0 after --help, 2 after a usage error). */
static int parse_stage_args(int argc, char **argv, stage_args *a) {
    memset(a, 0, sizeof *a);
    a->o = mk_stage_options_default();
    a->o.prefill_chunk = SIZE_MAX; /* not given: set once --serve is known */
    mk_cli_backend backend;
    mk_cli_backend_init(&backend);
    size_t rank = SIZE_MAX, world = 0;
    int64_t stop[MK_STAGE_MAX_LIST];
    mk_cli_list cuts_l = MK_CLI_LIST(a->cuts, 0, INT32_MAX, "layer", true);
    mk_cli_list stop_l = MK_CLI_LIST(stop, 0, INT32_MAX, "token id", false);
    char tokens_default[32], sequences_default[32];
    snprintf(tokens_default, sizeof tokens_default, "%zu", a->o.max_new_tokens);
    snprintf(sequences_default, sizeof sequences_default, "%zu", a->o.max_sequences);
    const mk_cli_option opts[] = {
        mk_cli_opt_split(&cuts_l),
        {"--rank", NULL, "R", "this process's rank, 0 the head (not under MPI)", NULL, MK_CLI_COUNT, &rank, 0,
         MK_STAGE_MAX_LIST - 1, NULL},
        {"--world", NULL, "N", "the number of processes (not under MPI)", NULL, MK_CLI_COUNT, &world, 2, MK_STAGE_MAX_LIST,
         NULL},
        {"--rendezvous", NULL, "HOST:PORT", "where rank 0 listens and the others join (not under MPI)", NULL,
         MK_CLI_TEXT, (void *)&a->rendezvous, 0, 0, NULL},
        {"--launcher", NULL, "mpi|rendezvous", "mpi: started by mpirun -np N, MPI says who is who", "rendezvous",
         MK_CLI_CALL, &a->mpi, 0, 0, parse_launcher},
        mk_cli_opt_prompts(&a->prompts, "rank 0: one prompt per line, comma-separated token ids (with --text: one user "
                                        "message per line); - is standard input"),
        {"--text", NULL, NULL, "the prompts are text through the chat template, the answers printed as text", NULL,
         MK_CLI_FLAG, &a->text, 0, 0, NULL},
        mk_cli_opt_max_tokens(&a->o.max_new_tokens, MK_CLI_MAX_NEW_TOKENS, tokens_default),
        mk_cli_opt_max_sequences(&a->o.max_sequences, sequences_default),
        mk_cli_opt_prefill_chunk(&a->o.prefill_chunk, "0; 128 with --serve"),
        mk_cli_opt_stop(&stop_l),
        {"--timeout", NULL, "S", "the deadline of every wait for another process, in seconds", "30", MK_CLI_CALL,
         &a->o.timeout_ms, 0, 0, parse_timeout},
        {"--seam", NULL, "tcp|unix|nccl", "the transport of every seam (between processes)", "tcp", MK_CLI_CALL,
         &a->o.seam, 0, 0, parse_stage_seam},
    };
    mk_cli_option backend_opts[MK_CLI_BACKEND_OPTIONS], tls_opts[MK_CLI_TLS_OPTIONS], http[MK_SERVE_CLI_OPTIONS];
    mk_serve_settings_default(&a->serve);
    const mk_cli_group groups[] = {
        {"options", opts, sizeof opts / sizeof *opts},
        {"serving options (rank 0, instead of --prompts: meshkern serve's endpoint over this run)", http,
         mk_serve_cli_options(&a->serve, true, http)},
        {"backend options", backend_opts, mk_cli_backend_options(&backend, backend_opts, "cpu threads (default: every core)")},
        {"TLS options (the rendezvous, control and seam connections; unix and tcp seams)", tls_opts,
         mk_cli_tls_options(&a->o.tls, tls_opts)},
    };
    const mk_cli_command cmd = {
        "stage", "MODEL --split L1,L2,...|auto --rank R --world N --rendezvous HOST:PORT [options]",
        "       mpirun -np N meshkern stage MODEL --split L1,L2,...|auto [options]\n"
        "  One range of a pipeline whose ranges run in separate processes; rank 0 takes the prompts and\n"
        "  prints every sequence's tokens, the throughput and the per-hop figures.\n",
        {"MODEL"}, groups, sizeof groups / sizeof *groups};
    const int bad = mk_cli_parse(&cmd, argc, argv, &a->model);
    if (bad >= 0) return bad;
    /* the HTTP flags (after --serve itself) act only on the endpoint */
    const int unused = mk_cli_needs(&cmd, argc, argv, &groups[1], 1, a->serve.enabled, "--serve HOST:PORT");
    if (unused >= 0) return unused;
    if (a->o.prefill_chunk == SIZE_MAX) a->o.prefill_chunk = a->serve.enabled ? MK_SERVE_PREFILL_CHUNK : 0; /* as meshkern serve, or whole */
    a->o.rank = rank == SIZE_MAX ? -1 : (int)rank;
    a->o.world = (int)world;
    a->o.split_auto = cuts_l.is_auto;
    a->o.n_cuts = cuts_l.n;
    for (a->n_stop = 0; a->n_stop < stop_l.n; a->n_stop++) a->stop[a->n_stop] = (int32_t)stop[a->n_stop];
    mk_cli_tls_finish(&a->o.tls);
    if (a->o.tls.enabled) { /* the key, the files and the seam, checked before anything starts */
        mk_seam_options so = mk_seam_options_default(a->o.seam);
        so.tls = a->o.tls;
        const int rc = mk_cli_tls_check("stage", &so);
        if (rc >= 0) return rc;
    }
    /* Started by mpirun without a rank of its own: MPI says who is who. */
    if (!a->mpi && a->o.rank < 0 && mk_stage_mpi_launched()) a->mpi = true;
    if ((!cuts_l.n && !cuts_l.is_auto) ||
        (!a->mpi && (a->o.rank < 0 || a->o.world < 2 || !a->rendezvous || a->o.rank >= a->o.world)))
        return mk_cli_usage_error("stage", "--split is required, and --rank, --world and --rendezvous unless MPI "
                                           "launches the ranks (0 <= rank < world)");
    /* A GGUF model on the cpu backend runs on its stored weights unless asked otherwise (as run). */
    const int bad_device = mk_cli_backend_finish(&backend, "stage", a->model);
    if (bad_device >= 0) return bad_device;
    mk_cli_backend_range(&backend, &a->o.range);
    a->o.cuts = a->cuts;
    a->o.rendezvous = a->rendezvous;
    if (a->mpi) a->o.world = 2; /* until MPI says */
    return -1;
}

/* The runtime's notices (a rank joined, a stranger dropped at the rendezvous) on stderr. */
static void stage_log(void *user, const char *line) {
    fprintf(stderr, "meshkern stage: rank %d: %s\n", *(const int *)user, line);
}

static void stage_report(void *user, const mk_stage_report *r) {
    stage_print *p = user;
    p->reported++;
    if (p->rank != 0) {
        printf("rank %d: seq %zu: FAILED %s: %s\n", p->rank, r->request + 1, mk_status_name(r->status), r->error);
        fflush(stdout);
        return;
    }
    printf("seq %zu (%zu prompt tokens): ", r->request + 1, p->prompts[r->request].n);
    if (r->status != MK_OK) {
        p->failed++;
        printf("FAILED %s: %s; %zu tokens:", mk_status_name(r->status), r->error, r->n_tokens);
    } else {
        printf("%s, %zu tokens:", r->stopped ? "stopped" : "limit", r->n_tokens);
    }
    p->generated += r->n_tokens;
    for (size_t k = 0; k < r->n_tokens; k++) printf(" %d", r->tokens[k]);
    printf("\n");
    if (r->status == MK_OK && p->text && p->tok) {
        /* as run -p prints it: the answer's text without the end-of-turn token */
        char *text = NULL;
        size_t len = 0;
        const size_t n = r->stopped && r->n_tokens ? r->n_tokens - 1 : r->n_tokens;
        if (mk_tokenizer_decode(p->tok, r->tokens, n, 0, &text, &len) == MK_OK) {
            printf("answer %zu: ", r->request + 1);
            fwrite(text, 1, len, stdout);
            printf("\n");
        }
        mk_buffer_free(text);
    } else if (r->status == MK_OK) {
        printf("  text: ");
        mk_cli_print_text(stdout, p->tok, r->tokens, r->n_tokens);
        printf("\n");
    }
    fflush(stdout);
}

/* Rank 0, after a finished run: each seam's figures, which the ranks sent with their
 * goodbye, and the mean per-hop latency over all boundaries of all seams. */
static void print_hops(const mk_stage *stage, const stage_args *a) {
    double latency = 0.0;
    size_t boundaries = 0;
    for (int k = 0; k + 1 < a->o.world; k++) {
        mk_stage_hop hop;
        const mk_status s = mk_stage_hop_stats(stage, (size_t)k, &hop);
        if (s != MK_OK) {
            printf("hop %d: rank %d -> %d: no figures: %s: %s\n", k, k, k + 1, mk_status_name(s), mk_last_error());
            continue;
        }
        printf("hop %d: rank %d -> %d over %s: %zu boundaries, %zu bytes, %.6f s in the seam, %.1f us per hop\n", k, k,
               k + 1, mk_seam_kind_name(a->o.seam), hop.boundaries, hop.bytes, hop.seam_seconds, hop.latency_s * 1e6);
        latency += hop.latency_s * (double)hop.boundaries;
        boundaries += hop.boundaries;
    }
    if (boundaries)
        printf("per-hop latency: %.1f us mean over %zu boundaries (%s, %zu in flight)\n", latency / (double)boundaries * 1e6,
               boundaries, mk_seam_kind_name(a->o.seam), a->o.max_sequences);
}

static int run_stage(stage_args *a, const mk_model *model, const mk_tokenizer *tok, const batch_prompt *prompts,
                     size_t n_prompts) {
    const mk_hparams *hp = mk_model_hparams(model);
    if (a->o.rank == 0) {
        /* As run --prompts: the model's EOS (its tokenizer's) stops too; with --text, as
         * run -p: every end-of-generation token of the tokenizer. */
        if (mk_tokenizer_eos(tok) >= 0) a->stop[a->n_stop++] = mk_tokenizer_eos(tok);
        for (size_t id = 0; a->text && tok && id < mk_tokenizer_vocab_size(tok); id++)
            if (mk_tokenizer_is_eog(tok, (int32_t)id) && a->n_stop < sizeof a->stop / sizeof *a->stop)
                a->stop[a->n_stop++] = (int32_t)id;
        a->o.stop_ids = a->stop;
        a->o.n_stop = a->n_stop;
        size_t longest = 0;
        for (size_t i = 0; i < n_prompts; i++) longest = prompts[i].n > longest ? prompts[i].n : longest;
        (void)mk_size_add(longest, a->o.max_new_tokens, &a->o.range.max_context); /* saturates, then capped */
        if (a->o.range.max_context > hp->max_context) a->o.range.max_context = hp->max_context;
        a->o.range.max_batch_tokens = longest < a->o.range.max_context ? longest : a->o.range.max_context;
    }
    a->o.log = stage_log;
    a->o.log_user = &a->o.rank;
    mk_stage *stage = NULL;
    mk_status s = mk_stage_join(model, &a->o, &stage);
    if (s != MK_OK) {
        fprintf(stderr, "meshkern stage: rank %d: refused at startup: %s: %s\n", a->o.rank, mk_status_name(s),
                mk_last_error());
        return 1;
    }
    const mk_range *r = mk_stage_range(stage);
    printf("stage: rank %d of %d, layers %lld-%lld %s, seam %s%s%s, backend %s, weights %s\n", a->o.rank, a->o.world,
           (long long)mk_range_start(r), (long long)mk_range_end(r), mk_role_name(mk_range_role(r)),
           mk_seam_kind_name(a->o.seam), a->o.nccl_ids ? " (NCCL ids by MPI_Bcast)" : "",
           a->o.tls.enabled ? " (TLS 1.3 on every connection)" : "",
           a->o.range.backend.kind == MK_BACKEND_CUDA ? "cuda" : "cpu",
           mk_dtype_name(a->o.range.backend.weight_dtype));
    fflush(stdout);
    mk_stage_request *req = calloc(n_prompts ? n_prompts : 1, sizeof *req);
    if (!req) {
        mk_stage_free(stage);
        return mk_cli_fail(mk_fail(MK_ERR_OUT_OF_MEMORY, "out of memory"));
    }
    for (size_t i = 0; i < n_prompts; i++) req[i] = (mk_stage_request){prompts[i].ids, prompts[i].n};
    stage_print p = {tok, a->text, prompts, 0, 0, 0, a->o.rank};
    const double t0 = stage_now_s();
    s = mk_stage_serve(stage, req, n_prompts, stage_report, &p);
    const double wall = stage_now_s() - t0;
    int rc = 0;
    if (s != MK_OK) {
        /* every rank says which requests the failure took, even when none */
        if (a->o.rank != 0 && p.reported == 0) printf("rank %d: no request in flight when the run failed\n", a->o.rank);
        fflush(stdout);
        fprintf(stderr, "meshkern stage: rank %d: %s: %s\n", a->o.rank, mk_status_name(s), mk_last_error());
        rc = 1;
    } else if (a->o.rank == 0) {
        printf("aggregate: %zu tokens from %zu sequences in %.3f s: %.1f tokens/s over %d processes\n", p.generated,
               n_prompts, wall, (double)p.generated / wall, a->o.world);
        print_hops(stage, a);
    } else {
        printf("rank %d: done\n", a->o.rank);
    }
    free(req);
    mk_stage_free(stage);
    return rc;
}

int mk_cli_stage(int argc, char **argv) {
    stage_args a;
    const int bad = parse_stage_args(argc, argv, &a);
    if (bad >= 0) return bad;
    mk_model *model = NULL;
    mk_status s = mk_cli_open_model(a.model, &model);
    if (s != MK_OK) return mk_cli_fail(s);
    /* Under MPI the rank, the world and the rendezvous come from MPI; the digests are
     * compared there, before any connection. */
    mk_stage_nccl_ids *nccl_ids = NULL; /* nccl seams under MPI: this rank's ids, MPI_Bcast'ed */
    if (a.mpi && (s = mk_stage_mpi_setup(model, &a.o, a.mpi_rendezvous, sizeof a.mpi_rendezvous, &nccl_ids)) != MK_OK) {
        fprintf(stderr, "meshkern stage: rank %d: refused at startup: %s: %s\n", a.o.rank, mk_status_name(s),
                mk_last_error());
        mk_model_free(model);
        return 1;
    }
    if (a.o.rank == 0 && (a.serve.enabled ? a.prompts != NULL : !a.prompts)) {
        mk_stage_nccl_ids_free(nccl_ids);
        mk_model_free(model);
        return mk_cli_usage_error("stage", a.prompts ? "--serve or --prompts: one or the other"
                                                     : "rank 0 needs --prompts FILE (or - for standard input) or "
                                                       "--serve HOST:PORT");
    }
    if (a.o.rank == 0 && a.serve.enabled) { /* the other ranks run as for a list */
        a.o.log = stage_log;
        a.o.log_user = &a.o.rank;
        const int rc = mk_cli_stage_serve(a.model, model, &a.o, &a.serve);
        mk_stage_nccl_ids_free(nccl_ids);
        mk_model_free(model);
        if (a.mpi && rc == 0) mk_stage_mpi_finalize();
        return rc;
    }
    batch_prompt *prompts = NULL;
    size_t n_prompts = 0;
    mk_tokenizer *tok = NULL;
    if (a.o.rank == 0 && a.text) { /* text needs the model's tokenizer: without one, the failure */
        s = mk_tokenizer_open(model, &tok);
        if (s == MK_OK) s = mk_cli_read_text_prompts(a.prompts, tok, &prompts, &n_prompts);
    } else if (a.o.rank == 0) {
        s = mk_cli_read_prompts(a.prompts, &prompts, &n_prompts);
    }
    if (s == MK_OK && a.o.rank == 0 && !tok) tok = mk_cli_tokenizer_or_null(model); /* the EOS, the text */
    const int rc = s == MK_OK ? run_stage(&a, model, tok, prompts, n_prompts) : mk_cli_fail(s);
    mk_stage_nccl_ids_free(nccl_ids);
    mk_tokenizer_free(tok);
    mk_model_free(model);
    mk_cli_free_prompts(prompts, n_prompts);
    /* A failed run leaves MPI unfinalized: MPI_Finalize waits for every rank, and the
     * launcher ends the others once this one exits non-zero. */
    if (a.mpi && rc == 0) mk_stage_mpi_finalize();
    return rc;
}
