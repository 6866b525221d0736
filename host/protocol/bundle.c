/* Boundary bundles: construction, the protobuf wire form, and its validation.
 * unpack trusts nothing it reads: every count, shape and length is checked against the
 * bytes actually present before any array is built. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshkern.pb-c.h"
#include "mk_error.h"
#include "core/mk_size.h"
#include "protocol/boundary.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include "protocol/bundle_codec.h"
#include "protocol/tensor_msg.h"

#define MK_MAX_RANK 8

/* =============================================================== lifecycle == */

void mk_boundary_header_defaults(mk_boundary_header *h) {
    memset(h, 0, sizeof *h);
    h->schema_version = MK_BOUNDARY_SCHEMA_VERSION;
    h->architecture = MK_PROTOCOL_ARCH_DENSE;
    snprintf(h->adapter, sizeof h->adapter, "%s", MK_DENSE_LLAMA_ADAPTER);
    snprintf(h->tensor_name, sizeof h->tensor_name, "%s", MK_RESIDUAL_TENSOR_NAME);
    snprintf(h->boundary_point, sizeof h->boundary_point, "%s", MK_BOUNDARY_POINT);
    h->dtype = MK_DTYPE_F32;
    h->batch = 1;
}

mk_status mk_bundle_create(size_t batch, size_t seq, size_t hidden, mk_bundle **out) {
    mk_clear_error();
    if (!out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_bundle_create: out is NULL");
    *out = NULL;
    if (batch == 0 || seq == 0 || hidden == 0)
        return mk_fail(MK_ERR_SHAPE, "bundle shape [%zu, %zu, %zu] has a zero dimension", batch, seq, hidden);
    size_t rows, elems;
    if (!mk_size_mul(batch, seq, &rows) || !mk_size_mul(rows, hidden, &elems) || elems > SIZE_MAX / sizeof(float))
        return mk_fail(MK_ERR_SHAPE_OVERFLOW, "bundle shape [%zu, %zu, %zu] overflows", batch, seq, hidden);
    mk_bundle *b = calloc(1, sizeof *b);
    if (!b) return mk_fail(MK_ERR_OUT_OF_MEMORY, "bundle: out of memory");
    b->residual = calloc(elems, sizeof(float));
    b->positions = calloc(rows, sizeof(int32_t));
    if (!b->residual || !b->positions) {
        mk_bundle_free(b);
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "bundle: out of memory for [%zu, %zu, %zu]", batch, seq, hidden);
    }
    mk_boundary_header_defaults(&b->h);
    b->h.batch = batch;
    b->h.rows = seq;
    b->h.hidden = hidden;
    b->cap_floats = elems;
    b->cap_rows = rows;
    *out = b;
    return MK_OK;
}

void mk_bundle_free(mk_bundle *b) {
    if (!b) return;
    if (b->storage) {
        meshkern__v1__tensor_bundle__free_unpacked(b->storage, NULL);
    } else {
        free(b->residual);
        free(b->positions);
    }
    free(b);
}

mk_status mk_bundle_clone(const mk_bundle *src, mk_bundle **out) {
    mk_clear_error();
    if (!src) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_bundle_clone: src is NULL");
    MK_TRY(mk_bundle_create(src->h.batch, src->h.rows, src->h.hidden, out));
    mk_bundle *b = *out;
    b->h = src->h;
    memcpy(b->residual, src->residual, src->h.batch * src->h.rows * src->h.hidden * sizeof(float));
    memcpy(b->positions, src->positions, src->h.batch * src->h.rows * sizeof(int32_t));
    return MK_OK;
}

const mk_boundary_header *mk_bundle_header_of(const mk_bundle *b) {
    return b ? &b->h : NULL;
}
float *mk_bundle_residual(mk_bundle *b) {
    return b ? b->residual : NULL;
}
int32_t *mk_bundle_positions(mk_bundle *b) {
    return b ? b->positions : NULL;
}
const float *mk_bundle_residual_const(const mk_bundle *b) {
    return b ? b->residual : NULL;
}
const int32_t *mk_bundle_positions_const(const mk_bundle *b) {
    return b ? b->positions : NULL;
}

mk_status mk_bundle_set_header(mk_bundle *b, const mk_boundary_header *h) {
    mk_clear_error();
    if (!b || !h) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_bundle_set_header: NULL argument");
    if (h->batch != b->h.batch || h->rows != b->h.rows || h->hidden != b->h.hidden || h->dtype != b->h.dtype)
        return mk_fail(MK_ERR_SHAPE, "mk_bundle_set_header: the header's shape [%zu, %zu, %zu] is not the bundle's "
                       "[%zu, %zu, %zu]", h->batch, h->rows, h->hidden, b->h.batch, b->h.rows, b->h.hidden);
    /* Every string must end inside its array (a strncpy of a name as long as the field leaves
     * no NUL): read on, it would run into the next field, and pack would send both. */
    const struct {
        const char *name, *field;
        size_t size;
    } strings[] = {{"adapter", h->adapter, sizeof h->adapter},
                   {"tensor_name", h->tensor_name, sizeof h->tensor_name},
                   {"boundary_point", h->boundary_point, sizeof h->boundary_point},
                   {"recipe_digest", h->recipe_digest, sizeof h->recipe_digest},
                   {"request_id", h->request_id, sizeof h->request_id}};
    for (size_t i = 0; i < sizeof strings / sizeof *strings; i++)
        if (!memchr(strings[i].field, '\0', strings[i].size))
            return mk_fail(MK_ERR_INVALID_ARGUMENT,
                           "mk_boundary_header.%s has no terminating NUL within its %zu bytes", strings[i].name,
                           strings[i].size);
    b->h = *h;
    return MK_OK;
}

void mk_buffer_free(void *buffer) { free(buffer); }

mk_status mk_bundle_tensor_fields(const mk_bundle *b, mk_tensor_fields *out) {
    mk_clear_error();
    if (!b || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_bundle_tensor_fields: NULL argument");
    out->name = b->h.tensor_name;
    out->dtype = MK_DTYPE_F32;
    out->rank = 3;
    out->shape[0] = b->h.batch;
    out->shape[1] = b->h.rows;
    out->shape[2] = b->h.hidden;
    out->shape[3] = 0;
    out->byte_order = mk_host_is_little() ? "little" : "big";
    return MK_OK;
}

mk_status mk_boundary_rows_finite(const void *rows, const mk_boundary_header *h) {
    size_t bad = 0;
    if (mk_floats_nonfinite(rows, h->rows * h->hidden, &bad))
        return mk_fail(MK_ERR_NONFINITE, "boundary residual value %zu (row %zu) is NaN or infinite", bad, bad / h->hidden);
    return MK_OK;
}

bool mk_floats_nonfinite(const void *data, size_t n, size_t *first_bad) {
    /* It reads every residual a transport accepts, so it runs without branches: SSE2
     * compares where there is SSE2, then two floats per 64-bit word (a lane's exponent
     * bits plus one exponent step carry into the lane's bit 31 exactly when they were all
     * ones, Inf or NaN, never into the next lane). The index is searched only in a block
     * that has one. */
    const uint8_t *p = data;
    enum { BLOCK = 2048 };
    const uint64_t exp_mask = 0x7f8000007f800000ull, step = 0x0080000000800000ull, top = 0x8000000080000000ull;
    for (size_t start = 0; start < n; start += BLOCK) {
        const size_t end = n - start < BLOCK ? n : start + BLOCK;
        uint64_t any = 0;
        size_t i = start;
#if defined(__SSE2__)
        /* Four lanes at a time (x86-64 always has SSE2): exponent == all ones. */
        const __m128i em = _mm_set1_epi32(0x7f800000);
        __m128i a0 = _mm_setzero_si128(), a1 = a0;
        for (; i + 8 <= end; i += 8) {
            const __m128i v0 = _mm_loadu_si128((const __m128i *)(const void *)(p + i * 4));
            const __m128i v1 = _mm_loadu_si128((const __m128i *)(const void *)(p + i * 4 + 16));
            a0 = _mm_or_si128(a0, _mm_cmpeq_epi32(_mm_and_si128(v0, em), em));
            a1 = _mm_or_si128(a1, _mm_cmpeq_epi32(_mm_and_si128(v1, em), em));
        }
        any |= (uint64_t)_mm_movemask_epi8(_mm_or_si128(a0, a1));
#endif
        for (; i + 2 <= end; i += 2) {
            uint64_t w;
            memcpy(&w, p + i * 4, 8);
            any |= ((w & exp_mask) + step) & top;
        }
        if (i < end) {
            uint32_t last;
            memcpy(&last, p + i * 4, 4);
            any |= (((uint64_t)(last & 0x7f800000u)) + 0x00800000u) & 0x80000000u;
        }
        if (!any) continue;
        for (i = start; i < end; i++) {
            uint32_t bits;
            memcpy(&bits, p + i * 4, 4);
            if ((bits & 0x7f800000u) == 0x7f800000u) {
                if (first_bad) *first_bad = i;
                return true;
            }
        }
    }
    return false;
}

size_t mk_bundle_payload_offset(const mk_bundle *b) {
    mk_clear_error();
    mk_bundle_message m;
    if (!b || mk_bundle_message_describe(&b->h, b->residual, b->positions, &m) != MK_OK) return 0;
    return mk_bundle_message_payload_offset(&m);
}

size_t mk_bundle_packed_size(const mk_bundle *b) {
    mk_clear_error();
    mk_bundle_message m;
    if (!b || mk_bundle_message_describe(&b->h, b->residual, b->positions, &m) != MK_OK) return 0;
    return mk_bundle_message_size(&m);
}

mk_status mk_bundle_pack_to(const mk_bundle *b, uint8_t *buffer, size_t capacity, size_t *out_len) {
    mk_clear_error();
    if (!b || !buffer || !out_len) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_bundle_pack_to: NULL argument");
    mk_bundle_message m;
    MK_TRY(mk_bundle_message_describe(&b->h, b->residual, b->positions, &m));
    const size_t len = mk_bundle_message_size(&m);
    if (len > capacity)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_bundle_pack_to: %zu bytes needed, buffer holds %zu", len, capacity);
    /* The payload is copied once, straight from the residual into the wire buffer. */
    *out_len = mk_bundle_message_pack(&m, buffer);
    return MK_OK;
}

mk_status mk_bundle_pack(const mk_bundle *b, uint8_t **out, size_t *out_len) {
    mk_clear_error();
    if (!b || !out || !out_len) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_bundle_pack: NULL argument");
    mk_bundle_message m;
    MK_TRY(mk_bundle_message_describe(&b->h, b->residual, b->positions, &m));
    const size_t len = mk_bundle_message_size(&m);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return mk_fail(MK_ERR_OUT_OF_MEMORY, "mk_bundle_pack: out of memory for %zu bytes", len);
    *out_len = mk_bundle_message_pack(&m, buf);
    *out = buf;
    return MK_OK;
}

/* =================================================================== unpack == */

static mk_status mk_bundle_from_message(Meshkern__V1__TensorBundle *msg, mk_bundle **out) {
    mk_boundary_header h;
    const uint8_t *residual, *positions;
    MK_TRY(mk_bundle_message_check(msg, &h, &residual, &positions));
    if ((uintptr_t)residual % sizeof(float) || (uintptr_t)positions % sizeof(int32_t))
        return mk_fail(MK_ERR_INTERNAL, "decoded payload is misaligned");
    mk_bundle *b = calloc(1, sizeof *b);
    if (!b) return mk_fail(MK_ERR_OUT_OF_MEMORY, "bundle: out of memory");
    b->h = h;
    b->residual = (float *)(void *)residual;
    b->positions = (int32_t *)(void *)positions;
    b->storage = msg;
    b->cap_rows = h.batch * h.rows;
    b->cap_floats = b->cap_rows * h.hidden;
    *out = b;
    return MK_OK;
}

mk_status mk_bundle_unpack(const uint8_t *bytes, size_t len, mk_bundle **out) {
    mk_clear_error();
    if (!out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_bundle_unpack: out is NULL");
    *out = NULL;
    if (!bytes && len) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_bundle_unpack: bytes is NULL");
    Meshkern__V1__TensorBundle *msg = meshkern__v1__tensor_bundle__unpack(NULL, len, bytes);
    if (!msg)
        return mk_fail(MK_ERR_WIRE_DECODE, "bundle bytes (%zu) are not a valid TensorBundle message (truncated or corrupt)", len);
    const mk_status s = mk_bundle_from_message(msg, out);
    if (s != MK_OK) meshkern__v1__tensor_bundle__free_unpacked(msg, NULL);
    return s;
}

mk_status mk_bundle_unpack_into(const uint8_t *bytes, size_t len, mk_bundle *into) {
    mk_clear_error();
    if (!into || (!bytes && len)) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_bundle_unpack_into: NULL argument");
    mk_boundary_header h;
    const uint8_t *residual;
    MK_TRY(mk_bundle_decode_body(bytes, len, &h, &residual));
    const size_t rows = h.batch * h.rows, floats = rows * h.hidden;
    if (floats > into->cap_floats || rows > into->cap_rows)
        return mk_fail(MK_ERR_SHAPE, "mk_bundle_unpack_into: [%zu, %zu, %zu] does not fit the bundle's %zu floats",
                       h.batch, h.rows, h.hidden, into->cap_floats);
    memcpy(into->residual, residual, floats * sizeof(float));
    for (size_t i = 0; i < rows; i++) into->positions[i] = (int32_t)(h.position + (int64_t)(i % h.rows));
    into->h = h;
    return MK_OK;
}

/* ======================================================== protocol bundles == */

static Meshkern__V1__ArchitectureType mk_wire_arch(mk_protocol_arch arch) {
    switch (arch) {
        case MK_PROTOCOL_ARCH_DENSE: return MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_DENSE;
        case MK_PROTOCOL_ARCH_MOE: return MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_MOE;
        case MK_PROTOCOL_ARCH_MLA: return MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_MLA;
    }
    return MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_UNSPECIFIED;
}

mk_status mk_protocol_bundle_pack(mk_protocol_arch arch, const mk_named_payload *payloads, size_t n,
                                  uint8_t **out, size_t *out_len) {
    mk_clear_error();
    if (!out || !out_len || (!payloads && n))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_protocol_bundle_pack: NULL argument");
    if (mk_wire_arch(arch) == MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_UNSPECIFIED)
        return mk_fail(MK_ERR_ARCHITECTURE_MISMATCH, "unknown protocol architecture %d", (int)arch);
    if (n > 64) return mk_fail(MK_ERR_INVALID_ARGUMENT, "protocol bundle: too many tensors (%zu)", n);
    const char *names[64] = {0};
    for (size_t i = 0; i < n; i++) names[i] = payloads[i].name;
    MK_TRY(mk_protocol_check_tensors(arch, names, n));

    Meshkern__V1__Tensor tensors[64];
    Meshkern__V1__Tensor *tensor_ptrs[64];
    uint64_t shapes[64];
    for (size_t i = 0; i < n; i++) {
        if (!payloads[i].name || !payloads[i].name[0] || !payloads[i].data || payloads[i].count == 0)
            return mk_fail(MK_ERR_INVALID_ARGUMENT, "protocol bundle: payload %zu is empty or unnamed", i);
        if (payloads[i].count > SIZE_MAX / sizeof(float))
            return mk_fail(MK_ERR_SHAPE_OVERFLOW, "protocol bundle: payload '%s' of %zu floats overflows", payloads[i].name,
                           payloads[i].count);
        shapes[i] = payloads[i].count;
        meshkern__v1__tensor__init(&tensors[i]);
        mk_tensor_msg_describe(&tensors[i], payloads[i].name, MESHKERN__V1__DTYPE__DTYPE_FLOAT32, &shapes[i], 1,
                                payloads[i].data, payloads[i].count * sizeof(float));
        tensor_ptrs[i] = &tensors[i];
    }
    Meshkern__V1__TensorBundle msg = MESHKERN__V1__TENSOR_BUNDLE__INIT;
    msg.schema_version = MK_BOUNDARY_SCHEMA_VERSION;
    msg.architecture = mk_wire_arch(arch);
    msg.adapter = arch == MK_PROTOCOL_ARCH_DENSE ? (char *)MK_DENSE_LLAMA_ADAPTER
                  : arch == MK_PROTOCOL_ARCH_MOE ? (char *)"moe" : (char *)"mla";
    msg.boundary_point = (char *)"pre_tail_residual";
    msg.has_next_layer = 1;
    msg.n_tensors = n;
    msg.tensors = tensor_ptrs;
    const size_t len = meshkern__v1__tensor_bundle__get_packed_size(&msg);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return mk_fail(MK_ERR_OUT_OF_MEMORY, "protocol bundle: out of memory");
    meshkern__v1__tensor_bundle__pack(&msg, buf);
    *out = buf;
    *out_len = len;
    return MK_OK;
}

mk_status mk_protocol_bundle_validate(const uint8_t *bytes, size_t len, mk_protocol_arch *arch) {
    mk_clear_error();
    if (!bytes && len) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_protocol_bundle_validate: bytes is NULL");
    Meshkern__V1__TensorBundle *msg = meshkern__v1__tensor_bundle__unpack(NULL, len, bytes);
    if (!msg) return mk_fail(MK_ERR_WIRE_DECODE, "bytes (%zu) are not a valid TensorBundle message", len);
    mk_status s = MK_OK;
    mk_protocol_arch kind = MK_PROTOCOL_ARCH_DENSE;
    switch (msg->architecture) {
        case MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_DENSE: kind = MK_PROTOCOL_ARCH_DENSE; break;
        case MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_MOE: kind = MK_PROTOCOL_ARCH_MOE; break;
        case MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_MLA: kind = MK_PROTOCOL_ARCH_MLA; break;
        default: s = mk_fail(MK_ERR_MISSING_FIELD, "bundle is missing field architecture");
    }
    if (s == MK_OK && msg->schema_version != MK_BOUNDARY_SCHEMA_VERSION)
        s = mk_fail(MK_ERR_SCHEMA_VERSION, "bundle schema version %u is not the supported version %u",
                    msg->schema_version, MK_BOUNDARY_SCHEMA_VERSION);
    const char *names[64] = {0};
    if (s == MK_OK && msg->n_tensors > 64)
        s = mk_fail(MK_ERR_INVALID_ARGUMENT, "protocol bundle: too many tensors (%zu)", msg->n_tensors);
    for (size_t i = 0; s == MK_OK && i < msg->n_tensors; i++) {
        uint64_t dims[MK_MAX_RANK];
        size_t rank;
        s = mk_tensor_msg_check(msg->tensors[i], "tensor", dims, MK_MAX_RANK, &rank);
        names[i] = msg->tensors[i]->name;
    }
    if (s == MK_OK) s = mk_protocol_check_tensors(kind, names, msg->n_tensors);
    if (s == MK_OK && arch) *arch = kind;
    meshkern__v1__tensor_bundle__free_unpacked(msg, NULL);
    return s;
}
