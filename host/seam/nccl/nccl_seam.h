/* The boundary header's encoding inside the NCCL header block (nccl_seam.c): fixed-width
 * little-endian fields, strings NUL-padded, so both ends agree whatever their compiler's
 * struct layout. Exposed for the tests that play a lying peer. */
#ifndef MK_SEAM_NCCL_SEAM_H
#define MK_SEAM_NCCL_SEAM_H

#include <stddef.h>

#include "meshkern.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of an encoded header (fits MK_NCCL_HEADER_MAX). */
#define MK_NCCL_BOUNDARY_HEADER_BYTES 292u

/* `more`: the entries of the same batch that follow this one (0: the message ends here):
 * a batch crosses as one exchange per entry, each header saying how many are still to come. */
void mk_nccl_header_encode(const mk_boundary_header *h, unsigned more, unsigned char out[MK_NCCL_BOUNDARY_HEADER_BYTES]);
/* MK_ERR_FRAME for a wrong length, tag or an unterminated string, or more than a batch
 * holds still to come. */
mk_status mk_nccl_header_decode(const unsigned char *in, size_t bytes, mk_boundary_header *h, unsigned *more);

#ifdef __cplusplus
}
#endif
#endif
