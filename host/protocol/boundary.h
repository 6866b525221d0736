/* Internal layout of the two boundary carriers: mk_bundle (host arrays, the protobuf
 * form's in-memory twin) and mk_boundary (payload in a range's backend memory). The
 * header is the same struct in both, so the contract reads one thing. */
#ifndef MK_BOUNDARY_H
#define MK_BOUNDARY_H

#include "meshkern.h"

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
    /* The contract passed h for this sequence at this length (a seam's receive sets it; the
     * forward that consumes the boundary then does not check it again). NULL: not checked. */
    const mk_sequence *checked_seq;
    size_t checked_length;
};

/* Protocol-level bundle for any architecture kind (dense/moe/mla): packs named F32
 * payloads and validates them; exercises architectures meshkern cannot run (tests and the
 * bundle fuzzer; not exported). */
typedef struct mk_named_payload {
    const char *name;
    const float *data; /* [count] */
    size_t count;
} mk_named_payload;
mk_status mk_protocol_bundle_pack(mk_protocol_arch arch, const mk_named_payload *payloads, size_t n_payloads,
                                  uint8_t **out, size_t *out_len);
/* Validate protocol bytes of any kind; fills *arch. Refuses missing required tensors. */
mk_status mk_protocol_bundle_validate(const uint8_t *bytes, size_t len, mk_protocol_arch *arch);

/* Dense-llama defaults: schema version, architecture, adapter, tensor name, boundary
 * point, F32, batch 1; everything else zero. */
void mk_boundary_header_defaults(mk_boundary_header *h);

/* NaN or Inf anywhere in n floats (read bytewise: the pointer may be unaligned). */
bool mk_floats_nonfinite(const void *data, size_t n, size_t *first_bad);

/* MK_ERR_NONFINITE naming the first NaN or Inf among the h->rows x h->hidden floats at
 * rows, else MK_OK: the one check every receiver of a residual applies (the contract and
 * the host-staged transports). */
mk_status mk_boundary_rows_finite(const void *rows, const mk_boundary_header *h);

#ifdef __cplusplus
}
#endif
#endif
