/* The public API as a C program sees it: include/meshkern.h compiled as strict C11 and
 * linked against libmeshkern.so alone (only MK_API symbols are exported). Runs a random
 * model whole and split through the wire and requires bit-identical logits. */
#include <stdio.h>
#include <string.h>

#include "meshkern.h"

static int failures = 0;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "c_api: %s failed (%s:%d): %s\n", #cond, __FILE__, __LINE__, \
                    mk_last_error());                                                \
            failures++;                                                              \
        }                                                                            \
    } while (0)

static int run(const mk_model *model, const int64_t *cuts, size_t n_cuts, float *logits /* [vocab] */) {
    mk_pipeline *p = NULL;
    const mk_seam_options wire = mk_seam_options_default(MK_SEAM_WIRE);
    mk_pipeline_options po = mk_pipeline_options_default();
    po.cuts = cuts;
    po.n_cuts = n_cuts;
    po.seam = &wire;
    if (mk_pipeline_create(model, &po, &p) != MK_OK) return -1;
    const int32_t prompt[] = {3, 14, 15, 9, 26};
    mk_tail_output *out = NULL;
    int token = -1;
    if (mk_pipeline_step(p, prompt, 5, &out) == MK_OK) {
        memcpy(logits, out->logits, out->vocab * sizeof(float));
        token = out->token_ids[0];
    }
    mk_tail_output_free(out);
    mk_pipeline_free(p);
    return token;
}

int main(void) {
    mk_architecture arch;
    CHECK(mk_certified_architecture("LlamaForCausalLM", &arch) == MK_OK);
    CHECK(mk_certified_architecture("mixtral", &arch) == MK_ERR_UNCERTIFIED_ARCHITECTURE);
    CHECK(strcmp(mk_status_name(MK_ERR_SEAM_MISMATCH), "MK_ERR_SEAM_MISMATCH") == 0);

    const mk_hparams hp = mk_hparams_seed_default();
    mk_model *model = NULL;
    CHECK(mk_model_create_random(&hp, 99, NULL, &model) == MK_OK);
    if (model) {
        float whole[48], split[48];
        const int64_t cuts[] = {1, 3};
        const int a = run(model, NULL, 0, whole), b = run(model, cuts, 2, split);
        CHECK(a >= 0 && a == b);
        CHECK(memcmp(whole, split, sizeof whole) == 0);
    }
    mk_model_free(model);
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
    return failures ? 1 : 0;
}
