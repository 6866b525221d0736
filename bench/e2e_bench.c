/* End-to-end benchmark: a model run whole and split in one process (seams through the
 * wire), prefill and decode tokens/s, decode's weight traffic against a measured ceiling,
 * and (with --peer) llama.cpp's decode speed on the same file, prompt and thread count.
 * On the cuda backend the whole model also decodes op by op (eager_decode), beside the
 * default replay of one captured graph per range and token: the before/after of graphs.
 *
 * A decode step reads every resident weight once, except an embedding table used only to
 * embed (one row is read), so those bytes x tokens/s is the bandwidth it sustains. On the
 * cpu backend it is compared with the machine's multi-threaded read ceiling measured in
 * the same run: `threads` threads each summing their share of a 512 MiB buffer (a decode
 * step streams its weights the same way); a single-thread memcpy is printed too, for
 * comparison with older figures. Every figure is the median of --runs rounds; llama.cpp
 * runs once per round between meshkern's, so both see the same machine load, which is
 * printed (/proc/loadavg) before and after. Results go to e2e_bench.json (in $OUT if set).
 *
 *   e2e_bench MODEL.gguf|--random [cpu|cuda] [prompt_tokens] [decode_tokens] [cut]
 *             [--dtype native|f32|f16|bf16] [--threads N] [--runs R] [--peer [SCRIPT]]
 *
 * Defaults: prompt 128, decode 128, cut in the middle, dtype native for a GGUF model on the
 * cpu backend (f32 otherwise), threads = cores, runs 3, peer script bench/llamacpp_peer.py. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_pool.h"
#include "backend/cpu/cpu_quant.h"
#include "model/gguf.h"
#include "meshkern.h"
#include "range/range.h"
#include "bench_time.h"
#include "core/cores.h"

#define MAX_RUNS 15

static double median(const double *v, size_t n) {
    double s[MAX_RUNS];
    memcpy(s, v, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

static void load_average(char *out, size_t cap) {
    FILE *f = fopen("/proc/loadavg", "r");
    out[0] = 0;
    if (f) {
        if (fgets(out, (int)cap, f)) out[strcspn(out, " ")] = 0; /* the 1-minute figure */
        fclose(f);
    }
    if (!out[0]) snprintf(out, cap, "unknown");
}

/* ================================================================ ceilings == */

/* Best of five copies of 256 MiB between warm buffers (one thread). */
static double memcpy_gbps(void) {
    const size_t bytes = (size_t)256 << 20;
    char *a = malloc(bytes), *b = malloc(bytes);
    double best = 0.0;
    if (a && b) {
        memset(a, 1, bytes);
        memset(b, 2, bytes);
        for (int i = 0; i < 5; i++) {
            const double t0 = now_s();
            memcpy(b, a, bytes);
            __asm__ volatile("" ::"r"(b) : "memory");
            const double gbps = (double)bytes / 1e9 / (now_s() - t0);
            if (gbps > best) best = gbps;
        }
    }
    free(a);
    free(b);
    return best;
}

typedef struct read_slice {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} read_slice;

static void *read_worker(void *arg) {
    read_slice *s = arg;
    s->sum = sum_words(s->p, s->n);
    return NULL;
}

/* Best of five passes of `threads` threads each summing its share of 512 MiB: the rate at
 * which the cores this run uses can stream reads from memory. */
static double read_ceiling_gbps(size_t threads) {
    const size_t bytes = (size_t)512 << 20, words = bytes / sizeof(uint64_t);
    uint64_t *buf = malloc(bytes);
    if (!buf || threads == 0 || threads > 256) {
        free(buf);
        return 0.0;
    }
    for (size_t i = 0; i < words; i++) buf[i] = i * 2654435761u;
    double best = 0.0;
    read_slice slices[256];
    pthread_t tid[256];
    for (int pass = 0; pass < 5; pass++) {
        const double t0 = now_s();
        for (size_t t = 0; t < threads; t++) {
            slices[t] = (read_slice){buf + t * (words / threads), words / threads, 0};
            if (t > 0) pthread_create(&tid[t], NULL, read_worker, &slices[t]);
        }
        read_worker(&slices[0]);
        for (size_t t = 1; t < threads; t++) pthread_join(tid[t], NULL);
        const double dt = now_s() - t0;
        uint64_t sum = 0;
        for (size_t t = 0; t < threads; t++) sum += slices[t].sum;
        __asm__ volatile("" ::"r"(sum));
        const double gbps = (double)(words / threads * threads * sizeof(uint64_t)) / 1e9 / dt;
        if (gbps > best) best = gbps;
    }
    free(buf);
    return best;
}

/* ============================================================== meshkern == */

/* Decode steps timed op by op after the timed decode (outside its figure). */
enum { PROFILE_STEPS = 32 };

typedef struct e2e_result {
    double prefill_tps, decode_tps;
    size_t weight_bytes, seam_bytes;
    int32_t last_token;
    bool profiled;
    double step_ms;                /* wall ms per profiled decode step */
    double op_ms[MK_OPF_COUNT];    /* ms per decode step in each op family, all ranges */
    /* per decode token, from the backends' structural counters (mk_backend_counters) */
    double launches, max_range_syncs, downloaded, graph_launches;
    double dev_read, dev_weight_read, dev_kv_read; /* device bytes read (model of each kernel), cuda */
} e2e_result;

/* PROFILE_STEPS more decode steps with every range's op timing on. */
static mk_status profile_decode(mk_pipeline *p, int32_t *token, e2e_result *res) {
    const size_t n = mk_pipeline_range_count(p);
    for (size_t i = 0; i < n; i++) mk_range_profile(mk_pipeline_range(p, i), true);
    mk_status s = MK_OK;
    const double t0 = now_s();
    for (size_t i = 0; s == MK_OK && i < PROFILE_STEPS; i++) {
        mk_tail_output *out = NULL;
        s = mk_pipeline_step(p, token, 1, &out);
        if (s == MK_OK) *token = out->token_ids[0];
        mk_tail_output_free(out);
    }
    res->step_ms = (now_s() - t0) * 1e3 / PROFILE_STEPS;
    for (int f = 0; f < MK_OPF_COUNT; f++) res->op_ms[f] = 0.0;
    for (size_t i = 0; i < n; i++) {
        mk_range *r = mk_pipeline_range(p, i);
        const mk_op_profile *prof = mk_range_op_profile(r);
        for (int f = 0; f < MK_OPF_COUNT; f++) res->op_ms[f] += prof->seconds[f] * 1e3 / PROFILE_STEPS;
        mk_range_profile(r, false);
    }
    res->profiled = s == MK_OK;
    return s;
}

/* Sum (or max over ranges, for the host waits) of the pipeline's backend counters. */
static void counters_of(mk_pipeline *p, mk_backend_counters *sum, uint64_t *syncs_per_range) {
    memset(sum, 0, sizeof *sum);
    for (size_t i = 0; i < mk_pipeline_range_count(p) && i < 64; i++) {
        const mk_backend_counters *c = mk_range_backend_counters(mk_pipeline_range(p, i));
        sum->launches += c->launches;
        sum->graph_launches += c->graph_launches;
        sum->host_syncs += c->host_syncs;
        sum->bytes_downloaded += c->bytes_downloaded;
        sum->bytes_uploaded += c->bytes_uploaded;
        sum->bytes_read += c->bytes_read;
        sum->weight_bytes_read += c->weight_bytes_read;
        sum->kv_bytes_read += c->kv_bytes_read;
        syncs_per_range[i] = c->host_syncs;
    }
}

static mk_status run(const mk_model *model, const int64_t *cuts, size_t n_cuts, const mk_range_options *opt,
                     const int32_t *prompt, size_t n_prompt, size_t n_decode, bool profile, e2e_result *res) {
    res->profiled = false;
    mk_pipeline *p = NULL;
    const mk_seam_options wire = mk_seam_options_default(MK_SEAM_WIRE);
    mk_pipeline_options po = mk_pipeline_options_default();
    po.range = opt;
    po.cuts = cuts;
    po.n_cuts = n_cuts;
    po.seam = &wire;
    mk_status s = mk_pipeline_create(model, &po, &p);
    if (s != MK_OK) return s;
    res->weight_bytes = 0;
    for (size_t i = 0; i < mk_pipeline_range_count(p); i++)
        res->weight_bytes += mk_range_weight_bytes(mk_pipeline_range(p, i));
    mk_tail_output *out = NULL;
    /* warm-up: one prefill and one decode step, then start over */
    s = mk_pipeline_step(p, prompt, n_prompt, &out);
    if (s == MK_OK) {
        const int32_t t = out->token_ids[0];
        mk_tail_output_free(out);
        out = NULL;
        s = mk_pipeline_step(p, &t, 1, &out);
        mk_tail_output_free(out);
        out = NULL;
    }
    if (s == MK_OK) s = mk_pipeline_reset(p);
    double t0 = now_s();
    if (s == MK_OK) s = mk_pipeline_step(p, prompt, n_prompt, &out);
    const double prefill = now_s() - t0;
    int32_t token = s == MK_OK ? out->token_ids[0] : 0;
    mk_tail_output_free(out);
    mk_backend_counters c0, c1;
    uint64_t r0[64] = {0}, r1[64] = {0};
    counters_of(p, &c0, r0);
    t0 = now_s();
    for (size_t i = 0; s == MK_OK && i < n_decode; i++) {
        out = NULL;
        s = mk_pipeline_step(p, &token, 1, &out);
        if (s == MK_OK) token = out->token_ids[0];
        mk_tail_output_free(out);
    }
    const double decode = now_s() - t0;
    counters_of(p, &c1, r1);
    res->launches = (double)(c1.launches - c0.launches) / (double)n_decode;
    res->graph_launches = (double)(c1.graph_launches - c0.graph_launches) / (double)n_decode;
    res->downloaded = (double)(c1.bytes_downloaded - c0.bytes_downloaded) / (double)n_decode;
    res->dev_read = (double)(c1.bytes_read - c0.bytes_read) / (double)n_decode;
    res->dev_weight_read = (double)(c1.weight_bytes_read - c0.weight_bytes_read) / (double)n_decode;
    res->dev_kv_read = (double)(c1.kv_bytes_read - c0.kv_bytes_read) / (double)n_decode;
    res->max_range_syncs = 0;
    for (size_t i = 0; i < 64; i++)
        if ((double)(r1[i] - r0[i]) / (double)n_decode > res->max_range_syncs)
            res->max_range_syncs = (double)(r1[i] - r0[i]) / (double)n_decode;
    res->last_token = token;
    if (s == MK_OK && profile) s = profile_decode(p, &token, res);
    res->prefill_tps = (double)n_prompt / prefill;
    res->decode_tps = (double)n_decode / decode;
    res->seam_bytes = mk_pipeline_seam_bytes(p);
    mk_pipeline_free(p);
    return s;
}

/* Bytes the token embedding table occupies in this weight mode (a range that only embeds
 * reads one row of it per step). */
static size_t table_bytes(const char *path, const mk_hparams *hp, mk_dtype dtype, bool gguf) {
    size_t bytes = hp->vocab * hp->hidden * sizeof(float); /* cpu F32/F16/BF16 modes store F32 */
    if (!gguf || dtype != MK_DTYPE_NATIVE) return bytes;
    mk_gguf *g = NULL;
    if (mk_gguf_open(path, &g) != MK_OK) return bytes;
    const mk_gguf_tensor_info *t = mk_gguf_find_tensor(g, "token_embd.weight");
    if (t && mk_cpu_quant_keeps(t->type)) bytes = t->n_bytes;
    mk_gguf_close(g);
    return bytes;
}

/* ============================================================== llama.cpp == */

/* One llama.cpp round through the peer script; decode tokens/s, or 0 with a reason. */
static double peer_decode_tps(const char *script, const char *model, size_t threads, size_t n_decode,
                              const int32_t *prompt, size_t n_prompt, char *why, size_t why_cap) {
    size_t cap = 256 + strlen(script) + strlen(model) + n_prompt * 12;
    char *cmd = malloc(cap);
    if (!cmd) return 0.0;
    int n = snprintf(cmd, cap, "python3 '%s' '%s' --threads %zu --tokens %zu --runs 1 --prompt-ids ", script, model,
                     threads, n_decode);
    for (size_t i = 0; i < n_prompt; i++) n += snprintf(cmd + n, cap - (size_t)n, "%s%d", i ? "," : "", prompt[i]);
    snprintf(cmd + n, cap - (size_t)n, " 2>&1");
    FILE *f = popen(cmd, "r");
    free(cmd);
    char line[8192] = {0}, all[8192] = {0};
    if (f) {
        while (fgets(line, sizeof line, f))
            if (strstr(line, "\"decode_tps_median\"") || strstr(line, "\"error\"") || !all[0])
                snprintf(all, sizeof all, "%s", line);
        pclose(f);
    }
    const char *key = strstr(all, "\"decode_tps_median\": ");
    if (!key) {
        all[strcspn(all, "\n")] = 0;
        snprintf(why, why_cap, "%s", all[0] ? all : "the peer script printed nothing");
        return 0.0;
    }
    return strtod(key + strlen("\"decode_tps_median\": "), NULL);
}

/* ================================================================== main == */

static int usage(void) {
    fprintf(stderr, "usage: e2e_bench MODEL|--random [cpu|cuda] [prompt_tokens] [decode_tokens] [cut]\n"
                    "                 [--dtype native|f32|f16|bf16] [--kv f32|f16|bf16] [--threads N] [--runs R]\n"
                    "                 [--peer [SCRIPT]]\n");
    return 2;
}

int main(int argc, char **argv) {
    const char *positional[5] = {NULL, NULL, NULL, NULL, NULL};
    size_t n_pos = 0, runs = 3, threads = 0;
    const char *dtype_name = NULL, *peer = NULL, *kv_name = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--dtype") == 0 && i + 1 < argc) dtype_name = argv[++i];
        else if (strcmp(a, "--kv") == 0 && i + 1 < argc) kv_name = argv[++i];
        else if (strcmp(a, "--threads") == 0 && i + 1 < argc) threads = strtoull(argv[++i], NULL, 10);
        else if (strcmp(a, "--runs") == 0 && i + 1 < argc) runs = strtoull(argv[++i], NULL, 10);
        else if (strcmp(a, "--peer") == 0)
            peer = i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0 && strstr(argv[i + 1], ".py") ? argv[++i]
                                                                                                     : "bench/llamacpp_peer.py";
        else if (strncmp(a, "--", 2) == 0 && strncmp(a, "--random", 8) != 0) return usage();
        else if (n_pos < 5) positional[n_pos++] = a;
        else return usage();
    }
    const char *path = positional[0] ? positional[0] : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const char *backend = positional[1] ? positional[1] : "cpu";
    const size_t n_prompt = positional[2] ? strtoull(positional[2], NULL, 10) : 128;
    const size_t n_decode = positional[3] ? strtoull(positional[3], NULL, 10) : 128;
    if (runs == 0 || runs > MAX_RUNS || threads > 256) return usage();
    const bool gguf = strncmp(path, "--random", 8) != 0;
    mk_model *model = NULL;
    mk_status s;
    if (!gguf) {
        const mk_hparams hp = mk_hparams_seed_default();
        s = mk_model_create_random(&hp, 1, NULL, &model);
    } else {
        s = mk_model_open_gguf(path, &model);
    }
    if (s != MK_OK) {
        fprintf(stderr, "e2e_bench: %s: %s\n", mk_status_name(s), mk_last_error());
        return 1;
    }
    const mk_hparams *hp = mk_model_hparams(model);
    const int64_t cut = positional[4] ? strtoll(positional[4], NULL, 10) : (int64_t)hp->n_layers / 2 - 1;
    mk_range_options opt = mk_range_options_default();
    if (mk_backend_kind_from_name(backend, &opt.backend.kind) != MK_OK || n_prompt == 0 || n_decode == 0) {
        mk_model_free(model);
        return usage();
    }
    const bool cpu = opt.backend.kind == MK_BACKEND_CPU;
    if (!dtype_name) opt.backend.weight_dtype = gguf && cpu ? MK_DTYPE_NATIVE : MK_DTYPE_F32;
    else if (strcmp(dtype_name, "native") == 0) opt.backend.weight_dtype = MK_DTYPE_NATIVE;
    else if (strcmp(dtype_name, "f32") == 0) opt.backend.weight_dtype = MK_DTYPE_F32;
    else if (strcmp(dtype_name, "f16") == 0) opt.backend.weight_dtype = MK_DTYPE_F16;
    else if (strcmp(dtype_name, "bf16") == 0) opt.backend.weight_dtype = MK_DTYPE_BF16;
    else {
        mk_model_free(model);
        return usage();
    }
    /* The KV cache dtype (default F32, the parity mode; f16/bf16 halve what decode reads). */
    if (kv_name && strcmp(kv_name, "f32") == 0) opt.backend.kv_dtype = MK_DTYPE_F32;
    else if (kv_name && strcmp(kv_name, "f16") == 0) opt.backend.kv_dtype = MK_DTYPE_F16;
    else if (kv_name && strcmp(kv_name, "bf16") == 0) opt.backend.kv_dtype = MK_DTYPE_BF16;
    else if (kv_name) {
        mk_model_free(model);
        return usage();
    }
    opt.backend.threads = threads;
    const size_t n_threads = threads ? threads : mk_core_count();
    opt.max_context = n_prompt + n_decode + 2 + PROFILE_STEPS;
    opt.token_only = true; /* the tail brings back the sampled token alone, as generation needs */
    int32_t *prompt = malloc(n_prompt * sizeof(int32_t));
    if (!prompt) return 1;
    for (size_t i = 0; i < n_prompt; i++) prompt[i] = (int32_t)((i * 7919 + 13) % hp->vocab);

    char load_before[64], load_after[64];
    load_average(load_before, sizeof load_before);
    const double ceiling = cpu ? read_ceiling_gbps(n_threads) : 0.0;
    const double copy = cpu ? memcpy_gbps() : 0.0;
    e2e_result whole[MAX_RUNS], split[MAX_RUNS], eager[MAX_RUNS];
    /* cuda: the whole model decoded op by op too (no graphs), the before of the graph step */
    const bool compare_eager = !cpu;
    mk_range_options eager_opt = opt;
    eager_opt.eager_decode = true;
    double peer_tps[MAX_RUNS] = {0};
    char peer_why[512] = "";
    bool peer_ok = peer != NULL;
    for (size_t r = 0; s == MK_OK && r < runs; r++) {
        s = run(model, NULL, 0, &opt, prompt, n_prompt, n_decode, r == 0, &whole[r]);
        if (s == MK_OK) s = run(model, &cut, 1, &opt, prompt, n_prompt, n_decode, false, &split[r]);
        if (s == MK_OK && compare_eager) s = run(model, NULL, 0, &eager_opt, prompt, n_prompt, n_decode, false, &eager[r]);
        if (s == MK_OK && peer_ok) {
            peer_tps[r] = peer_decode_tps(peer, path, n_threads, n_decode, prompt, n_prompt, peer_why, sizeof peer_why);
            peer_ok = peer_tps[r] > 0.0;
        }
    }
    load_average(load_after, sizeof load_after);
    if (s != MK_OK) {
        fprintf(stderr, "e2e_bench: %s: %s\n", mk_status_name(s), mk_last_error());
        mk_model_free(model);
        free(prompt);
        return 1;
    }

    /* Bytes one decode step reads: every resident weight, less a table that only embeds. */
    const size_t table = table_bytes(path, hp, opt.backend.weight_dtype, gguf);
    const size_t read_whole = whole[0].weight_bytes - (hp->tied_embeddings ? 0 : table);
    const size_t read_split = split[0].weight_bytes - table;
    double v[MAX_RUNS];
    double med[3][2] = {{0}};
    for (int k = 0; k < (compare_eager ? 3 : 2); k++) {
        const e2e_result *res = k == 2 ? eager : k ? split : whole;
        for (size_t r = 0; r < runs; r++) v[r] = res[r].prefill_tps;
        med[k][0] = median(v, runs);
        for (size_t r = 0; r < runs; r++) v[r] = res[r].decode_tps;
        med[k][1] = median(v, runs);
    }
    const double peer_med = peer_ok ? median(peer_tps, runs) : 0.0;

    /* The cpu backend's native kernels are chosen by cpuid (MESHKERN_CPU_KERNELS caps them):
     * figures from two machines compare only with the table each ran named. */
    const char *kernels = cpu && opt.backend.weight_dtype == MK_DTYPE_NATIVE ? mk_cpu_quant_best()->name : "none";
    printf("model %s, backend %s, weights %s (cpu kernels %s), kv %s, threads %zu, prompt %zu, decode %zu, "
           "split after layer %lld, median of %zu rounds\n",
           path, backend, mk_dtype_name(opt.backend.weight_dtype), kernels,
           mk_dtype_name(opt.backend.kv_dtype ? opt.backend.kv_dtype : MK_DTYPE_F32), n_threads, n_prompt, n_decode, (long long)cut, runs);
    printf("load average (1 min) before %s, after %s\n", load_before, load_after);
    printf("%-6s %12s %12s %12s %14s %12s\n", "run", "prefill t/s", "decode t/s", "read GB/tok", "decode GB/s",
           ceiling > 0 ? "% ceiling" : "");
    const size_t reads[3] = {read_whole, read_split, read_whole};
    const char *names[3] = {"whole", "split", "eager"};
    const int rows = compare_eager ? 3 : 2;
    for (int k = 0; k < rows; k++) {
        const double gbps = (double)reads[k] / 1e9 * med[k][1];
        printf("%-6s %12.1f %12.2f %12.4f %14.2f", names[k], med[k][0], med[k][1], (double)reads[k] / 1e9, gbps);
        if (ceiling > 0) printf(" %11.0f%%", 100.0 * gbps / ceiling);
        printf("\n");
    }
    for (int k = 0; k < rows; k++) {
        const e2e_result *res = k == 2 ? eager : k ? split : whole;
        printf("%-6s per decode token: %.2f launches in %.2f graph launches, %.2f host waits (most in one range), "
               "%.1f bytes downloaded\n",
               names[k], res[0].launches, res[0].graph_launches, res[0].max_range_syncs, res[0].downloaded);
        /* The device's bytes per token from the kernels' model (cuda backend; 0 on cpu): at the
         * measured decode rate, the bandwidth the step implies. */
        if (res[0].dev_read > 0)
            printf("%-6s device bytes read per decode token: %.0f (weights %.0f, KV cache %.0f, other %.0f); "
                   "implied %.2f GB/s at %.2f t/s\n",
                   names[k], res[0].dev_read, res[0].dev_weight_read, res[0].dev_kv_read,
                   res[0].dev_read - res[0].dev_weight_read - res[0].dev_kv_read, res[0].dev_read / 1e9 * med[k][1],
                   med[k][1]);
    }
    if (compare_eager)
        printf("decode with graphs / op by op (whole): %.2fx\n", med[2][1] > 0 ? med[0][1] / med[2][1] : 0.0);
    printf("decode t/s per round (whole):");
    for (size_t r = 0; r < runs; r++) printf(" %.2f", whole[r].decode_tps);
    printf("\n");
    if (ceiling > 0)
        printf("read ceiling %.2f GB/s (%zu threads summing 512 MiB, best of 5); single-thread memcpy %.2f GB/s\n",
               ceiling, n_threads, copy);
    if (peer) {
        if (peer_ok) {
            printf("llama.cpp decode %.2f t/s (rounds:", peer_med);
            for (size_t r = 0; r < runs; r++) printf(" %.2f", peer_tps[r]);
            printf("); meshkern whole / llama.cpp = %.2fx\n", med[0][1] / peer_med);
        } else {
            printf("llama.cpp peer unavailable: %s\n", peer_why);
        }
    }
    if (whole[0].profiled) {
        /* Where a decode step's time goes; "other" is the step's wall time outside the ops
         * (pipeline and output bookkeeping). */
        double ops = 0.0;
        printf("decode ms/token by op (whole, %d more steps after round 1, step %.3f ms):", PROFILE_STEPS,
               whole[0].step_ms);
        for (int f = 0; f < MK_OPF_COUNT; f++) {
            ops += whole[0].op_ms[f];
            printf(" %s %.3f", mk_op_family_name((mk_op_family)f), whole[0].op_ms[f]);
        }
        printf(" other %.3f\n", whole[0].step_ms - ops);
    }
    const bool same = whole[0].last_token == split[0].last_token &&
                      (!compare_eager || whole[0].last_token == eager[0].last_token);
    printf("seam bytes on the wire (split run): %zu; same final token%s: %s\n", split[0].seam_bytes,
           compare_eager ? " (whole, split, eager)" : "", same ? "yes" : "NO");
    const char *out_dir = getenv("OUT");
    char json_path[4096];
    snprintf(json_path, sizeof json_path, "%s/e2e_bench.json", out_dir && *out_dir ? out_dir : ".");
    FILE *json = fopen(json_path, "w");
    if (json) {
        fprintf(json,
                "{\"model\": \"%s\", \"backend\": \"%s\", \"weights\": \"%s\", \"cpu_kernels\": \"%s\", "
                "\"threads\": %zu, \"prompt\": %zu, "
                "\"decode\": %zu, \"rounds\": %zu,\n \"load_before\": \"%s\", \"load_after\": \"%s\", "
                "\"read_ceiling_gbps\": %.3f, \"memcpy_gbps\": %.3f,\n"
                " \"whole\": {\"prefill_tps\": %.3f, \"decode_tps\": %.3f, \"read_bytes_per_token\": %zu, "
                "\"launches_per_token\": %.2f, \"graph_launches_per_token\": %.2f, "
                "\"host_waits_per_token_per_range\": %.2f, \"bytes_downloaded_per_token\": %.1f},\n"
                " \"split\": {\"prefill_tps\": %.3f, \"decode_tps\": %.3f, \"read_bytes_per_token\": %zu, "
                "\"seam_bytes\": %zu},\n \"llamacpp_decode_tps\": %.3f, \"ratio_vs_llamacpp\": %.3f",
                path, backend, mk_dtype_name(opt.backend.weight_dtype), kernels, n_threads, n_prompt, n_decode, runs,
                load_before, load_after, ceiling, copy, med[0][0], med[0][1], read_whole, whole[0].launches,
                whole[0].graph_launches, whole[0].max_range_syncs, whole[0].downloaded, med[1][0], med[1][1],
                read_split, split[0].seam_bytes, peer_med, peer_med > 0 ? med[0][1] / peer_med : 0.0);
        if (compare_eager)
            fprintf(json,
                    ",\n \"eager\": {\"prefill_tps\": %.3f, \"decode_tps\": %.3f, \"launches_per_token\": %.2f, "
                    "\"graph_launches_per_token\": %.2f, \"host_waits_per_token_per_range\": %.2f}",
                    med[2][0], med[2][1], eager[0].launches, eager[0].graph_launches, eager[0].max_range_syncs);
        if (whole[0].profiled) {
            fprintf(json, ",\n \"decode_step_ms\": %.4f, \"decode_ms_per_op\": {", whole[0].step_ms);
            for (int f = 0; f < MK_OPF_COUNT; f++)
                fprintf(json, "%s\"%s\": %.4f", f ? ", " : "", mk_op_family_name((mk_op_family)f),
                        whole[0].op_ms[f]);
            fprintf(json, "}");
        }
        if (whole[0].dev_read > 0)
            fprintf(json,
                    ",\n \"device_bytes_read_per_token\": %.0f, \"device_weight_bytes_read_per_token\": %.0f, "
                    "\"device_kv_bytes_read_per_token\": %.0f, \"device_read_gbps\": %.3f",
                    whole[0].dev_read, whole[0].dev_weight_read, whole[0].dev_kv_read, whole[0].dev_read / 1e9 * med[0][1]);
        fprintf(json, "}\n");
        fclose(json);
        printf("results: %s\n", json_path);
    }
    const int rc = same ? 0 : 3;
    free(prompt);
    mk_model_free(model);
    return rc;
}
