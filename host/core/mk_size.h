/* Checked sizes: where a count from outside (a command-line flag, an option field, a file
 * or a message) meets an allocation, the byte count is computed here, never with a bare
 * `n * sizeof x` that wraps to a small number and lets the writes run past the buffer.
 * One helper for the library and the command-line program; header-only, no state. */
#ifndef MK_SIZE_H
#define MK_SIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mk_error.h"

/* *out = a * b; false (and *out = SIZE_MAX) when the product does not fit in size_t. */
static inline bool mk_size_mul(size_t a, size_t b, size_t *out) {
    if (__builtin_mul_overflow(a, b, out)) {
        *out = SIZE_MAX;
        return false;
    }
    return true;
}

/* *out = a + b; false (and *out = SIZE_MAX) when the sum does not fit in size_t. */
static inline bool mk_size_add(size_t a, size_t b, size_t *out) {
    if (__builtin_add_overflow(a, b, out)) {
        *out = SIZE_MAX;
        return false;
    }
    return true;
}

/* The bytes of n elements of `size` bytes, or MK_ERR_OUT_OF_MEMORY naming `what` and the
 * count when that does not fit in size_t (no machine has that memory either). */
static inline mk_status mk_size_bytes(size_t n, size_t size, const char *what, size_t *out) {
    if (mk_size_mul(n, size, out)) return MK_OK;
    (void)mk_fail(MK_ERR_OUT_OF_MEMORY, "%s: %zu elements of %zu bytes overflow the address space", what, n, size);
    return MK_ERR_OUT_OF_MEMORY;
}

/* malloc of n elements of `size` bytes (at least one byte, so that n = 0 is not NULL):
 * NULL with MK_ERR_OUT_OF_MEMORY recorded, naming `what` and the count, when the byte
 * count wraps or the memory is not there. */
static inline void *mk_alloc_array(size_t n, size_t size, const char *what) {
    size_t bytes;
    if (mk_size_bytes(n, size, what, &bytes) != MK_OK) return NULL;
    void *p = malloc(bytes ? bytes : 1);
    if (!p) (void)mk_fail(MK_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu elements of %zu bytes", what, n, size);
    return p;
}

/* Room for `need` elements of `size` bytes in a growing array: `array` is the address of
 * the array's pointer (T **), *cap its capacity in elements. Nothing changes when *cap
 * holds `need` already; otherwise the capacity doubles (from `first` when it is 0) until it
 * does, and the elements are kept. MK_ERR_OUT_OF_MEMORY, naming `what`, when the count or
 * the bytes would overflow or the memory is not there; the array and *cap are then as they
 * were. */
static inline mk_status mk_grow_array(void *array, size_t *cap, size_t need, size_t size, size_t first,
                                      const char *what) {
    if (need <= *cap) return MK_OK;
    size_t n = *cap ? *cap : first ? first : 1, bytes;
    while (n < need) {
        size_t twice;
        if (!mk_size_mul(n, 2, &twice))
            return mk_fail(MK_ERR_OUT_OF_MEMORY, "%s: %zu elements cannot double", what, n);
        n = twice;
    }
    MK_TRY(mk_size_bytes(n, size, what, &bytes));
    void *items; /* the pointer read and written as bytes: T * and void * share a representation */
    memcpy(&items, array, sizeof items);
    void *grown = realloc(items, bytes);
    if (!grown) return mk_fail(MK_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu elements of %zu bytes", what, n, size);
    memcpy(array, &grown, sizeof grown);
    *cap = n;
    return MK_OK;
}

#endif
