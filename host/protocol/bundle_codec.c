/* The TensorBundle codec: the one file that knows the protobuf field numbers of
 * proto/meshkern.proto (the enums below; tests/test_seams.cpp checks them against the
 * descriptors protobuf-c generates from the .proto, so the two cannot drift).
 *
 * Encoding writes the bundle's own fields by hand so the payload is copied once (see
 * mk_bundle_message_pack). Decoding is zero-copy: protobuf-c copies every bytes field
 * while unpacking, and a 32 MiB residual read into pinned memory would be copied again for
 * nothing, so mk_bundle_view_parse walks the wire format (varints, length-delimited
 * fields, protobuf's merge rules for repeated sub-messages) and points at the payload
 * where it lies. It trusts no length: every field is bounded by what remains. Every
 * check of a decoded message's meaning is mk_bundle_message_check. */
#include "protocol/bundle_codec.h"

#include <stdio.h>
#include <string.h>

#include "mk_error.h"
#include "protocol/tensor_msg.h"

#define MK_MAX_RANK 8

/* Field numbers of message TensorBundle and message Tensor. */
enum {
    MK_BUNDLE_SCHEMA_VERSION = 1,
    MK_BUNDLE_ARCHITECTURE = 2,
    MK_BUNDLE_ADAPTER = 3,
    MK_BUNDLE_BOUNDARY_POINT = 4,
    MK_BUNDLE_NEXT_LAYER = 5,
    MK_BUNDLE_NORMALIZED = 6,
    MK_BUNDLE_TENSORS = 7,
    MK_BUNDLE_POSITIONS = 8,
    MK_BUNDLE_RECIPE_DIGEST = 9,
    MK_BUNDLE_REQUEST_ID = 10,
    MK_BUNDLE_HAS_NEXT_LAYER = 11,
    MK_BUNDLE_STEP = 12,
    MK_BUNDLE_ENTRIES = 13,
};
enum { MK_TENSOR_NAME = 1, MK_TENSOR_DTYPE = 2, MK_TENSOR_SHAPE = 3, MK_TENSOR_BYTE_ORDER = 4, MK_TENSOR_DATA = 5 };
enum { MK_ENTRY_REQUEST_ID = 1, MK_ENTRY_STEP = 2, MK_ENTRY_POSITION = 3, MK_ENTRY_ROWS = 4 };

unsigned mk_bundle_field_number(const char *name) {
    static const struct {
        const char *name;
        unsigned number;
    } fields[] = {
        {"schema_version", MK_BUNDLE_SCHEMA_VERSION}, {"architecture", MK_BUNDLE_ARCHITECTURE},
        {"adapter", MK_BUNDLE_ADAPTER},               {"boundary_point", MK_BUNDLE_BOUNDARY_POINT},
        {"next_layer", MK_BUNDLE_NEXT_LAYER},         {"normalized", MK_BUNDLE_NORMALIZED},
        {"tensors", MK_BUNDLE_TENSORS},               {"positions", MK_BUNDLE_POSITIONS},
        {"runtime_recipe_digest", MK_BUNDLE_RECIPE_DIGEST}, {"request_id", MK_BUNDLE_REQUEST_ID},
        {"has_next_layer", MK_BUNDLE_HAS_NEXT_LAYER}, {"step", MK_BUNDLE_STEP},
        {"entries", MK_BUNDLE_ENTRIES},
        {"BundleEntry.request_id", MK_ENTRY_REQUEST_ID}, {"BundleEntry.step", MK_ENTRY_STEP},
        {"BundleEntry.position", MK_ENTRY_POSITION},     {"BundleEntry.rows", MK_ENTRY_ROWS},
        {"Tensor.name", MK_TENSOR_NAME},              {"Tensor.dtype", MK_TENSOR_DTYPE},
        {"Tensor.shape", MK_TENSOR_SHAPE},            {"Tensor.byte_order", MK_TENSOR_BYTE_ORDER},
        {"Tensor.data", MK_TENSOR_DATA},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (name && strcmp(fields[i].name, name) == 0) return fields[i].number;
    return 0;
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
    mk_tensor_msg_describe(&m->residual, h->tensor_name, MESHKERN__V1__DTYPE__DTYPE_FLOAT32, m->residual_shape, 3,
                            residual, rows * h->hidden * sizeof(float));
    meshkern__v1__tensor__init(&m->positions);
    mk_tensor_msg_describe(&m->positions, "positions", MESHKERN__V1__DTYPE__DTYPE_INT32, m->positions_shape, 2,
                            positions, rows * sizeof(int32_t));
    m->tensors[0] = &m->residual;
    m->n_parts = 0;
    m->parts_bytes = 0;
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

/* The fields every entry of a batch shares: one value on the wire, so they must agree. */
static bool mk_batch_shared_agree(const mk_boundary_header *a, const mk_boundary_header *b) {
    return a->schema_version == b->schema_version && a->architecture == b->architecture &&
           strcmp(a->adapter, b->adapter) == 0 && strcmp(a->tensor_name, b->tensor_name) == 0 &&
           strcmp(a->boundary_point, b->boundary_point) == 0 && a->next_layer == b->next_layer &&
           a->normalized == b->normalized && strcmp(a->recipe_digest, b->recipe_digest) == 0 &&
           a->batch == 1 && b->batch == 1 && a->hidden == b->hidden && a->dtype == b->dtype;
}

mk_status mk_bundle_batch_check(const mk_boundary_header *const *h, size_t n) {
    if (!h || n == 0 || n > MK_MAX_BATCH_SEQUENCES)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "a batch carries 1 to %d sequences, not %zu", MK_MAX_BATCH_SEQUENCES, n);
    for (size_t k = 0; k < n; k++) {
        if (h[k]->rows == 0) return mk_fail(MK_ERR_EMPTY_INPUT, "batch entry %zu (%s) carries no rows", k, h[k]->request_id);
        if (n == 1) break; /* one sequence: its header alone, as it always was */
        if (!mk_batch_shared_agree(h[0], h[k]))
            return mk_fail(MK_ERR_INVALID_ARGUMENT,
                           "batch entry %zu (%s) differs from entry 0 in a field the entries share (layer, digest, "
                           "width, dtype...)", k, h[k]->request_id);
        if (!h[k]->request_id[0]) return mk_fail(MK_ERR_INVALID_ARGUMENT, "batch entry %zu has no request id", k);
        for (size_t j = 0; j < k; j++)
            if (strcmp(h[j]->request_id, h[k]->request_id) == 0)
                return mk_fail(MK_ERR_INVALID_ARGUMENT, "request id '%s' names batch entries %zu and %zu",
                               h[k]->request_id, j, k);
    }
    return MK_OK;
}

mk_status mk_bundle_message_describe_batch(const mk_boundary_header *const *h, size_t n, const void *const *rows,
                                           const int32_t *positions, mk_bundle_message *m) {
    MK_TRY(mk_bundle_batch_check(h, n));
    if (n == 1) return mk_bundle_message_describe(h[0], rows[0], positions, m);
    mk_boundary_header *total = &m->batch; /* the message points into it: it lives in m */
    *total = *h[0];
    total->rows = 0;
    for (size_t k = 0; k < n; k++) total->rows += h[k]->rows;
    total->schema_version = MK_BOUNDARY_BATCH_SCHEMA_VERSION;
    total->request_id[0] = '\0';
    total->step = 0;
    MK_TRY(mk_bundle_message_describe(total, rows[0], positions, m));
    /* The residual's bytes come from each entry's rows where they lie (no gathering copy):
     * the tensor is packed without its data, which the pack appends part by part. */
    m->residual.data.data = NULL;
    m->residual.data.len = 0;
    m->n_parts = n;
    m->parts_bytes = 0;
    for (size_t k = 0; k < n; k++) {
        Meshkern__V1__BundleEntry *e = &m->entry[k];
        meshkern__v1__bundle_entry__init(e);
        e->request_id = (char *)h[k]->request_id;
        e->step = h[k]->step;
        e->position = h[k]->position;
        e->rows = h[k]->rows;
        m->entries[k] = e;
        m->part[k] = rows[k];
        m->part_bytes[k] = h[k]->rows * h[k]->hidden * sizeof(float);
        m->parts_bytes += m->part_bytes[k];
    }
    m->msg.n_entries = n;
    m->msg.entries = m->entries;
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
    return mk_pb_uint_size(MK_BUNDLE_SCHEMA_VERSION, m->schema_version) + mk_pb_uint_size(MK_BUNDLE_ARCHITECTURE, mk_pb_int(m->architecture)) +
           mk_pb_string_size(MK_BUNDLE_ADAPTER, m->adapter) + mk_pb_string_size(MK_BUNDLE_BOUNDARY_POINT, m->boundary_point) +
           mk_pb_uint_size(MK_BUNDLE_NEXT_LAYER, mk_pb_int(m->next_layer)) + mk_pb_uint_size(MK_BUNDLE_NORMALIZED, m->normalized ? 1 : 0);
}

/* One BundleEntry's own bytes. */
static size_t mk_pb_entry_size(const Meshkern__V1__BundleEntry *e) {
    return mk_pb_string_size(MK_ENTRY_REQUEST_ID, e->request_id) + mk_pb_uint_size(MK_ENTRY_STEP, e->step) +
           mk_pb_uint_size(MK_ENTRY_POSITION, mk_pb_int(e->position)) + mk_pb_uint_size(MK_ENTRY_ROWS, e->rows);
}

/* Fields 8-13, after the tensors. */
static size_t mk_pb_tail_size(const Meshkern__V1__TensorBundle *m, size_t positions_size) {
    size_t entries = 0;
    for (size_t k = 0; k < m->n_entries; k++) entries += mk_pb_len_size(MK_BUNDLE_ENTRIES, mk_pb_entry_size(m->entries[k]));
    return (m->positions ? mk_pb_len_size(MK_BUNDLE_POSITIONS, positions_size) : 0) + mk_pb_string_size(MK_BUNDLE_RECIPE_DIGEST, m->runtime_recipe_digest) +
           mk_pb_string_size(MK_BUNDLE_REQUEST_ID, m->request_id) + mk_pb_uint_size(MK_BUNDLE_HAS_NEXT_LAYER, m->has_next_layer ? 1 : 0) +
           mk_pb_uint_size(MK_BUNDLE_STEP, m->step) + entries;
}

/* The residual tensor's packed size, its data included (appended by hand for a batch). */
static size_t mk_residual_size(const mk_bundle_message *m) {
    const size_t packed = meshkern__v1__tensor__get_packed_size(&m->residual);
    return m->n_parts ? packed + mk_pb_len_size(MK_TENSOR_DATA, m->parts_bytes) : packed;
}

size_t mk_bundle_message_size(const mk_bundle_message *m) {
    const size_t tensor = mk_residual_size(m);
    const size_t positions = meshkern__v1__tensor__get_packed_size(&m->positions);
    return mk_pb_head_size(&m->msg) + mk_pb_len_size(MK_BUNDLE_TENSORS, tensor) + mk_pb_tail_size(&m->msg, positions);
}

size_t mk_bundle_message_payload_offset(const mk_bundle_message *m) {
    const size_t tensor = mk_residual_size(m);
    /* data is the tensor's last field: its bytes end the tensor message. */
    return mk_pb_head_size(&m->msg) + mk_pb_len_size(MK_BUNDLE_TENSORS, tensor) -
           (m->n_parts ? m->parts_bytes : m->residual.data.len);
}

size_t mk_bundle_message_pack(const mk_bundle_message *m, uint8_t *out) {
    const Meshkern__V1__TensorBundle *msg = &m->msg;
    uint8_t *p = out;
    p = mk_pb_uint(p, MK_BUNDLE_SCHEMA_VERSION, msg->schema_version);
    p = mk_pb_uint(p, MK_BUNDLE_ARCHITECTURE, mk_pb_int(msg->architecture));
    p = mk_pb_string(p, MK_BUNDLE_ADAPTER, msg->adapter);
    p = mk_pb_string(p, MK_BUNDLE_BOUNDARY_POINT, msg->boundary_point);
    p = mk_pb_uint(p, MK_BUNDLE_NEXT_LAYER, mk_pb_int(msg->next_layer));
    p = mk_pb_uint(p, MK_BUNDLE_NORMALIZED, msg->normalized ? 1 : 0);
    /* Nested messages: their length first, then protobuf-c packs them in place (a Tensor
     * has no nested message, so its data is copied once). */
    p = mk_pb_len(p, MK_BUNDLE_TENSORS, mk_residual_size(m));
    p += meshkern__v1__tensor__pack(&m->residual, p);
    if (m->n_parts) { /* data, the last field, as protobuf-c would write it: each entry's rows in turn */
        p = mk_pb_len(p, MK_TENSOR_DATA, m->parts_bytes);
        for (size_t k = 0; k < m->n_parts; k++) {
            memcpy(p, m->part[k], m->part_bytes[k]);
            p += m->part_bytes[k];
        }
    }
    p = mk_pb_len(p, MK_BUNDLE_POSITIONS, meshkern__v1__tensor__get_packed_size(&m->positions));
    p += meshkern__v1__tensor__pack(&m->positions, p);
    p = mk_pb_string(p, MK_BUNDLE_RECIPE_DIGEST, msg->runtime_recipe_digest);
    p = mk_pb_string(p, MK_BUNDLE_REQUEST_ID, msg->request_id);
    p = mk_pb_uint(p, MK_BUNDLE_HAS_NEXT_LAYER, msg->has_next_layer ? 1 : 0);
    p = mk_pb_uint(p, MK_BUNDLE_STEP, msg->step);
    for (size_t k = 0; k < msg->n_entries; k++) {
        const Meshkern__V1__BundleEntry *e = msg->entries[k];
        p = mk_pb_len(p, MK_BUNDLE_ENTRIES, mk_pb_entry_size(e));
        p = mk_pb_string(p, MK_ENTRY_REQUEST_ID, e->request_id);
        p = mk_pb_uint(p, MK_ENTRY_STEP, e->step);
        p = mk_pb_uint(p, MK_ENTRY_POSITION, mk_pb_int(e->position));
        p = mk_pb_uint(p, MK_ENTRY_ROWS, e->rows);
    }
    return (size_t)(p - out);
}

/* ================================================================== decode == */

typedef struct mk_cursor {
    const uint8_t *p, *end;
} mk_cursor;

static mk_status mk_bad(const char *what) {
    return mk_fail(MK_ERR_WIRE_DECODE, "bundle bytes are not a valid TensorBundle message (%s)", what);
}

static mk_status mk_varint(mk_cursor *c, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (c->p >= c->end) return mk_bad("truncated varint");
        const uint8_t b = *c->p++;
        if (shift == 63 && b > 1) return mk_bad("varint overflows 64 bits");
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return MK_OK;
        }
    }
    return mk_bad("varint longer than 10 bytes");
}

/* A length-delimited field: [p, p + n) within the cursor. */
static mk_status mk_delimited(mk_cursor *c, mk_cursor *field) {
    uint64_t n = 0;
    MK_TRY(mk_varint(c, &n));
    if (n > (uint64_t)(c->end - c->p)) return mk_bad("length past the end");
    field->p = c->p;
    field->end = c->p + n;
    c->p += n;
    return MK_OK;
}

static mk_status mk_skip(mk_cursor *c, unsigned wire_type) {
    uint64_t v = 0;
    mk_cursor f = {0};
    switch (wire_type) {
        case 0: return mk_varint(c, &v);
        case 1:
            if (c->end - c->p < 8) return mk_bad("truncated fixed64");
            c->p += 8;
            return MK_OK;
        case 2: return mk_delimited(c, &f);
        case 5:
            if (c->end - c->p < 4) return mk_bad("truncated fixed32");
            c->p += 4;
            return MK_OK;
        default: return mk_bad("unsupported wire type");
    }
}

static void mk_copy_string(char *dst, const mk_cursor *f) {
    size_t n = (size_t)(f->end - f->p);
    if (n >= MK_VIEW_STRING) n = MK_VIEW_STRING - 1; /* longer than any valid value: still refused */
    memcpy(dst, f->p, n);
    dst[n] = '\0';
}

/* protobuf's largest field number (2^29 - 1). */
#define MK_PROTO_MAX_FIELD 536870911u

/* A field's key: its number (1 to MK_PROTO_MAX_FIELD, as protobuf-c insists; a larger one
 * narrowed to unsigned would alias a known field) and wire type. */
static mk_status mk_key(mk_cursor *c, unsigned *field, unsigned *wire_type) {
    uint64_t key = 0;
    MK_TRY(mk_varint(c, &key));
    if (key >> 3 == 0) return mk_bad("field number 0");
    if (key >> 3 > MK_PROTO_MAX_FIELD) return mk_bad("field number past 2^29 - 1");
    *field = (unsigned)(key >> 3);
    *wire_type = (unsigned)(key & 7);
    return MK_OK;
}

static mk_status mk_expect(unsigned wire_type, unsigned wanted) {
    return wire_type == wanted ? MK_OK : mk_bad("field with the wrong wire type");
}

/* A string field (wire type 2) copied into dst[MK_VIEW_STRING]; *out points at it. */
static mk_status mk_string_field(mk_cursor *c, unsigned wire_type, char *dst, char **out) {
    mk_cursor f = {0};
    MK_TRY(mk_expect(wire_type, 2));
    MK_TRY(mk_delimited(c, &f));
    mk_copy_string(dst, &f);
    *out = dst;
    return MK_OK;
}

/* One Tensor message, merged into t (protobuf merges repeated occurrences). */
static mk_status mk_parse_tensor(mk_cursor c, Meshkern__V1__Tensor *t, uint64_t *shape, char *name) {
    while (c.p < c.end) {
        uint64_t v;
        unsigned field = 0, wt = 0; /* set by mk_key (gcc -O3 cannot see it) */
        MK_TRY(mk_key(&c, &field, &wt));
        mk_cursor f = {0};
        switch (field) {
            case MK_TENSOR_NAME: MK_TRY(mk_string_field(&c, wt, name, &t->name)); break;
            case MK_TENSOR_DTYPE:
                MK_TRY(mk_expect(wt, 0));
                MK_TRY(mk_varint(&c, &v));
                t->dtype = (Meshkern__V1__DType)(int32_t)v;
                break;
            case MK_TENSOR_SHAPE:
                if (wt == 2) { /* packed */
                    MK_TRY(mk_delimited(&c, &f));
                    while (f.p < f.end) {
                        MK_TRY(mk_varint(&f, &v));
                        if (t->n_shape < MK_VIEW_RANK) shape[t->n_shape] = v;
                        t->n_shape++;
                    }
                } else {
                    MK_TRY(mk_expect(wt, 0));
                    MK_TRY(mk_varint(&c, &v));
                    if (t->n_shape < MK_VIEW_RANK) shape[t->n_shape] = v;
                    t->n_shape++;
                }
                t->shape = shape;
                break;
            case MK_TENSOR_BYTE_ORDER:
                MK_TRY(mk_expect(wt, 0));
                MK_TRY(mk_varint(&c, &v));
                t->byte_order = (Meshkern__V1__ByteOrder)(int32_t)v;
                break;
            case MK_TENSOR_DATA:
                MK_TRY(mk_expect(wt, 2));
                MK_TRY(mk_delimited(&c, &f));
                t->data.data = (uint8_t *)(uintptr_t)f.p; /* in place: the zero copy */
                t->data.len = (size_t)(f.end - f.p);
                break;
            default: MK_TRY(mk_skip(&c, wt));
        }
    }
    return MK_OK;
}

/* One BundleEntry message (a repeated field: each occurrence is an entry of its own). */
static mk_status mk_parse_entry(mk_cursor c, Meshkern__V1__BundleEntry *e, char *id) {
    while (c.p < c.end) {
        uint64_t v;
        unsigned field = 0, wt = 0; /* set by mk_key (gcc -O3 cannot see it) */
        MK_TRY(mk_key(&c, &field, &wt));
        switch (field) {
            case MK_ENTRY_REQUEST_ID: MK_TRY(mk_string_field(&c, wt, id, &e->request_id)); break;
            case MK_ENTRY_STEP: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(&c, &e->step)); break;
            case MK_ENTRY_POSITION: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(&c, &v)); e->position = (int64_t)v; break;
            case MK_ENTRY_ROWS: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(&c, &e->rows)); break;
            default: MK_TRY(mk_skip(&c, wt));
        }
    }
    return MK_OK;
}

mk_status mk_bundle_view_parse(const uint8_t *bytes, size_t len, mk_bundle_view *view) {
    memset(view, 0, sizeof *view);
    meshkern__v1__tensor_bundle__init(&view->msg);
    meshkern__v1__tensor__init(&view->residual);
    meshkern__v1__tensor__init(&view->positions);
    Meshkern__V1__TensorBundle *m = &view->msg;
    m->adapter = m->boundary_point = m->runtime_recipe_digest = m->request_id = (char *)"";
    view->residual.name = view->positions.name = (char *)"";
    if (!bytes && len) return mk_bad("no bytes");
    mk_cursor c = {bytes, bytes + len};
    while (c.p < c.end) {
        uint64_t v;
        unsigned field = 0, wt = 0; /* set by mk_key (gcc -O3 cannot see it) */
        MK_TRY(mk_key(&c, &field, &wt));
        mk_cursor f = {0};
        switch (field) {
            case MK_BUNDLE_SCHEMA_VERSION: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(&c, &v)); m->schema_version = (uint32_t)v; break;
            case MK_BUNDLE_ARCHITECTURE: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(&c, &v)); m->architecture = (Meshkern__V1__ArchitectureType)(int32_t)v; break;
            case MK_BUNDLE_NEXT_LAYER: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(&c, &v)); m->next_layer = (int64_t)v; break;
            case MK_BUNDLE_NORMALIZED: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(&c, &v)); m->normalized = v != 0; break;
            case MK_BUNDLE_HAS_NEXT_LAYER: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(&c, &v)); m->has_next_layer = v != 0; break;
            case MK_BUNDLE_STEP: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(&c, &m->step)); break;
            case MK_BUNDLE_ADAPTER: MK_TRY(mk_string_field(&c, wt, view->adapter, &m->adapter)); break;
            case MK_BUNDLE_BOUNDARY_POINT: MK_TRY(mk_string_field(&c, wt, view->boundary_point, &m->boundary_point)); break;
            case MK_BUNDLE_RECIPE_DIGEST: MK_TRY(mk_string_field(&c, wt, view->digest, &m->runtime_recipe_digest)); break;
            case MK_BUNDLE_REQUEST_ID: MK_TRY(mk_string_field(&c, wt, view->request_id, &m->request_id)); break;
            case MK_BUNDLE_TENSORS:
                /* Only the first tensor is kept; the count still tells the checker how many came. */
                MK_TRY(mk_expect(wt, 2));
                MK_TRY(mk_delimited(&c, &f));
                if (m->n_tensors == 0) MK_TRY(mk_parse_tensor(f, &view->residual, view->residual_shape, view->residual_name));
                else {
                    Meshkern__V1__Tensor scratch = MESHKERN__V1__TENSOR__INIT;
                    uint64_t shape[MK_VIEW_RANK];
                    char name[MK_VIEW_STRING];
                    MK_TRY(mk_parse_tensor(f, &scratch, shape, name)); /* well-formed, then counted */
                }
                m->n_tensors++;
                break;
            case MK_BUNDLE_POSITIONS:
                MK_TRY(mk_expect(wt, 2));
                MK_TRY(mk_delimited(&c, &f));
                MK_TRY(mk_parse_tensor(f, &view->positions, view->positions_shape, view->positions_name));
                m->positions = &view->positions;
                break;
            case MK_BUNDLE_ENTRIES:
                /* The first MK_MAX_BATCH_SEQUENCES are kept; the count tells the checker how many came. */
                MK_TRY(mk_expect(wt, 2));
                MK_TRY(mk_delimited(&c, &f));
                if (m->n_entries < MK_MAX_BATCH_SEQUENCES) {
                    Meshkern__V1__BundleEntry *e = &view->entry[m->n_entries];
                    meshkern__v1__bundle_entry__init(e);
                    e->request_id = (char *)"";
                    MK_TRY(mk_parse_entry(f, e, view->entry_id[m->n_entries]));
                    view->entries[m->n_entries] = e;
                } else {
                    Meshkern__V1__BundleEntry scratch = MESHKERN__V1__BUNDLE_ENTRY__INIT;
                    char id[MK_VIEW_STRING];
                    MK_TRY(mk_parse_entry(f, &scratch, id)); /* well-formed, then counted */
                }
                m->n_entries++;
                break;
            default: MK_TRY(mk_skip(&c, wt));
        }
    }
    view->tensors[0] = &view->residual;
    m->tensors = m->n_tensors ? view->tensors : NULL;
    m->entries = m->n_entries ? view->entries : NULL;
    return MK_OK;
}

mk_status mk_bundle_decode_batch(const uint8_t *bytes, size_t len, mk_boundary_header *h, size_t cap, size_t *n,
                                 const uint8_t **rows) {
    mk_bundle_view view;
    const uint8_t *residual = NULL;
    MK_TRY(mk_bundle_view_parse(bytes, len, &view));
    MK_TRY(mk_bundle_message_check_batch(&view.msg, h, cap, n, &residual));
    size_t row = 0; /* the entries share one width (checked) */
    for (size_t k = 0; k < *n; k++) {
        rows[k] = residual + row * h[k].hidden * sizeof(float);
        row += h[k].rows;
    }
    return MK_OK;
}

mk_status mk_bundle_decode_body(const uint8_t *bytes, size_t len, mk_boundary_header *h, const uint8_t **residual) {
    size_t n = 0;
    return mk_bundle_decode_batch(bytes, len, h, 1, &n, residual); /* one entry: its rows are the residual */
}

/* =================================================================== check == */


static mk_status mk_copy_field(char *dst, size_t cap, const char *src, const char *what) {
    const size_t n = strlen(src);
    if (n >= cap) return mk_fail(MK_ERR_INVALID_ARGUMENT, "bundle field %s is too long (%zu bytes)", what, n);
    memcpy(dst, src, n + 1);
    return MK_OK;
}

/* What both schemas check: the envelope, the residual and positions tensors. h describes
 * the whole message (schema 2: all entries' rows, no request id). */
static mk_status mk_message_common(const Meshkern__V1__TensorBundle *msg, mk_boundary_header *h,
                                   const uint8_t **residual, const uint8_t **positions) {
    /* Envelope: every field present. */
    if (msg->schema_version == 0) return mk_fail(MK_ERR_MISSING_FIELD, "bundle is missing field schema_version");
    if (msg->schema_version != MK_BOUNDARY_SCHEMA_VERSION && msg->schema_version != MK_BOUNDARY_BATCH_SCHEMA_VERSION)
        return mk_fail(MK_ERR_SCHEMA_VERSION, "bundle schema version %u is not a supported version (%u, or %u for a batch)",
                       msg->schema_version, MK_BOUNDARY_SCHEMA_VERSION, MK_BOUNDARY_BATCH_SCHEMA_VERSION);
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
    MK_TRY(mk_tensor_msg_check(t, "residual", dims, MK_MAX_RANK, &rank));
    if (strcmp(t->name, arch.boundary_tensor_name) != 0)
        return mk_fail(MK_ERR_TENSOR_NAME, "boundary tensor is named '%.64s', expected '%s'", t->name,
                       arch.boundary_tensor_name);
    if (t->dtype != MESHKERN__V1__DTYPE__DTYPE_FLOAT32)
        return mk_fail(MK_ERR_DTYPE, "residual dtype %d is not float32", (int)t->dtype);
    if (rank != 3) return mk_fail(MK_ERR_SHAPE, "residual has rank %zu, expected 3 [batch, seq, hidden]", rank);

    uint64_t pdims[MK_MAX_RANK];
    size_t prank = 0;
    MK_TRY(mk_tensor_msg_check(msg->positions, "positions", pdims, MK_MAX_RANK, &prank));
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

mk_status mk_bundle_message_check(const Meshkern__V1__TensorBundle *msg, mk_boundary_header *h,
                                  const uint8_t **residual, const uint8_t **positions) {
    MK_TRY(mk_message_common(msg, h, residual, positions));
    if (msg->schema_version != MK_BOUNDARY_SCHEMA_VERSION || msg->n_entries)
        return mk_fail(MK_ERR_SCHEMA_VERSION,
                       "bundle schema version %u with %zu entries is a batch: one sequence's bundle is schema version %u "
                       "(a seam receives batches)",
                       msg->schema_version, msg->n_entries, MK_BOUNDARY_SCHEMA_VERSION);
    return MK_OK;
}

/* Rows [row0, row0 + rows) of the positions count up from `first`. */
static mk_status mk_positions_continue(const uint8_t *positions, size_t row0, size_t rows, int64_t first) {
    for (size_t i = 0; i < rows; i++) {
        int32_t p;
        memcpy(&p, positions + (row0 + i) * sizeof p, sizeof p);
        if ((int64_t)p != first + (int64_t)i)
            return mk_fail(MK_ERR_POSITIONS_SHAPE, "bundle position %d at row %zu does not continue row %zu's %lld", p,
                           row0 + i, row0, (long long)first);
    }
    return MK_OK;
}

mk_status mk_bundle_message_check_batch(const Meshkern__V1__TensorBundle *msg, mk_boundary_header *h, size_t cap,
                                        size_t *n, const uint8_t **residual) {
    *n = 0;
    mk_boundary_header all;
    const uint8_t *positions;
    MK_TRY(mk_message_common(msg, &all, residual, &positions));
    if (msg->schema_version == MK_BOUNDARY_SCHEMA_VERSION) {
        if (msg->n_entries)
            return mk_fail(MK_ERR_SCHEMA_VERSION, "bundle schema version %u carries %zu entries: entries are version %u's",
                           MK_BOUNDARY_SCHEMA_VERSION, msg->n_entries, MK_BOUNDARY_BATCH_SCHEMA_VERSION);
        MK_TRY(mk_positions_continue(positions, 0, all.rows, all.position));
        h[0] = all;
        *n = 1;
        return MK_OK;
    }
    if (msg->n_entries == 0)
        return mk_fail(MK_ERR_MISSING_FIELD, "bundle is missing field entries (schema version %u is a batch)",
                       MK_BOUNDARY_BATCH_SCHEMA_VERSION);
    if (msg->n_entries > cap)
        return mk_fail(MK_ERR_SHAPE, "a batch of %zu entries is more than the %zu this receiver takes", msg->n_entries, cap);
    if (all.batch != 1)
        return mk_fail(MK_ERR_SHAPE, "a batch bundle's residual is [1, rows, hidden], not batch %zu", all.batch);
    if (all.request_id[0] || msg->step)
        return mk_fail(MK_ERR_SCHEMA_VERSION,
                       "a batch bundle names its sequences in its entries: request_id '%s' and step %llu are version %u's",
                       all.request_id, (unsigned long long)msg->step, MK_BOUNDARY_SCHEMA_VERSION);
    size_t row = 0;
    for (size_t k = 0; k < msg->n_entries; k++) {
        const Meshkern__V1__BundleEntry *e = msg->entries[k];
        const char *id = e->request_id ? e->request_id : "";
        if (!id[0]) return mk_fail(MK_ERR_MISSING_FIELD, "batch entry %zu is missing field request_id", k);
        for (size_t j = 0; j < k; j++)
            if (strcmp(h[j].request_id, id) == 0)
                return mk_fail(MK_ERR_SHAPE, "request id '%.64s' names batch entries %zu and %zu", id, j, k);
        if (e->rows == 0 || e->rows > all.rows - row)
            return mk_fail(MK_ERR_SHAPE, "batch entry %zu (%.64s) carries %llu rows: entries add up to 1 to %zu rows each, "
                                         "%zu in all", k, id, (unsigned long long)e->rows, all.rows - row, all.rows);
        MK_TRY(mk_positions_continue(positions, row, (size_t)e->rows, e->position));
        h[k] = all;
        MK_TRY(mk_copy_field(h[k].request_id, sizeof h[k].request_id, id, "request_id"));
        h[k].step = e->step;
        h[k].position = e->position;
        h[k].rows = (size_t)e->rows;
        row += (size_t)e->rows;
    }
    if (row != all.rows)
        return mk_fail(MK_ERR_SHAPE, "batch entries carry %zu rows, the residual %zu", row, all.rows);
    *n = msg->n_entries;
    return MK_OK;
}

/* Validate a decoded message and wrap it as a bundle. On success the bundle takes the
 * message: residual and positions point into its decoded arrays (protobuf-c aligns each
 * bytes field as malloc does), so unpack copies the payload once, in protobuf-c. */
