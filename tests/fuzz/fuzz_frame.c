/* libFuzzer target: the stream transport's decoders, as a peer's bytes reach them. The
 * first 16 bytes are a frame header (magic, version, align, length) checked against a
 * receiver's limit; the rest is the body, decoded in place by the zero-copy TensorBundle
 * reader and validated into its entries' headers (one, or a batch's). A body the reader
 * accepts must also be accepted by protobuf-c's decoder with the same headers and payload
 * bytes: the two decoders agree on what a valid boundary is. */
#include <stdlib.h>
#include <string.h>

#include "meshkern.h"
#include "protocol/bundle_codec.h"
#include "seam/frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size >= MK_FRAME_HEADER_BYTES) {
        uint64_t length = 0;
        unsigned align = 0;
        const mk_status s = mk_frame_header_decode(data, mk_frame_limit(64, 32), &length, &align);
        if (s == MK_OK && (length == 0 || length > mk_frame_limit(64, 32) || align >= MK_FRAME_ALIGN)) abort();
        if (s != MK_OK && mk_last_error()[0] == '\0') abort();
    }
    mk_boundary_header h[MK_MAX_BATCH_SEQUENCES];
    size_t n_entries = 0;
    const uint8_t *entry_rows[MK_MAX_BATCH_SEQUENCES];
    if (mk_bundle_decode_batch(data, size, h, MK_MAX_BATCH_SEQUENCES, &n_entries, entry_rows) != MK_OK) {
        if (mk_last_error()[0] == '\0') abort(); /* a refusal always says why */
        if (n_entries != 0) abort();              /* and accepts nothing */
        return 0;
    }
    if (n_entries == 0) abort();
    const uint8_t *residual = entry_rows[0];
    size_t rows = 0;
    for (size_t k = 0; k < n_entries; k++) {
        /* each entry's rows follow the ones before it */
        if (entry_rows[k] != residual + rows * h[0].hidden * sizeof(float)) abort();
        rows += h[k].batch * h[k].rows;
    }
    const size_t n = rows * h[0].hidden;
    if (residual < data || residual + n * sizeof(float) > data + size) abort(); /* inside the input */
    if (h[0].schema_version == MK_BOUNDARY_BATCH_SCHEMA_VERSION) {
        /* a batch: protobuf-c's decode, checked by the same rules, gives the same entries */
        Meshkern__V1__TensorBundle *msg = meshkern__v1__tensor_bundle__unpack(NULL, size, data);
        if (!msg) abort();
        mk_boundary_header g[MK_MAX_BATCH_SEQUENCES];
        size_t m = 0;
        const uint8_t *r = NULL;
        if (mk_bundle_message_check_batch(msg, g, MK_MAX_BATCH_SEQUENCES, &m, &r) != MK_OK || m != n_entries ||
            memcmp(r, residual, n * sizeof(float)) != 0)
            abort();
        for (size_t k = 0; k < m; k++)
            if (g[k].rows != h[k].rows || g[k].position != h[k].position || g[k].step != h[k].step ||
                strcmp(g[k].request_id, h[k].request_id) != 0)
                abort();
        meshkern__v1__tensor_bundle__free_unpacked(msg, NULL);
        return 0;
    }
    mk_bundle *b = NULL;
    if (mk_bundle_unpack(data, size, &b) != MK_OK) abort();
    const mk_boundary_header *g = mk_bundle_header_of(b);
    if (g->rows != h[0].rows || g->hidden != h[0].hidden || g->batch != h[0].batch || g->next_layer != h[0].next_layer ||
        g->normalized != h[0].normalized || g->step != h[0].step || g->position != h[0].position ||
        strcmp(g->recipe_digest, h[0].recipe_digest) != 0 || strcmp(g->request_id, h[0].request_id) != 0 ||
        memcmp(mk_bundle_residual_const(b), residual, n * sizeof(float)) != 0)
        abort();
    mk_bundle_free(b);
    return 0;
}
