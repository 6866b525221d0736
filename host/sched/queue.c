/* The bounded FIFO between stages: a ring of item pointers under a mutex, a condvar for
 * the consumer. Sized for every item that can exist, so producers never wait. */
#include <stdlib.h>

#include "mk_error.h"
#include "sched/sched.h"

mk_status mk_queue_init(mk_queue *q, size_t cap) {
    q->ring = calloc(cap, sizeof *q->ring);
    if (!q->ring) return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline queue: out of memory");
    q->cap = cap;
    q->head = q->count = 0;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    return MK_OK;
}

void mk_queue_destroy(mk_queue *q) {
    if (!q->ring) return;
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q->ring);
    q->ring = NULL;
}

mk_status mk_queue_push(mk_queue *q, mk_sched_item *item) {
    pthread_mutex_lock(&q->mu);
    if (q->count == q->cap) {
        /* Cannot happen while every item in flight has a place: report, never wait. */
        pthread_mutex_unlock(&q->mu);
        return mk_fail(MK_ERR_INTERNAL, "pipeline queue of %zu items is full", q->cap);
    }
    q->ring[(q->head + q->count) % q->cap] = item;
    q->count++;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return MK_OK;
}

mk_sched_item *mk_queue_pop(mk_queue *q) {
    pthread_mutex_lock(&q->mu);
    while (q->count == 0) pthread_cond_wait(&q->cv, &q->mu);
    mk_sched_item *item = q->ring[q->head];
    q->head = (q->head + 1) % q->cap;
    q->count--;
    pthread_mutex_unlock(&q->mu);
    return item;
}

mk_sched_item *mk_queue_pop_if(mk_queue *q, bool (*take)(const mk_sched_item *, void *), void *arg) {
    pthread_mutex_lock(&q->mu);
    mk_sched_item *item = q->count && take(q->ring[q->head], arg) ? q->ring[q->head] : NULL;
    if (item) {
        q->head = (q->head + 1) % q->cap;
        q->count--;
    }
    pthread_mutex_unlock(&q->mu);
    return item;
}
