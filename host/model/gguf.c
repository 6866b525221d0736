/* GGUF reader: a validating parser over a read-only mapping (or borrowed bytes).
 *
 * File layout (little-endian):
 *   header      magic "GGUF" u32, version u32 (2|3), tensor_count u64, kv_count u64
 *   metadata    kv_count x { key: string, type: u32, value }
 *               string = { len: u64, bytes[len] } (no NUL); array = { type u32, count u64,
 *               elements }
 *   tensors     tensor_count x { name: string, n_dims u32, dims u64[n_dims], type u32,
 *               offset u64 (relative to the data section, multiple of the alignment) }
 *   padding     to general.alignment (default 32)
 *   data        tensor bytes
 *
 * Every read goes through a cursor that refuses to move past the end; every count is
 * checked against the bytes left before anything is allocated for it. See gguf.h for
 * the status each failure reports. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/gguf.h"
#include "mk_error.h"
#include "core/mk_size.h"

/* Smallest encodings, used to cap counts by what the remaining bytes could hold. */
#define GG_MIN_KV_BYTES 14u     /* key len 8 + 1 byte of key + type 4 + 1-byte value */
#define GG_MIN_TENSOR_BYTES 33u /* name len 8 + 1 + n_dims 4 + one dim 8 + type 4 + offset 8 */

typedef struct gg_kv {
    char *key;                     /* owned, NUL-terminated */
    mk_gguf_value_type type;
    mk_gguf_value_type elem_type;  /* arrays only */
    size_t count;                  /* arrays: element count */
    const uint8_t *value;          /* scalars/arrays: first byte; strings: the characters */
    size_t len;                    /* strings: length; arrays: bytes of the elements */
    size_t *str_pos;               /* string arrays: file offset of each element's chars */
    size_t *str_len;               /* string arrays: length of each element */
} gg_kv;

struct mk_gguf {
    const uint8_t *base;
    size_t size;
    void *map; /* non-NULL when we own an mmap of size bytes */
    uint32_t version;
    size_t alignment;
    size_t data_offset;
    size_t n_kv;
    gg_kv *kv;
    size_t *kv_sorted; /* indices of kv sorted by key */
    size_t n_tensors;
    mk_gguf_tensor_info *tensors;
    size_t *tensor_sorted; /* indices of tensors sorted by name */
};

/* =================================================================== cursor == */

typedef struct gg_cursor {
    const uint8_t *base;
    size_t size;
    size_t pos;
} gg_cursor;

static size_t gg_left(const gg_cursor *c) { return c->size - c->pos; }

static mk_status gg_take(gg_cursor *c, size_t n, const char *what, const uint8_t **out) {
    if (n > gg_left(c))
        return mk_fail(MK_ERR_GGUF_TRUNCATED,
                       "gguf truncated: %s at byte %zu needs %zu bytes, only %zu remain", what,
                       c->pos, n, gg_left(c));
    *out = c->base + c->pos;
    c->pos += n;
    return MK_OK;
}

static mk_status gg_u32(gg_cursor *c, const char *what, uint32_t *v) {
    const uint8_t *p = NULL;
    MK_TRY(gg_take(c, 4, what, &p));
    memcpy(v, p, 4);
    return MK_OK;
}

static mk_status gg_u64(gg_cursor *c, const char *what, uint64_t *v) {
    const uint8_t *p = NULL;
    MK_TRY(gg_take(c, 8, what, &p));
    memcpy(v, p, 8);
    return MK_OK;
}

/* A string: length-prefixed bytes, bounds-checked. */
static mk_status gg_string(gg_cursor *c, const char *what, const uint8_t **chars, size_t *len) {
    uint64_t n;
    size_t at = c->pos;
    MK_TRY(gg_u64(c, what, &n));
    if (n > gg_left(c))
        return mk_fail(MK_ERR_GGUF_STRING,
                       "gguf: %s at byte %zu has length %llu, past the end of the file (%zu bytes remain)",
                       what, at, (unsigned long long)n, gg_left(c));
    *len = (size_t)n;
    *chars = c->base + c->pos;
    c->pos += (size_t)n;
    return MK_OK;
}

/* A key or tensor name: non-empty, no NUL inside; copied NUL-terminated. */
static mk_status gg_name(gg_cursor *c, const char *what, char **out) {
    /* Initialised: the compiler cannot see that gg_string sets both whenever it returns
     * MK_OK (its failures return mk_fail's value, which it does not know is non-zero). */
    const uint8_t *chars = NULL;
    size_t len = 0, at = c->pos;
    MK_TRY(gg_string(c, what, &chars, &len));
    if (len == 0) return mk_fail(MK_ERR_GGUF_STRING, "gguf: empty %s at byte %zu", what, at);
    if (memchr(chars, 0, len))
        return mk_fail(MK_ERR_GGUF_STRING, "gguf: %s at byte %zu contains a NUL byte", what, at);
    char *s = malloc(len + 1);
    if (!s) return mk_fail(MK_ERR_OUT_OF_MEMORY, "gguf: out of memory for a %zu-byte %s", len, what);
    memcpy(s, chars, len);
    s[len] = '\0';
    *out = s;
    return MK_OK;
}

/* ============================================================= value types == */

static size_t gg_scalar_size(uint32_t t) {
    switch (t) {
    case MK_GGUF_TYPE_UINT8: case MK_GGUF_TYPE_INT8: case MK_GGUF_TYPE_BOOL: return 1;
    case MK_GGUF_TYPE_UINT16: case MK_GGUF_TYPE_INT16: return 2;
    case MK_GGUF_TYPE_UINT32: case MK_GGUF_TYPE_INT32: case MK_GGUF_TYPE_FLOAT32: return 4;
    case MK_GGUF_TYPE_UINT64: case MK_GGUF_TYPE_INT64: case MK_GGUF_TYPE_FLOAT64: return 8;
    default: return 0; /* string, array, unknown */
    }
}

static bool gg_known_type(uint32_t t) { return t <= MK_GGUF_TYPE_FLOAT64; }

static mk_status gg_value(gg_cursor *c, gg_kv *kv) {
    uint32_t t;
    size_t at = c->pos;
    MK_TRY(gg_u32(c, "metadata value type", &t));
    if (!gg_known_type(t))
        return mk_fail(MK_ERR_GGUF_VALUE_TYPE, "gguf: key '%s' has unknown value type %u (byte %zu)",
                       kv->key, t, at);
    kv->type = (mk_gguf_value_type)t;
    if (t == MK_GGUF_TYPE_STRING) return gg_string(c, "string value", &kv->value, &kv->len);
    if (t != MK_GGUF_TYPE_ARRAY) {
        kv->len = gg_scalar_size(t);
        kv->count = 1;
        return gg_take(c, kv->len, "metadata value", &kv->value);
    }
    /* array */
    uint32_t et;
    uint64_t count;
    at = c->pos;
    MK_TRY(gg_u32(c, "array element type", &et));
    if (!gg_known_type(et))
        return mk_fail(MK_ERR_GGUF_VALUE_TYPE,
                       "gguf: array '%s' has unknown element type %u (byte %zu)", kv->key, et, at);
    if (et == MK_GGUF_TYPE_ARRAY)
        return mk_fail(MK_ERR_GGUF_VALUE_TYPE, "gguf: array '%s' nests arrays (not supported)",
                       kv->key);
    kv->elem_type = (mk_gguf_value_type)et;
    at = c->pos;
    MK_TRY(gg_u64(c, "array count", &count));
    size_t min_elem = et == MK_GGUF_TYPE_STRING ? 8 : gg_scalar_size(et);
    if (count > gg_left(c) / min_elem)
        return mk_fail(MK_ERR_GGUF_COUNT,
                       "gguf: array '%s' at byte %zu declares %llu elements of %zu+ bytes, but only %zu bytes remain",
                       kv->key, at, (unsigned long long)count, min_elem, gg_left(c));
    kv->count = (size_t)count;
    kv->value = c->base + c->pos;
    if (et != MK_GGUF_TYPE_STRING) {
        kv->len = kv->count * min_elem;
        c->pos += kv->len;
        return MK_OK;
    }
    /* string array: count <= left/8, so these allocations are bounded by the file size */
    if (kv->count) {
        kv->str_pos = malloc(kv->count * sizeof(size_t));
        kv->str_len = malloc(kv->count * sizeof(size_t));
        if (!kv->str_pos || !kv->str_len)
            return mk_fail(MK_ERR_OUT_OF_MEMORY, "gguf: out of memory for string array '%s' (%zu)",
                           kv->key, kv->count);
    }
    size_t start = c->pos;
    for (size_t i = 0; i < kv->count; i++) {
        const uint8_t *chars;
        MK_TRY(gg_string(c, "array string", &chars, &kv->str_len[i]));
        kv->str_pos[i] = (size_t)(chars - c->base);
    }
    kv->len = c->pos - start;
    return MK_OK;
}

/* =============================================================== sorting == */

/* qsort has no context argument in C11: sort (name pointer, index) pairs instead. */
typedef struct gg_named {
    const char *name;
    size_t index;
} gg_named;

static int gg_named_cmp(const void *a, const void *b) {
    return strcmp(((const gg_named *)a)->name, ((const gg_named *)b)->name);
}

/* Sort indices by name into *out; a duplicate yields MK_ERR_GGUF_STRING. name_at(i) is
 * read through a small accessor so keys and tensor names share the code. */
typedef const char *(*gg_name_at_fn)(const mk_gguf *g, size_t i);

static mk_status gg_sort_names(const mk_gguf *g, gg_name_at_fn name_at, size_t n, const char *what,
                               size_t **out) {
    *out = NULL;
    if (n == 0) return MK_OK;
    gg_named *tmp = malloc(n * sizeof *tmp);
    size_t *idx = malloc(n * sizeof *idx);
    if (!tmp || !idx) {
        free(tmp);
        free(idx);
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "gguf: out of memory sorting %zu %ss", n, what);
    }
    for (size_t i = 0; i < n; i++) {
        tmp[i].name = name_at(g, i);
        tmp[i].index = i;
    }
    qsort(tmp, n, sizeof *tmp, gg_named_cmp);
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && strcmp(tmp[i - 1].name, tmp[i].name) == 0) {
            mk_status st = mk_fail(MK_ERR_GGUF_STRING, "gguf: duplicate %s '%s'", what, tmp[i].name);
            free(tmp);
            free(idx);
            return st;
        }
        idx[i] = tmp[i].index;
    }
    free(tmp);
    *out = idx;
    return MK_OK;
}

static const char *gg_key_name(const mk_gguf *g, size_t i) { return g->kv[i].key; }
static const char *gg_tensor_name(const mk_gguf *g, size_t i) { return g->tensors[i].name; }

/* ================================================================ lookups == */

/* Binary search of `name` among n entries sorted by name (sorted[] holds their indices);
 * the index of the match, or n. */
static size_t gg_find_sorted(const mk_gguf *g, const size_t *sorted, size_t n,
                             const char *(*name_at)(const mk_gguf *, size_t), const char *name) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        const int c = strcmp(name_at(g, sorted[mid]), name);
        if (c == 0) return sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return n;
}

static const gg_kv *gg_find_kv(const mk_gguf *g, const char *key) {
    if (!g || !key) return NULL;
    const size_t i = gg_find_sorted(g, g->kv_sorted, g->n_kv, gg_key_name, key);
    return i < g->n_kv ? &g->kv[i] : NULL;
}

int64_t mk_gguf_find_key(const mk_gguf *g, const char *key) {
    const gg_kv *kv = gg_find_kv(g, key);
    return kv ? (int64_t)(kv - g->kv) : -1;
}

const mk_gguf_tensor_info *mk_gguf_find_tensor(const mk_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    const size_t i = gg_find_sorted(g, g->tensor_sorted, g->n_tensors, gg_tensor_name, name);
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

/* ================================================================= parsing == */

static mk_status gg_get_alignment(mk_gguf *g) {
    g->alignment = MK_GGUF_DEFAULT_ALIGNMENT;
    const gg_kv *kv = gg_find_kv(g, "general.alignment");
    if (!kv) return MK_OK;
    uint32_t a = 0;
    if (mk_gguf_get_u32(g, "general.alignment", &a) != MK_OK)
        return mk_fail(MK_ERR_GGUF_ALIGNMENT,
                       "gguf: general.alignment must be an unsigned 32-bit integer (value type %d)",
                       (int)kv->type);
    if (a == 0 || (a & (a - 1)) != 0)
        return mk_fail(MK_ERR_GGUF_ALIGNMENT, "gguf: general.alignment %u is not a power of two", a);
    g->alignment = a;
    return MK_OK;
}

static mk_status gg_tensor_info(gg_cursor *c, mk_gguf_tensor_info *t) {
    size_t at = c->pos;
    char *name = NULL;
    MK_TRY(gg_name(c, "tensor name", &name));
    t->name = name;
    MK_TRY(gg_u32(c, "tensor n_dims", &t->n_dims));
    if (t->n_dims == 0 || t->n_dims > MK_GGUF_MAX_DIMS)
        return mk_fail(MK_ERR_GGUF_DIMS, "gguf: tensor '%s' (byte %zu) has %u dimensions (1..%u allowed)",
                       name, at, t->n_dims, MK_GGUF_MAX_DIMS);
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < MK_GGUF_MAX_DIMS; d++) t->dims[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        MK_TRY(gg_u64(c, "tensor dimension", &t->dims[d]));
        if (t->dims[d] == 0)
            return mk_fail(MK_ERR_GGUF_DIMS, "gguf: tensor '%s' has a zero dimension (dim %u)", name, d);
        if (t->dims[d] > (uint64_t)INT64_MAX / n_el)
            return mk_fail(MK_ERR_GGUF_DIMS, "gguf: tensor '%s': element count overflows at dim %u (%llu)",
                           name, d, (unsigned long long)t->dims[d]);
        n_el *= t->dims[d];
    }
    t->n_elements = n_el;
    MK_TRY(gg_u32(c, "tensor type", &t->type));
    size_t be, bb;
    if (!mk_ggml_type_layout(t->type, &be, &bb))
        return mk_fail(MK_ERR_GGUF_TENSOR_TYPE, "gguf: tensor '%s' has unknown ggml type %u", name, t->type);
    if (t->dims[0] % be != 0)
        return mk_fail(MK_ERR_GGUF_DIMS, "gguf: tensor '%s': row length %llu is not a multiple of the %s block size %zu",
                       name, (unsigned long long)t->dims[0], mk_ggml_type_name(t->type), be);
    uint64_t n_blocks = n_el / be;
    if (n_blocks > SIZE_MAX / bb)
        return mk_fail(MK_ERR_GGUF_DIMS, "gguf: tensor '%s': byte size overflows", name);
    t->n_bytes = (size_t)n_blocks * bb;
    uint64_t off;
    MK_TRY(gg_u64(c, "tensor offset", &off));
    if (off > SIZE_MAX)
        return mk_fail(MK_ERR_GGUF_DATA_BOUNDS, "gguf: tensor '%s' offset %llu is too large", name,
                       (unsigned long long)off);
    t->offset = (size_t)off;
    return MK_OK;
}

/* Every tensor owns its bytes: two whose data ranges overlap (a header edit re-pointing
 * one tensor into another's bytes) would read each other's weights and run. Checked on
 * the tensors sorted by offset, after each range is known to lie inside the data. */
typedef struct gg_span {
    size_t offset, index;
} gg_span;

static int gg_span_cmp(const void *a, const void *b) {
    const gg_span *x = a, *y = b; /* by offset, then by order in the file (a stable message) */
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static mk_status gg_check_overlaps(const mk_gguf *g) {
    if (g->n_tensors < 2) return MK_OK;
    gg_span *span = mk_alloc_array(g->n_tensors, sizeof *span, "gguf: tensor spans");
    if (!span) return MK_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < g->n_tensors; i++) span[i] = (gg_span){g->tensors[i].offset, i};
    qsort(span, g->n_tensors, sizeof *span, gg_span_cmp);
    mk_status s = MK_OK;
    for (size_t i = 1; s == MK_OK && i < g->n_tensors; i++) {
        const mk_gguf_tensor_info *a = &g->tensors[span[i - 1].index], *b = &g->tensors[span[i].index];
        if (a->offset + a->n_bytes > b->offset) /* both lie inside the data: no wrap */
            s = mk_fail(MK_ERR_GGUF_DATA_BOUNDS, "gguf: tensor '%s' data [%zu, +%zu) overlaps tensor '%s' data [%zu, +%zu)",
                        b->name, b->offset, b->n_bytes, a->name, a->offset, a->n_bytes);
    }
    free(span);
    return s;
}

static mk_status gg_parse(mk_gguf *g) {
    gg_cursor c = {g->base, g->size, 0};
    const uint8_t *p = NULL;
    if (g->size < 4)
        return mk_fail(MK_ERR_GGUF_TRUNCATED, "gguf truncated: %zu bytes is too short for the magic", g->size);
    uint32_t magic;
    MK_TRY(gg_u32(&c, "magic", &magic));
    if (magic != MK_GGUF_MAGIC)
        return mk_fail(MK_ERR_GGUF_MAGIC, "not a GGUF file: magic is 0x%08x, expected 0x%08x (\"GGUF\")",
                       magic, MK_GGUF_MAGIC);
    MK_TRY(gg_u32(&c, "version", &g->version));
    if (g->version != 2 && g->version != 3)
        return mk_fail(MK_ERR_GGUF_VERSION, "gguf: version %u is not supported (2 and 3 are)", g->version);
    uint64_t n_tensors, n_kv;
    MK_TRY(gg_u64(&c, "tensor count", &n_tensors));
    MK_TRY(gg_u64(&c, "kv count", &n_kv));
    if (n_kv > gg_left(&c) / GG_MIN_KV_BYTES)
        return mk_fail(MK_ERR_GGUF_COUNT,
                       "gguf: header declares %llu key/values, which need at least %u bytes each, but only %zu bytes remain",
                       (unsigned long long)n_kv, GG_MIN_KV_BYTES, gg_left(&c));
    if (n_tensors > gg_left(&c) / GG_MIN_TENSOR_BYTES)
        return mk_fail(MK_ERR_GGUF_COUNT,
                       "gguf: header declares %llu tensors, which need at least %u bytes each, but only %zu bytes remain",
                       (unsigned long long)n_tensors, GG_MIN_TENSOR_BYTES, gg_left(&c));

    /* metadata */
    if (n_kv) {
        g->kv = calloc((size_t)n_kv, sizeof *g->kv);
        if (!g->kv) return mk_fail(MK_ERR_OUT_OF_MEMORY, "gguf: out of memory for %llu kvs", (unsigned long long)n_kv);
    }
    for (size_t i = 0; i < (size_t)n_kv; i++) {
        gg_kv *kv = &g->kv[i];
        g->n_kv = i + 1; /* so close() frees what this entry allocated */
        MK_TRY(gg_name(&c, "metadata key", &kv->key));
        MK_TRY(gg_value(&c, kv));
    }
    MK_TRY(gg_sort_names(g, gg_key_name, g->n_kv, "metadata key", &g->kv_sorted));
    MK_TRY(gg_get_alignment(g));

    /* tensor infos: recheck the count now that the metadata has been consumed */
    if (n_tensors > gg_left(&c) / GG_MIN_TENSOR_BYTES)
        return mk_fail(MK_ERR_GGUF_COUNT,
                       "gguf: header declares %llu tensors, but after the metadata only %zu bytes remain",
                       (unsigned long long)n_tensors, gg_left(&c));
    if (n_tensors) {
        g->tensors = calloc((size_t)n_tensors, sizeof *g->tensors);
        if (!g->tensors)
            return mk_fail(MK_ERR_OUT_OF_MEMORY, "gguf: out of memory for %llu tensor infos",
                           (unsigned long long)n_tensors);
    }
    for (size_t i = 0; i < (size_t)n_tensors; i++) {
        g->n_tensors = i + 1;
        MK_TRY(gg_tensor_info(&c, &g->tensors[i]));
    }
    MK_TRY(gg_sort_names(g, gg_tensor_name, g->n_tensors, "tensor name", &g->tensor_sorted));

    /* data section */
    size_t pad = (g->alignment - c.pos % g->alignment) % g->alignment;
    if (pad > gg_left(&c)) {
        if (g->n_tensors > 0)
            return mk_fail(MK_ERR_GGUF_TRUNCATED,
                           "gguf truncated: the data section would start at byte %zu, past the end (%zu bytes)",
                           c.pos + pad, g->size);
        g->data_offset = g->size;
    } else {
        MK_TRY(gg_take(&c, pad, "alignment padding", &p));
        g->data_offset = c.pos;
    }
    const size_t data_size = g->size - g->data_offset;
    for (size_t i = 0; i < g->n_tensors; i++) {
        mk_gguf_tensor_info *t = &g->tensors[i];
        if (t->offset % g->alignment != 0)
            return mk_fail(MK_ERR_GGUF_ALIGNMENT, "gguf: tensor '%s' offset %zu is not a multiple of the alignment %zu",
                           t->name, t->offset, g->alignment);
        if (t->offset > data_size || t->n_bytes > data_size - t->offset)
            return mk_fail(MK_ERR_GGUF_DATA_BOUNDS,
                           "gguf: tensor '%s' data [%zu, +%zu) lies past the end of the data section (%zu bytes)",
                           t->name, t->offset, t->n_bytes, data_size);
        t->data = g->base + g->data_offset + t->offset;
    }
    return gg_check_overlaps(g);
}

/* ============================================================ open / close == */

static mk_status gg_open_bytes(const uint8_t *base, size_t size, void *map, mk_gguf **out) {
    mk_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        if (map) munmap(map, size);
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "gguf: out of memory");
    }
    g->base = base;
    g->size = size;
    g->map = map;
    mk_status st = gg_parse(g);
    if (st != MK_OK) {
        mk_gguf_close(g);
        return st;
    }
    *out = g;
    return MK_OK;
}

mk_status mk_gguf_open_memory(const void *data, size_t len, mk_gguf **out) {
    mk_clear_error();
    if (!out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_gguf_open_memory: NULL out");
    *out = NULL;
    if (!data && len > 0) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_gguf_open_memory: NULL data");
    static const uint8_t empty[1] = {0};
    return gg_open_bytes(data ? (const uint8_t *)data : empty, data ? len : 0, NULL, out);
}

mk_status mk_gguf_open(const char *path, mk_gguf **out) {
    mk_clear_error();
    if (!out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_gguf_open: NULL out");
    *out = NULL;
    if (!path) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_gguf_open: NULL path");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mk_fail(MK_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mk_fail(MK_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return mk_fail(MK_ERR_IO, "'%s' is not a regular file", path);
    }
    if (st.st_size < 4) {
        close(fd);
        return mk_fail(MK_ERR_GGUF_TRUNCATED, "'%s': %lld bytes is too short for a GGUF file", path,
                       (long long)st.st_size);
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return mk_fail(MK_ERR_IO, "cannot mmap '%s': %s", path, strerror(e));
    mk_status s = gg_open_bytes(map, size, map, out);
    if (s != MK_OK) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", mk_last_error());
        return mk_fail(s, "%s: %s", path, msg);
    }
    return MK_OK;
}

void mk_gguf_close(mk_gguf *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].str_pos);
        free(g->kv[i].str_len);
    }
    free(g->kv);
    free(g->kv_sorted);
    for (size_t i = 0; i < g->n_tensors; i++) free((char *)g->tensors[i].name);
    free(g->tensors);
    free(g->tensor_sorted);
    if (g->map) munmap(g->map, g->size);
    free(g);
}

uint32_t mk_gguf_version(const mk_gguf *g) { return g ? g->version : 0; }
size_t mk_gguf_alignment(const mk_gguf *g) { return g ? g->alignment : 0; }
size_t mk_gguf_data_offset(const mk_gguf *g) { return g ? g->data_offset : 0; }
size_t mk_gguf_file_size(const mk_gguf *g) { return g ? g->size : 0; }

/* ========================================================= typed metadata == */

size_t mk_gguf_kv_count(const mk_gguf *g) { return g ? g->n_kv : 0; }

const char *mk_gguf_key_at(const mk_gguf *g, size_t index) {
    return g && index < g->n_kv ? g->kv[index].key : NULL;
}

mk_gguf_value_type mk_gguf_type_at(const mk_gguf *g, size_t index) {
    return g && index < g->n_kv ? g->kv[index].type : (mk_gguf_value_type)-1;
}

static mk_status gg_lookup(const mk_gguf *g, const char *key, const gg_kv **out) {
    if (!g || !key) return mk_fail(MK_ERR_INVALID_ARGUMENT, "gguf lookup: NULL handle or key");
    *out = gg_find_kv(g, key);
    if (!*out) return mk_fail(MK_ERR_GGUF_MISSING, "gguf: key '%s' not found", key);
    return MK_OK;
}

/* An integer-valued scalar as (negative?, magnitude-or-value). */
static mk_status gg_integer(const gg_kv *kv, bool *neg, uint64_t *u, int64_t *s) {
    const uint8_t *v = kv->value;
    *neg = false;
    *u = 0;
    *s = 0;
    switch (kv->type) {
    case MK_GGUF_TYPE_UINT8: case MK_GGUF_TYPE_BOOL: *u = v[0]; break;
    case MK_GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, v, 2); *u = x; break; }
    case MK_GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, v, 4); *u = x; break; }
    case MK_GGUF_TYPE_UINT64: { uint64_t x; memcpy(&x, v, 8); *u = x; break; }
    case MK_GGUF_TYPE_INT8: { int8_t x; memcpy(&x, v, 1); *s = x; break; }
    case MK_GGUF_TYPE_INT16: { int16_t x; memcpy(&x, v, 2); *s = x; break; }
    case MK_GGUF_TYPE_INT32: { int32_t x; memcpy(&x, v, 4); *s = x; break; }
    case MK_GGUF_TYPE_INT64: { int64_t x; memcpy(&x, v, 8); *s = x; break; }
    default:
        return mk_fail(MK_ERR_GGUF_VALUE_TYPE, "gguf: key '%s' is not an integer (value type %d)",
                       kv->key, (int)kv->type);
    }
    switch (kv->type) {
    case MK_GGUF_TYPE_INT8: case MK_GGUF_TYPE_INT16: case MK_GGUF_TYPE_INT32: case MK_GGUF_TYPE_INT64:
        if (*s < 0) *neg = true;
        else *u = (uint64_t)*s;
        break;
    default:
        *s = *u <= (uint64_t)INT64_MAX ? (int64_t)*u : INT64_MAX;
        break;
    }
    return MK_OK;
}

/* The integer value of `key`, of any integer type: its sign, magnitude if non-negative
 * (u) and value if signed (s). */
static mk_status gg_lookup_integer(const mk_gguf *g, const char *key, bool *neg, uint64_t *u, int64_t *s) {
    const gg_kv *kv;
    MK_TRY(gg_lookup(g, key, &kv));
    return gg_integer(kv, neg, u, s);
}

mk_status mk_gguf_get_u64(const mk_gguf *g, const char *key, uint64_t *out) {
    bool neg = false;
    uint64_t u = 0;
    int64_t s = 0;
    MK_TRY(gg_lookup_integer(g, key, &neg, &u, &s));
    if (neg) return mk_fail(MK_ERR_GGUF_VALUE_TYPE, "gguf: key '%s' is negative (%lld)", key, (long long)s);
    *out = u;
    return MK_OK;
}

mk_status mk_gguf_get_u32(const mk_gguf *g, const char *key, uint32_t *out) {
    uint64_t u = 0;
    MK_TRY(mk_gguf_get_u64(g, key, &u));
    if (u > UINT32_MAX)
        return mk_fail(MK_ERR_GGUF_VALUE_TYPE, "gguf: key '%s' value %llu does not fit 32 bits", key,
                       (unsigned long long)u);
    *out = (uint32_t)u;
    return MK_OK;
}

mk_status mk_gguf_get_i64(const mk_gguf *g, const char *key, int64_t *out) {
    bool neg = false;
    uint64_t u = 0;
    int64_t s = 0;
    MK_TRY(gg_lookup_integer(g, key, &neg, &u, &s));
    if (!neg && u > (uint64_t)INT64_MAX)
        return mk_fail(MK_ERR_GGUF_VALUE_TYPE, "gguf: key '%s' value %llu does not fit int64", key,
                       (unsigned long long)u);
    *out = neg ? s : (int64_t)u;
    return MK_OK;
}

mk_status mk_gguf_get_i32(const mk_gguf *g, const char *key, int32_t *out) {
    int64_t v = 0;
    MK_TRY(mk_gguf_get_i64(g, key, &v));
    if (v < INT32_MIN || v > INT32_MAX)
        return mk_fail(MK_ERR_GGUF_VALUE_TYPE, "gguf: key '%s' value %lld does not fit int32", key, (long long)v);
    *out = (int32_t)v;
    return MK_OK;
}

mk_status mk_gguf_get_f32(const mk_gguf *g, const char *key, float *out) {
    const gg_kv *kv;
    MK_TRY(gg_lookup(g, key, &kv));
    if (kv->type == MK_GGUF_TYPE_FLOAT32) {
        memcpy(out, kv->value, 4);
        return MK_OK;
    }
    if (kv->type == MK_GGUF_TYPE_FLOAT64) {
        double d;
        memcpy(&d, kv->value, 8);
        *out = (float)d;
        return MK_OK;
    }
    bool neg = false;
    uint64_t u = 0;
    int64_t s = 0;
    if (kv->type == MK_GGUF_TYPE_BOOL || gg_integer(kv, &neg, &u, &s) != MK_OK)
        return mk_fail(MK_ERR_GGUF_VALUE_TYPE, "gguf: key '%s' is not a number (value type %d)", key,
                       (int)kv->type);
    *out = neg ? (float)s : (float)u;
    return MK_OK;
}

mk_status mk_gguf_get_bool(const mk_gguf *g, const char *key, bool *out) {
    const gg_kv *kv;
    bool neg = false;
    uint64_t u = 0;
    int64_t s = 0;
    MK_TRY(gg_lookup(g, key, &kv));
    if (gg_integer(kv, &neg, &u, &s) != MK_OK)
        return mk_fail(MK_ERR_GGUF_VALUE_TYPE, "gguf: key '%s' is not a bool (value type %d)", key,
                       (int)kv->type);
    *out = neg || u != 0;
    return MK_OK;
}

mk_status mk_gguf_get_string(const mk_gguf *g, const char *key, const char **str, size_t *len) {
    const gg_kv *kv;
    MK_TRY(gg_lookup(g, key, &kv));
    if (kv->type != MK_GGUF_TYPE_STRING)
        return mk_fail(MK_ERR_GGUF_VALUE_TYPE, "gguf: key '%s' is not a string (value type %d)", key,
                       (int)kv->type);
    *str = (const char *)kv->value;
    *len = kv->len;
    return MK_OK;
}

mk_status mk_gguf_get_string_copy(const mk_gguf *g, const char *key, char *buf, size_t cap) {
    const char *s = NULL;
    size_t len = 0;
    if (!buf || cap == 0) return mk_fail(MK_ERR_INVALID_ARGUMENT, "gguf: no buffer for '%s'", key ? key : "");
    MK_TRY(mk_gguf_get_string(g, key, &s, &len));
    if (len >= cap)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "gguf: string '%s' (%zu bytes) does not fit %zu", key, len, cap);
    memcpy(buf, s, len);
    buf[len] = '\0';
    return MK_OK;
}

static mk_status gg_lookup_array(const mk_gguf *g, const char *key, const gg_kv **out) {
    MK_TRY(gg_lookup(g, key, out));
    if ((*out)->type != MK_GGUF_TYPE_ARRAY)
        return mk_fail(MK_ERR_GGUF_VALUE_TYPE, "gguf: key '%s' is not an array (value type %d)", key,
                       (int)(*out)->type);
    return MK_OK;
}

mk_status mk_gguf_get_array_info(const mk_gguf *g, const char *key, mk_gguf_value_type *elem_type,
                                 size_t *count) {
    const gg_kv *kv;
    MK_TRY(gg_lookup_array(g, key, &kv));
    if (elem_type) *elem_type = kv->elem_type;
    if (count) *count = kv->count;
    return MK_OK;
}

mk_status mk_gguf_get_array_data(const mk_gguf *g, const char *key, const void **data, size_t *count) {
    const gg_kv *kv;
    MK_TRY(gg_lookup_array(g, key, &kv));
    if (kv->elem_type == MK_GGUF_TYPE_STRING)
        return mk_fail(MK_ERR_GGUF_VALUE_TYPE, "gguf: array '%s' holds strings; use mk_gguf_get_array_string", key);
    *data = kv->value;
    *count = kv->count;
    return MK_OK;
}

mk_status mk_gguf_get_array_string(const mk_gguf *g, const char *key, size_t index, const char **str,
                                   size_t *len) {
    const gg_kv *kv;
    MK_TRY(gg_lookup_array(g, key, &kv));
    if (kv->elem_type != MK_GGUF_TYPE_STRING)
        return mk_fail(MK_ERR_GGUF_VALUE_TYPE, "gguf: array '%s' does not hold strings", key);
    if (index >= kv->count)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "gguf: index %zu past the end of array '%s' (%zu)", index,
                       key, kv->count);
    *str = (const char *)g->base + kv->str_pos[index];
    *len = kv->str_len[index];
    return MK_OK;
}

/* ================================================================= tensors == */

size_t mk_gguf_tensor_count(const mk_gguf *g) { return g ? g->n_tensors : 0; }

const mk_gguf_tensor_info *mk_gguf_tensor_at(const mk_gguf *g, size_t index) {
    return g && index < g->n_tensors ? &g->tensors[index] : NULL;
}

mk_status mk_gguf_tensor_info_get(const mk_gguf *g, const char *name, const mk_gguf_tensor_info **out) {
    if (!g || !name || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "gguf tensor lookup: NULL argument");
    *out = mk_gguf_find_tensor(g, name);
    if (!*out) return mk_fail(MK_ERR_GGUF_MISSING, "gguf: tensor '%s' not found", name);
    return MK_OK;
}

mk_status mk_gguf_tensor_to_f32(const mk_gguf *g, const char *name, float *out, size_t n_elements) {
    const mk_gguf_tensor_info *t;
    MK_TRY(mk_gguf_tensor_info_get(g, name, &t));
    if (!out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "gguf: NULL output for tensor '%s'", name);
    if (n_elements != t->n_elements)
        return mk_fail(MK_ERR_GGUF_DIMS, "gguf: tensor '%s' has %llu elements, caller expected %zu", name,
                       (unsigned long long)t->n_elements, n_elements);
    mk_status st = mk_gguf_dequantize(t->type, t->data, t->n_bytes, out, n_elements);
    if (st != MK_OK) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", mk_last_error());
        return mk_fail(st, "tensor '%s': %s", name, msg);
    }
    return MK_OK;
}

mk_status mk_gguf_tensor_rows_to_f32(const mk_gguf *g, const char *name, size_t row_start, size_t n_rows,
                                     float *out) {
    const mk_gguf_tensor_info *t;
    MK_TRY(mk_gguf_tensor_info_get(g, name, &t));
    if (!out && n_rows) return mk_fail(MK_ERR_INVALID_ARGUMENT, "gguf: NULL output for tensor '%s'", name);
    size_t be, bb;
    mk_ggml_type_layout(t->type, &be, &bb); /* known: checked at open */
    const size_t row_len = (size_t)t->dims[0];
    const size_t rows = (size_t)(t->n_elements / t->dims[0]);
    if (row_start > rows || n_rows > rows - row_start)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "gguf: rows [%zu, +%zu) outside tensor '%s' (%zu rows)",
                       row_start, n_rows, name, rows);
    const size_t row_bytes = row_len / be * bb;
    const uint8_t *src = (const uint8_t *)t->data + row_start * row_bytes;
    mk_status st = mk_gguf_dequantize(t->type, src, n_rows * row_bytes, out, n_rows * row_len);
    if (st != MK_OK) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", mk_last_error());
        return mk_fail(st, "tensor '%s': %s", name, msg);
    }
    return MK_OK;
}

/* ============================================================ architecture == */

mk_status mk_gguf_architecture(const mk_gguf *g, char *arch, size_t arch_cap) {
    if (!g || !arch || arch_cap == 0) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_gguf_architecture: NULL argument");
    arch[0] = '\0';
    const gg_kv *kv = gg_find_kv(g, "general.architecture");
    if (!kv) return mk_fail(MK_ERR_GGUF_MISSING, "gguf: general.architecture is missing");
    if (kv->type != MK_GGUF_TYPE_STRING)
        return mk_fail(MK_ERR_GGUF_VALUE_TYPE, "gguf: general.architecture is not a string");
    if (kv->len == 0 || memchr(kv->value, 0, kv->len))
        return mk_fail(MK_ERR_GGUF_STRING, "gguf: general.architecture is empty or contains NUL");
    return mk_gguf_get_string_copy(g, "general.architecture", arch, arch_cap);
}
