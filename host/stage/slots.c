/* One sequence (KV cache) per live request on this rank, found by the request id that
 * every boundary carries. The table has as many slots as rank 0 keeps requests in flight. */
#include <stdlib.h>
#include <string.h>

#include "mk_error.h"
#include "stage/stage.h"

mk_status mk_slots_init(mk_slots *t, mk_range *range, size_t n) {
    memset(t, 0, sizeof *t);
    if (n == 0) return mk_fail(MK_ERR_INVALID_ARGUMENT, "stage: a request table needs at least one slot");
    t->slot = calloc(n, sizeof *t->slot);
    if (!t->slot) return mk_fail(MK_ERR_OUT_OF_MEMORY, "stage: out of memory for %zu sequence slots", n);
    t->range = range;
    t->n = n;
    return MK_OK;
}

void mk_slots_free(mk_slots *t) {
    for (size_t i = 0; t->slot && i < t->n; i++) mk_sequence_close(t->slot[i].seq);
    free(t->slot);
    memset(t, 0, sizeof *t);
}

static mk_stage_slot *mk_slots_find(mk_slots *t, const char *id) {
    for (size_t i = 0; i < t->n; i++)
        if (t->slot[i].request_id[0] && strcmp(t->slot[i].request_id, id) == 0) return &t->slot[i];
    return NULL;
}

mk_status mk_slots_get(mk_slots *t, const char *id, bool fresh, mk_sequence **seq) {
    if (!id[0] || strlen(id) >= sizeof t->slot[0].request_id)
        return mk_fail(MK_ERR_MISSING_FIELD, "a boundary without a usable request id ('%.80s')", id);
    mk_stage_slot *s = mk_slots_find(t, id);
    if (!fresh) {
        if (!s) return mk_fail(MK_ERR_POSITIONS_SHAPE, "no sequence of request '%s' on this rank (no prefill seen)", id);
    } else {
        if (s) return mk_fail(MK_ERR_POSITIONS_SHAPE, "a second prefill of request '%s'", id);
        for (size_t i = 0; i < t->n && !s; i++)
            if (!t->slot[i].request_id[0]) s = &t->slot[i];
        if (!s)
            return mk_fail(MK_ERR_KV_POOL_FULL, "request '%s': every one of the %zu sequence slots holds a request", id,
                           t->n);
        if (!s->seq) MK_TRY(mk_sequence_open(t->range, &s->seq)); /* a freed slot's was reset at its release */
        strcpy(s->request_id, id);
    }
    *seq = s->seq;
    return MK_OK;
}

void mk_slots_release(mk_slots *t, const char *id) {
    mk_stage_slot *s = mk_slots_find(t, id);
    if (!s) return;
    s->request_id[0] = '\0';
    (void)mk_sequence_reset(s->seq); /* its KV blocks back to the pool now, not at the slot's reuse */
}
