/* The option-struct rule (include/meshkern.h, "Option structs ... are versioned"): one
 * reader for every struct that carries struct_size. */
#include <string.h>

#include "core/options.h"
#include "mk_error.h"

mk_status mk_options_take(void *dst, size_t current_size, size_t v1_size, const void *src, const char *what) {
    size_t size;
    memcpy(&size, src, sizeof size); /* struct_size is the first field of every option struct */
    if (size < v1_size || size > current_size)
        return mk_fail(MK_ERR_INVALID_ARGUMENT,
                       "%s.struct_size %zu is not a version this meshkern knows (%zu to %zu bytes): start from "
                       "%s_default()",
                       what, size, v1_size, current_size, what);
    memcpy(dst, src, size);
    memcpy(dst, &current_size, sizeof current_size);
    return MK_OK;
}
