/* Internal layout of the two boundary carriers: mk_bundle (host arrays, the protobuf
 * form's in-memory twin) and mk_boundary (payload in a range's backend memory). The
 * header is the same struct in both, so the contract reads one thing. */
#ifndef MK_BOUNDARY_H
#define MK_BOUNDARY_H

#include "meshkern.h"
#include "meshkern.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mk_bundle {
    mk_boundary_header h;
    float *residual;    /* [batch, rows, hidden] */
    int32_t *positions; /* [batch, rows] */
    void *storage;      /* the decoded message the arrays live in (mk_bundle_unpack), or NULL */
    size_t cap_floats, cap_rows; /* what residual and positions can hold */
};

struct mk_boundary {
    mk_range *range;
    mk_boundary_header h;
    float *payload;        /* dev [capacity_rows, hidden] in the range's backend */
    size_t capacity_rows;
};

/* Dense-llama defaults: schema version, architecture, adapter, tensor name, boundary
 * point, F32, batch 1; everything else zero. */
void mk_boundary_header_defaults(mk_boundary_header *h);

/* Validate a decoded TensorBundle (from protobuf-c or the zero-copy frame reader) and
 * fill the header; *residual and *positions point at the message's payload bytes (not
 * necessarily aligned). One place for every wire check. */
mk_status mk_bundle_message_check(const Meshkern__V1__TensorBundle *msg, mk_boundary_header *h,
                                  const uint8_t **residual, const uint8_t **positions);

/* Describe a header + host arrays as a TensorBundle message (arrays by reference). */
typedef struct mk_bundle_message {
    Meshkern__V1__TensorBundle msg;
    Meshkern__V1__Tensor residual, positions;
    Meshkern__V1__Tensor *tensors[1];
    uint64_t residual_shape[3], positions_shape[2];
} mk_bundle_message;
mk_status mk_bundle_message_describe(const mk_boundary_header *h, const void *residual, const int32_t *positions,
                                     mk_bundle_message *m);

/* Pack m (the payload copied once) into out[mk_bundle_message_size(m)]; returns the
 * length. The bytes equal protobuf-c's pack of m->msg. */
size_t mk_bundle_message_size(const mk_bundle_message *m);
size_t mk_bundle_message_pack(const mk_bundle_message *m, uint8_t *out);
/* Byte offset of the residual's data inside what m packs to: a buffer placed so that
 * offset lands on 64 bytes lets pack and unpack copy at full speed. */
size_t mk_bundle_message_payload_offset(const mk_bundle_message *m);

/* NaN or Inf anywhere in n floats (read bytewise: the pointer may be unaligned). */
bool mk_floats_nonfinite(const void *data, size_t n, size_t *first_bad);

#ifdef __cplusplus
}
#endif
#endif
