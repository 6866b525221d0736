/* libFuzzer target: GGUF bytes. Opening, reading hyper-parameters, dequantizing every
 * tensor and loading the tokenizer (then encoding and decoding a fixed text with it) must
 * return statuses, never read out of bounds or allocate without bound. */
#include <stdint.h>
#include <stdlib.h>

#include "model/gguf.h"
#include "model/model.h" /* mk_gguf_read_hparams */
#include "text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mk_gguf *g = NULL;
    if (mk_gguf_open_memory(data, size, &g) != MK_OK) return 0;
    mk_hparams hp;
    char arch[64];
    (void)mk_gguf_read_hparams(g, &hp, arch, sizeof arch);
    for (size_t i = 0; i < mk_gguf_tensor_count(g); i++) {
        const mk_gguf_tensor_info *t = mk_gguf_tensor_at(g, i);
        if (t->n_elements > ((size_t)1 << 20)) continue; /* keep each run small */
        float *out = malloc((size_t)t->n_elements * sizeof(float) + 1);
        if (out) (void)mk_gguf_tensor_to_f32(g, t->name, out, (size_t)t->n_elements);
        free(out);
    }
    mk_tokenizer *tok = NULL;
    if (mk_tokenizer_from_gguf(g, &tok) == MK_OK) {
        static const char text[] = "Hello <|im_end|> w\xc3\xb6rld 123 \xf0\x9f\x98\x80";
        int32_t *ids = NULL;
        size_t n = 0;
        if (mk_tokenizer_encode(tok, text, sizeof text - 1, MK_TOKENIZE_ADD_SPECIAL | MK_TOKENIZE_PARSE_SPECIAL, &ids,
                                &n) == MK_OK) {
            char *back = NULL;
            size_t len = 0;
            (void)mk_tokenizer_decode(tok, ids, n, MK_DECODE_SPECIAL, &back, &len);
            mk_buffer_free(back);
        }
        mk_buffer_free(ids);
        mk_tokenizer_free(tok);
    }
    mk_gguf_close(g);
    return 0;
}
