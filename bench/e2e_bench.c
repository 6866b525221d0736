/* End-to-end benchmark: a model run whole and split in one process (seams through the
 * wire), prefill and decode tokens/s, and decode's weight traffic against a measured
 * ceiling. A decode step reads every resident weight once, except an embedding table used
 * only to embed (one row is read), so those bytes x tokens/s is the bandwidth it sustains; on the cpu backend it is
 * compared with a memcpy of 256 MiB measured in the same run. Results go to
 * e2e_bench.json (in $OUT if set).
 *
 *   e2e_bench MODEL.gguf|--random[:...] [cpu|cuda] [prompt_tokens] [decode_tokens] [cut] */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "meshkern.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Best of five copies of 256 MiB between warm buffers. */
static double memcpy_gbps(void) {
    const size_t bytes = (size_t)256 << 20;
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) return 0.0;
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 0.0;
    for (int i = 0; i < 5; i++) {
        const double t0 = now_s();
        memcpy(b, a, bytes);
        __asm__ volatile("" ::"r"(b) : "memory");
        const double gbps = (double)bytes / 1e9 / (now_s() - t0);
        if (gbps > best) best = gbps;
    }
    free(a);
    free(b);
    return best;
}

typedef struct e2e_result {
    double prefill_tps, decode_tps, weight_gb;
    size_t seam_bytes;
    int32_t last_token;
} e2e_result;

static mk_status run(const mk_model *model, const int64_t *cuts, size_t n_cuts, const mk_range_options *opt,
                     size_t n_prompt, size_t n_decode, e2e_result *res) {
    const mk_hparams *hp = mk_model_hparams(model);
    mk_pipeline *p = NULL;
    mk_status s = mk_pipeline_create(model, cuts, n_cuts, opt, true, &p);
    if (s != MK_OK) return s;
    size_t weights = 0;
    for (size_t i = 0; i < mk_pipeline_range_count(p); i++) weights += mk_range_weight_bytes(mk_pipeline_range(p, i));
    /* The head's table is read whole only when the same range also projects with it (a
     * whole, tied model); otherwise decode reads one row of it. F32 weights (the default). */
    const bool embed_is_lm_head = hp->tied_embeddings && mk_pipeline_range_count(p) == 1;
    if (!embed_is_lm_head) weights -= hp->vocab * hp->hidden * sizeof(float);
    int32_t *prompt = malloc(n_prompt * sizeof(int32_t));
    if (!prompt) {
        mk_pipeline_free(p);
        return MK_ERR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < n_prompt; i++) prompt[i] = (int32_t)((i * 7919 + 13) % hp->vocab);
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
    t0 = now_s();
    for (size_t i = 0; s == MK_OK && i < n_decode; i++) {
        out = NULL;
        s = mk_pipeline_step(p, &token, 1, &out);
        if (s == MK_OK) token = out->token_ids[0];
        mk_tail_output_free(out);
    }
    const double decode = now_s() - t0;
    res->prefill_tps = (double)n_prompt / prefill;
    res->decode_tps = (double)n_decode / decode;
    res->weight_gb = (double)weights / 1e9;
    res->seam_bytes = mk_pipeline_seam_bytes(p);
    res->last_token = token;
    free(prompt);
    mk_pipeline_free(p);
    return s;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const char *backend = argc > 2 ? argv[2] : "cpu";
    const size_t n_prompt = argc > 3 ? strtoull(argv[3], NULL, 10) : 128;
    const size_t n_decode = argc > 4 ? strtoull(argv[4], NULL, 10) : 32;
    mk_model *model = NULL;
    mk_status s;
    if (strncmp(path, "--random", 8) == 0) {
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
    const int64_t cut = argc > 5 ? strtoll(argv[5], NULL, 10) : (int64_t)hp->n_layers / 2 - 1;
    mk_range_options opt = mk_range_options_default();
    if (mk_backend_kind_from_name(backend, &opt.backend.kind) != MK_OK || n_prompt == 0 || n_decode == 0) {
        fprintf(stderr, "usage: e2e_bench MODEL [cpu|cuda] [prompt_tokens] [decode_tokens] [cut]\n");
        return 2;
    }
    opt.max_context = n_prompt + n_decode + 2;
    const double ceiling = opt.backend.kind == MK_BACKEND_CPU ? memcpy_gbps() : 0.0;
    e2e_result whole, split;
    s = run(model, NULL, 0, &opt, n_prompt, n_decode, &whole);
    if (s == MK_OK) s = run(model, &cut, 1, &opt, n_prompt, n_decode, &split);
    if (s != MK_OK) {
        fprintf(stderr, "e2e_bench: %s: %s\n", mk_status_name(s), mk_last_error());
        mk_model_free(model);
        return 1;
    }
    printf("model %s, backend %s, prompt %zu, decode %zu, split after layer %lld\n", path, backend, n_prompt, n_decode,
           (long long)cut);
    printf("%-6s %12s %12s %12s %14s %10s\n", "run", "prefill t/s", "decode t/s", "weights GB", "decode GB/s",
           ceiling > 0 ? "% memcpy" : "");
    const e2e_result *rs[2] = {&whole, &split};
    const char *names[2] = {"whole", "split"};
    for (int i = 0; i < 2; i++) {
        const double gbps = rs[i]->weight_gb * rs[i]->decode_tps;
        printf("%-6s %12.1f %12.2f %12.3f %14.2f", names[i], rs[i]->prefill_tps, rs[i]->decode_tps, rs[i]->weight_gb,
               gbps);
        if (ceiling > 0) printf(" %9.0f%%", 100.0 * gbps / ceiling);
        printf("\n");
    }
    if (ceiling > 0) printf("memcpy ceiling %.2f GB/s (256 MiB, best of 5)\n", ceiling);
    printf("seam bytes on the wire (split run): %zu; same final token: %s\n", split.seam_bytes,
           whole.last_token == split.last_token ? "yes" : "NO");
    const char *out_dir = getenv("OUT");
    char json_path[4096];
    snprintf(json_path, sizeof json_path, "%s/e2e_bench.json", out_dir && *out_dir ? out_dir : ".");
    FILE *json = fopen(json_path, "w");
    if (json) {
        fprintf(json,
                "{\"model\": \"%s\", \"backend\": \"%s\", \"prompt\": %zu, \"decode\": %zu, \"memcpy_gbps\": %.3f,\n"
                " \"whole\": {\"prefill_tps\": %.3f, \"decode_tps\": %.3f, \"weight_gb\": %.4f},\n"
                " \"split\": {\"prefill_tps\": %.3f, \"decode_tps\": %.3f, \"weight_gb\": %.4f, \"seam_bytes\": %zu}}\n",
                path, backend, n_prompt, n_decode, ceiling, whole.prefill_tps, whole.decode_tps, whole.weight_gb,
                split.prefill_tps, split.decode_tps, split.weight_gb, split.seam_bytes);
        fclose(json);
        printf("results: %s\n", json_path);
    }
    mk_model_free(model);
    return whole.last_token == split.last_token ? 0 : 3;
}
