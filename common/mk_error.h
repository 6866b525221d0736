/* Per-thread error reporting shared by every host file. The library returns a status
 * upward and records a readable message; only tools print and exit. */
#ifndef MK_ERROR_H
#define MK_ERROR_H

#include "meshkern.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Record `status` with a printf-style message on this thread and return it, so a
 * failure reads `return mk_fail(MK_ERR_SHAPE, "bad rank %zu", rank);`. */
mk_status mk_fail(mk_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Clear the message: the first statement of every MK_API function that can fail (checked
 * by tests/api_surface_check.py), and of module entries the tests drive directly. */
void mk_clear_error(void);

/* Propagate a failing status unchanged (message already recorded). */
#define MK_TRY(expr)                                                                   \
    do {                                                                               \
        mk_status mk_try_status_ = (expr);                                             \
        if (mk_try_status_ != MK_OK) return mk_try_status_;                            \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
