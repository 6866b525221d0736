/* The generation loop every driver shares: prompt in, greedy tokens out, stopping at the
 * model's end of generation or at a token budget, whichever comes first. Because it runs
 * on a pipeline, the stop is the same for every backend and every split. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "mk_error.h"

static double mk_gen_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

mk_status mk_pipeline_generate(mk_pipeline *p, const mk_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
                               size_t max_new, mk_token_callback callback, void *user, mk_generate_stats *stats) {
    mk_clear_error();
    mk_generate_stats st = {.n_prompt = n_prompt, .eog_token = -1};
    if (stats) *stats = st;
    if (!p || !prompt || n_prompt == 0)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_pipeline_generate: NULL pipeline or empty prompt");
    int32_t next = 0;
    mk_status s = MK_OK;
    for (size_t step = 0; s == MK_OK && st.n_generated < max_new; step++) {
        mk_tail_output *out = NULL;
        const double t0 = mk_gen_now();
        s = step == 0 ? mk_pipeline_step(p, prompt, n_prompt, &out) : mk_pipeline_step(p, &next, 1, &out);
        const double dt = mk_gen_now() - t0;
        if (s != MK_OK) {
            if (step == 0 && s == MK_ERR_CONTEXT_OVERFLOW) {
                char why[512];
                snprintf(why, sizeof why, "%s", mk_last_error());
                s = mk_fail(s, "the prompt of %zu tokens does not fit the context (%s)", n_prompt, why);
            }
            break;
        }
        if (step == 0) st.prefill_s = dt;
        else st.decode_s += dt;
        next = out->token_ids[0];
        if (mk_tokenizer_is_eog(tok, next)) {
            st.stopped_at_eog = true;
            st.eog_token = next;
            mk_tail_output_free(out);
            break;
        }
        st.n_generated++;
        if (callback) s = callback(user, next, out->logits, out->vocab);
        mk_tail_output_free(out);
    }
    if (stats) *stats = st;
    return s;
}
