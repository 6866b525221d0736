/* The worker timeline as JSON: one record per step (worker, sequence, rows, start, end),
 * microseconds from the earliest start, for the benchmark harness to plot. */
#include <stdio.h>
#include <stdlib.h>

#include "mk_error.h"
#include "sched/sched.h"

mk_status mk_sched_timeline_json(const mk_sched *s, char **out, size_t *out_len) {
    mk_clear_error();
    if (!s || !out || !out_len) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_sched_timeline_json: NULL argument");
    *out = NULL;
    *out_len = 0;
    uint64_t base = UINT64_MAX;
    for (size_t i = 0; i < s->n_workers; i++)
        for (size_t k = 0; k < s->workers[i].timeline_len; k++)
            if (s->workers[i].timeline[k].start_ns < base) base = s->workers[i].timeline[k].start_ns;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return mk_fail(MK_ERR_OUT_OF_MEMORY, "timeline: out of memory");
    fprintf(f, "{\"workers\":%zu,\"steps\":[", s->n_workers);
    bool first = true;
    for (size_t i = 0; i < s->n_workers; i++)
        for (size_t k = 0; k < s->workers[i].timeline_len; k++) {
            const mk_timeline_record *r = &s->workers[i].timeline[k];
            fprintf(f, "%s\n{\"worker\":%zu,\"seq\":%llu,\"rows\":%u,\"start_us\":%.3f,\"end_us\":%.3f}",
                    first ? "" : ",", i, (unsigned long long)r->seq_id, r->rows, (double)(r->start_ns - base) / 1e3,
                    (double)(r->end_ns - base) / 1e3);
            first = false;
        }
    fprintf(f, "\n]}\n");
    if (fclose(f) != 0 || !text) {
        free(text);
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "timeline: out of memory");
    }
    *out = text;
    *out_len = len;
    return MK_OK;
}
