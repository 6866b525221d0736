/* libFuzzer target: GGUF bytes. Opening, reading hyper-parameters and dequantizing every
 * tensor must return statuses, never read out of bounds or allocate without bound. */
#include <stdint.h>
#include <stdlib.h>

#include "gguf.h"

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
    mk_gguf_close(g);
    return 0;
}
