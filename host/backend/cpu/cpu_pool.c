/* The cpu backend's thread pool (see cpu_pool.h).
 *
 * A job is published as one 64-bit ticket (chunk count << 32 | next chunk). A thread
 * claims a run of chunks by a compare-and-swap on the ticket, so it can never take a chunk of a
 * job whose fields it has not seen; the job's fields change only after every chunk of the
 * previous job has been completed, and the caller waits for exactly that. */
#include "backend/cpu/cpu_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "mk_error.h"

/* A worker spins this long after a job before it sleeps: longer than the gap between two
 * jobs of a forward and than the gap between two decode steps (argmax, the logits copy,
 * the next embedding: ~0.1 ms on SmolLM2), so a steady decode never pays a futex wake;
 * short enough that the idle pool of another range in the same process does not steal a
 * core for long. Measured in time, not in pause instructions (a pause takes ~27 ns on
 * this machine's Zen 1 under KVM, 3 to 140 cycles elsewhere). */
enum { MK_POOL_SPIN_NS = 150000, MK_POOL_SPINS_PER_CLOCK_READ = 64, MK_POOL_WAIT_SPINS_BEFORE_YIELD = 1 << 14 };

static uint64_t mk_pool_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

typedef struct mk_pool_worker_arg mk_pool_worker_arg;

struct mk_cpu_pool {
    size_t n_threads;
    pthread_t *workers; /* [n_threads - 1] */
    mk_pool_worker_arg *args; /* [n_threads - 1] */
    size_t n_started;

    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_uint_fast64_t generation; /* bumped for every job and for stop */
    atomic_size_t sleepers;          /* workers inside (or entering) the condition wait */
    atomic_bool stop;

    atomic_uint_fast64_t ticket;    /* n_chunks << 32 | next chunk */
    atomic_size_t completed;        /* chunks of the current job done */
    mk_cpu_task_fn fn;              /* the current job; written only between jobs */
    void *arg;
    size_t n, chunk;
};

struct mk_pool_worker_arg {
    mk_cpu_pool *pool;
    size_t index; /* 1..n_threads-1 */
};

static inline void mk_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claim and run runs of chunks of the current job until none is left. A claim takes
 * 1/(2 x threads) of the chunks still unclaimed (at least one): a few large runs first,
 * single chunks at the end, so threads finish together while the shared ticket and
 * counter change hands a few dozen times per job instead of once per chunk (each hand-
 * over moves a cache line between cores, ~0.1 us; SmolLM2's lm_head alone has 3072
 * chunks of 16 rows). */
static void mk_pool_work(mk_cpu_pool *p, size_t thread) {
    const uint_fast64_t share = 2 * (uint_fast64_t)p->n_threads;
    uint_fast64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
    for (;;) {
        const uint_fast64_t next = t & 0xffffffffu, n_chunks = t >> 32;
        if (next >= n_chunks) return;
        const uint_fast64_t take = (n_chunks - next) / share ? (n_chunks - next) / share : 1;
        if (!atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + take, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        const size_t begin = (size_t)next * p->chunk;
        const size_t end = (size_t)(next + take) * p->chunk < p->n ? (size_t)(next + take) * p->chunk : p->n;
        p->fn(p->arg, begin, end, thread);
        atomic_fetch_add_explicit(&p->completed, (size_t)take, memory_order_release);
        t = atomic_load_explicit(&p->ticket, memory_order_acquire);
    }
}

static void *mk_pool_worker(void *arg) {
    const mk_pool_worker_arg *a = arg;
    mk_cpu_pool *p = a->pool;
    const size_t index = a->index;
    uint_fast64_t seen = 0;
    for (;;) {
        uint_fast64_t g;
        unsigned spins = 0;
        uint64_t spin_until = 0;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen) {
            if (++spins % MK_POOL_SPINS_PER_CLOCK_READ != 0) {
                mk_cpu_relax();
                continue;
            }
            const uint64_t now = mk_pool_now_ns();
            if (spin_until == 0) spin_until = now + MK_POOL_SPIN_NS;
            if (now < spin_until) continue;
            /* Announce the sleep, then re-check under the lock: the publisher bumps the
             * generation before it looks at `sleepers` (both sequentially consistent), so
             * either it sees this sleeper and broadcasts under the lock, or this check
             * sees the new generation. */
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->generation) == seen) pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        mk_pool_work(p, index);
    }
}

static void mk_pool_publish(mk_cpu_pool *p) {
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->sleepers) == 0) return; /* every worker is spinning and will see it */
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
}

mk_status mk_cpu_pool_create(size_t n_threads, mk_cpu_pool **out) {
    *out = NULL;
    if (n_threads == 0 || n_threads > 1024)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "cpu thread pool: %zu threads (1 to 1024)", n_threads);
    mk_cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return mk_fail(MK_ERR_OUT_OF_MEMORY, "cpu thread pool: out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->ticket, 0);
    atomic_init(&p->completed, 0);
    if (n_threads > 1) {
        p->workers = calloc(n_threads - 1, sizeof *p->workers);
        p->args = calloc(n_threads - 1, sizeof *p->args);
        if (!p->workers || !p->args) {
            mk_cpu_pool_free(p);
            return mk_fail(MK_ERR_OUT_OF_MEMORY, "cpu thread pool: out of memory");
        }
        for (size_t i = 0; i + 1 < n_threads; i++) {
            p->args[i] = (mk_pool_worker_arg){p, i + 1};
            if (pthread_create(&p->workers[i], NULL, mk_pool_worker, &p->args[i]) != 0) {
                mk_cpu_pool_free(p);
                return mk_fail(MK_ERR_INTERNAL, "cpu thread pool: could not start thread %zu of %zu", i + 1,
                               n_threads);
            }
            p->n_started++;
        }
    }
    *out = p;
    return MK_OK;
}

void mk_cpu_pool_free(mk_cpu_pool *p) {
    if (!p) return;
    atomic_store_explicit(&p->stop, true, memory_order_release);
    mk_pool_publish(p);
    for (size_t i = 0; i < p->n_started; i++) pthread_join(p->workers[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p->args);
    free(p);
}

size_t mk_cpu_pool_threads(const mk_cpu_pool *p) { return p->n_threads; }

void mk_cpu_pool_run(mk_cpu_pool *p, size_t n, size_t chunk, mk_cpu_task_fn fn, void *arg) {
    if (n == 0) return;
    if (chunk == 0) chunk = 1;
    size_t n_chunks = (n + chunk - 1) / chunk;
    if (n_chunks > 0xffffffffu) { /* keep the count inside the ticket: bigger chunks, same rule */
        chunk = (n + 0xfffffffeu) / 0xffffffffu;
        n_chunks = (n + chunk - 1) / chunk;
    }
    if (p->n_threads == 1 || n_chunks == 1) {
        fn(arg, 0, n, 0);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->chunk = chunk;
    atomic_store_explicit(&p->completed, 0, memory_order_relaxed);
    atomic_store_explicit(&p->ticket, (uint_fast64_t)n_chunks << 32, memory_order_release);
    mk_pool_publish(p);
    mk_pool_work(p, 0);
    int spins = 0;
    while (atomic_load_explicit(&p->completed, memory_order_acquire) < n_chunks) {
        if (++spins < MK_POOL_WAIT_SPINS_BEFORE_YIELD) mk_cpu_relax();
        else sched_yield();
    }
}
