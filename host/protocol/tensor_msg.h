/* Shared pieces of the protobuf wire form: describing an in-memory array as a Tensor
 * message (by reference, no copy) and validating a received Tensor message. */
#ifndef MK_TENSOR_MSG_H
#define MK_TENSOR_MSG_H

#include <stdbool.h>

#include "meshkern.pb-c.h"
#include "meshkern.h"

bool mk_host_is_little(void);

/* Point `t` at `data` (not copied): name, dtype, shape[rank], host byte order. `t`, the
 * shape array and the data must outlive the pack call. */
void mk_tensor_msg_describe(Meshkern__V1__Tensor *t, const char *name, Meshkern__V1__DType dtype,
                             uint64_t *shape, size_t rank, const void *data, size_t bytes);

/* Validate a received tensor: every field present, known dtype, host byte order, rank in
 * [1, max_rank], no zero dimension, no overflow of elements x dtype size, and data length
 * equal to that product. Fills dims[rank]. `what` names it in messages. */
mk_status mk_tensor_msg_check(const Meshkern__V1__Tensor *t, const char *what, uint64_t *dims, size_t max_rank,
                               size_t *rank);

#endif
