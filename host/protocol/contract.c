/* The boundary contract's static parts: certified architectures, protocol tensor
 * requirements, roles from (start, end, total), the sampling contract and dtypes. */
#include <string.h>

#include "mk_error.h"

/* ============================================================= architectures == */

static const char *const mk_dense_llama_names[] = {
    MK_DENSE_LLAMA_ADAPTER, "llama", "LlamaForCausalLM", "LlamaModel"};

mk_status mk_certified_architecture(const char *name, mk_architecture *out) {
    mk_clear_error();
    if (name != NULL) {
        for (size_t i = 0; i < sizeof mk_dense_llama_names / sizeof *mk_dense_llama_names; i++) {
            if (strcmp(name, mk_dense_llama_names[i]) == 0) {
                if (out) {
                    out->adapter = MK_DENSE_LLAMA_ADAPTER;
                    out->boundary_tensor_name = MK_RESIDUAL_TENSOR_NAME;
                }
                return MK_OK;
            }
        }
    }
    return mk_fail(MK_ERR_UNCERTIFIED_ARCHITECTURE,
                   "uncertified architecture '%s': only dense-llama (aliases llama, "
                   "LlamaForCausalLM, LlamaModel) is certified; refusing to guess a tensor layout",
                   name ? name : "(null)");
}

bool mk_is_certified_architecture(const char *name) {
    if (name == NULL) return false;
    for (size_t i = 0; i < sizeof mk_dense_llama_names / sizeof *mk_dense_llama_names; i++)
        if (strcmp(name, mk_dense_llama_names[i]) == 0) return true;
    return false;
}

static const char *const mk_dense_required[] = {"residual_stream", NULL};
static const char *const mk_moe_required[] = {"hidden_states", "router_logits", NULL};
static const char *const mk_mla_required[] = {"hidden_states", "mla_position_state", NULL};

const char *const *mk_protocol_required_tensors(mk_protocol_arch arch) {
    switch (arch) {
        case MK_PROTOCOL_ARCH_DENSE: return mk_dense_required;
        case MK_PROTOCOL_ARCH_MOE: return mk_moe_required;
        case MK_PROTOCOL_ARCH_MLA: return mk_mla_required;
    }
    return NULL;
}

static const char *mk_protocol_arch_name(mk_protocol_arch arch) {
    switch (arch) {
        case MK_PROTOCOL_ARCH_DENSE: return "dense";
        case MK_PROTOCOL_ARCH_MOE: return "moe";
        case MK_PROTOCOL_ARCH_MLA: return "mla";
    }
    return "unknown";
}

mk_status mk_protocol_check_tensors(mk_protocol_arch arch, const char *const *names,
                                    size_t n_names) {
    mk_clear_error();
    const char *const *required = mk_protocol_required_tensors(arch);
    if (!required) return mk_fail(MK_ERR_ARCHITECTURE_MISMATCH, "unknown protocol architecture %d", (int)arch);
    if (!names && n_names)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_protocol_check_tensors: %zu names given but the list is NULL", n_names);
    for (const char *const *r = required; *r; r++) {
        bool present = false;
        for (size_t i = 0; i < n_names && !present; i++)
            present = names[i] && strcmp(names[i], *r) == 0;
        if (!present)
            return mk_fail(MK_ERR_REQUIRED_TENSORS, "%s boundary requires tensor '%s'",
                           mk_protocol_arch_name(arch), *r);
    }
    return MK_OK;
}

/* ===================================================================== roles == */

mk_status mk_role_for_range(int64_t start, int64_t end, int64_t total, mk_role *out) {
    mk_clear_error();
    if (!out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_role_for_range: NULL out");
    if (total <= 0) return mk_fail(MK_ERR_INVALID_RANGE, "model has no layers (total %lld)", (long long)total);
    if (start < 0 || end < start)
        return mk_fail(MK_ERR_INVALID_RANGE, "dense range [%lld, %lld] is empty or inverted",
                       (long long)start, (long long)end);
    if (end >= total)
        return mk_fail(MK_ERR_INVALID_RANGE, "dense range [%lld, %lld] lies outside the model (%lld layers)",
                       (long long)start, (long long)end, (long long)total);
    const bool head = start == 0, tail = end == total - 1;
    *out = head && tail ? MK_ROLE_FULL : head ? MK_ROLE_HEAD : tail ? MK_ROLE_TAIL : MK_ROLE_MIDDLE;
    return MK_OK;
}

bool mk_role_owns_embedding(mk_role role) { return role == MK_ROLE_HEAD || role == MK_ROLE_FULL; }
bool mk_role_owns_final_head(mk_role role) { return role == MK_ROLE_TAIL || role == MK_ROLE_FULL; }

const char *mk_role_name(mk_role role) {
    switch (role) {
        case MK_ROLE_HEAD: return "head";
        case MK_ROLE_MIDDLE: return "middle";
        case MK_ROLE_TAIL: return "tail";
        case MK_ROLE_FULL: return "full";
    }
    return "unknown";
}

/* ================================================================== sampling == */

static const char *const mk_sampling_names[] = {"greedy", "top_p", "top_k", "temperature"};

const char *mk_sampling_mode_name(mk_sampling_mode mode) {
    if ((unsigned)mode < sizeof mk_sampling_names / sizeof *mk_sampling_names) return mk_sampling_names[mode];
    return "unknown";
}

mk_status mk_sampling_contract_init(mk_sampling_contract *out, mk_sampling_mode mode) {
    mk_clear_error();
    if (!out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "sampling contract: out is NULL");
    if (mode != MK_SAMPLING_GREEDY)
        return mk_fail(MK_ERR_UNCERTIFIED_SAMPLING,
                       "sampling mode '%s' is not certified; only greedy is", mk_sampling_mode_name(mode));
    out->mode = mode;
    return MK_OK;
}

mk_status mk_sampling_contract_from_name(mk_sampling_contract *out, const char *mode) {
    mk_clear_error();
    for (size_t i = 0; mode && i < sizeof mk_sampling_names / sizeof *mk_sampling_names; i++)
        if (strcmp(mode, mk_sampling_names[i]) == 0) return mk_sampling_contract_init(out, (mk_sampling_mode)i);
    return mk_fail(MK_ERR_UNCERTIFIED_SAMPLING, "unknown sampling mode '%s'; only greedy is certified",
                   mode ? mode : "(null)");
}

/* ==================================================================== dtypes == */

size_t mk_dtype_size(mk_dtype dtype) {
    switch (dtype) {
        case MK_DTYPE_F32: return 4;
        case MK_DTYPE_F16: return 2;
        case MK_DTYPE_BF16: return 2;
        case MK_DTYPE_I32: return 4;
        case MK_DTYPE_I64: return 8;
        case MK_DTYPE_NATIVE: return 0;
    }
    return 0;
}

const char *mk_dtype_name(mk_dtype dtype) {
    switch (dtype) {
        case MK_DTYPE_F32: return "f32";
        case MK_DTYPE_F16: return "f16";
        case MK_DTYPE_BF16: return "bf16";
        case MK_DTYPE_I32: return "i32";
        case MK_DTYPE_I64: return "i64";
        case MK_DTYPE_NATIVE: return "native";
    }
    return "unknown";
}

/* ================================================================== backends == */

mk_backend_config mk_backend_config_default(mk_backend_kind kind) {
    mk_backend_config c = {.struct_size = sizeof c, .kind = kind, .device = 0, .weight_dtype = MK_DTYPE_F32, .speed_mode = false, .threads = 0,
                            .kv_dtype = MK_DTYPE_F32};
    return c;
}

mk_status mk_backend_kind_from_name(const char *name, mk_backend_kind *out) {
    mk_clear_error();
    if (name && strcmp(name, "cpu") == 0) {
        *out = MK_BACKEND_CPU;
        return MK_OK;
    }
    if (name && strcmp(name, "cuda") == 0) {
        *out = MK_BACKEND_CUDA;
        return MK_OK;
    }
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "unknown backend '%s' (cpu, cuda)", name ? name : "(null)");
}
