/* libFuzzer target: the stream transport's decoders, as a peer's bytes reach them. The
 * first 16 bytes are a frame header (magic, version, align, length) checked against a
 * receiver's limit; the rest is the body, decoded in place by the zero-copy TensorBundle
 * reader and validated into a boundary header. A body the reader accepts must also be
 * accepted by protobuf-c's decoder with the same header and payload bytes: the two
 * decoders agree on what a valid boundary is. */
#include <stdlib.h>
#include <string.h>

#include "meshkern.h"
#include "protocol/bundle_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size >= MK_FRAME_HEADER_BYTES) {
        uint64_t length = 0;
        unsigned align = 0;
        const mk_status s = mk_frame_header_decode(data, mk_frame_limit(64, 32), &length, &align);
        if (s == MK_OK && (length == 0 || length > mk_frame_limit(64, 32) || align >= MK_FRAME_ALIGN)) abort();
        if (s != MK_OK && mk_last_error()[0] == '\0') abort();
    }
    mk_boundary_header h;
    const uint8_t *residual = NULL;
    if (mk_bundle_decode_body(data, size, &h, &residual) != MK_OK) {
        if (mk_last_error()[0] == '\0') abort(); /* a refusal always says why */
        return 0;
    }
    const size_t n = h.batch * h.rows * h.hidden;
    if (residual < data || residual + n * sizeof(float) > data + size) abort(); /* points inside the input */
    mk_bundle *b = NULL;
    if (mk_bundle_unpack(data, size, &b) != MK_OK) abort();
    const mk_boundary_header *g = mk_bundle_header_of(b);
    if (g->rows != h.rows || g->hidden != h.hidden || g->batch != h.batch || g->next_layer != h.next_layer ||
        g->normalized != h.normalized || g->step != h.step || g->position != h.position ||
        strcmp(g->recipe_digest, h.recipe_digest) != 0 || strcmp(g->request_id, h.request_id) != 0 ||
        memcmp(mk_bundle_residual_const(b), residual, n * sizeof(float)) != 0)
        abort();
    mk_bundle_free(b);
    return 0;
}
