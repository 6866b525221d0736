/* Per-thread last-error message and status names. */
#include <stdarg.h>
#include <stdio.h>

#include "mk_error.h"

static _Thread_local char mk_error_message[512];

mk_status mk_fail(mk_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(mk_error_message, sizeof mk_error_message, fmt, args);
    va_end(args);
    return status;
}

void mk_clear_error(void) { mk_error_message[0] = '\0'; }

const char *mk_last_error(void) { return mk_error_message; }

const char *mk_status_name(mk_status status) {
    switch (status) {
#define MK_NAME(s) \
    case s:        \
        return #s;
        MK_NAME(MK_OK)
        MK_NAME(MK_ERR_INVALID_ARGUMENT)
        MK_NAME(MK_ERR_OUT_OF_MEMORY)
        MK_NAME(MK_ERR_IO)
        MK_NAME(MK_ERR_INTERNAL)
        MK_NAME(MK_ERR_UNSUPPORTED)
        MK_NAME(MK_ERR_UNCERTIFIED_ARCHITECTURE)
        MK_NAME(MK_ERR_INVALID_RANGE)
        MK_NAME(MK_ERR_HEAD_OWNS_EMBEDDING)
        MK_NAME(MK_ERR_BYPASS_EMBEDDING)
        MK_NAME(MK_ERR_BUNDLE_REQUIRED)
        MK_NAME(MK_ERR_SEAM_MISMATCH)
        MK_NAME(MK_ERR_NORMALIZED_BUNDLE)
        MK_NAME(MK_ERR_EMPTY_INPUT)
        MK_NAME(MK_ERR_TOKEN_OUT_OF_RANGE)
        MK_NAME(MK_ERR_CONTEXT_OVERFLOW)
        MK_NAME(MK_ERR_UNCERTIFIED_SAMPLING)
        MK_NAME(MK_ERR_KV_POOL_FULL)
        MK_NAME(MK_ERR_WIRE_DECODE)
        MK_NAME(MK_ERR_MISSING_FIELD)
        MK_NAME(MK_ERR_SCHEMA_VERSION)
        MK_NAME(MK_ERR_TENSOR_NAME)
        MK_NAME(MK_ERR_ARCHITECTURE_MISMATCH)
        MK_NAME(MK_ERR_HIDDEN_WIDTH)
        MK_NAME(MK_ERR_DTYPE)
        MK_NAME(MK_ERR_BYTE_ORDER)
        MK_NAME(MK_ERR_SHAPE)
        MK_NAME(MK_ERR_SHAPE_OVERFLOW)
        MK_NAME(MK_ERR_DATA_LENGTH)
        MK_NAME(MK_ERR_POSITIONS_SHAPE)
        MK_NAME(MK_ERR_RECIPE_DIGEST)
        MK_NAME(MK_ERR_BOUNDARY_POINT)
        MK_NAME(MK_ERR_REQUIRED_TENSORS)
        MK_NAME(MK_ERR_TAIL_RESULT)
        MK_NAME(MK_ERR_GGUF_TRUNCATED)
        MK_NAME(MK_ERR_GGUF_MAGIC)
        MK_NAME(MK_ERR_GGUF_VERSION)
        MK_NAME(MK_ERR_GGUF_COUNT)
        MK_NAME(MK_ERR_GGUF_STRING)
        MK_NAME(MK_ERR_GGUF_VALUE_TYPE)
        MK_NAME(MK_ERR_GGUF_TENSOR_TYPE)
        MK_NAME(MK_ERR_GGUF_DIMS)
        MK_NAME(MK_ERR_GGUF_ALIGNMENT)
        MK_NAME(MK_ERR_GGUF_DATA_BOUNDS)
        MK_NAME(MK_ERR_GGUF_MISSING)
        MK_NAME(MK_ERR_GGUF_HPARAMS)
        MK_NAME(MK_ERR_NO_DEVICE)
        MK_NAME(MK_ERR_DEVICE_INDEX)
        MK_NAME(MK_ERR_DEVICE_MEMORY)
        MK_NAME(MK_ERR_CUDA)
        MK_NAME(MK_ERR_CUBLAS)
        MK_NAME(MK_ERR_NCCL)
        MK_NAME(MK_ERR_KERNEL_LAUNCH)
        MK_NAME(MK_ERR_MPI)
        MK_NAME(MK_ERR_PEER_CLOSED)
        MK_NAME(MK_ERR_PEER_TIMEOUT)
        MK_NAME(MK_ERR_AUTH)
        MK_NAME(MK_ERR_FRAME)
        MK_NAME(MK_ERR_NONFINITE)
        MK_NAME(MK_ERR_TOKENIZER)
        MK_NAME(MK_ERR_INVALID_UTF8)
        MK_NAME(MK_ERR_CHAT_TEMPLATE)
        MK_NAME(MK_ERR_CONNECT)
        MK_NAME(MK_ERR_PEER_LOST)
#undef MK_NAME
    }
    return "MK_ERR_UNKNOWN";
}
