/* meshkern: inspect a model, or run it whole and split into ranges and compare.
 *
 *   meshkern --help                    the commands
 *   meshkern COMMAND --help            that command's options (from its table: cli_options.h)
 *   meshkern inspect MODEL.gguf | --random[:key=value,...]
 *   meshkern run MODEL --tokens 1,2,3 [--split L1,L2,...] [--max-tokens N] [--seam ...] ...
 *   meshkern run MODEL -p TEXT ... | chat MODEL | tokenize MODEL TEXT   (cli_text.c)
 *   meshkern run MODEL --prompts FILE ...   (run_batch.c: many sequences, a placed pipeline)
 *   meshkern stage MODEL --split ... --rank R --world N --rendezvous HOST:PORT ...   (stage_cmd.c)
 *   meshkern serve MODEL ...   (serve.c: OpenAI-compatible HTTP)
 *
 * run executes the model as one FULL range and, with --split, as the given ranges in this
 * process, every seam carried by the chosen transport (default wire: packed and unpacked
 * as protobuf); it prints the greedy tokens, the throughput, the bytes and time spent in
 * seams, and whether the split output equals the whole-model output bit for bit.
 *
 * Exit status: 0 done, 1 a runtime failure, 2 a usage error (one line on stderr naming
 * it), 3 a split whose output differs from the whole model's (run), 4 some sequences
 * failed (run --prompts). */
#include <stdbool.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cli_text.h"
#include "meshkern.h"
#include "mk_error.h"
#include "model/model.h"
#include "range/range.h"
#include "serve.h"

#define MK_MAX_CUTS 64
#define MK_MAX_TOKENS 4096

static int fail(mk_status s) {
    fprintf(stderr, "meshkern: %s: %s\n", mk_status_name(s), mk_last_error());
    return 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "--random[:key=value,...]": the seeded random model, optionally reshaped. */
static mk_status open_random(const char *spec, mk_model **out) {
    mk_hparams hp = mk_hparams_seed_default();
    unsigned long long seed = 20260715;
    bool head_dim_set = false;
    if (spec[0] && spec[0] != ':')
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "random model spec '--random%s': expected --random or --random:key=value,...",
                       spec);
    const char *p = spec[0] == ':' ? spec + 1 : spec;
    while (*p) {
        char key[32];
        int used = 0;
        /* key=digits: sscanf's %llu would take blanks and signs (-1 as 2^64 - 1) */
        if (sscanf(p, "%31[a-z_]%n", key, &used) != 1 || p[used] != '=' || p[used + 1] < '0' || p[used + 1] > '9')
            return mk_fail(MK_ERR_INVALID_ARGUMENT, "random model spec '%s': expected key=value pairs (decimal values)",
                           spec);
        char *end = NULL;
        errno = 0;
        const unsigned long long value = strtoull(p + used + 1, &end, 10);
        if (errno || (*end && *end != ','))
            return mk_fail(MK_ERR_INVALID_ARGUMENT, "random model spec '%s': value of '%s' is not a decimal count", spec,
                           key);
        used = (int)(end - p);
        if (strcmp(key, "vocab") == 0) hp.vocab = value;
        else if (strcmp(key, "hidden") == 0) hp.hidden = value;
        else if (strcmp(key, "layers") == 0) hp.n_layers = value;
        else if (strcmp(key, "heads") == 0) hp.n_heads = hp.n_kv_heads = value;
        else if (strcmp(key, "kv_heads") == 0) hp.n_kv_heads = value;
        else if (strcmp(key, "head_dim") == 0) hp.head_dim = value, head_dim_set = true;
        else if (strcmp(key, "ffn") == 0) hp.intermediate = value;
        else if (strcmp(key, "ctx") == 0) hp.max_context = value;
        else if (strcmp(key, "seed") == 0) seed = value;
        else return mk_fail(MK_ERR_INVALID_ARGUMENT, "random model spec: unknown key '%s'", key);
        p += used;
        if (*p == ',') p++;
    }
    /* heads may be given after kv_heads; keep kv_heads <= heads */
    if (hp.n_kv_heads > hp.n_heads) hp.n_kv_heads = hp.n_heads;
    if (!head_dim_set && hp.n_heads) hp.head_dim = hp.hidden / hp.n_heads;
    return mk_model_create_random(&hp, seed, NULL, out);
}

static mk_status open_model(const char *path, mk_model **out) {
    if (strncmp(path, "--random", 8) == 0) return open_random(path + 8, out);
    return mk_model_open_gguf(path, out);
}

/* ================================================================= inspect == */

static int cmd_inspect(int argc, char **argv) {
    const mk_cli_command cmd = {"inspect", "MODEL", "  The model's architecture, digest, shapes and (a GGUF file) its tensors.\n" MK_CLI_MODEL_ABOUT,
                                {"MODEL"}, NULL, 0};
    const char *path = NULL;
    const int bad = mk_cli_parse(&cmd, argc, argv, &path);
    if (bad >= 0) return bad;
    mk_model *model = NULL;
    const mk_status s = open_model(path, &model);
    if (s != MK_OK) return fail(s);
    const mk_hparams *hp = mk_model_hparams(model);
    mk_architecture arch;
    const bool certified = mk_certified_architecture(mk_model_architecture(model), &arch) == MK_OK;
    printf("model        %s\n", path);
    printf("architecture %s (%s%s)\n", mk_model_architecture(model), certified ? "certified as " : "uncertified",
           certified ? arch.adapter : "");
    printf("digest       %s\n", mk_model_digest(model));
    printf("vocab %zu  hidden %zu  layers %zu  heads %zu  kv_heads %zu  head_dim %zu  intermediate %zu\n", hp->vocab,
           hp->hidden, hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->head_dim, hp->intermediate);
    printf("rms_eps %g  rope_theta %g  rope %s  tied_embeddings %s  max_context %zu\n", (double)hp->rms_eps,
           (double)hp->rope_theta, hp->rope_layout == MK_ROPE_ADJACENT_PAIRS ? "adjacent-pairs" : "rotate-half",
           hp->tied_embeddings ? "yes" : "no", hp->max_context);
    const size_t n_tensors = mk_model_stored_tensor_count(model); /* 0: a random model */
    if (n_tensors) {
        size_t total = 0;
        printf("%-32s %-6s %-24s %12s\n", "tensor", "type", "dims", "bytes");
        mk_model_stored_info t;
        for (size_t i = 0; mk_model_stored_tensor_at(model, i, &t); i++) {
            char dims[64];
            int n = 0;
            for (uint32_t d = 0; d < t.n_dims; d++)
                n += snprintf(dims + n, sizeof dims - (size_t)n, d ? "x%llu" : "%llu", (unsigned long long)t.dims[d]);
            printf("%-32s %-6s %-24s %12zu\n", t.name, t.type_name, dims, t.bytes);
            total += t.bytes;
        }
        printf("%zu tensors, %.1f MiB of tensor data\n", n_tensors, (double)total / 1048576.0);
    }
    mk_model_free(model);
    return 0;
}

/* ===================================================================== run == */

typedef struct run_result {
    int32_t tokens[MK_MAX_TOKENS];
    float *logits; /* [n_steps, vocab] */
    double prefill_s, decode_s;
    size_t seam_bytes;
    double seam_s;
} run_result;

static mk_status run_pipeline(const mk_model *model, const int64_t *cuts, size_t n_cuts, const mk_range_options *opt,
                              const mk_seam_options *seam, const int *devices, size_t n_devices, const int32_t *prompt,
                              size_t n_prompt, size_t n_new, run_result *res) {
    const size_t vocab = mk_model_hparams(model)->vocab;
    mk_pipeline *p = NULL;
    mk_pipeline_options po = mk_pipeline_options_default();
    po.range = opt;
    po.cuts = cuts;
    po.n_cuts = n_cuts;
    po.seam = seam;
    po.devices = devices;
    po.n_devices = n_devices;
    mk_status s = mk_pipeline_create(model, &po, &p);
    if (s != MK_OK) return s;
    printf("  ranges:");
    for (size_t i = 0; i < mk_pipeline_range_count(p); i++) {
        const mk_range *r = mk_pipeline_range(p, i);
        printf(" [%lld-%lld] %s %.1f MiB%s", (long long)mk_range_start(r), (long long)mk_range_end(r),
               mk_role_name(mk_range_role(r)), (double)mk_range_weight_bytes(r) / 1048576.0,
               i + 1 < mk_pipeline_range_count(p) ? " |" : "\n");
    }
    res->logits = malloc(n_new * vocab * sizeof(float));
    if (!res->logits) s = mk_fail(MK_ERR_OUT_OF_MEMORY, "out of memory for %zu x %zu logits", n_new, vocab);
    const int32_t *input = prompt;
    size_t n_input = n_prompt;
    for (size_t step = 0; s == MK_OK && step < n_new; step++) {
        mk_tail_output *out = NULL;
        const double t0 = now_s();
        s = mk_pipeline_step(p, input, n_input, &out);
        const double dt = now_s() - t0;
        if (s != MK_OK) break;
        if (step == 0) res->prefill_s = dt;
        else res->decode_s += dt;
        memcpy(res->logits + step * vocab, out->logits, vocab * sizeof(float));
        res->tokens[step] = out->token_ids[0];
        mk_tail_output_free(out);
        input = &res->tokens[step];
        n_input = 1;
    }
    for (size_t i = 0; i < mk_pipeline_range_count(p); i++) { /* said once per range, with the reason */
        const mk_range *r = mk_pipeline_range(p, i);
        const char *why = mk_range_graph_failure(r);
        if (why)
            fprintf(stderr, "meshkern: note: range [%lld-%lld] decodes op by op: its decode step could not be recorded "
                            "as a CUDA graph (%s)\n", (long long)mk_range_start(r), (long long)mk_range_end(r), why);
    }
    res->seam_bytes = mk_pipeline_seam_bytes(p);
    res->seam_s = mk_pipeline_seam_seconds(p);
    mk_pipeline_free(p);
    return s;
}

static void print_run(const char *label, const run_result *r, size_t n_prompt, size_t n_new) {
    printf("  %s: prefill %zu tokens %.3f s (%.1f tok/s), decode %zu tokens %.3f s (%.1f tok/s)", label, n_prompt,
           r->prefill_s, (double)n_prompt / r->prefill_s, n_new - 1, r->decode_s,
           n_new > 1 ? (double)(n_new - 1) / r->decode_s : 0.0);
    if (r->seam_bytes)
        printf("\n  %s seams: %.1f KiB in %.3f ms (%.1f MB/s)", label, (double)r->seam_bytes / 1024.0, r->seam_s * 1e3,
               r->seam_s > 0 ? (double)r->seam_bytes / r->seam_s / 1e6 : 0.0);
    printf("\n  %s tokens:", label);
    for (size_t i = 0; i < n_new; i++) printf(" %d", r->tokens[i]);
    printf("\n");
}

static int cmd_run(int argc, char **argv) {
    int64_t tokens_v[MK_MAX_TOKENS], cuts_v[MK_MAX_CUTS], devices_v[MK_MAX_CUTS + 1];
    mk_cli_list tokens_l = MK_CLI_LIST(tokens_v, 0, INT32_MAX, "token id", false);
    mk_cli_list cuts_l = MK_CLI_LIST(cuts_v, 0, INT32_MAX, "layer", false);
    mk_cli_list devices_l = MK_CLI_LIST(devices_v, 0, MK_CLI_MAX_DEVICE, "device", false);
    size_t n_new = 16, seam_timeout_ms = 0;
    mk_range_options opt = mk_range_options_default();
    mk_seam_options seam = mk_seam_options_default(MK_SEAM_WIRE);
    mk_cli_backend backend;
    mk_cli_backend_init(&backend);
    const mk_cli_option run_opts[] = {
        {"--tokens", NULL, "IDS", "the prompt's token ids, comma-separated (required)", NULL, MK_CLI_CALL, &tokens_l, 0, 0,
         mk_cli_parse_list},
        mk_cli_opt_max_tokens(&n_new, MK_MAX_TOKENS - 2, "16"),
        mk_cli_opt_split(&cuts_l),
        mk_cli_opt_devices(&devices_l),
        mk_cli_opt_seam(&seam.kind, false, "wire"),
        {"--seam-address", NULL, "PATH|HOST:PORT", "where the unix or tcp seams meet", NULL, MK_CLI_TEXT, &seam.address,
         0, 0, NULL},
        {"--seam-timeout", NULL, "MS", "the seams' connect and per-frame deadline in milliseconds", "5000 / 30000",
         MK_CLI_COUNT, &seam_timeout_ms, 1, 86400000, NULL},
    };
    mk_cli_option backend_opts[MK_CLI_BACKEND_OPTIONS], tls_opts[MK_CLI_TLS_OPTIONS];
    const mk_cli_group groups[] = {
        {"options", run_opts, sizeof run_opts / sizeof *run_opts},
        {"backend options", backend_opts,
         mk_cli_backend_options(&backend, backend_opts, "cpu threads (default: every core)")},
        {"TLS options (unix and tcp seams)", tls_opts, mk_cli_tls_options(&seam.tls, tls_opts)},
    };
    const mk_cli_command cmd = {
        "run", "MODEL --tokens IDS [options]",
        "  Runs the model whole and, with --split, as ranges joined by seams; prints the greedy tokens,\n"
        "  the throughput, the seams' bytes and time, and whether the split equals the whole bit for bit.\n"
        MK_CLI_MODEL_ABOUT,
        {"MODEL"}, groups, sizeof groups / sizeof *groups};
    const char *path = NULL;
    const int bad = mk_cli_parse(&cmd, argc, argv, &path);
    if (bad >= 0) return bad;
    /* the seam's flags (run_opts from --seam on, and TLS) act only where there is a seam */
    int unused = mk_cli_needs(&cmd, argc, argv, &groups[0], 4, cuts_l.n > 0, "--split");
    if (unused < 0) unused = mk_cli_needs(&cmd, argc, argv, &groups[2], 0, cuts_l.n > 0, "--split");
    if (unused < 0 && seam.kind != MK_SEAM_UNIX && seam.kind != MK_SEAM_TCP && mk_cli_given(&cmd, argc, argv, "--seam-address"))
        unused = mk_cli_usage_error("run", "--seam-address has no effect on the %s seam (unix and tcp seams meet there)",
                                    mk_seam_kind_name(seam.kind));
    if (unused >= 0) return unused;
    if (seam_timeout_ms) seam.io_timeout_ms = seam.connect_timeout_ms = (int)seam_timeout_ms;
    mk_cli_tls_finish(&seam.tls);
    /* TLS flags are checked before anything runs: the transport (only unix and tcp carry
     * TLS), the combination and the key's length, the files. */
    if (seam.tls.enabled) {
        const int rc = mk_cli_tls_check("run", &seam);
        if (rc >= 0) return rc;
    }
    const int bad_device = mk_cli_backend_finish(&backend, "run", path);
    if (bad_device >= 0) return bad_device;
    mk_cli_backend_range(&backend, &opt);
    const long n_tokens = (long)tokens_l.n, n_cuts = (long)cuts_l.n, n_devices = (long)devices_l.n;
    if (n_tokens == 0) return mk_cli_usage_error("run", "--tokens IDS is required (or -p TEXT, or --prompts FILE)");
    if ((size_t)n_tokens + n_new >= MK_MAX_TOKENS)
        return mk_cli_usage_error("run", "%ld prompt tokens and --max-tokens %zu exceed the limit of %d positions",
                                  n_tokens, n_new, MK_MAX_TOKENS - 1);

    /* GPU to GPU needs the cuda backend: said here, before the model is read. */
    if (opt.backend.kind != MK_BACKEND_CUDA && (seam.kind == MK_SEAM_NCCL || n_devices > 0))
        return mk_cli_usage_error("run", "%s needs --backend cuda (the %s backend has no devices)",
                                  seam.kind == MK_SEAM_NCCL ? "--seam nccl" : "--devices",
                                  opt.backend.kind == MK_BACKEND_CPU ? "cpu" : "chosen");
    if (n_devices > 0 && n_devices != n_cuts + 1)
        return mk_cli_usage_error("run", "--devices names %ld devices for %ld ranges (one per range: --split has %ld cuts)",
                                  n_devices, n_cuts + 1, n_cuts);
    int devices[MK_MAX_CUTS + 1];
    for (long i = 0; i < n_devices; i++) devices[i] = (int)devices_v[i];
    if (n_devices > 0) opt.backend.device = devices[0]; /* the whole model runs on the first */

    mk_model *model = NULL;
    mk_status s = open_model(path, &model);
    if (s != MK_OK) return fail(s);
    const mk_hparams *hp = mk_model_hparams(model);
    int32_t prompt[MK_MAX_TOKENS];
    for (long i = 0; i < n_tokens; i++) prompt[i] = (int32_t)tokens_v[i];
    const int64_t *cuts = cuts_v;
    /* the split is checked against the model before the whole-model run, not after it */
    if (n_cuts > 0 && (s = mk_cuts_to_spans(cuts, (size_t)n_cuts, hp->n_layers, MK_MAX_CUTS + 1, NULL)) != MK_OK) {
        mk_model_free(model);
        return fail(s);
    }
    opt.max_context = (size_t)n_tokens + n_new;
    if (opt.max_context > hp->max_context) opt.max_context = hp->max_context;

    printf("model %s: %s, %zu layers, hidden %zu, vocab %zu; backend %s, weights %s\n", path,
           mk_model_architecture(model), hp->n_layers, hp->hidden, hp->vocab,
           opt.backend.kind == MK_BACKEND_CUDA ? "cuda" : "cpu", mk_dtype_name(opt.backend.weight_dtype));
    run_result whole = {0}, split = {0};
    int rc = 0;
    printf("whole model:\n");
    s = run_pipeline(model, NULL, 0, &opt, &seam, NULL, 0, prompt, (size_t)n_tokens, n_new, &whole);
    if (s == MK_OK) print_run("whole", &whole, (size_t)n_tokens, n_new);
    if (s == MK_OK && n_cuts > 0) {
        printf("split at");
        for (long i = 0; i < n_cuts; i++) printf(" %lld", (long long)cuts[i]);
        printf(" over the %s seam%s:\n", mk_seam_kind_name(seam.kind), seam.tls.enabled ? " (TLS 1.3)" : "");
        s = run_pipeline(model, cuts, (size_t)n_cuts, &opt, &seam, n_devices > 0 ? devices : NULL, (size_t)n_devices,
                         prompt, (size_t)n_tokens, n_new, &split);
        if (s == MK_OK) print_run("split", &split, (size_t)n_tokens, n_new);
    }
    if (s != MK_OK) {
        rc = fail(s);
    } else {
        mk_tokenizer *tok = mk_cli_tokenizer_or_null(model);
        printf("text: ");
        mk_cli_print_text(stdout, tok, whole.tokens, n_new);
        printf("\n");
        mk_tokenizer_free(tok);
        if (n_cuts > 0) {
            const bool same_logits = memcmp(whole.logits, split.logits, n_new * hp->vocab * sizeof(float)) == 0;
            const bool same_tokens = memcmp(whole.tokens, split.tokens, n_new * sizeof(int32_t)) == 0;
            if (same_logits && same_tokens) {
                printf("parity: exact (logits bit-identical at all %zu steps, tokens identical)\n", n_new);
            } else {
                printf("parity: MISMATCH (logits %s, tokens %s)\n", same_logits ? "equal" : "differ",
                       same_tokens ? "equal" : "differ");
                rc = 3;
            }
        }
    }
    free(whole.logits);
    free(split.logits);
    mk_model_free(model);
    return rc;
}

/* For the other files of the program (cli.h). */
mk_status mk_cli_open_model(const char *path, mk_model **out) { return open_model(path, out); }
int mk_cli_fail(mk_status s) { return fail(s); }

mk_tokenizer *mk_cli_tokenizer_or_null(const mk_model *model) {
    mk_tokenizer *tok = NULL;
    if (mk_tokenizer_open(model, &tok) != MK_OK) mk_clear_error(); /* "<id>" is printed instead */
    return tok;
}

/* run's three forms: a text prompt (-p), prompts from a file (--prompts), token ids. */
static int cmd_run_any(int argc, char **argv) {
    for (int i = 1; i < argc; i++) /* a text prompt: the text path (whose parser knows -p --help is a prompt) */
        if (strcmp(argv[i], "-p") == 0 || strcmp(argv[i], "--prompt") == 0) return mk_cli_run_text(argc, argv);
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            char *help[] = {argv[i], NULL};
            (void)cmd_run(1, help);
            printf("\n");
            (void)mk_cli_run_text(1, help);
            printf("\n");
            return mk_cli_run_batch(1, help);
        }
    return mk_cli_is_batch_run(argc, argv) ? mk_cli_run_batch(argc, argv) : cmd_run(argc, argv);
}

/* The commands: one table, read by the dispatch and by `meshkern --help`. */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0]: the first argument after the command */
    const char *about;
} mk_commands[] = {
    {"inspect", cmd_inspect, "a model's architecture, shapes and tensors"},
    {"run", cmd_run_any, "run a model whole and split into ranges (--tokens IDS, -p TEXT or --prompts FILE)"},
    {"chat", mk_cli_chat, "a conversation on standard input, one user turn per line"},
    {"tokenize", mk_cli_tokenize, "a text's token ids under a model's tokenizer"},
    {"stage", mk_cli_stage, "one range of a pipeline whose ranges run in separate processes"},
    {"serve", mk_cli_serve, "an OpenAI-compatible HTTP server"},
};

static void mk_main_help(FILE *f) {
    fprintf(f, "usage: meshkern COMMAND MODEL [options]\n"
               "       meshkern COMMAND --help    the command's options\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof mk_commands / sizeof *mk_commands; i++)
        fprintf(f, "  %-9s %s\n", mk_commands[i].name, mk_commands[i].about);
    fprintf(f, "exit status: 0 done, 1 a runtime failure, 2 a usage error, 3 split output differs from the whole\n"
               "model's (run), 4 some sequences failed (run --prompts)\n");
}

int main(int argc, char **argv) {
    if (argc < 2) return mk_cli_usage_error(NULL, "missing COMMAND");
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        mk_main_help(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof mk_commands / sizeof *mk_commands; i++)
        if (strcmp(argv[1], mk_commands[i].name) == 0) return mk_commands[i].run(argc - 2, argv + 2);
    return mk_cli_usage_error(NULL, "unknown command '%s'", argv[1]);
}
