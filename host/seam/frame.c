/* Frame header and the zero-copy TensorBundle reader. protobuf-c copies every bytes
 * field while unpacking; a 32 MiB residual read into pinned memory would be copied again
 * for nothing. This reader walks the protobuf wire format (varints, length-delimited
 * fields, with protobuf's merge rules for repeated sub-messages) and points at the
 * payload where it lies. It trusts no length: every field is bounded by what remains. */
#include "frame.h"

#include <string.h>

#include "mk_error.h"

static void mk_put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t mk_get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void mk_frame_header_encode(uint8_t out[MK_FRAME_HEADER_BYTES], uint64_t length, unsigned align) {
    mk_put_le(out, MK_FRAME_MAGIC, 4);
    mk_put_le(out + 4, MK_FRAME_VERSION, 2);
    mk_put_le(out + 6, align % MK_FRAME_ALIGN, 2);
    mk_put_le(out + 8, length, 8);
}

mk_status mk_frame_header_decode(const uint8_t in[MK_FRAME_HEADER_BYTES], uint64_t limit, uint64_t *length,
                                 unsigned *align) {
    const uint64_t magic = mk_get_le(in, 4), version = mk_get_le(in + 4, 2), flags = mk_get_le(in + 6, 2);
    if (magic != MK_FRAME_MAGIC)
        return mk_fail(MK_ERR_FRAME, "seam frame: bad magic 0x%08llx (not a meshkern frame)", (unsigned long long)magic);
    if (version != MK_FRAME_VERSION)
        return mk_fail(MK_ERR_FRAME, "seam frame: version %llu is not the supported version %u",
                       (unsigned long long)version, MK_FRAME_VERSION);
    if (flags >= MK_FRAME_ALIGN)
        return mk_fail(MK_ERR_FRAME, "seam frame: alignment hint %llu is not below %u", (unsigned long long)flags,
                       MK_FRAME_ALIGN);
    *align = (unsigned)flags;
    *length = mk_get_le(in + 8, 8);
    if (*length == 0) return mk_fail(MK_ERR_FRAME, "seam frame: empty body");
    if (*length > limit)
        return mk_fail(MK_ERR_FRAME, "seam frame of %llu bytes exceeds this range's limit of %llu bytes",
                       (unsigned long long)*length, (unsigned long long)limit);
    return MK_OK;
}

uint64_t mk_frame_limit(size_t max_rows, size_t hidden) {
    return (uint64_t)max_rows * hidden * sizeof(float) + (uint64_t)max_rows * sizeof(int32_t) + MK_FRAME_OVERHEAD;
}

/* ============================================================ wire format == */

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

static mk_status mk_expect(unsigned wire_type, unsigned wanted) {
    return wire_type == wanted ? MK_OK : mk_bad("field with the wrong wire type");
}

/* One Tensor message, merged into t (protobuf merges repeated occurrences). */
static mk_status mk_parse_tensor(mk_cursor c, Meshkern__V1__Tensor *t, uint64_t *shape, char *name) {
    while (c.p < c.end) {
        uint64_t key, v;
        MK_TRY(mk_varint(&c, &key));
        const unsigned field = (unsigned)(key >> 3), wt = (unsigned)(key & 7);
        mk_cursor f = {0};
        switch (field) {
            case 1:
                MK_TRY(mk_expect(wt, 2));
                MK_TRY(mk_delimited(&c, &f));
                mk_copy_string(name, &f);
                t->name = name;
                break;
            case 2:
                MK_TRY(mk_expect(wt, 0));
                MK_TRY(mk_varint(&c, &v));
                t->dtype = (Meshkern__V1__DType)(int32_t)v;
                break;
            case 3:
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
            case 4:
                MK_TRY(mk_expect(wt, 0));
                MK_TRY(mk_varint(&c, &v));
                t->byte_order = (Meshkern__V1__ByteOrder)(int32_t)v;
                break;
            case 5:
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
        uint64_t key, v;
        MK_TRY(mk_varint(&c, &key));
        const unsigned field = (unsigned)(key >> 3), wt = (unsigned)(key & 7);
        if (field == 0) return mk_bad("field number 0");
        mk_cursor f = {0};
        switch (field) {
            case 1: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(&c, &v)); m->schema_version = (uint32_t)v; break;
            case 2: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(&c, &v)); m->architecture = (Meshkern__V1__ArchitectureType)(int32_t)v; break;
            case 5: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(&c, &v)); m->next_layer = (int64_t)v; break;
            case 6: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(&c, &v)); m->normalized = v != 0; break;
            case 11: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(&c, &v)); m->has_next_layer = v != 0; break;
            case 12: MK_TRY(mk_expect(wt, 0)); MK_TRY(mk_varint(&c, &m->step)); break;
            case 3: MK_TRY(mk_expect(wt, 2)); MK_TRY(mk_delimited(&c, &f)); mk_copy_string(view->adapter, &f); m->adapter = view->adapter; break;
            case 4: MK_TRY(mk_expect(wt, 2)); MK_TRY(mk_delimited(&c, &f)); mk_copy_string(view->boundary_point, &f); m->boundary_point = view->boundary_point; break;
            case 9: MK_TRY(mk_expect(wt, 2)); MK_TRY(mk_delimited(&c, &f)); mk_copy_string(view->digest, &f); m->runtime_recipe_digest = view->digest; break;
            case 10: MK_TRY(mk_expect(wt, 2)); MK_TRY(mk_delimited(&c, &f)); mk_copy_string(view->request_id, &f); m->request_id = view->request_id; break;
            case 7:
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
            case 8:
                MK_TRY(mk_expect(wt, 2));
                MK_TRY(mk_delimited(&c, &f));
                MK_TRY(mk_parse_tensor(f, &view->positions, view->positions_shape, view->positions_name));
                m->positions = &view->positions;
                break;
            default: MK_TRY(mk_skip(&c, wt));
        }
    }
    view->tensors[0] = &view->residual;
    m->tensors = m->n_tensors ? view->tensors : NULL;
    return MK_OK;
}

mk_status mk_frame_decode_body(const uint8_t *bytes, size_t len, mk_boundary_header *h, const uint8_t **residual) {
    mk_bundle_view view;
    MK_TRY(mk_bundle_view_parse(bytes, len, &view));
    const uint8_t *positions;
    MK_TRY(mk_bundle_message_check(&view.msg, h, residual, &positions));
    for (size_t i = 0; i < h->rows; i++) {
        int32_t p;
        memcpy(&p, positions + i * sizeof p, sizeof p);
        if ((int64_t)p != h->position + (int64_t)i)
            return mk_fail(MK_ERR_POSITIONS_SHAPE, "bundle position %d at row %zu does not continue row 0's %lld", p, i,
                           (long long)h->position);
    }
    return MK_OK;
}
