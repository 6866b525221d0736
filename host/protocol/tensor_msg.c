#include "protocol/tensor_msg.h"

#include <string.h>

#include "mk_error.h"

bool mk_host_is_little(void) {
    const uint16_t probe = 1;
    uint8_t first;
    memcpy(&first, &probe, 1);
    return first == 1;
}

void mk_tensor_msg_describe(Meshkern__V1__Tensor *t, const char *name, Meshkern__V1__DType dtype,
                             uint64_t *shape, size_t rank, const void *data, size_t bytes) {
    t->name = (char *)name;
    t->dtype = dtype;
    t->n_shape = rank;
    t->shape = shape;
    t->byte_order = mk_host_is_little() ? MESHKERN__V1__BYTE_ORDER__BYTE_ORDER_LITTLE
                                             : MESHKERN__V1__BYTE_ORDER__BYTE_ORDER_BIG;
    t->data.data = (uint8_t *)data;
    t->data.len = bytes;
}

static size_t mk_tensor_msg_dtype_size(Meshkern__V1__DType dtype) {
    switch (dtype) {
        case MESHKERN__V1__DTYPE__DTYPE_FLOAT32: return 4;
        case MESHKERN__V1__DTYPE__DTYPE_FLOAT16: return 2;
        case MESHKERN__V1__DTYPE__DTYPE_BFLOAT16: return 2;
        case MESHKERN__V1__DTYPE__DTYPE_INT32: return 4;
        case MESHKERN__V1__DTYPE__DTYPE_INT64: return 8;
        default: return 0;
    }
}

mk_status mk_tensor_msg_check(const Meshkern__V1__Tensor *t, const char *what, uint64_t *dims, size_t max_rank,
                               size_t *rank) {
    if (t->name == NULL || t->name[0] == '\0') return mk_fail(MK_ERR_MISSING_FIELD, "%s tensor is missing field name", what);
    if (t->dtype == MESHKERN__V1__DTYPE__DTYPE_UNSPECIFIED)
        return mk_fail(MK_ERR_MISSING_FIELD, "%s tensor is missing field dtype", what);
    const size_t elem = mk_tensor_msg_dtype_size(t->dtype);
    if (elem == 0) return mk_fail(MK_ERR_DTYPE, "%s tensor has unknown dtype %d", what, (int)t->dtype);
    if (t->byte_order == MESHKERN__V1__BYTE_ORDER__BYTE_ORDER_UNSPECIFIED)
        return mk_fail(MK_ERR_MISSING_FIELD, "%s tensor is missing field byte_order", what);
    const Meshkern__V1__ByteOrder host = mk_host_is_little() ? MESHKERN__V1__BYTE_ORDER__BYTE_ORDER_LITTLE
                                                                  : MESHKERN__V1__BYTE_ORDER__BYTE_ORDER_BIG;
    if (t->byte_order != host)
        return mk_fail(MK_ERR_BYTE_ORDER, "%s tensor byte order %d is not this host's (%s)", what, (int)t->byte_order,
                       host == MESHKERN__V1__BYTE_ORDER__BYTE_ORDER_LITTLE ? "little" : "big");
    if (t->n_shape == 0) return mk_fail(MK_ERR_MISSING_FIELD, "%s tensor is missing field shape", what);
    if (t->n_shape > max_rank) return mk_fail(MK_ERR_SHAPE, "%s tensor rank %zu exceeds %zu", what, t->n_shape, max_rank);
    uint64_t bytes = elem;
    for (size_t i = 0; i < t->n_shape; i++) {
        if (t->shape[i] == 0) return mk_fail(MK_ERR_SHAPE, "%s tensor dimension %zu is zero", what, i);
        if (__builtin_mul_overflow(bytes, t->shape[i], &bytes) || bytes > (uint64_t)SIZE_MAX)
            return mk_fail(MK_ERR_SHAPE_OVERFLOW, "%s tensor shape overflows at dimension %zu (%llu)", what, i,
                           (unsigned long long)t->shape[i]);
        dims[i] = t->shape[i];
    }
    if (t->data.len == 0 || t->data.data == NULL)
        return mk_fail(MK_ERR_MISSING_FIELD, "%s tensor is missing field data", what);
    if (t->data.len != bytes)
        return mk_fail(MK_ERR_DATA_LENGTH, "%s tensor carries %zu data bytes but its shape and dtype need %llu", what,
                       t->data.len, (unsigned long long)bytes);
    *rank = t->n_shape;
    return MK_OK;
}
