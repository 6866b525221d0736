/* Boundary bundles: construction, the protobuf wire form, and its validation.
 * unpack trusts nothing it reads: every count, shape and length is checked against the
 * bytes actually present before any array is built. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshkern.pb-c.h"
#include "mk_error.h"
#include "mk_size.h"
#include "boundary.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include "seam/frame.h"
#include "wire.h"

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

const mk_boundary_header *mk_bundle_header(const mk_bundle *b) {
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
    out->byte_order = mk_wire_host_is_little() ? "little" : "big";
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

/* ===================================================================== pack == */

mk_status mk_bundle_message_describe(const mk_boundary_header *h, const void *residual, const int32_t *positions,
                                     mk_bundle_message *m) {
    if (!h || !residual || !positions || h->batch == 0 || h->rows == 0 || h->hidden == 0)
        return mk_fail(MK_ERR_SHAPE, "mk_bundle_pack: bundle has no residual");
    const size_t rows = h->batch * h->rows;
    m->residual_shape[0] = h->batch;
    m->residual_shape[1] = h->rows;
    m->residual_shape[2] = h->hidden;
    m->positions_shape[0] = h->batch;
    m->positions_shape[1] = h->rows;
    meshkern__v1__tensor__init(&m->residual);
    mk_wire_tensor_describe(&m->residual, h->tensor_name, MESHKERN__V1__DTYPE__DTYPE_FLOAT32, m->residual_shape, 3,
                            residual, rows * h->hidden * sizeof(float));
    meshkern__v1__tensor__init(&m->positions);
    mk_wire_tensor_describe(&m->positions, "positions", MESHKERN__V1__DTYPE__DTYPE_INT32, m->positions_shape, 2,
                            positions, rows * sizeof(int32_t));
    m->tensors[0] = &m->residual;
    meshkern__v1__tensor_bundle__init(&m->msg);
    m->msg.schema_version = h->schema_version;
    m->msg.architecture = MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_DENSE;
    m->msg.adapter = (char *)h->adapter;
    m->msg.boundary_point = (char *)h->boundary_point;
    m->msg.next_layer = h->next_layer;
    m->msg.has_next_layer = 1;
    m->msg.normalized = h->normalized;
    m->msg.n_tensors = 1;
    m->msg.tensors = m->tensors;
    m->msg.positions = &m->positions;
    m->msg.runtime_recipe_digest = (char *)h->recipe_digest;
    m->msg.request_id = (char *)h->request_id;
    m->msg.step = h->step;
    return MK_OK;
}

/* The TensorBundle's own fields are written here rather than by protobuf-c's pack, which
 * writes a nested message behind a one-byte length guess and then moves the whole
 * message (the residual included) when the length needs more bytes: a second copy of
 * the payload. Sizes come first here, so the payload is copied once. The bytes are those
 * protobuf-c writes (fields in number order, proto3 defaults left out); tests compare. */
static size_t mk_pb_varint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) v >>= 7, n++;
    return n;
}

static uint8_t *mk_pb_varint(uint8_t *out, uint64_t v) {
    while (v >= 0x80) *out++ = (uint8_t)(v | 0x80), v >>= 7;
    *out++ = (uint8_t)v;
    return out;
}

/* Field `number` as a varint (skipped when 0, as proto3 does). */
static size_t mk_pb_uint_size(unsigned number, uint64_t v) { return v ? mk_pb_varint_size(number << 3) + mk_pb_varint_size(v) : 0; }
static uint8_t *mk_pb_uint(uint8_t *out, unsigned number, uint64_t v) {
    if (!v) return out;
    return mk_pb_varint(mk_pb_varint(out, number << 3), v);
}

/* A length-delimited field of `len` bytes (the bytes follow). */
static size_t mk_pb_len_size(unsigned number, size_t len) { return mk_pb_varint_size((number << 3) | 2) + mk_pb_varint_size(len) + len; }
static uint8_t *mk_pb_len(uint8_t *out, unsigned number, size_t len) {
    return mk_pb_varint(mk_pb_varint(out, (number << 3) | 2), len);
}

static size_t mk_pb_string_size(unsigned number, const char *sv) { return sv && *sv ? mk_pb_len_size(number, strlen(sv)) : 0; }
static uint8_t *mk_pb_string(uint8_t *out, unsigned number, const char *sv) {
    if (!sv || !*sv) return out;
    const size_t n = strlen(sv);
    out = mk_pb_len(out, number, n);
    memcpy(out, sv, n);
    return out + n;
}

/* int64 and enums as protobuf-c writes them: negative values sign-extended to 64 bits. */
static uint64_t mk_pb_int(int64_t v) { return (uint64_t)v; }

/* Fields 1-6, before the tensors. */
static size_t mk_pb_head_size(const Meshkern__V1__TensorBundle *m) {
    return mk_pb_uint_size(1, m->schema_version) + mk_pb_uint_size(2, mk_pb_int(m->architecture)) +
           mk_pb_string_size(3, m->adapter) + mk_pb_string_size(4, m->boundary_point) +
           mk_pb_uint_size(5, mk_pb_int(m->next_layer)) + mk_pb_uint_size(6, m->normalized ? 1 : 0);
}

/* Fields 8-12, after the tensors. */
static size_t mk_pb_tail_size(const Meshkern__V1__TensorBundle *m, size_t positions_size) {
    return (m->positions ? mk_pb_len_size(8, positions_size) : 0) + mk_pb_string_size(9, m->runtime_recipe_digest) +
           mk_pb_string_size(10, m->request_id) + mk_pb_uint_size(11, m->has_next_layer ? 1 : 0) +
           mk_pb_uint_size(12, m->step);
}

size_t mk_bundle_message_size(const mk_bundle_message *m) {
    const size_t tensor = meshkern__v1__tensor__get_packed_size(&m->residual);
    const size_t positions = meshkern__v1__tensor__get_packed_size(&m->positions);
    return mk_pb_head_size(&m->msg) + mk_pb_len_size(7, tensor) + mk_pb_tail_size(&m->msg, positions);
}

size_t mk_bundle_message_payload_offset(const mk_bundle_message *m) {
    const size_t tensor = meshkern__v1__tensor__get_packed_size(&m->residual);
    /* data is the tensor's last field: its bytes end the tensor message. */
    return mk_pb_head_size(&m->msg) + mk_pb_len_size(7, tensor) - m->residual.data.len;
}

size_t mk_bundle_message_pack(const mk_bundle_message *m, uint8_t *out) {
    const Meshkern__V1__TensorBundle *msg = &m->msg;
    uint8_t *p = out;
    p = mk_pb_uint(p, 1, msg->schema_version);
    p = mk_pb_uint(p, 2, mk_pb_int(msg->architecture));
    p = mk_pb_string(p, 3, msg->adapter);
    p = mk_pb_string(p, 4, msg->boundary_point);
    p = mk_pb_uint(p, 5, mk_pb_int(msg->next_layer));
    p = mk_pb_uint(p, 6, msg->normalized ? 1 : 0);
    /* Nested messages: their length first, then protobuf-c packs them in place (a Tensor
     * has no nested message, so its data is copied once). */
    p = mk_pb_len(p, 7, meshkern__v1__tensor__get_packed_size(&m->residual));
    p += meshkern__v1__tensor__pack(&m->residual, p);
    p = mk_pb_len(p, 8, meshkern__v1__tensor__get_packed_size(&m->positions));
    p += meshkern__v1__tensor__pack(&m->positions, p);
    p = mk_pb_string(p, 9, msg->runtime_recipe_digest);
    p = mk_pb_string(p, 10, msg->request_id);
    p = mk_pb_uint(p, 11, msg->has_next_layer ? 1 : 0);
    p = mk_pb_uint(p, 12, msg->step);
    return (size_t)(p - out);
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

static mk_status mk_copy_field(char *dst, size_t cap, const char *src, const char *what) {
    const size_t n = strlen(src);
    if (n >= cap) return mk_fail(MK_ERR_INVALID_ARGUMENT, "bundle field %s is too long (%zu bytes)", what, n);
    memcpy(dst, src, n + 1);
    return MK_OK;
}

mk_status mk_bundle_message_check(const Meshkern__V1__TensorBundle *msg, mk_boundary_header *h,
                                  const uint8_t **residual, const uint8_t **positions) {
    /* Envelope: every field present. */
    if (msg->schema_version == 0) return mk_fail(MK_ERR_MISSING_FIELD, "bundle is missing field schema_version");
    if (msg->schema_version != MK_BOUNDARY_SCHEMA_VERSION)
        return mk_fail(MK_ERR_SCHEMA_VERSION, "bundle schema version %u is not the supported version %u",
                       msg->schema_version, MK_BOUNDARY_SCHEMA_VERSION);
    if (msg->architecture == MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_UNSPECIFIED)
        return mk_fail(MK_ERR_MISSING_FIELD, "bundle is missing field architecture");
    /* moe/mla bundles are valid protocol, but not executable here: say so first. */
    if (msg->architecture != MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_DENSE)
        return mk_fail(MK_ERR_ARCHITECTURE_MISMATCH,
                       "bundle architecture type %d is not dense: it is not executable by the dense-llama adapter",
                       (int)msg->architecture);
    if (msg->adapter == NULL || msg->adapter[0] == '\0')
        return mk_fail(MK_ERR_MISSING_FIELD, "bundle is missing field adapter");
    if (msg->boundary_point == NULL || msg->boundary_point[0] == '\0')
        return mk_fail(MK_ERR_MISSING_FIELD, "bundle is missing field boundary_point");
    if (!msg->has_next_layer) return mk_fail(MK_ERR_MISSING_FIELD, "bundle is missing field next_layer");
    if (msg->n_tensors == 0) return mk_fail(MK_ERR_MISSING_FIELD, "bundle is missing field tensors");
    if (msg->positions == NULL) return mk_fail(MK_ERR_MISSING_FIELD, "bundle is missing field positions");
    if (msg->runtime_recipe_digest == NULL || msg->runtime_recipe_digest[0] == '\0')
        return mk_fail(MK_ERR_MISSING_FIELD, "bundle is missing field runtime_recipe_digest");

    /* The adapter name goes through the certified registry (aliases resolve). */
    mk_architecture arch;
    MK_TRY(mk_certified_architecture(msg->adapter, &arch));
    if (strcmp(msg->boundary_point, MK_BOUNDARY_POINT) != 0)
        return mk_fail(MK_ERR_BOUNDARY_POINT, "incompatible dense residual boundary schema '%s' (expected '%s')",
                       msg->boundary_point, MK_BOUNDARY_POINT);
    if (msg->next_layer < 0)
        return mk_fail(MK_ERR_SEAM_MISMATCH, "bundle next_layer %lld is negative", (long long)msg->next_layer);
    if (strlen(msg->runtime_recipe_digest) != MK_DIGEST_HEX_LEN ||
        strspn(msg->runtime_recipe_digest, "0123456789abcdef") != MK_DIGEST_HEX_LEN)
        return mk_fail(MK_ERR_RECIPE_DIGEST, "bundle recipe digest '%.80s' is not a 64-digit lowercase hex sha256",
                       msg->runtime_recipe_digest);

    /* The residual: exactly one tensor named residual_stream, F32 [batch, seq, hidden]. */
    if (msg->n_tensors != 1)
        return mk_fail(MK_ERR_TENSOR_NAME, "dense residual boundary requires exactly one tensor, got %zu",
                       msg->n_tensors);
    const Meshkern__V1__Tensor *t = msg->tensors[0];
    uint64_t dims[MK_MAX_RANK];
    size_t rank = 0;
    MK_TRY(mk_wire_tensor_check(t, "residual", dims, MK_MAX_RANK, &rank));
    if (strcmp(t->name, arch.boundary_tensor_name) != 0)
        return mk_fail(MK_ERR_TENSOR_NAME, "boundary tensor is named '%.64s', expected '%s'", t->name,
                       arch.boundary_tensor_name);
    if (t->dtype != MESHKERN__V1__DTYPE__DTYPE_FLOAT32)
        return mk_fail(MK_ERR_DTYPE, "residual dtype %d is not float32", (int)t->dtype);
    if (rank != 3) return mk_fail(MK_ERR_SHAPE, "residual has rank %zu, expected 3 [batch, seq, hidden]", rank);

    uint64_t pdims[MK_MAX_RANK];
    size_t prank = 0;
    MK_TRY(mk_wire_tensor_check(msg->positions, "positions", pdims, MK_MAX_RANK, &prank));
    if (msg->positions->dtype != MESHKERN__V1__DTYPE__DTYPE_INT32)
        return mk_fail(MK_ERR_DTYPE, "positions dtype %d is not int32", (int)msg->positions->dtype);
    if (prank != 2 || pdims[0] != dims[0] || pdims[1] != dims[1])
        return mk_fail(MK_ERR_POSITIONS_SHAPE,
                       "positions shape (rank %zu) does not match the residual's [batch=%llu, seq=%llu]", prank,
                       (unsigned long long)dims[0], (unsigned long long)dims[1]);

    mk_boundary_header_defaults(h);
    h->batch = (size_t)dims[0];
    h->rows = (size_t)dims[1];
    h->hidden = (size_t)dims[2];
    h->schema_version = msg->schema_version;
    h->next_layer = msg->next_layer;
    h->normalized = msg->normalized != 0;
    h->step = msg->step;
    int32_t first;
    memcpy(&first, msg->positions->data.data, sizeof first);
    h->position = first;
    MK_TRY(mk_copy_field(h->adapter, sizeof h->adapter, arch.adapter, "adapter"));
    MK_TRY(mk_copy_field(h->recipe_digest, sizeof h->recipe_digest, msg->runtime_recipe_digest, "digest"));
    MK_TRY(mk_copy_field(h->request_id, sizeof h->request_id, msg->request_id ? msg->request_id : "", "request_id"));
    *residual = t->data.data;
    *positions = msg->positions->data.data;
    return MK_OK;
}

/* Validate a decoded message and wrap it as a bundle. On success the bundle takes the
 * message: residual and positions point into its decoded arrays (protobuf-c aligns each
 * bytes field as malloc does), so unpack copies the payload once, in protobuf-c. */
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
    MK_TRY(mk_frame_decode_body(bytes, len, &h, &residual));
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
        mk_wire_tensor_describe(&tensors[i], payloads[i].name, MESHKERN__V1__DTYPE__DTYPE_FLOAT32, &shapes[i], 1,
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
        s = mk_wire_tensor_check(msg->tensors[i], "tensor", dims, MK_MAX_RANK, &rank);
        names[i] = msg->tensors[i]->name;
    }
    if (s == MK_OK) s = mk_protocol_check_tensors(kind, names, msg->n_tensors);
    if (s == MK_OK && arch) *arch = kind;
    meshkern__v1__tensor_bundle__free_unpacked(msg, NULL);
    return s;
}
