/* The stream transport's framing (the body is a TensorBundle: protocol/bundle_codec.h).
 *
 * A frame: a 16-byte header (magic "MKSF", version, align, length, all little-endian)
 * then `length` bytes of one protobuf TensorBundle. The receiver checks the magic, the
 * version and the length against its own limit before it reads a byte of the body.
 * `align` (0..63) is the residual's offset in the body modulo 64: the receiver reads the
 * body at a matching shift so the payload lands 64-byte aligned (a placement hint only;
 * nothing trusts it). */
#ifndef MK_SEAM_FRAME_H
#define MK_SEAM_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "meshkern.h"


#define MK_FRAME_MAGIC 0x46534b4du /* "MKSF" read as little-endian */
#define MK_FRAME_VERSION 1u
#define MK_FRAME_HEADER_BYTES 16u
/* Bytes a TensorBundle needs beyond its two arrays (strings, shapes, tags): generous; and
 * a batch's entries at most (request id of 63 bytes, three varints and tags each). */
#define MK_FRAME_OVERHEAD 1024u
#define MK_FRAME_ENTRY_BYTES 128u
#define MK_FRAME_BATCH_OVERHEAD (MK_FRAME_OVERHEAD + MK_MAX_BATCH_SEQUENCES * MK_FRAME_ENTRY_BYTES)
#define MK_FRAME_ALIGN 64u

void mk_frame_header_encode(uint8_t out[MK_FRAME_HEADER_BYTES], uint64_t length, unsigned align);
/* Magic, version, align < 64 and length <= limit; *length is the body size. */
mk_status mk_frame_header_decode(const uint8_t in[MK_FRAME_HEADER_BYTES], uint64_t limit, uint64_t *length,
                                 unsigned *align);
/* Shift that puts a payload at `offset` on an MK_FRAME_ALIGN boundary from an aligned base. */
static inline size_t mk_frame_shift(size_t offset) { return (MK_FRAME_ALIGN - offset % MK_FRAME_ALIGN) % MK_FRAME_ALIGN; }
/* The largest body a receiver of max_rows x hidden accepts. */
uint64_t mk_frame_limit(size_t max_rows, size_t hidden);

#endif
