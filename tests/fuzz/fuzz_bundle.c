/* libFuzzer target: TensorBundle and TailResult bytes from an untrusted peer. Every input
 * must give MK_OK or a status with a message; an accepted bundle must re-pack and
 * round-trip to the same bytes-derived arrays. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "meshkern.h"
#include "protocol/boundary.h" /* mk_protocol_bundle_validate: internal, linked from meshkern_core */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mk_bundle *b = NULL;
    if (mk_bundle_unpack(data, size, &b) == MK_OK) {
        uint8_t *bytes = NULL;
        size_t len = 0;
        if (mk_bundle_pack(b, &bytes, &len) != MK_OK) abort();
        mk_bundle *again = NULL;
        if (mk_bundle_unpack(bytes, len, &again) != MK_OK) abort();
        const mk_boundary_header *h = mk_bundle_header_of(b);
        const size_t n = h->batch * h->rows * h->hidden;
        if (memcmp(mk_bundle_residual_const(again), mk_bundle_residual_const(b), n * sizeof(float)) != 0) abort();
        mk_bundle_free(again);
        mk_buffer_free(bytes);
        mk_bundle_free(b);
    } else if (mk_last_error()[0] == '\0') {
        abort(); /* a refusal always says why */
    }
    mk_protocol_arch arch;
    (void)mk_protocol_bundle_validate(data, size, &arch);
    mk_tail_result_info info;
    (void)mk_tail_result_validate(data, size, &info);
    return 0;
}
