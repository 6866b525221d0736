/* Cuts, the one way a model's layers are split into ranges: cuts[i] is the last layer of
 * range i, the last range ends at the model's last layer. Every driver (pipeline/,
 * sched/, stage/) checks its cuts and derives its ranges here. */
#include "mk_error.h"
#include "range/range.h"

mk_status mk_cuts_to_spans(const int64_t *cuts, size_t n_cuts, size_t n_layers, size_t max_ranges,
                           mk_layer_span *spans) {
    if (n_cuts && !cuts) return mk_fail(MK_ERR_INVALID_ARGUMENT, "%zu cuts given but the cut list is NULL", n_cuts);
    if (n_layers == 0) return mk_fail(MK_ERR_INVALID_RANGE, "a model without layers cannot be cut");
    /* too many: more ranges than the driver holds, or than the model has layers */
    if (n_cuts >= max_ranges || n_cuts >= n_layers)
        return mk_fail(MK_ERR_INVALID_ARGUMENT,
                       "%zu cuts make %zu ranges: at most %zu here (%zu layers, each range needs one)", n_cuts,
                       n_cuts + 1, max_ranges < n_layers ? max_ranges : n_layers,
                       n_layers);
    const int64_t last = (int64_t)n_layers - 1;
    int64_t start = 0;
    for (size_t i = 0; i < n_cuts; i++) {
        const int64_t c = cuts[i];
        if (c < 0 || c >= last)
            return mk_fail(MK_ERR_INVALID_RANGE,
                           "cut %zu is layer %lld, out of range: a cut is the last layer of a range before the last, "
                           "in [0, %lld)",
                           i, (long long)c, (long long)last);
        if (i > 0 && c == cuts[i - 1])
            return mk_fail(MK_ERR_INVALID_RANGE, "cut %zu repeats layer %lld: range %zu would be empty", i,
                           (long long)c, i);
        if (i > 0 && c < cuts[i - 1])
            return mk_fail(MK_ERR_INVALID_RANGE, "cuts are not ascending: cut %zu (layer %lld) follows layer %lld", i,
                           (long long)c, (long long)cuts[i - 1]);
        if (spans) spans[i] = (mk_layer_span){.start = start, .end = c};
        start = c + 1;
    }
    if (spans) spans[n_cuts] = (mk_layer_span){.start = start, .end = last};
    return MK_OK;
}
