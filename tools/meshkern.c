/* meshkern: inspect a model, or run it whole and split into ranges and compare.
 *
 *   meshkern inspect MODEL.gguf | --random[:key=value,...]
 *   meshkern run MODEL.gguf | --random[:key=value,...]  --tokens 1,2,3 [--split L1,L2,...] [--n N]
 *                [--backend cpu|cuda] [--device I] [--dtype native|f32|f16|bf16] [--threads N] [--kv f32|f16|bf16]
 *                [--seam local|wire|unix|tcp|nccl] [--devices D0,D1,...]
 *                [--seam-address A] [--seam-timeout MS]
 *                [--tls-psk HEX [--tls-identity ID] | --tls-cert PEM --tls-key PEM --tls-ca PEM]
 *   meshkern run MODEL.gguf -p TEXT ... | chat MODEL.gguf | tokenize MODEL.gguf TEXT
 *                (text in, text out: tools/cli_text.c)
 *   meshkern run MODEL --prompts FILE [--split auto|L1,...] [--devices 0,1] [--batch M] ...
 *                (run_batch.c: many sequences through a placed pipeline)
 *   meshkern stage MODEL --split ... --rank R --world N --rendezvous HOST:PORT ...
 *                (stage_cmd.c: one range per process)
 *
 * run executes the model as one FULL range and, with --split, as the given ranges in this
 * process, every seam carried by the chosen transport (default wire: packed and unpacked
 * as protobuf); it prints the greedy tokens, the throughput, the bytes and time spent in
 * seams, and whether the split output equals the whole-model output bit for bit. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "model/gguf.h"
#include "meshkern.h"
#include "model/model.h"
#include "mk_error.h"
#include "cli_text.h"
#include "serve.h"

#define MK_MAX_CUTS 64
#define MK_MAX_TOKENS 4096

static int usage(void) {
    fprintf(stderr,
            "usage:\n"
            "  meshkern inspect MODEL.gguf | --random[:key=value,...]\n"
            "  meshkern run MODEL.gguf | --random[:key=value,...] --tokens IDS [--split L1,L2,...] [--n N]\n"
            "               [--backend cpu|cuda] [--device I] [--dtype native|f32|f16|bf16] [--threads N]\n"
            "               [--kv f32|f16|bf16] [--speed] [--eager-decode (cuda: no decode graphs)]\n"
            "               [--seam local|wire|unix|tcp|nccl] [--devices D0,D1,... (one per range; cuda)]\n"
            "               [--seam-address PATH|HOST:PORT] [--seam-timeout MS]\n"
            "               [--tls-psk HEX [--tls-identity ID] | --tls-cert PEM --tls-key PEM --tls-ca PEM]\n"
            "  meshkern run MODEL.gguf -p TEXT [--system S] [--raw] [--split L1,L2,...] [--n N] [--backend ...]\n"
            "  meshkern chat MODEL.gguf [--system S] [--split L1,...] [--n N] [--backend ...]\n"
            "  meshkern tokenize MODEL.gguf TEXT [--ids] [--no-bos] [--no-parse-special]\n"
            "  --dtype native keeps weights in their GGUF format (the cpu backend's default for a\n"
            "  GGUF model; on cuda Q8_0/Q4_1/Q4_K stay in their blocks, other formats become bf16);\n"
            "  f32 is the parity mode. --threads: cpu threads (default: every core).\n"
            "  --kv f16 halves the KV cache (cpu, cuda); --kv bf16 too (cuda).\n"
            "  meshkern run MODEL --prompts FILE [--split auto|L1,L2,...] [--devices 0,1,...] [--batch M]\n"
            "               [--n N] [--stop IDS] [--seam auto|local|wire|unix|tcp|nccl] [--timeline FILE.json]\n"
            "               [--backend cpu|cuda] [--dtype native|f32|f16|bf16] [--kv f32|f16|bf16] [--threads N] [--speed]\n"
            "               FILE: one prompt per line, comma-separated token ids; --threads: per stage\n"
            "               (default: the cores divided among the stages)\n"
            "  meshkern stage MODEL --split L1,L2,...|auto --rank R --world N --rendezvous HOST:PORT\n"
            "               [--prompts FILE|- (rank 0)] [--max-tokens K] [--batch M] [--timeout S]\n"
            "               [--seam tcp|unix|nccl] [--backend cpu|cuda] [--dtype native|f32|f16|bf16] [--kv f32|f16|bf16]\n"
            "               [--threads N] [--speed]\n"
            "               [--stop IDS] [--launcher mpi|rendezvous (mpi: mpirun -np N ..., no --rank/--world)]\n"
            "               [--tls-psk HEX [--tls-identity ID] | --tls-cert PEM --tls-key PEM --tls-ca PEM]\n"
            "               (TLS 1.3 on the rendezvous, control and seam connections; unix/tcp seams)\n"
            "               one process per range; rank 0 takes the prompts and prints the tokens\n"
            "  meshkern serve MODEL.gguf [--host 127.0.0.1] [--port 8080] [--api-key KEY|--api-key-file F]\n"
            "               [--split L1,...] [--max-sequences N] [--max-queue N] [--ctx N] [--threads N] ...\n"
            "               OpenAI-compatible HTTP: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics\n"
            "  --random is the seed's random model (vocab 48, hidden 32, 6 layers, 4 heads); keys\n"
            "  vocab, hidden, layers, heads, kv_heads, head_dim, ffn, ctx, seed change its shape.\n");
    return 2;
}

static int fail(mk_status s) {
    fprintf(stderr, "meshkern: %s: %s\n", mk_status_name(s), mk_last_error());
    return 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Parse "a,b,c" into out[cap]; returns the count or -1. */
static long parse_list(const char *text, long long *out, size_t cap) {
    size_t n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        const long long v = strtoll(p, &end, 10);
        if (end == p || n == cap) return -1;
        out[n++] = v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return (long)n;
}

/* "--random[:key=value,...]": the seeded random model, optionally reshaped. */
static mk_status open_random(const char *spec, mk_model **out) {
    mk_hparams hp = mk_hparams_seed_default();
    unsigned long long seed = 20260715;
    bool head_dim_set = false;
    const char *p = spec[0] == ':' ? spec + 1 : spec;
    while (*p) {
        char key[32];
        unsigned long long value;
        int used = 0;
        if (sscanf(p, "%31[a-z_]=%llu%n", key, &value, &used) != 2)
            return mk_fail(MK_ERR_INVALID_ARGUMENT, "random model spec '%s': expected key=value pairs", spec);
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

static int cmd_inspect(const char *path) {
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
    if (model->gguf) {
        size_t total = 0;
        printf("%-32s %-6s %-24s %12s\n", "tensor", "type", "dims", "bytes");
        for (size_t i = 0; i < mk_gguf_tensor_count(model->gguf); i++) {
            const mk_gguf_tensor_info *t = mk_gguf_tensor_at(model->gguf, i);
            char dims[64];
            int n = 0;
            for (uint32_t d = 0; d < t->n_dims; d++)
                n += snprintf(dims + n, sizeof dims - (size_t)n, d ? "x%llu" : "%llu", (unsigned long long)t->dims[d]);
            printf("%-32s %-6s %-24s %12zu\n", t->name, mk_ggml_type_name(t->type), dims, t->n_bytes);
            total += t->n_bytes;
        }
        printf("%zu tensors, %.1f MiB of tensor data\n", mk_gguf_tensor_count(model->gguf), (double)total / 1048576.0);
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
    if (argc < 1) return usage();
    const char *path = argv[0];
    long long tokens_ll[MK_MAX_TOKENS], cuts_ll[MK_MAX_CUTS], devices_ll[MK_MAX_CUTS + 1];
    long n_tokens = -1, n_cuts = 0, n_devices = 0;
    size_t n_new = 16;
    mk_range_options opt = mk_range_options_default();
    mk_seam_options seam = mk_seam_options_default(MK_SEAM_WIRE);
    /* --backend, --device, --dtype, --kv, --threads, --speed: the run forms' shared parser */
    mk_cli_backend backend;
    mk_cli_backend_init(&backend);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (mk_cli_backend_flag(a, &backend)) continue;
        const char *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v) return usage();
        const int taken = mk_cli_backend_option(a, v, &backend);
        if (taken < 0) return usage();
        if (taken) continue;
        if (strcmp(a, "--tokens") == 0) n_tokens = parse_list(v, tokens_ll, MK_MAX_TOKENS);
        else if (strcmp(a, "--split") == 0) n_cuts = parse_list(v, cuts_ll, MK_MAX_CUTS);
        else if (strcmp(a, "--n") == 0) {
            if (!mk_cli_parse_count(a, v, 1, MK_MAX_TOKENS - 2, &n_new)) return usage();
        }
        else if (strcmp(a, "--devices") == 0) {
            n_devices = parse_list(v, devices_ll, MK_MAX_CUTS + 1);
            if (n_devices <= 0) return usage();
        } else if (strcmp(a, "--seam") == 0) {
            const mk_status s = mk_seam_kind_from_name(v, &seam.kind);
            if (s != MK_OK) return fail(s);
        } else if (strcmp(a, "--seam-address") == 0) seam.address = v;
        else if (strcmp(a, "--seam-timeout") == 0) {
            size_t ms = 0;
            if (!mk_cli_parse_count(a, v, 1, 86400000, &ms)) return usage();
            seam.io_timeout_ms = seam.connect_timeout_ms = (int)ms;
        } else if (mk_cli_tls_option(a, v, &seam.tls)) continue;
        else return usage();
    }
    /* TLS flags are checked before anything runs: the transport (only unix and tcp carry
     * TLS), the combination and the key's length, the files. */
    if (seam.tls.enabled && !mk_cli_tls_usable(&seam)) return 2;
    mk_cli_backend_finish(&backend, path);
    opt.backend = backend.config;
    opt.eager_decode = backend.eager_decode;
    if (n_tokens <= 0 || n_cuts < 0 || n_new == 0) return usage();
    if ((size_t)n_tokens + n_new >= MK_MAX_TOKENS) {
        fprintf(stderr, "meshkern: %ld prompt tokens and --n %zu exceed the limit of %d positions\n", n_tokens, n_new,
                MK_MAX_TOKENS - 1);
        return usage();
    }
    for (long i = 0; i < n_tokens; i++) /* the head checks the vocabulary; int32 must not wrap first */
        if (tokens_ll[i] < 0 || tokens_ll[i] > INT32_MAX) {
            fprintf(stderr, "meshkern: token id %lld is not a valid token id\n", tokens_ll[i]);
            return usage();
        }

    /* GPU to GPU needs the cuda backend: said here, before the model is read. */
    if (opt.backend.kind != MK_BACKEND_CUDA && (seam.kind == MK_SEAM_NCCL || n_devices > 0)) {
        fprintf(stderr, "meshkern: %s needs --backend cuda (the %s backend has no devices)\n",
                seam.kind == MK_SEAM_NCCL ? "--seam nccl" : "--devices", opt.backend.kind == MK_BACKEND_CPU ? "cpu" : "chosen");
        return 2;
    }
    if (n_devices > 0 && n_devices != n_cuts + 1) {
        fprintf(stderr, "meshkern: --devices names %ld devices for %ld ranges (one per range: --split has %ld cuts)\n",
                n_devices, n_cuts + 1, n_cuts);
        return 2;
    }
    int devices[MK_MAX_CUTS + 1];
    for (long i = 0; i < n_devices; i++) {
        if (devices_ll[i] < 0 || devices_ll[i] > INT32_MAX) return usage();
        devices[i] = (int)devices_ll[i];
    }
    if (n_devices > 0) opt.backend.device = devices[0]; /* the whole model runs on the first */

    mk_model *model = NULL;
    mk_status s = open_model(path, &model);
    if (s != MK_OK) return fail(s);
    const mk_hparams *hp = mk_model_hparams(model);
    int32_t prompt[MK_MAX_TOKENS];
    for (long i = 0; i < n_tokens; i++) prompt[i] = (int32_t)tokens_ll[i];
    int64_t cuts[MK_MAX_CUTS];
    for (long i = 0; i < n_cuts; i++) cuts[i] = cuts_ll[i];
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
        printf("text: ");
        mk_cli_print_text(stdout, model, whole.tokens, n_new);
        printf("\n");
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
int mk_cli_usage(void) { return usage(); }
int mk_cli_fail(mk_status s) { return fail(s); }

int main(int argc, char **argv) {
    if (argc < 3) return usage();
    if (strcmp(argv[1], "inspect") == 0) return cmd_inspect(argv[2]);
    if (strcmp(argv[1], "run") == 0) {
        for (int i = 3; i < argc; i++) /* a text prompt: the text path */
            if (strcmp(argv[i], "-p") == 0 || strcmp(argv[i], "--prompt") == 0) return mk_cli_run_text(argc - 2, argv + 2);
        return mk_cli_is_batch_run(argc - 2, argv + 2) ? mk_cli_run_batch(argc - 2, argv + 2)
                                                       : cmd_run(argc - 2, argv + 2);
    }
    if (strcmp(argv[1], "chat") == 0) return mk_cli_chat(argc - 2, argv + 2);
    if (strcmp(argv[1], "stage") == 0) return mk_cli_stage(argc - 2, argv + 2);
    if (strcmp(argv[1], "tokenize") == 0) return mk_cli_tokenize(argc - 2, argv + 2);
    if (strcmp(argv[1], "serve") == 0) return mk_cli_serve(argc - 2, argv + 2);
    return usage();
}
