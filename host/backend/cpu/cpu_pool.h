/* A fixed set of worker threads owned by one cpu backend, for splitting a job's items
 * (matrix rows) across cores without creating threads per op.
 *
 * mk_cpu_pool_run(pool, n, chunk, fn, arg) calls fn(arg, begin, end, thread) over [0, n) in
 * runs of whole chunks of `chunk` items (begin a multiple of chunk; end one too, or n);
 * `thread` (0 = the caller, 1..n_threads-1 the workers) lets a task use per-thread scratch.
 * The caller's thread works too and the call returns when every chunk is done. Runs are
 * handed out in order from a shared counter, large ones first, so a busy core takes fewer
 * of them; how many chunks a run holds depends on timing, so fn's result for an item must
 * depend only on the item (never on begin or end): then the output is the same bit for
 * bit for any number of threads.
 *
 * Workers spin briefly after a job (the next matrix product follows within microseconds
 * during a forward) and then sleep on a condition variable, so an idle pool costs nothing.
 *
 * Ownership: mk_cpu_pool_create allocates the pool and starts n_threads - 1 workers;
 * mk_cpu_pool_free joins them and frees it (accepts NULL). One caller at a time. */
#ifndef MK_CPU_POOL_H
#define MK_CPU_POOL_H

#include <stddef.h>

#include "meshkern.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mk_cpu_pool mk_cpu_pool;
typedef void (*mk_cpu_task_fn)(void *arg, size_t begin, size_t end, size_t thread);

/* n_threads >= 1 threads in all, the caller's included. */
mk_status mk_cpu_pool_create(size_t n_threads, mk_cpu_pool **out);
void mk_cpu_pool_free(mk_cpu_pool *pool);
size_t mk_cpu_pool_threads(const mk_cpu_pool *pool);
void mk_cpu_pool_run(mk_cpu_pool *pool, size_t n, size_t chunk, mk_cpu_task_fn fn, void *arg);

#ifdef __cplusplus
}
#endif
#endif
