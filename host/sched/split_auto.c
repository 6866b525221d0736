/* Balanced cuts (--split auto). A stage's cost is the weight elements one decode step
 * reads: its layers' matrices and norms, plus, on the head, the one embedding row each
 * token gathers (a lookup, not a pass over the table) and, on the tail, the final norm and
 * the lm_head (for SmolLM2 the 49152 x 576 lm_head weighs as much as eight layers). The
 * weight dtype is the same for every matrix, so elements rank stages as bytes do.
 * Attention over the KV cache grows with the context and is not counted. */
#include <float.h>
#include <stdlib.h>

#include "mk_error.h"
#include "sched/sched.h"

mk_status mk_split_costs(const mk_model *model, double *layer_cost, double *head_extra, double *tail_extra) {
    const mk_hparams *hp = mk_model_hparams(model);
    const double hidden = (double)hp->hidden, q_dim = (double)(hp->n_heads * hp->head_dim),
                 kv_dim = (double)(hp->n_kv_heads * hp->head_dim), ffn = (double)hp->intermediate;
    const double layer = hidden * q_dim * 2 + hidden * kv_dim * 2 + hidden * ffn * 3 + hidden * 2;
    for (size_t l = 0; l < hp->n_layers; l++) layer_cost[l] = layer;
    *head_extra = hidden;
    *tail_extra = hidden + (double)hp->vocab * hidden;
    return MK_OK;
}

/* Exact minimax partition by dynamic programming over (stages, prefix): best[k][j] is the
 * smallest possible largest-stage cost of layers [0, j) cut into k stages. O(k n^2) for a
 * few hundred layers at most. */
mk_status mk_choose_cuts(const double *cost, size_t n, double head_extra, double tail_extra, size_t k,
                         int64_t *cuts) {
    if (!cost || (k > 1 && !cuts)) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_choose_cuts: NULL argument");
    if (k == 0 || k > n)
        return mk_fail(MK_ERR_INVALID_RANGE, "%zu ranges over %zu layers: each range needs a layer", k, n);
    double *prefix = malloc((n + 1) * sizeof *prefix);
    double *best = malloc((k + 1) * (n + 1) * sizeof *best); /* [k + 1][n + 1] */
    size_t *from = malloc((k + 1) * (n + 1) * sizeof *from);  /* where stage k's layers begin */
    if (!prefix || !best || !from) {
        free(prefix);
        free(best);
        free(from);
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "split: out of memory");
    }
#define BEST(a, b) best[(a) * (n + 1) + (b)]
#define FROM(a, b) from[(a) * (n + 1) + (b)]
    prefix[0] = 0;
    for (size_t l = 0; l < n; l++) prefix[l + 1] = prefix[l] + cost[l];
    for (size_t j = 0; j <= n; j++) BEST(1, j) = prefix[j] + head_extra + (k == 1 ? tail_extra : 0);
    for (size_t a = 2; a <= k; a++)
        for (size_t j = a; j <= n; j++) {
            BEST(a, j) = DBL_MAX;
            for (size_t i = a - 1; i < j; i++) { /* stage a holds layers [i, j) */
                const double stage = prefix[j] - prefix[i] + (a == k && j == n ? tail_extra : 0);
                const double worst = BEST(a - 1, i) > stage ? BEST(a - 1, i) : stage;
                if (worst < BEST(a, j)) {
                    BEST(a, j) = worst;
                    FROM(a, j) = i;
                }
            }
        }
    size_t j = n;
    for (size_t a = k; a >= 2; a--) {
        j = FROM(a, j);
        cuts[a - 2] = (int64_t)j - 1;
    }
#undef BEST
#undef FROM
    free(prefix);
    free(best);
    free(from);
    return MK_OK;
}

mk_status mk_split_auto(const mk_model *model, size_t n_ranges, int64_t *cuts, double *shares) {
    mk_clear_error();
    if (!model || (n_ranges > 1 && !cuts)) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_split_auto: NULL argument");
    const size_t n = mk_model_hparams(model)->n_layers;
    double *cost = malloc((n ? n : 1) * sizeof *cost);
    if (!cost) return mk_fail(MK_ERR_OUT_OF_MEMORY, "split: out of memory");
    double head = 0, tail = 0;
    mk_status s = mk_split_costs(model, cost, &head, &tail);
    if (s == MK_OK) s = mk_choose_cuts(cost, n, head, tail, n_ranges, cuts);
    if (s == MK_OK && shares) {
        double total = head + tail;
        for (size_t l = 0; l < n; l++) total += cost[l];
        size_t layer = 0;
        for (size_t i = 0; i < n_ranges; i++) {
            const size_t end = i + 1 < n_ranges ? (size_t)cuts[i] : n - 1;
            double c = (i == 0 ? head : 0) + (i + 1 == n_ranges ? tail : 0);
            for (; layer <= end; layer++) c += cost[layer];
            shares[i] = c / total;
        }
    }
    free(cost);
    return s;
}
