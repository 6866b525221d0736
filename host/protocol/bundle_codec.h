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
    Meshkern__V1__BundleEntry entry[MK_MAX_BATCH_SEQUENCES]; /* schema 2 */
    Meshkern__V1__BundleEntry *entries[MK_MAX_BATCH_SEQUENCES];
    mk_boundary_header batch; /* schema 2: the shared fields the message points at */
    /* schema 2: the residual's data, entry by entry where each lies (packed in turn) */
    const void *part[MK_MAX_BATCH_SEQUENCES];
    size_t part_bytes[MK_MAX_BATCH_SEQUENCES], n_parts, parts_bytes;
} mk_bundle_message;
mk_status mk_bundle_message_describe(const mk_boundary_header *h, const void *residual, const int32_t *positions,
                                     mk_bundle_message *m);
/* A batch of n sequences' boundaries as one message: schema 1 when n == 1 (the bytes a
 * single boundary packs to), else schema 2 with an entry per header, residual
 * [1, total rows, hidden] packed from rows[0], then rows[1]... (entry k's h[k]->rows rows,
 * wherever they lie: no gathering copy) and positions [1, total rows].
 * The headers must agree on everything but request id, step, position and rows, and each
 * have rows and (n > 1) a request id of its own: mk_bundle_batch_check, which every seam's
 * send applies. */
mk_status mk_bundle_batch_check(const mk_boundary_header *const *h, size_t n);
mk_status mk_bundle_message_describe_batch(const mk_boundary_header *const *h, size_t n, const void *const *rows,
                                           const int32_t *positions, mk_bundle_message *m);

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
    /* schema 2: the first MK_MAX_BATCH_SEQUENCES entries (msg.n_entries counts them all) */
    Meshkern__V1__BundleEntry entry[MK_MAX_BATCH_SEQUENCES];
    Meshkern__V1__BundleEntry *entries[MK_MAX_BATCH_SEQUENCES];
    char entry_id[MK_MAX_BATCH_SEQUENCES][MK_VIEW_STRING];
} mk_bundle_view;

/* Parse protobuf wire bytes into *view (MK_ERR_WIRE_DECODE on malformed wire format).
 * No field is validated beyond the wire format: mk_bundle_message_check does that. */
mk_status mk_bundle_view_parse(const uint8_t *bytes, size_t len, mk_bundle_view *view);

/* A whole received body: parse, check the message, and check that the positions are the
 * header's position + row. *residual points into `bytes` (may be unaligned). One sequence
 * only: a batch of several is refused (mk_bundle_decode_batch takes those). */
mk_status mk_bundle_decode_body(const uint8_t *bytes, size_t len, mk_boundary_header *h, const uint8_t **residual);

/* A received body of either schema as its entries: h[k] is entry k's header (schema 1: the
 * one sequence) and rows[k] its first residual value in `bytes` (may be unaligned; the rows
 * of h[0..k) come before it). At most cap entries, h and rows each with room for cap (a
 * batch of more is refused whole, MK_ERR_SHAPE). Every wire check is made here and refuses
 * the whole message: entries present only in schema 2 and there at least one, each with a
 * request id of its own and at least one row, rows adding up to the residual's, positions
 * counting up from each entry's position. */
mk_status mk_bundle_decode_batch(const uint8_t *bytes, size_t len, mk_boundary_header *h, size_t cap, size_t *n,
                                 const uint8_t **rows);
/* The same on a message already decoded (protobuf-c or a view). */
mk_status mk_bundle_message_check_batch(const Meshkern__V1__TensorBundle *msg, mk_boundary_header *h, size_t cap,
                                        size_t *n, const uint8_t **residual);

#ifdef __cplusplus
}
#endif
#endif
