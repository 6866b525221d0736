/* Frame header and the zero-copy TensorBundle reader. protobuf-c copies every bytes
 * field while unpacking; a 32 MiB residual read into pinned memory would be copied again
 * for nothing. This reader walks the protobuf wire format (varints, length-delimited
 * fields, with protobuf's merge rules for repeated sub-messages) and points at the
 * payload where it lies. It trusts no length: every field is bounded by what remains. */
#include "seam/frame.h"

#include <string.h>

#include "mk_error.h"

static void mk_put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t mk_get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void mk_frame_header_encode(uint8_t out[MK_FRAME_HEADER_BYTES], uint64_t length, unsigned align) {
    mk_put_le(out, MK_FRAME_MAGIC, 4);
    mk_put_le(out + 4, MK_FRAME_VERSION, 2);
    mk_put_le(out + 6, align % MK_FRAME_ALIGN, 2);
    mk_put_le(out + 8, length, 8);
}

mk_status mk_frame_header_decode(const uint8_t in[MK_FRAME_HEADER_BYTES], uint64_t limit, uint64_t *length,
                                 unsigned *align) {
    const uint64_t magic = mk_get_le(in, 4), version = mk_get_le(in + 4, 2), flags = mk_get_le(in + 6, 2);
    if (magic != MK_FRAME_MAGIC)
        return mk_fail(MK_ERR_FRAME, "seam frame: bad magic 0x%08llx (not a meshkern frame)", (unsigned long long)magic);
    if (version != MK_FRAME_VERSION)
        return mk_fail(MK_ERR_FRAME, "seam frame: version %llu is not the supported version %u",
                       (unsigned long long)version, MK_FRAME_VERSION);
    if (flags >= MK_FRAME_ALIGN)
        return mk_fail(MK_ERR_FRAME, "seam frame: alignment hint %llu is not below %u", (unsigned long long)flags,
                       MK_FRAME_ALIGN);
    *align = (unsigned)flags;
    *length = mk_get_le(in + 8, 8);
    if (*length == 0) return mk_fail(MK_ERR_FRAME, "seam frame: empty body");
    if (*length > limit)
        return mk_fail(MK_ERR_FRAME, "seam frame of %llu bytes exceeds this range's limit of %llu bytes",
                       (unsigned long long)*length, (unsigned long long)limit);
    return MK_OK;
}

uint64_t mk_frame_limit(size_t max_rows, size_t hidden) {
    return (uint64_t)max_rows * hidden * sizeof(float) + (uint64_t)max_rows * sizeof(int32_t) + MK_FRAME_BATCH_OVERHEAD;
}
