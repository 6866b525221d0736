/* libFuzzer target: meshkern serve's request path (tools/serve_req.c), a JSON body -> a
 * checked request. The first byte picks the endpoint (chat or completions), the tokenizer
 * (the tiny Llama-3 BPE fixture, or SmolLM2's when MK_FUZZ_SMOLLM2 names its GGUF) and a
 * small context; the rest is the body. Every input must end in a request the server can
 * run (prompt ids in the vocabulary, prompt + max_tokens within the context, at most four
 * stop strings) or in a refusal with an HTTP status, a message and a JSON error body; the
 * stop-string scan of the body as generated text must stay within it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve.h"

static mk_tokenizer *toks[2];
static size_t n_toks;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *paths[2] = {"tests/fixtures/tokenizer/llama3_tiny.gguf", getenv("MK_FUZZ_SMOLLM2")};
    for (size_t i = 0; i < 2; i++) {
        if (!paths[i]) continue;
        if (mk_tokenizer_open_file(paths[i], &toks[n_toks]) != MK_OK) {
            fprintf(stderr, "fuzz_serve_request: %s: %s (run from the repository root)\n", paths[i], mk_last_error());
            abort();
        }
        n_toks++;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t sel = data[0];
    const mk_serve_limits lim = {.tok = toks[(sel >> 1) % n_toks], .model_id = "m", .context = (size_t)16 << (sel >> 4 & 3)};
    const mk_serve_kind kind = sel & 1 ? MK_SERVE_COMPLETION : MK_SERVE_CHAT;
    const char *body = (const char *)data + 1;
    const size_t len = size - 1;
    mk_serve_req req;
    mk_serve_err err;
    memset(&err, 0, sizeof err);
    if (mk_serve_parse(&lim, kind, body, len, &req, &err)) {
        const size_t vocab = mk_tokenizer_vocab_size(lim.tok);
        if (req.n_ids == 0 || req.max_tokens == 0 || req.n_ids + req.max_tokens > lim.context ||
            req.n_stop > MK_SERVE_MAX_STOP)
            abort();
        for (size_t i = 0; i < req.n_ids; i++)
            if (req.ids[i] < 0 || (size_t)req.ids[i] >= vocab) abort();
        size_t cut, safe;
        const bool hit = mk_serve_stop_scan(&req, body, len, 0, &cut, &safe);
        if (safe > len || (hit && cut > len) || (!hit && cut != len)) abort();
        /* scanning in two steps (from the first scan's safe point) finds what one scan finds */
        size_t cut1, safe1, cut2, safe2;
        if (!mk_serve_stop_scan(&req, body, len / 2, 0, &cut1, &safe1)) {
            const bool hit2 = mk_serve_stop_scan(&req, body, len, safe1, &cut2, &safe2);
            if (hit2 != hit || (hit && cut2 != cut) || safe2 != safe) abort();
        }
        mk_serve_req_free(&req);
    } else {
        if ((err.http != 400 && err.http != 404 && err.http != 500) || !err.message[0] || !err.code) abort();
        char *json = mk_serve_error_json(&err);
        cJSON *back = json ? cJSON_Parse(json) : NULL;
        if (!back || !cJSON_GetObjectItem(back, "error")) abort();
        cJSON_Delete(back);
        free(json);
    }
    return 0;
}
