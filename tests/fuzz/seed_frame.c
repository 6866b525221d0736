/* Writes seed inputs for fuzz_frame: valid TensorBundle bodies of a few shapes, packed
 * through the public API, into the directory given. */
#include <stdio.h>
#include <string.h>

#include "meshkern.h"

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    const size_t shapes[][2] = {{1, 8}, {3, 32}, {5, 7}};
    for (size_t k = 0; k < 3; k++) {
        mk_bundle *b = NULL;
        if (mk_bundle_create(1, shapes[k][0], shapes[k][1], &b) != MK_OK) return 1;
        float *r = mk_bundle_residual(b);
        for (size_t i = 0; i < shapes[k][0] * shapes[k][1]; i++) r[i] = (float)i * 0.25f - 3.0f;
        for (size_t i = 0; i < shapes[k][0]; i++) mk_bundle_positions(b)[i] = (int32_t)(k + i);
        mk_boundary_header h = *mk_bundle_header_of(b);
        memset(h.recipe_digest, 'a' + (int)k, MK_DIGEST_HEX_LEN);
        h.next_layer = (int64_t)k + 1;
        h.step = k;
        h.position = (int64_t)k;
        snprintf(h.request_id, sizeof h.request_id, "req-%zu", k);
        mk_bundle_set_header(b, &h);
        uint8_t *bytes = NULL;
        size_t len = 0;
        if (mk_bundle_pack(b, &bytes, &len) != MK_OK) return 1;
        char path[4096];
        snprintf(path, sizeof path, "%s/seed_%zu", argv[1], k);
        FILE *f = fopen(path, "wb");
        if (!f) return 1;
        fwrite(bytes, 1, len, f);
        fclose(f);
        mk_buffer_free(bytes);
        mk_bundle_free(b);
    }
    return 0;
}
