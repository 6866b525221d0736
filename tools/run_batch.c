/* meshkern run MODEL --prompts FILE: many sequences through a placed pipeline.
 *
 *   meshkern run MODEL --prompts FILE [--split auto|L1,L2,...] [--devices 0,1,...] [--max-sequences M]
 *                [--max-tokens N] [--stop IDS] [--seam auto|local|wire|unix|tcp|nccl] [--timeline FILE.json]
 *                [backend options]
 *
 * FILE holds one prompt per line as comma-separated token ids (blank lines and lines
 * starting with '#' are skipped). Each range runs on its own device (cuda) or worker
 * thread (cpu); --max-sequences are in flight at once and the rest wait for a slot.
 * Generation stops at --max-tokens tokens or at a stop id: the model's EOS (its
 * tokenizer's), plus --stop. Weights are native (GGUF block format) for a GGUF model
 * on the cpu backend unless --dtype says otherwise; --threads is per stage (default: the
 * cores divided among the stages). Prints the cuts and each stage's share, every
 * sequence's tokens (and text), and the aggregate throughput and per-stage busy share. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cli_text.h"
#include "core/mk_size.h"
#include "mk_error.h"

#define MK_BATCH_MAX_LIST MK_CLI_MAX_LIST

typedef struct batch_args {
    const char *model, *prompts, *timeline;
    bool split_auto;
    bool text; /* --text: prompts are user messages through the chat template */
    int64_t cuts[MK_BATCH_MAX_LIST];
    size_t n_cuts;
    int devices[MK_BATCH_MAX_LIST];
    size_t n_devices;
    int32_t stop[MK_BATCH_MAX_LIST + 1]; /* --stop, then the model's EOS */
    size_t n_stop;
    size_t batch, n_new;
    size_t step_seqs; /* --step-sequences, 0: the default (mk_cli_step_sequences) */
    size_t workers;   /* --workers: the stages of --split auto, 0: one per device, else 2 */
    size_t prefill_chunk; /* --prefill-chunk, 0: a prompt in one step */
    mk_seam_kind seam; /* 0: the placement rule */
    mk_cli_backend backend;
} batch_args;

bool mk_cli_is_batch_run(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--prompts") == 0) return true;
    return false;
}

static double batch_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "a,b,c" of token ids (a prompt line, its line end allowed) into out[cap]; false on anything
 * else: each id plain decimal digits (no sign, no blank), a comma between two ids only. */
static bool parse_ints(const char *text, long long lo, long long hi, long long *out, size_t cap, size_t *n) {
    *n = 0;
    for (const char *p = text;;) {
        if (*p < '0' || *p > '9') return false;
        char *end;
        errno = 0;
        const long long v = strtoll(p, &end, 10);
        if (errno || v < lo || v > hi || *n == cap) return false;
        out[(*n)++] = v;
        if (*end != ',') return strspn(end, "\r\n") == strlen(end);
        p = end + 1;
    }
}

/* -1 when parsed; else the exit status (0 after --help, 2 after a usage error). */
static int parse_batch_args(int argc, char **argv, batch_args *a) {
    memset(a, 0, sizeof *a);
    a->batch = 8;
    a->n_new = 16;
    a->seam = 0;
    mk_cli_backend_init(&a->backend);
    int64_t devices[MK_BATCH_MAX_LIST], stop[MK_BATCH_MAX_LIST];
    mk_cli_list cuts_l = MK_CLI_LIST(a->cuts, 0, INT32_MAX, "layer", true);
    mk_cli_list devices_l = MK_CLI_LIST(devices, 0, MK_CLI_MAX_DEVICE, "device", false);
    mk_cli_list stop_l = MK_CLI_LIST(stop, 0, INT32_MAX, "token id", false);
    const mk_cli_option opts[] = {
        mk_cli_opt_prompts(&a->prompts, "one prompt per line, comma-separated token ids (with --text: one user message "
                                        "per line); - is standard input (required)"),
        {"--text", NULL, NULL, "the prompts are text through the chat template (as run -p)", NULL, MK_CLI_FLAG, &a->text,
         0, 0, NULL},
        mk_cli_opt_max_tokens(&a->n_new, MK_CLI_MAX_NEW_TOKENS, "16"),
        mk_cli_opt_max_sequences(&a->batch, "8"),
        mk_cli_opt_step_sequences(&a->step_seqs),
        mk_cli_opt_prefill_chunk(&a->prefill_chunk, "0"),
        mk_cli_opt_stop(&stop_l),
        mk_cli_opt_split(&cuts_l),
        mk_cli_opt_devices(&devices_l),
        {"--workers", NULL, "N", "the stages of --split auto (cpu: worker threads; cuda: as --devices)",
         "one per --devices entry, else 2", MK_CLI_COUNT, &a->workers, 1, MK_BATCH_MAX_LIST, NULL},
        mk_cli_opt_seam(&a->seam, true, "auto: by the placement rule"),
        {"--timeline", NULL, "FILE.json", "every stage's steps as a Chrome trace", NULL, MK_CLI_TEXT, (void *)&a->timeline,
         0, 0, NULL},
    };
    mk_cli_option backend_opts[MK_CLI_BACKEND_OPTIONS];
    const mk_cli_group groups[] = {
        {"options", opts, sizeof opts / sizeof *opts},
        {"backend options", backend_opts,
         mk_cli_backend_options(&a->backend, backend_opts, "cpu threads per stage (default: the cores divided among the stages)")},
    };
    const mk_cli_command cmd = {
        "run", "MODEL --prompts FILE [options]",
        "  Many sequences through a placed pipeline: one range per device (cuda) or worker thread (cpu).\n"
        "  A sequence stops at --max-tokens, at the model's EOS or at a --stop id.\n",
        {"MODEL"}, groups, sizeof groups / sizeof *groups};
    const int bad = mk_cli_parse(&cmd, argc, argv, &a->model);
    if (bad >= 0) return bad;
    if (!a->prompts) return mk_cli_usage_error("run", "--prompts FILE is required");
    a->split_auto = cuts_l.is_auto;
    a->n_cuts = cuts_l.n;
    for (a->n_devices = 0; a->n_devices < devices_l.n; a->n_devices++) a->devices[a->n_devices] = (int)devices[a->n_devices];
    for (a->n_stop = 0; a->n_stop < stop_l.n; a->n_stop++) a->stop[a->n_stop] = (int32_t)stop[a->n_stop];
    if (a->n_devices && a->backend.config.kind != MK_BACKEND_CUDA)
        return mk_cli_usage_error("run", "--devices needs --backend cuda (the cpu backend has no devices: --split auto "
                                         "--workers N gives N worker threads)");
    if (a->seam && !a->split_auto && !a->n_cuts && a->n_devices < 2)
        return mk_cli_usage_error("run", "--seam has no effect without --split (one stage has no seam)");
    if (a->workers && !a->split_auto)
        return mk_cli_usage_error("run", "--workers N goes with --split auto (given cuts make one stage per range)");
    if (a->workers && a->n_devices && a->workers != a->n_devices)
        return mk_cli_usage_error("run", "--workers %zu and --devices naming %zu: one stage per device", a->workers,
                                  a->n_devices);
    return mk_cli_backend_finish(&a->backend, "run", a->model);
}

/* One prompt per line; *out is an array of *n prompts (mk_cli_free_prompts). */
mk_status mk_cli_read_prompts(const char *path, batch_prompt **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    const bool std_in = strcmp(path, "-") == 0;
    FILE *f = std_in ? stdin : fopen(path, "r");
    if (!f) return mk_fail(MK_ERR_IO, "cannot open prompts file %s: %s", path, strerror(errno));
    batch_prompt *prompts = NULL;
    size_t n = 0, cap = 0, line_no = 0;
    char *line = NULL;
    size_t line_cap = 0;
    mk_status s = MK_OK;
    ssize_t len;
    while (s == MK_OK && (len = getline(&line, &line_cap, f)) >= 0) {
        line_no++;
        if (memchr(line, '\0', (size_t)len)) { /* C strings would end the line there, silently */
            s = mk_fail(MK_ERR_INVALID_ARGUMENT, "%s:%zu: a NUL byte at column %zu", path, line_no,
                        (size_t)((const char *)memchr(line, '\0', (size_t)len) - line) + 1);
            break;
        }
        const char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '\0' || *p == '\n' || *p == '\r' || *p == '#') continue;
        size_t count = 1;
        for (const char *q = p; *q; q++) count += *q == ',';
        long long *ids = malloc(count * sizeof *ids);
        size_t got = 0;
        if (!ids) s = mk_fail(MK_ERR_OUT_OF_MEMORY, "out of memory reading prompts");
        else if (!parse_ints(p, 0, INT32_MAX, ids, count, &got))
            s = mk_fail(MK_ERR_INVALID_ARGUMENT, "%s:%zu: expected comma-separated token ids", path, line_no);
        if (s == MK_OK) s = mk_grow_array(&prompts, &cap, n + 1, sizeof *prompts, 16, "prompts");
        if (s == MK_OK) {
            prompts[n].ids = malloc(got * sizeof(int32_t));
            if (!prompts[n].ids) s = mk_fail(MK_ERR_OUT_OF_MEMORY, "out of memory reading prompts");
            else {
                for (size_t i = 0; i < got; i++) prompts[n].ids[i] = (int32_t)ids[i];
                prompts[n++].n = got;
            }
        }
        free(ids);
    }
    free(line);
    if (s == MK_OK && ferror(f)) /* getline's error is no end of file (a directory, say) */
        s = mk_fail(MK_ERR_IO, "cannot read prompts file %s: %s", path, strerror(errno));
    if (!std_in) fclose(f);
    if (s == MK_OK && n == 0) s = mk_fail(MK_ERR_EMPTY_INPUT, "prompts file %s holds no prompt", path);
    *out = prompts;
    *n_out = n;
    return s;
}

/* --text: each non-empty line of the file is a user message, rendered with the model's chat
 * template and tokenized as run -p does. */
mk_status mk_cli_read_text_prompts(const char *path, const mk_tokenizer *tok, batch_prompt **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!f) return mk_fail(MK_ERR_IO, "cannot open prompts file %s", path);
    mk_status s = MK_OK;
    char *line = NULL;
    size_t cap = 0, n = 0, have = 0, line_no = 0;
    ssize_t len;
    while (s == MK_OK && (len = getline(&line, &cap, f)) >= 0) {
        line_no++;
        const char *nul = memchr(line, '\0', (size_t)len); /* C strings would end the line there, silently */
        if (nul) {
            s = mk_fail(MK_ERR_INVALID_ARGUMENT, "%s:%zu: a NUL byte at column %zu", path, line_no,
                        (size_t)(nul - line) + 1);
            break;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (len == 0) continue;
        if ((s = mk_grow_array(out, &have, n + 1, sizeof **out, 8, "prompts")) != MK_OK) break;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        const char *template_name = NULL;
        s = mk_cli_text_ids(tok, NULL, line, false, &ids, &n_ids, &template_name);
        if (s == MK_OK && !((*out)[n].ids = malloc((n_ids ? n_ids : 1) * sizeof(int32_t))))
            s = mk_fail(MK_ERR_OUT_OF_MEMORY, "out of memory");
        if (s == MK_OK) {
            memcpy((*out)[n].ids, ids, n_ids * sizeof(int32_t));
            (*out)[n++].n = n_ids;
        }
        mk_buffer_free(ids);
    }
    free(line);
    if (s == MK_OK && ferror(f)) s = mk_fail(MK_ERR_IO, "cannot read prompts file %s: %s", path, strerror(errno));
    if (f != stdin) fclose(f);
    *n_out = n;
    if (s == MK_OK && n == 0) s = mk_fail(MK_ERR_EMPTY_INPUT, "no prompts in %s", path);
    return s;
}

void mk_cli_free_prompts(batch_prompt *p, size_t n) {
    for (size_t i = 0; p && i < n; i++) free(p[i].ids);
    free(p);
}

static mk_status write_timeline(const mk_sched *sched, const char *path) {
    char *json = NULL;
    size_t len = 0;
    MK_TRY(mk_sched_timeline_json(sched, &json, &len));
    FILE *f = fopen(path, "w");
    const bool ok = f && fwrite(json, 1, len, f) == len;
    if (f && fclose(f) != 0) return mk_fail(MK_ERR_IO, "cannot write %s", path);
    mk_buffer_free(json);
    return ok ? MK_OK : mk_fail(MK_ERR_IO, "cannot write %s: %s", path, strerror(errno));
}

static int run_batch(const batch_args *a, const mk_model *model, const mk_tokenizer *tok, const batch_prompt *prompts,
                     size_t n_prompts) {
    const mk_hparams *hp = mk_model_hparams(model);
    /* The model's EOS, when its tokenizer names one, stops a sequence too. */
    int32_t stop[MK_BATCH_MAX_LIST + 1];
    size_t n_stop = a->n_stop;
    memcpy(stop, a->stop, n_stop * sizeof *stop);
    if (mk_tokenizer_eos(tok) >= 0) stop[n_stop++] = mk_tokenizer_eos(tok);
    /* --text, as run -p: every end-of-generation token of the tokenizer stops too */
    for (size_t id = 0; a->text && tok && id < mk_tokenizer_vocab_size(tok) && n_stop < MK_BATCH_MAX_LIST; id++)
        if (mk_tokenizer_is_eog(tok, (int32_t)id) && (int32_t)id != mk_tokenizer_eos(tok)) stop[n_stop++] = (int32_t)id;

    size_t longest = 0;
    for (size_t i = 0; i < n_prompts; i++) longest = prompts[i].n > longest ? prompts[i].n : longest;
    mk_sched_options o = mk_sched_options_default();
    mk_cli_backend_range(&a->backend, &o.range);
    (void)mk_size_add(longest, a->n_new, &o.range.max_context); /* saturates, then capped */
    if (o.range.max_context > hp->max_context) o.range.max_context = hp->max_context;
    /* a step's rows: several prompts fit one step (as many rows as a sequence's context) */
    o.range.max_batch_tokens = o.range.max_context;
    o.split_auto = a->split_auto || (a->n_cuts == 0 && a->n_devices > 1);
    o.n_workers = a->n_devices ? a->n_devices : a->workers ? a->workers : o.split_auto ? 2 : 1;
    o.cuts = a->cuts;
    o.n_cuts = a->n_cuts;
    o.devices = a->n_devices ? a->devices : NULL;
    o.n_devices = a->n_devices;
    o.max_sequences = a->batch;
    o.range.max_batch_sequences = mk_cli_step_sequences(a->step_seqs, a->batch);
    o.prefill_chunk = a->prefill_chunk;
    o.seam = a->seam;
    if (a->timeline && !mk_size_mul(n_prompts, a->n_new + 1, &o.timeline_capacity))
        return mk_cli_fail(mk_fail(MK_ERR_OUT_OF_MEMORY, "a timeline of %zu sequences x %zu steps overflows", n_prompts,
                                   a->n_new + 1));
    const bool cuda = a->backend.config.kind == MK_BACKEND_CUDA;
    mk_sched *sched = NULL;
    mk_status s = mk_sched_create(model, &o, &sched);
    if (s != MK_OK) return mk_cli_fail(s);
    const size_t n_workers = mk_sched_worker_count(sched);
    printf("pipeline: %zu stages, %zu sequences in flight, seam %s%s, backend %s, weights %s, kv %s\n", n_workers,
           a->batch, n_workers > 1 ? mk_seam_kind_name(mk_sched_seam_kind(sched, 0)) : "none", a->seam ? "" : " (auto)",
           cuda ? "cuda" : "cpu", mk_dtype_name(a->backend.config.weight_dtype),
           a->backend.config.kv_dtype ? mk_dtype_name(a->backend.config.kv_dtype) : "f32");
    printf("cuts (%s):", o.split_auto ? "auto" : "given");
    for (size_t i = 0; i + 1 < n_workers; i++) printf(" %lld", (long long)mk_range_end(mk_sched_worker_range(sched, i)));
    printf("\n");
    for (size_t i = 0; i < n_workers; i++) {
        const mk_range *r = mk_sched_worker_range(sched, i);
        printf("  stage %zu: layers %lld-%lld %-6s on %s %d, %.1f MiB, %.1f%% of the per-step cost\n", i,
               (long long)mk_range_start(r), (long long)mk_range_end(r), mk_role_name(mk_range_role(r)),
               cuda ? "device" : "worker", cuda ? (o.devices ? o.devices[i] : (int)i) : (int)i,
               (double)mk_range_weight_bytes(r) / 1048576.0, 100.0 * mk_sched_worker_share(sched, i));
    }

    uint64_t *ids = calloc(n_prompts, sizeof *ids);
    int32_t *tokens = mk_alloc_array(a->n_new, sizeof *tokens, "generated tokens");
    if (!ids || !tokens) s = tokens ? mk_fail(MK_ERR_OUT_OF_MEMORY, "out of memory") : MK_ERR_OUT_OF_MEMORY;
    const double t0 = batch_now_s();
    for (size_t i = 0; s == MK_OK && i < n_prompts; i++)
        if ((s = mk_sched_submit(sched, prompts[i].ids, prompts[i].n, a->n_new, stop, n_stop, &ids[i])) != MK_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", mk_last_error());
            s = mk_fail(s, "prompt %zu of %s: %s", i + 1, a->prompts, why);
        }
    if (s == MK_OK) s = mk_sched_wait_all(sched);
    const double wall = batch_now_s() - t0;
    int rc = s == MK_OK ? 0 : mk_cli_fail(s);
    size_t generated = 0, failed = 0;
    for (size_t i = 0; rc == 0 && i < n_prompts; i++) {
        mk_seq_info info;
        if (mk_sched_poll(sched, ids[i], &info, tokens, a->n_new) != MK_OK) continue;
        generated += info.n_tokens;
        printf("seq %zu (%zu prompt tokens): ", i + 1, prompts[i].n);
        if (info.state == MK_SEQ_FAILED) {
            failed++;
            printf("FAILED %s: %s;", mk_status_name(info.status), info.error);
        } else {
            printf("%s,", info.stopped ? "stopped" : "limit");
        }
        printf(" %zu tokens:", info.n_tokens);
        for (size_t k = 0; k < info.n_tokens; k++) printf(" %d", tokens[k]);
        printf("\n  text: ");
        /* --text answers as run -p shows them: the stop token ends the answer, not part of it */
        const size_t shown = a->text && info.stopped && info.n_tokens ? info.n_tokens - 1 : info.n_tokens;
        mk_cli_print_text(stdout, tok, tokens, shown); /* "<id>" without a tokenizer */
        printf("\n");
    }
    if (rc == 0) {
        printf("aggregate: %zu tokens from %zu sequences in %.3f s: %.1f tokens/s%s\n", generated, n_prompts, wall,
               (double)generated / wall, failed ? " (some sequences failed)" : "");
        for (size_t i = 0; i < n_workers; i++) {
            mk_worker_stats st;
            if (mk_sched_worker_stats(sched, i, &st) == MK_OK)
                printf("  stage %zu: %zu steps, busy %.1f%% of the run\n", i, st.steps,
                       100.0 * (double)st.busy_ns / (wall * 1e9));
        }
        if (a->timeline) {
            s = write_timeline(sched, a->timeline);
            if (s != MK_OK) rc = mk_cli_fail(s);
            else printf("timeline: %s\n", a->timeline);
        }
        if (failed) rc = 4;
    }
    free(ids);
    free(tokens);
    mk_sched_free(sched);
    return rc;
}

int mk_cli_run_batch(int argc, char **argv) {
    batch_args a;
    const int bad = parse_batch_args(argc, argv, &a);
    if (bad >= 0) return bad;
    batch_prompt *prompts = NULL;
    size_t n_prompts = 0;
    mk_status s = a.text ? MK_OK : mk_cli_read_prompts(a.prompts, &prompts, &n_prompts);
    if (s != MK_OK) {
        mk_cli_free_prompts(prompts, n_prompts);
        return mk_cli_fail(s);
    }
    mk_model *model = NULL;
    s = mk_cli_open_model(a.model, &model);
    mk_tokenizer *tok = NULL;
    if (s == MK_OK && a.text && (s = mk_tokenizer_open(model, &tok)) == MK_OK)
        s = mk_cli_read_text_prompts(a.prompts, tok, &prompts, &n_prompts);
    else if (s == MK_OK)
        tok = mk_cli_tokenizer_or_null(model);
    int rc = s == MK_OK ? run_batch(&a, model, tok, prompts, n_prompts) : mk_cli_fail(s);
    mk_tokenizer_free(tok);
    mk_model_free(model);
    mk_cli_free_prompts(prompts, n_prompts);
    return rc;
}
