/* The single-process pipeline driver: ranges in a chain, the residual carried across each
 * seam as a bundle (packed and unpacked when through_wire). */
#include <stdlib.h>
#include <time.h>

#include "mk_error.h"
#include "range.h"

struct mk_pipeline {
    size_t n_ranges;
    mk_range **ranges;       /* [n_ranges] */
    mk_sequence **sequences; /* [n_ranges] */
    bool through_wire;
    size_t seam_bytes;
    double *range_seconds;   /* [n_ranges] wall time per range, all steps */
};

static double mk_pipeline_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

mk_status mk_pipeline_create(const mk_model *model, const int64_t *cuts, size_t n_cuts, const mk_range_options *options,
                             bool through_wire, mk_pipeline **out) {
    mk_clear_error();
    if (!model || !out || (n_cuts && !cuts)) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_pipeline_create: NULL argument");
    *out = NULL;
    const int64_t n_layers = (int64_t)mk_model_hparams(model)->n_layers;
    for (size_t i = 0; i < n_cuts; i++)
        if (cuts[i] < 0 || cuts[i] >= n_layers - 1 || (i > 0 && cuts[i] <= cuts[i - 1]))
            return mk_fail(MK_ERR_INVALID_RANGE,
                           "split point %lld is invalid: cuts must ascend within [0, %lld) (the last layer of each "
                           "non-final range)",
                           (long long)cuts[i], (long long)(n_layers - 1));
    mk_pipeline *p = calloc(1, sizeof *p);
    if (!p) return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory");
    p->n_ranges = n_cuts + 1;
    p->through_wire = through_wire;
    p->ranges = calloc(p->n_ranges, sizeof *p->ranges);
    p->sequences = calloc(p->n_ranges, sizeof *p->sequences);
    p->range_seconds = calloc(p->n_ranges, sizeof *p->range_seconds);
    mk_status s = p->ranges && p->sequences && p->range_seconds ? MK_OK : mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory");
    int64_t start = 0;
    for (size_t i = 0; s == MK_OK && i < p->n_ranges; i++) {
        const int64_t end = i < n_cuts ? cuts[i] : n_layers - 1;
        s = mk_range_create(model, start, end, options, &p->ranges[i]);
        if (s == MK_OK) s = mk_sequence_open(p->ranges[i], &p->sequences[i]);
        start = end + 1;
    }
    if (s != MK_OK) {
        mk_pipeline_free(p);
        return s;
    }
    *out = p;
    return MK_OK;
}

void mk_pipeline_free(mk_pipeline *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_ranges; i++) {
        if (p->sequences) mk_sequence_close(p->sequences[i]);
        if (p->ranges) mk_range_free(p->ranges[i]);
    }
    free(p->sequences);
    free(p->ranges);
    free(p->range_seconds);
    free(p);
}

size_t mk_pipeline_range_count(const mk_pipeline *p) { return p ? p->n_ranges : 0; }
mk_range *mk_pipeline_range(mk_pipeline *p, size_t i) { return p && i < p->n_ranges ? p->ranges[i] : NULL; }
size_t mk_pipeline_seam_bytes(const mk_pipeline *p) { return p ? p->seam_bytes : 0; }
double mk_pipeline_range_seconds(const mk_pipeline *p, size_t i) {
    mk_clear_error();
    return p && i < p->n_ranges ? p->range_seconds[i] : 0.0;
}

/* Ship a bundle across a seam: pack to bytes and unpack them, as a peer would. */
static mk_status mk_pipeline_cross(mk_pipeline *p, mk_bundle **bundle) {
    if (!p->through_wire) return MK_OK;
    uint8_t *bytes = NULL;
    size_t len = 0;
    MK_TRY(mk_bundle_pack(*bundle, &bytes, &len));
    mk_bundle *received = NULL;
    const mk_status s = mk_bundle_unpack(bytes, len, &received);
    mk_buffer_free(bytes);
    if (s != MK_OK) return s;
    p->seam_bytes += len;
    mk_bundle_free(*bundle);
    *bundle = received;
    return MK_OK;
}

mk_status mk_pipeline_step(mk_pipeline *p, const int32_t *tokens, size_t n_tokens, mk_tail_output **out) {
    mk_clear_error();
    if (!p || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_pipeline_step: NULL argument");
    *out = NULL;
    /* A step is all or nothing: if a later range fails, the earlier ranges' sequences
     * are rewound, so the same step can be retried and the ranges stay in step. */
    size_t *lengths = malloc(p->n_ranges * sizeof *lengths); /* [n_ranges] */
    if (!lengths) return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory");
    for (size_t i = 0; i < p->n_ranges; i++) lengths[i] = mk_sequence_length(p->sequences[i]);
    mk_bundle *carried = NULL;
    mk_status s = MK_OK;
    for (size_t i = 0; s == MK_OK && i < p->n_ranges; i++) {
        const bool last = i + 1 == p->n_ranges;
        const double t0 = mk_pipeline_now();
        if (i > 0) s = mk_pipeline_cross(p, &carried);
        mk_bundle *emitted = NULL;
        if (s == MK_OK)
            s = mk_range_forward(p->ranges[i], p->sequences[i], i == 0 ? tokens : NULL, i == 0 ? n_tokens : 0, carried,
                                 NULL, last ? NULL : &emitted, last ? out : NULL);
        mk_bundle_free(carried);
        carried = emitted;
        p->range_seconds[i] += mk_pipeline_now() - t0;
    }
    mk_bundle_free(carried);
    if (s != MK_OK)
        for (size_t i = 0; i < p->n_ranges; i++) (void)mk_sequence_rewind(p->sequences[i], lengths[i]);
    free(lengths);
    return s;
}

mk_status mk_pipeline_reset(mk_pipeline *p) {
    mk_clear_error();
    if (!p) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_pipeline_reset: NULL pipeline");
    for (size_t i = 0; i < p->n_ranges; i++) MK_TRY(mk_sequence_reset(p->sequences[i]));
    return MK_OK;
}
