/* Placed-pipeline benchmark: N sequences served by the whole model on one worker and by
 * a 2-stage pipeline (balanced cuts, one worker per stage), in the same run.
 *
 * Prints the aggregate tokens/s of each and their ratio (the overlap the pipeline buys),
 * each stage's bubble (idle share of the run) for M = 1, 2, 4, 8 sequences in flight, and
 * how much of the run both stages were busy at once (from the stage timeline). Results go
 * to pipeline_bench.json and the M = 8 timeline to pipeline_timeline.json (in $OUT if set).
 * The load average before and after is printed: on a shared machine the ratio is only as
 * good as the two idle cores it needs. Run with OPENBLAS_NUM_THREADS=1 (one thread per
 * stage).
 *
 *   pipeline_bench MODEL.gguf|--random|--random-llama [cpu|cuda] [sequences] [decode_tokens] [repeats] [devices]
 *                  [dtype]
 *   (--random: the seed's tiny model; --random-llama: a random 0.5B-parameter llama for GPUs)
 *   (devices: the 2-stage placement on cuda, e.g. 0,1 or 0,0 for two streams on one GPU)
 *   (dtype: the weight mode, f32|native|f16|bf16, or "both" = f32 then native; default
 *    both for a GGUF model on the cpu backend, f32 otherwise. With native weights a step
 *    computes several times less, so what the seams and queues cost weighs more: both
 *    ratios are printed. The JSON's top-level figures are the last mode's, every mode's
 *    are in "by_dtype".)
 *
 * On the cpu backend every range gets one thread (threads = 1): the whole model on one
 * worker against one worker per stage. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "meshkern.h"
#include "bench_time.h"

static void loadavg(char *out, size_t cap) {
    FILE *f = fopen("/proc/loadavg", "r");
    out[0] = '\0';
    if (f) {
        if (!fgets(out, (int)cap, f)) out[0] = '\0';
        fclose(f);
    }
    out[strcspn(out, "\n")] = '\0';
}

typedef struct run_figures {
    size_t stages, in_flight, tokens;
    double wall_s, tokens_per_s;
    double bubble[2];  /* idle share of the run per stage */
    double both_busy;  /* share of the run with both stages computing */
    double cpu_s[2];   /* CPU time of each stage's thread inside its steps */
} run_figures;

typedef struct bench_config {
    const mk_model *model;
    mk_backend_kind backend;
    mk_dtype dtype;
    int devices[2];
    int32_t **prompts;
    size_t *prompt_len;
    size_t n_seqs, n_decode, max_prompt;
} bench_config;

/* Time both stages spent computing at once: the intersection of their step intervals
 * (each stage's steps are disjoint and in order: one thread). */
typedef struct interval { double a, b; } interval;
static size_t parse_steps(const char *json, size_t stage, interval *out, size_t cap) {
    size_t n = 0;
    char key[32];
    snprintf(key, sizeof key, "{\"worker\":%zu,", stage);
    for (const char *p = strstr(json, key); p && n < cap; p = strstr(p + 1, key)) {
        const char *s = strstr(p, "\"start_us\":"), *e = strstr(p, "\"end_us\":");
        if (!s || !e) break;
        out[n].a = strtod(s + 11, NULL);
        out[n].b = strtod(e + 9, NULL);
        n++;
    }
    return n;
}

static double overlap_us(const interval *x, size_t nx, const interval *y, size_t ny) {
    double total = 0;
    size_t i = 0, j = 0;
    while (i < nx && j < ny) {
        const double a = x[i].a > y[j].a ? x[i].a : y[j].a, b = x[i].b < y[j].b ? x[i].b : y[j].b;
        if (b > a) total += b - a;
        if (x[i].b < y[j].b) i++;
        else j++;
    }
    return total;
}

static mk_status run_once(const bench_config *c, size_t stages, size_t in_flight, const char *timeline_path,
                          run_figures *f) {
    mk_sched_options o = mk_sched_options_default();
    o.range.backend = mk_backend_config_default(c->backend);
    o.range.backend.weight_dtype = c->dtype;
    o.range.backend.threads = 1; /* cpu: one worker per range, the whole model's too */
    o.range.max_context = c->max_prompt + c->n_decode;
    o.range.max_batch_tokens = c->max_prompt;
    o.split_auto = true;
    o.n_workers = stages;
    o.devices = c->devices;
    o.n_devices = stages;
    o.max_sequences = in_flight;
    const size_t steps = c->n_seqs * c->n_decode + 8;
    o.timeline_capacity = steps;
    mk_sched *s = NULL;
    mk_status st = mk_sched_create(c->model, &o, &s);
    if (st != MK_OK) return st;
    /* Warm-up: one short sequence touches every weight and cache path once. */
    uint64_t id;
    st = mk_sched_submit(s, c->prompts[0], c->prompt_len[0], 2, NULL, 0, &id);
    if (st == MK_OK) st = mk_sched_wait_all(s);
    if (st == MK_OK) st = mk_sched_reset_stats(s);
    const double t0 = now_s();
    for (size_t i = 0; st == MK_OK && i < c->n_seqs; i++)
        st = mk_sched_submit(s, c->prompts[i], c->prompt_len[i], c->n_decode, NULL, 0, &id);
    if (st == MK_OK) st = mk_sched_wait_all(s);
    const double wall = now_s() - t0;
    memset(f, 0, sizeof *f);
    f->stages = stages;
    f->in_flight = in_flight;
    f->wall_s = wall;
    for (uint64_t k = 2; st == MK_OK && k <= 1 + c->n_seqs; k++) {
        mk_seq_info info;
        st = mk_sched_poll(s, k, &info, NULL, 0);
        if (st == MK_OK && info.state != MK_SEQ_DONE) {
            fprintf(stderr, "pipeline_bench: sequence %llu failed: %s\n", (unsigned long long)k, info.error);
            st = info.status != MK_OK ? info.status : MK_ERR_INTERNAL;
        }
        f->tokens += info.n_tokens;
    }
    f->tokens_per_s = (double)f->tokens / wall;
    uint64_t first = UINT64_MAX, last = 0;
    mk_worker_stats ss[2];
    for (size_t i = 0; st == MK_OK && i < stages; i++) {
        st = mk_sched_worker_stats(s, i, &ss[i]);
        if (ss[i].first_ns < first) first = ss[i].first_ns;
        if (ss[i].last_ns > last) last = ss[i].last_ns;
    }
    for (size_t i = 0; st == MK_OK && i < stages; i++) {
        f->bubble[i] = 1.0 - (double)ss[i].busy_ns / (double)(last - first);
        f->cpu_s[i] = (double)ss[i].cpu_ns * 1e-9;
    }
    if (st == MK_OK && stages == 2) {
        char *json = NULL;
        size_t len = 0;
        st = mk_sched_timeline_json(s, &json, &len);
        interval *x = malloc(steps * sizeof *x), *y = malloc(steps * sizeof *y);
        if (st == MK_OK && x && y) {
            const size_t nx = parse_steps(json, 0, x, steps), ny = parse_steps(json, 1, y, steps);
            f->both_busy = overlap_us(x, nx, y, ny) * 1e3 / (double)(last - first);
            if (timeline_path) {
                FILE *tf = fopen(timeline_path, "w");
                if (tf) {
                    fwrite(json, 1, len, tf);
                    fclose(tf);
                }
            }
        }
        free(x);
        free(y);
        mk_buffer_free(json);
    }
    mk_sched_free(s);
    return st;
}

static mk_status dtype_from_name(const char *name, mk_dtype *out) {
    static const struct {
        const char *name;
        mk_dtype dtype;
    } modes[] = {{"f32", MK_DTYPE_F32}, {"native", MK_DTYPE_NATIVE}, {"f16", MK_DTYPE_F16}, {"bf16", MK_DTYPE_BF16}};
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++)
        if (strcmp(name, modes[i].name) == 0) {
            *out = modes[i].dtype;
            return MK_OK;
        }
    fprintf(stderr, "pipeline_bench: weight mode '%s' is not f32, native, f16, bf16 or both\n", name);
    return MK_ERR_INVALID_ARGUMENT;
}

/* One weight mode's figures: the ratio pair and the bubbles for M = 1, 2, 4, 8. */
typedef struct dtype_figures {
    const char *name;
    run_figures whole, pipe, bubbles[4];
} dtype_figures;

static mk_status bench_dtype(const bench_config *c, size_t repeats, const char *timeline_path, dtype_figures *d) {
    printf("== weights %s\n", d->name);
    /* The ratio: whole model on one worker vs 2 stages, M = sequences, best of `repeats`
     * alternating pairs (other load on the machine only ever slows a run down). */
    run_figures f;
    mk_status st = MK_OK;
    for (size_t r = 0; st == MK_OK && r < repeats; r++) {
        st = run_once(c, 1, c->n_seqs, NULL, &f);
        if (st != MK_OK) break;
        printf("  pair %zu: whole %.2f tokens/s", r + 1, f.tokens_per_s);
        if (f.tokens_per_s > d->whole.tokens_per_s) d->whole = f;
        st = run_once(c, 2, c->n_seqs, timeline_path, &f);
        if (st != MK_OK) break;
        printf(", 2 stages %.2f tokens/s (both busy %.0f%% of the run), ratio %.2fx\n", f.tokens_per_s,
               100 * f.both_busy, f.tokens_per_s / d->whole.tokens_per_s);
        if (f.tokens_per_s > d->pipe.tokens_per_s) d->pipe = f;
    }
    const size_t ms[4] = {1, 2, 4, 8};
    for (size_t i = 0; st == MK_OK && i < 4; i++) {
        if (ms[i] == c->n_seqs && d->pipe.tokens) {
            d->bubbles[i] = d->pipe;
            continue;
        }
        st = run_once(c, 2, ms[i] < c->n_seqs ? ms[i] : c->n_seqs, NULL, &d->bubbles[i]);
    }
    if (st != MK_OK) return st;
    const run_figures *whole = &d->whole, *pipe = &d->pipe;
    printf("whole model, one worker, %zu in flight: %.2f tokens/s (%zu tokens in %.2f s)\n", c->n_seqs,
           whole->tokens_per_s, whole->tokens, whole->wall_s);
    printf("2 stages, one worker each, %zu in flight: %.2f tokens/s (%zu tokens in %.2f s)\n", c->n_seqs,
           pipe->tokens_per_s, pipe->tokens, pipe->wall_s);
    printf("ratio (%s weights): %.2fx (best of %zu pairs)\n", d->name, pipe->tokens_per_s / whole->tokens_per_s,
           repeats);
    /* Not a measurement of overlap: what the CPU time the threads got implies on two
     * otherwise idle cores (the slower stage bounds the pipeline). */
    const double slow = pipe->cpu_s[0] > pipe->cpu_s[1] ? pipe->cpu_s[0] : pipe->cpu_s[1];
    printf("CPU time inside steps: whole %.2f s; stages %.2f s + %.2f s (whole / slower stage = %.2fx)\n",
           whole->cpu_s[0], pipe->cpu_s[0], pipe->cpu_s[1], slow > 0 ? whole->cpu_s[0] / slow : 0.0);
    /* Time outside the steps (queues, seams, admission): what the pipeline's wall clock
     * holds beyond its slower stage's busy time. */
    const double busy0 = (1.0 - pipe->bubble[0]) * pipe->wall_s, busy1 = (1.0 - pipe->bubble[1]) * pipe->wall_s;
    const double busy = busy0 > busy1 ? busy0 : busy1;
    printf("outside the slower stage's steps: %.1f%% of the pipelined run (seams, queues, waits)\n",
           pipe->wall_s > 0 ? 100.0 * (pipe->wall_s - busy) / pipe->wall_s : 0.0);
    printf("%-10s %12s %14s %14s %14s\n", "in flight", "tokens/s", "bubble st.0", "bubble st.1", "both busy");
    for (size_t i = 0; i < 4; i++)
        printf("%-10zu %12.2f %13.1f%% %13.1f%% %13.1f%%\n", d->bubbles[i].in_flight, d->bubbles[i].tokens_per_s,
               100 * d->bubbles[i].bubble[0], 100 * d->bubbles[i].bubble[1], 100 * d->bubbles[i].both_busy);
    return MK_OK;
}

static void json_figures(FILE *json, const dtype_figures *d) {
    fprintf(json, "\"whole_tokens_per_s\":%.3f,\"pipeline_tokens_per_s\":%.3f,\"ratio\":%.3f,\"bubble\":[",
            d->whole.tokens_per_s, d->pipe.tokens_per_s, d->pipe.tokens_per_s / d->whole.tokens_per_s);
    for (size_t i = 0; i < 4; i++)
        fprintf(json, "%s{\"in_flight\":%zu,\"tokens_per_s\":%.3f,\"stage0\":%.4f,\"stage1\":%.4f,\"both_busy\":%.4f}",
                i ? "," : "", d->bubbles[i].in_flight, d->bubbles[i].tokens_per_s, d->bubbles[i].bubble[0],
                d->bubbles[i].bubble[1], d->bubbles[i].both_busy);
    fprintf(json, "]");
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const char *backend = argc > 2 ? argv[2] : "cpu";
    bench_config c = {0};
    c.n_seqs = argc > 3 ? strtoull(argv[3], NULL, 10) : 8;
    c.n_decode = argc > 4 ? strtoull(argv[4], NULL, 10) : 16;
    const size_t repeats = argc > 5 ? strtoull(argv[5], NULL, 10) : 2;
    c.devices[0] = 0;
    c.devices[1] = 1;
    if (argc > 6 && sscanf(argv[6], "%d,%d", &c.devices[0], &c.devices[1]) != 2) {
        fprintf(stderr, "devices: expected A,B\n");
        return 2;
    }
    if (c.n_seqs == 0 || c.n_decode == 0 || repeats == 0) {
        fprintf(stderr, "usage: pipeline_bench MODEL [cpu|cuda] [sequences] [decode_tokens] [repeats] [devices] [dtype]\n");
        return 2;
    }
    mk_status st = mk_backend_kind_from_name(backend, &c.backend);
    mk_model *model = NULL;
    mk_hparams hp = mk_hparams_seed_default();
    if (strcmp(path, "--random-llama") == 0) {
        hp.vocab = 32000;
        hp.hidden = 2048;
        hp.n_layers = 8;
        hp.n_heads = 32;
        hp.n_kv_heads = 8;
        hp.head_dim = 64;
        hp.intermediate = 5632;
        hp.max_context = 1024;
    }
    if (st == MK_OK)
        st = strncmp(path, "--random", 8) == 0 ? mk_model_create_random(&hp, 1, NULL, &model)
                                               : mk_model_open_gguf(path, &model);
    if (st != MK_OK) {
        fprintf(stderr, "pipeline_bench: %s: %s\n", mk_status_name(st), mk_last_error());
        return 1;
    }
    c.model = model;
    const bool gguf = strncmp(path, "--random", 8) != 0;
    const char *dtype_arg = argc > 7 ? argv[7] : gguf && c.backend == MK_BACKEND_CPU ? "both" : "f32";
    const size_t vocab = mk_model_hparams(model)->vocab;
    c.prompts = calloc(c.n_seqs, sizeof *c.prompts);
    c.prompt_len = calloc(c.n_seqs, sizeof *c.prompt_len);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < c.n_seqs; i++) {
        c.prompt_len[i] = 6 + i % 5; /* mixed lengths 6..10 */
        c.prompts[i] = malloc(c.prompt_len[i] * sizeof(int32_t));
        for (size_t k = 0; k < c.prompt_len[i]; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            c.prompts[i][k] = (int32_t)((rng >> 33) % (vocab > 200 ? vocab - 100 : vocab) + (vocab > 200 ? 100 : 0));
        }
        if (c.prompt_len[i] > c.max_prompt) c.max_prompt = c.prompt_len[i];
    }
    int64_t cut = -1;
    double shares[2] = {0, 0};
    if (mk_split_auto(model, 2, &cut, shares) != MK_OK) return 1;

    char load_before[128], load_after[128];
    loadavg(load_before, sizeof load_before);
    printf("pipeline_bench: %s, backend %s, weights %s, %zu sequences x %zu tokens (prompts 6-10), "
           "OPENBLAS_NUM_THREADS=%s\n",
           path, backend, dtype_arg, c.n_seqs, c.n_decode,
           getenv("OPENBLAS_NUM_THREADS") ? getenv("OPENBLAS_NUM_THREADS") : "unset");
    printf("auto cut after layer %lld: stage shares %.1f%% / %.1f%%\n", (long long)cut, 100 * shares[0],
           100 * shares[1]);
    printf("load average before: %s\n", load_before);

    const char *out_dir = getenv("OUT");
    char timeline_path[4096], json_path[4096];
    snprintf(timeline_path, sizeof timeline_path, "%s/pipeline_timeline.json", out_dir && *out_dir ? out_dir : ".");
    snprintf(json_path, sizeof json_path, "%s/pipeline_bench.json", out_dir && *out_dir ? out_dir : ".");

    const char *modes[2] = {NULL, NULL};
    size_t n_modes = 0;
    if (strcmp(dtype_arg, "both") == 0) {
        modes[n_modes++] = "f32";
        modes[n_modes++] = "native";
    } else {
        modes[n_modes++] = dtype_arg;
    }
    dtype_figures figs[2];
    memset(figs, 0, sizeof figs);
    for (size_t k = 0; st == MK_OK && k < n_modes; k++) {
        figs[k].name = modes[k];
        st = dtype_from_name(modes[k], &c.dtype);
        if (st == MK_OK) st = bench_dtype(&c, repeats, timeline_path, &figs[k]);
    }
    loadavg(load_after, sizeof load_after);
    if (st != MK_OK) {
        fprintf(stderr, "pipeline_bench: %s: %s\n", mk_status_name(st), mk_last_error());
        return 1;
    }
    if (n_modes == 2)
        printf("ratio by weight mode: f32 %.2fx, native %.2fx (native steps are %.1fx faster on the whole model)\n",
               figs[0].pipe.tokens_per_s / figs[0].whole.tokens_per_s,
               figs[1].pipe.tokens_per_s / figs[1].whole.tokens_per_s,
               figs[1].whole.tokens_per_s / figs[0].whole.tokens_per_s);
    printf("load average after: %s\n", load_after);
    printf("timeline (M = %zu, %s weights): %s\n", c.n_seqs, modes[n_modes - 1], timeline_path);

    FILE *json = fopen(json_path, "w");
    if (json) {
        const dtype_figures *last = &figs[n_modes - 1];
        fprintf(json,
                "{\"model\":\"%s\",\"backend\":\"%s\",\"dtype\":\"%s\",\"sequences\":%zu,\"decode_tokens\":%zu,"
                "\"cut\":%lld,\"shares\":[%.4f,%.4f],",
                path, backend, last->name, c.n_seqs, c.n_decode, (long long)cut, shares[0], shares[1]);
        json_figures(json, last);
        fprintf(json, ",\"load_before\":\"%s\",\"load_after\":\"%s\",\"by_dtype\":[", load_before, load_after);
        for (size_t k = 0; k < n_modes; k++) {
            fprintf(json, "%s{\"dtype\":\"%s\",", k ? "," : "", figs[k].name);
            json_figures(json, &figs[k]);
            fprintf(json, "}");
        }
        fprintf(json, "]}\n");
        fclose(json);
        printf("results: %s\n", json_path);
    }
    for (size_t i = 0; i < c.n_seqs; i++) free(c.prompts[i]);
    free(c.prompts);
    free(c.prompt_len);
    mk_model_free(model);
    return 0;
}
