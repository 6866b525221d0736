/* The TensorBundle codec (bundle_codec.c): the protobuf form of a boundary, encoded with
 * the payload copied once and decoded in place. The only code that knows the field
 * numbers of proto/meshkern.proto. */
#ifndef MK_PROTOCOL_BUNDLE_CODEC_H
#define MK_PROTOCOL_BUNDLE_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "meshkern.pb-c.h"
#include "protocol/boundary.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The field number the codec writes and reads for a TensorBundle field ("step") or a
 * Tensor field ("Tensor.data"); 0 for a name it does not know. For the test that holds the
 * codec to the .proto. */
unsigned mk_bundle_field_number(const char *name);

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

/* A TensorBundle decoded in place: the message struct protobuf-c would give, but every
 * bytes field points into the caller's buffer (no payload copy) and strings are copied
 * into the view's own small buffers. Valid while the buffer is. */
#define MK_VIEW_RANK 8
#define MK_VIEW_STRING 256
typedef struct mk_bundle_view {
    Meshkern__V1__TensorBundle msg;
    Meshkern__V1__Tensor residual, positions;
    Meshkern__V1__Tensor *tensors[1];
    uint64_t residual_shape[MK_VIEW_RANK], positions_shape[MK_VIEW_RANK];
    char adapter[MK_VIEW_STRING], boundary_point[MK_VIEW_STRING], digest[MK_VIEW_STRING],
        request_id[MK_VIEW_STRING], residual_name[MK_VIEW_STRING], positions_name[MK_VIEW_STRING];
} mk_bundle_view;

/* Parse protobuf wire bytes into *view (MK_ERR_WIRE_DECODE on malformed wire format).
 * No field is validated beyond the wire format: mk_bundle_message_check does that. */
mk_status mk_bundle_view_parse(const uint8_t *bytes, size_t len, mk_bundle_view *view);

/* A whole received body: parse, check the message, and check that the positions are the
 * header's position + row. *residual points into `bytes` (may be unaligned). */
mk_status mk_bundle_decode_body(const uint8_t *bytes, size_t len, mk_boundary_header *h, const uint8_t **residual);

#ifdef __cplusplus
}
#endif
#endif
