#define _GNU_SOURCE /* memmem */
/* libFuzzer target: the encoder on arbitrary bytes. The first byte picks the tokenizer
 * (the tiny Llama-3 BPE or SentencePiece fixture, or SmolLM2's when MK_FUZZ_SMOLLM2 names
 * its GGUF) and the flags; the rest is the text. Every input must give MK_OK or
 * MK_ERR_INVALID_UTF8 (exactly when the bytes are not UTF-8); ids must lie in the
 * vocabulary; for the two fixtures, whose vocabularies cover every byte, decode(encode(s))
 * without special parsing must give s back (unless s holds U+2581, which SentencePiece
 * reads as its space mark) and so must the streaming decoder. (SmolLM2 lacks a few byte
 * tokens, such as 0x06; llama.cpp drops such bytes, and so does meshkern.) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshkern.h"

static mk_tokenizer *toks[3];
static size_t n_toks;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *paths[3] = {"tests/fixtures/tokenizer/llama3_tiny.gguf", "tests/fixtures/tokenizer/spm_tiny.gguf",
                            getenv("MK_FUZZ_SMOLLM2")};
    for (size_t i = 0; i < 3; i++) {
        if (!paths[i]) continue;
        if (mk_tokenizer_open_file(paths[i], &toks[n_toks]) != MK_OK) {
            fprintf(stderr, "fuzz_tokenizer: %s: %s (run from the repository root)\n", paths[i], mk_last_error());
            abort();
        }
        n_toks++;
    }
    return 0;
}

static int utf8_ok(const uint8_t *s, size_t n) { /* independent of the library's check */
    for (size_t i = 0; i < n;) {
        const uint8_t c = s[i];
        size_t len;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xc2 && c <= 0xdf) len = 2, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef) len = 3, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4) len = 4, cp = c & 0x07;
        else return 0;
        if (i + len > n) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += len;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || n_toks == 0) return 0;
    const size_t which = data[0] % n_toks;
    const mk_tokenizer *t = toks[which];
    const unsigned flags = (data[0] >> 4) & 3u; /* ADD_SPECIAL, PARSE_SPECIAL */
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    int32_t *ids = NULL;
    size_t n = 0;
    const mk_status s = mk_tokenizer_encode(t, text, len, flags, &ids, &n);
    const int valid = utf8_ok((const uint8_t *)text, len);
    if (s == MK_ERR_INVALID_UTF8 && !valid) return 0;
    if (s != MK_OK || !valid) abort();
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= mk_tokenizer_vocab_size(t)) abort();
    if (which < 2 && flags == 0 && !memmem(text, len, "\xe2\x96\x81", 3)) {
        char *back = NULL;
        size_t back_len = 0;
        if (mk_tokenizer_decode(t, ids, n, 0, &back, &back_len) != MK_OK) abort();
        if (back_len != len || memcmp(back, text, len) != 0) abort();
        /* streaming: the same bytes, chunk by chunk */
        mk_detokenizer *d = NULL;
        if (mk_detokenizer_create(t, 0, &d) != MK_OK) abort();
        size_t at = 0;
        for (size_t i = 0; i <= n; i++) {
            const char *chunk;
            size_t chunk_len;
            if ((i < n ? mk_detokenizer_push(d, ids[i], &chunk, &chunk_len) : mk_detokenizer_flush(d, &chunk, &chunk_len)) !=
                MK_OK)
                abort();
            if (at + chunk_len > len || memcmp(chunk, text + at, chunk_len) != 0) abort();
            at += chunk_len;
        }
        if (at != len) abort();
        mk_detokenizer_free(d);
        mk_buffer_free(back);
    }
    mk_buffer_free(ids);
    return 0;
}
