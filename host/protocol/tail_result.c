/* The protocol's TailResult: request/recipe identity, sampling parameters and exactly one
 * output (a sampled token id or a logits bundle). Built and validated here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshkern.pb-c.h"
#include "mk_error.h"
#include "protocol/tensor_msg.h"

static mk_status mk_identity_check(const mk_request_identity *id) {
    if (!id) return mk_fail(MK_ERR_INVALID_ARGUMENT, "tail result: identity is NULL");
    if (id->architecture != MK_PROTOCOL_ARCH_DENSE)
        return mk_fail(MK_ERR_TAIL_RESULT, "tail result architecture does not match certified adapter");
    if (!id->request_id || !id->request_id[0] || !id->runtime_recipe_digest || !id->runtime_recipe_digest[0])
        return mk_fail(MK_ERR_TAIL_RESULT, "tail result requires exact request and recipe identity");
    return MK_OK;
}

static char *mk_or_empty(const char *s) { return (char *)(s ? s : ""); }

static mk_status mk_tail_result_pack(const mk_request_identity *identity, const mk_sampling_params *sampling,
                                     Meshkern__V1__TailResult *msg, uint8_t **out, size_t *out_len) {
    MK_TRY(mk_identity_check(identity));
    if (!sampling || !out || !out_len) return mk_fail(MK_ERR_INVALID_ARGUMENT, "tail result: NULL argument");
    Meshkern__V1__RequestRecipeIdentity id = MESHKERN__V1__REQUEST_RECIPE_IDENTITY__INIT;
    id.request_id = mk_or_empty(identity->request_id);
    id.runtime_recipe_digest = mk_or_empty(identity->runtime_recipe_digest);
    id.chat_template_id = mk_or_empty(identity->chat_template_id);
    id.chat_template_version = mk_or_empty(identity->chat_template_version);
    id.reasoning_mode = mk_or_empty(identity->reasoning_mode);
    id.architecture = MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_DENSE;
    Meshkern__V1__SamplingParameters sp = MESHKERN__V1__SAMPLING_PARAMETERS__INIT;
    sp.temperature = sampling->temperature;
    sp.top_p = sampling->top_p;
    sp.top_k = sampling->top_k;
    sp.seed = sampling->seed;
    sp.greedy = sampling->temperature == 0.0f;
    msg->identity = &id;
    msg->sampling = &sp;
    const size_t len = meshkern__v1__tail_result__get_packed_size(msg);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return mk_fail(MK_ERR_OUT_OF_MEMORY, "tail result: out of memory");
    meshkern__v1__tail_result__pack(msg, buf);
    /* Round-trip through the validator: what we emit is what a peer accepts. */
    const mk_status s = mk_tail_result_validate(buf, len, NULL);
    if (s != MK_OK) {
        free(buf);
        return s;
    }
    *out = buf;
    *out_len = len;
    return MK_OK;
}

mk_status mk_tail_result_pack_token(const mk_request_identity *identity, const mk_sampling_params *sampling,
                                    int64_t token_id, uint8_t **out, size_t *out_len) {
    mk_clear_error();
    if (token_id < 0) return mk_fail(MK_ERR_TAIL_RESULT, "sampled token id must be non-negative (got %lld)", (long long)token_id);
    Meshkern__V1__TailResult msg = MESHKERN__V1__TAIL_RESULT__INIT;
    msg.output_case = MESHKERN__V1__TAIL_RESULT__OUTPUT_SAMPLED_TOKEN_ID;
    msg.sampled_token_id = token_id;
    return mk_tail_result_pack(identity, sampling, &msg, out, out_len);
}

mk_status mk_tail_result_pack_logits(const mk_request_identity *identity, const mk_sampling_params *sampling,
                                     const float *logits, size_t batch, size_t vocab, uint8_t **out, size_t *out_len) {
    mk_clear_error();
    if (!logits || batch == 0 || vocab == 0)
        return mk_fail(MK_ERR_TAIL_RESULT, "logits tail output must carry a non-empty [batch, vocab] tensor");
    if (batch > SIZE_MAX / sizeof(float) / vocab) return mk_fail(MK_ERR_SHAPE_OVERFLOW, "logits shape overflows");
    uint64_t shape[2] = {batch, vocab};
    Meshkern__V1__Tensor t = MESHKERN__V1__TENSOR__INIT;
    mk_tensor_msg_describe(&t, "logits", MESHKERN__V1__DTYPE__DTYPE_FLOAT32, shape, 2, logits,
                            batch * vocab * sizeof(float));
    Meshkern__V1__Tensor *tensors[1] = {&t};
    Meshkern__V1__TensorBundle bundle = MESHKERN__V1__TENSOR_BUNDLE__INIT;
    bundle.schema_version = MK_BOUNDARY_SCHEMA_VERSION;
    bundle.architecture = MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_DENSE;
    bundle.adapter = (char *)MK_DENSE_LLAMA_ADAPTER;
    bundle.boundary_point = (char *)"tail_logits";
    bundle.n_tensors = 1;
    bundle.tensors = tensors;
    bundle.runtime_recipe_digest = mk_or_empty(identity ? identity->runtime_recipe_digest : NULL);
    bundle.request_id = mk_or_empty(identity ? identity->request_id : NULL);
    Meshkern__V1__TailResult msg = MESHKERN__V1__TAIL_RESULT__INIT;
    msg.output_case = MESHKERN__V1__TAIL_RESULT__OUTPUT_LOGITS;
    msg.logits = &bundle;
    return mk_tail_result_pack(identity, sampling, &msg, out, out_len);
}

static mk_status mk_tail_result_check(const Meshkern__V1__TailResult *msg, mk_tail_result_info *info) {
    const Meshkern__V1__RequestRecipeIdentity *id = msg->identity;
    if (!id) return mk_fail(MK_ERR_MISSING_FIELD, "tail result is missing field identity");
    if (!msg->sampling) return mk_fail(MK_ERR_MISSING_FIELD, "tail result is missing field sampling");
    if (!id->request_id[0] || !id->runtime_recipe_digest[0])
        return mk_fail(MK_ERR_TAIL_RESULT, "tail result requires exact request and recipe identity");
    if (id->architecture != MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_DENSE)
        return mk_fail(MK_ERR_TAIL_RESULT, "tail result architecture does not match certified adapter");
    mk_tail_result_info local;
    /* Exact identity: an id that does not fit the info is refused, never truncated. */
    if (strlen(id->request_id) >= sizeof local.request_id ||
        strlen(id->runtime_recipe_digest) >= sizeof local.runtime_recipe_digest)
        return mk_fail(MK_ERR_TAIL_RESULT, "tail result request id or recipe digest is too long (%zu / %zu bytes)",
                       strlen(id->request_id), strlen(id->runtime_recipe_digest));
    memset(&local, 0, sizeof local);
    switch (msg->output_case) {
        case MESHKERN__V1__TAIL_RESULT__OUTPUT_SAMPLED_TOKEN_ID:
            if (msg->sampled_token_id < 0) return mk_fail(MK_ERR_TAIL_RESULT, "sampled token id must be non-negative");
            local.kind = MK_TAIL_OUTPUT_TOKEN;
            local.token_id = msg->sampled_token_id;
            break;
        case MESHKERN__V1__TAIL_RESULT__OUTPUT_LOGITS: {
            const Meshkern__V1__TensorBundle *b = msg->logits;
            if (!b) return mk_fail(MK_ERR_MISSING_FIELD, "tail result is missing field logits");
            /* The logits bundle is validated before it is trusted: an incompatible boundary
             * schema or another request's / recipe's logits are refused. */
            if (b->schema_version != MK_BOUNDARY_SCHEMA_VERSION)
                return mk_fail(MK_ERR_SCHEMA_VERSION, "logits bundle schema version %u is not the supported version %u",
                               b->schema_version, MK_BOUNDARY_SCHEMA_VERSION);
            if (b->architecture != MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_DENSE)
                return mk_fail(MK_ERR_TAIL_RESULT, "logits bundle architecture does not match certified adapter");
            if (strcmp(b->runtime_recipe_digest, id->runtime_recipe_digest) != 0 ||
                strcmp(b->request_id, id->request_id) != 0)
                return mk_fail(MK_ERR_TAIL_RESULT,
                               "logits bundle identity does not match the tail result's exact request and recipe identity");
            if (b->n_tensors != 1) return mk_fail(MK_ERR_TAIL_RESULT, "logits tail output must carry exactly one tensor");
            uint64_t dims[2];
            size_t rank = 0;
            MK_TRY(mk_tensor_msg_check(b->tensors[0], "logits", dims, 2, &rank));
            if (rank != 2 || b->tensors[0]->dtype != MESHKERN__V1__DTYPE__DTYPE_FLOAT32)
                return mk_fail(MK_ERR_TAIL_RESULT, "logits tail output must be float32 [batch, vocab]");
            local.kind = MK_TAIL_OUTPUT_LOGITS;
            local.batch = (size_t)dims[0];
            local.vocab = (size_t)dims[1];
            break;
        }
        default: return mk_fail(MK_ERR_TAIL_RESULT, "tail result carries no output (exactly one is required)");
    }
    local.greedy = msg->sampling->greedy != 0;
    local.architecture = MK_PROTOCOL_ARCH_DENSE;
    snprintf(local.request_id, sizeof local.request_id, "%s", id->request_id);
    snprintf(local.runtime_recipe_digest, sizeof local.runtime_recipe_digest, "%s", id->runtime_recipe_digest);
    if (info) *info = local;
    return MK_OK;
}

mk_status mk_tail_result_validate(const uint8_t *bytes, size_t len, mk_tail_result_info *info) {
    mk_clear_error();
    if (!bytes && len) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_tail_result_validate: bytes is NULL");
    Meshkern__V1__TailResult *msg = meshkern__v1__tail_result__unpack(NULL, len, bytes);
    if (!msg) return mk_fail(MK_ERR_WIRE_DECODE, "bytes (%zu) are not a valid TailResult message", len);
    const mk_status s = mk_tail_result_check(msg, info);
    meshkern__v1__tail_result__free_unpacked(msg, NULL);
    return s;
}
