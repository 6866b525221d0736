/* The single-process pipeline driver: ranges in a chain, the residual carried across
 * each seam by a transport (local device-to-device copy, wire pack/unpack, or a stream
 * socket), as boundaries that stay in each range's backend memory. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mk_error.h"
#include "core/options.h"
#include "range/range.h"

struct mk_pipeline {
    size_t n_ranges;
    mk_range **ranges;       /* [n_ranges] */
    mk_sequence **sequences; /* [n_ranges] */
    mk_boundary **outs;      /* [n_ranges - 1]: range i's output, in range i's memory */
    mk_boundary **ins;       /* [n_ranges - 1]: range i+1's input, in range i+1's memory */
    mk_seam **tx, **rx;      /* [n_ranges - 1]: the two ends of seam i */
    double seam_seconds;
    double *range_seconds;   /* [n_ranges] wall time per range (its forward, and the seam into it), all steps */
    size_t *step_lengths;    /* [n_ranges] each sequence's length when the current step began */
};

static double mk_pipeline_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

mk_pipeline_options mk_pipeline_options_default(void) {
    mk_pipeline_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    return o;
}

mk_status mk_pipeline_create(const mk_model *model, const mk_pipeline_options *options, mk_pipeline **out) {
    mk_clear_error();
    if (!model || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_pipeline_create: NULL argument");
    *out = NULL;
    /* The caller's structs, each by its own struct_size; what is not given has its default. */
    mk_pipeline_options o = mk_pipeline_options_default();
    if (options)
        MK_TRY(mk_options_take(&o, sizeof o, MK_PIPELINE_OPTIONS_V1_SIZE, options, "mk_pipeline_options"));
    mk_range_options placed = mk_range_options_default();
    if (o.range) MK_TRY(mk_options_take(&placed, sizeof placed, MK_RANGE_OPTIONS_V1_SIZE, o.range, "mk_range_options"));
    mk_seam_options seam = mk_seam_options_default(MK_SEAM_LOCAL);
    if (o.seam) MK_TRY(mk_options_take(&seam, sizeof seam, MK_SEAM_OPTIONS_V1_SIZE, o.seam, "mk_seam_options"));
    if (o.n_devices && !o.devices)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_pipeline_create: n_devices set but devices is NULL");
    if (o.devices && o.n_devices != o.n_cuts + 1)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_pipeline_create: %zu devices for %zu ranges (one per range)",
                       o.n_devices, o.n_cuts + 1);
    const size_t n_layers = mk_model_hparams(model)->n_layers;
    mk_layer_span *spans = malloc((o.n_cuts + 1) * sizeof *spans); /* [n_cuts + 1] */
    if (!spans) return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory");
    const mk_status cut = mk_cuts_to_spans(o.cuts, o.n_cuts, n_layers, n_layers, spans);
    if (cut != MK_OK) {
        free(spans);
        return cut;
    }
    mk_pipeline *p = calloc(1, sizeof *p);
    if (!p) {
        free(spans);
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory");
    }
    p->n_ranges = o.n_cuts + 1;
    p->ranges = calloc(p->n_ranges, sizeof *p->ranges);
    p->sequences = calloc(p->n_ranges, sizeof *p->sequences);
    p->range_seconds = calloc(p->n_ranges, sizeof *p->range_seconds);
    p->step_lengths = calloc(p->n_ranges, sizeof *p->step_lengths);
    p->outs = calloc(p->n_ranges, sizeof *p->outs);
    p->ins = calloc(p->n_ranges, sizeof *p->ins);
    p->tx = calloc(p->n_ranges, sizeof *p->tx);
    p->rx = calloc(p->n_ranges, sizeof *p->rx);
    mk_status s = p->ranges && p->sequences && p->outs && p->ins && p->tx && p->rx && p->range_seconds && p->step_lengths
                      ? MK_OK
                      : mk_fail(MK_ERR_OUT_OF_MEMORY, "pipeline: out of memory");
    for (size_t i = 0; s == MK_OK && i < p->n_ranges; i++) {
        if (o.devices) placed.backend.device = o.devices[i];
        s = mk_range_create(model, spans[i].start, spans[i].end, &placed, &p->ranges[i]);
        if (s == MK_OK) s = mk_sequence_open(p->ranges[i], &p->sequences[i]);
    }
    free(spans);
    for (size_t i = 0; s == MK_OK && i + 1 < p->n_ranges; i++) {
        s = mk_boundary_create(p->ranges[i], &p->outs[i]);
        if (s == MK_OK) s = mk_boundary_create(p->ranges[i + 1], &p->ins[i]);
        if (s == MK_OK) s = mk_seam_pair(&seam, p->ranges[i], p->ranges[i + 1], &p->tx[i], &p->rx[i]);
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
        /* seams and boundaries before their ranges */
        if (p->tx) mk_seam_free(p->tx[i]);
        if (p->rx) mk_seam_free(p->rx[i]);
        if (p->outs) mk_boundary_free(p->outs[i]);
        if (p->ins) mk_boundary_free(p->ins[i]);
    }
    for (size_t i = 0; i < p->n_ranges; i++) {
        if (p->sequences) mk_sequence_close(p->sequences[i]);
        if (p->ranges) mk_range_free(p->ranges[i]);
    }
    free(p->tx);
    free(p->rx);
    free(p->outs);
    free(p->ins);
    free(p->sequences);
    free(p->ranges);
    free(p->range_seconds);
    free(p->step_lengths);
    free(p);
}

size_t mk_pipeline_range_count(const mk_pipeline *p) { return p ? p->n_ranges : 0; }
mk_range *mk_pipeline_range(mk_pipeline *p, size_t i) { return p && i < p->n_ranges ? p->ranges[i] : NULL; }
double mk_pipeline_range_seconds(const mk_pipeline *p, size_t i) {
    return p && i < p->n_ranges ? p->range_seconds[i] : 0.0;
}

size_t mk_pipeline_seam_bytes(const mk_pipeline *p) {
    size_t bytes = 0;
    for (size_t i = 0; p && i + 1 < p->n_ranges; i++) bytes += mk_seam_bytes(p->rx[i]);
    return bytes;
}

double mk_pipeline_seam_seconds(const mk_pipeline *p) {
    return p ? p->seam_seconds : 0.0;
}

/* Carry range i's output across seam i into range i+1's input. */
static mk_status mk_pipeline_cross(mk_pipeline *p, size_t i) {
    const double t0 = mk_pipeline_now();
    mk_status s = mk_seam_send(p->tx[i], p->outs[i]);
    if (s == MK_OK) s = mk_seam_recv(p->rx[i], p->sequences[i + 1], p->ins[i]);
    /* Collect the write's status either way: a stream sender finishes in its own thread. */
    if (s == MK_OK) s = mk_seam_send_wait(p->tx[i]);
    else (void)mk_seam_send_wait(p->tx[i]);
    p->seam_seconds += mk_pipeline_now() - t0;
    return s;
}

mk_status mk_pipeline_step(mk_pipeline *p, const int32_t *tokens, size_t n_tokens, mk_tail_output **out) {
    mk_clear_error();
    if (!p || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_pipeline_step: NULL argument");
    *out = NULL;
    /* A step is all or nothing: if a later range fails, the earlier ranges' sequences
     * are rewound, so the same step can be retried and the ranges stay in step. */
    size_t *lengths = p->step_lengths;
    for (size_t i = 0; i < p->n_ranges; i++) lengths[i] = mk_sequence_length(p->sequences[i]);
    mk_status s = MK_OK;
    for (size_t i = 0; s == MK_OK && i < p->n_ranges; i++) {
        const bool first = i == 0, last = i + 1 == p->n_ranges;
        const double t0 = mk_pipeline_now();
        s = mk_range_forward_boundary(p->ranges[i], p->sequences[i], first ? tokens : NULL, first ? n_tokens : 0,
                                      first ? NULL : p->ins[i - 1], NULL, last ? NULL : p->outs[i], last ? out : NULL);
        p->range_seconds[i] += mk_pipeline_now() - t0;
        if (s == MK_OK && !last) {
            const double t1 = mk_pipeline_now();
            s = mk_pipeline_cross(p, i);
            p->range_seconds[i + 1] += mk_pipeline_now() - t1;
        }
    }
    if (s != MK_OK)
        for (size_t i = 0; i < p->n_ranges; i++) (void)mk_sequence_rewind(p->sequences[i], lengths[i]);
    return s;
}

mk_status mk_pipeline_reset(mk_pipeline *p) {
    mk_clear_error();
    if (!p) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_pipeline_reset: NULL pipeline");
    for (size_t i = 0; i < p->n_ranges; i++) MK_TRY(mk_sequence_reset(p->sequences[i]));
    return MK_OK;
}
