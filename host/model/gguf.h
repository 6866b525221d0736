/* GGUF reader (llama.cpp's model format, versions 2 and 3): internal API.
 *
 * A GGUF file is an untrusted input. mk_gguf_open validates the whole structure before
 * returning: header, every metadata key/value (all value types, arrays of any scalar type
 * and of strings), every tensor info, the alignment and the data section. Every count,
 * string length, dimension, offset and size is checked against the bytes that remain
 * BEFORE it is used; a count is capped by what the remaining bytes could possibly hold, so
 * a crafted file can cause neither an out-of-bounds read nor a huge allocation. Failures
 * return an MK_ERR_GGUF_* status with a message (mk_last_error()):
 *
 *   MK_ERR_GGUF_TRUNCATED    the file ends inside a field or before the data section
 *   MK_ERR_GGUF_MAGIC        not "GGUF"
 *   MK_ERR_GGUF_VERSION      version other than 2 or 3 (v1 used 32-bit counts)
 *   MK_ERR_GGUF_COUNT        kv / tensor / array count larger than the remaining bytes
 *                            could hold (truncated or crafted)
 *   MK_ERR_GGUF_STRING       string length past the end; empty or duplicate key or
 *                            tensor name
 *   MK_ERR_GGUF_VALUE_TYPE   unknown metadata value type, nested array, or a lookup with
 *                            a type that cannot be coerced
 *   MK_ERR_GGUF_TENSOR_TYPE  unknown ggml tensor type (or not dequantizable, at
 *                            mk_gguf_tensor_to_f32)
 *   MK_ERR_GGUF_DIMS         n_dims 0 or > 4, a zero dimension, element count or byte
 *                            size overflow, row length not a multiple of the block size
 *   MK_ERR_GGUF_ALIGNMENT    general.alignment 0 / not a power of two / not an integer,
 *                            or a tensor offset that is not a multiple of it
 *   MK_ERR_GGUF_DATA_BOUNDS  tensor data past the end of the file
 *   MK_ERR_GGUF_MISSING      a key or tensor looked up does not exist
 *   MK_ERR_GGUF_HPARAMS      inconsistent hyper-parameters or tensor shapes (reported by
 *                            the dense-llama reader, mk_gguf_read_hparams in model/model.h)
 *
 * Byte order: GGUF is little-endian; this reader assumes a little-endian host.
 *
 * Ownership: mk_gguf_open maps the file read-only and owns the mapping;
 * mk_gguf_open_memory borrows the caller's bytes (they must outlive the handle). Both
 * allocate the handle, released with mk_gguf_close (accepts NULL). Every pointer handed
 * out (strings, tensor data, tensor names) points into the handle or the file bytes and
 * is valid until mk_gguf_close. GGUF strings are NOT NUL-terminated in the file: string
 * values are returned as (pointer, length); keys and tensor names are copied and are
 * NUL-terminated. */
#ifndef MK_GGUF_H
#define MK_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meshkern.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mk_gguf mk_gguf; /* opaque */

/* ------------------------------------------------------------------ constants -- */

#define MK_GGUF_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */
#define MK_GGUF_DEFAULT_ALIGNMENT 32u
#define MK_GGUF_MAX_DIMS 4u

/* Metadata value types (the GGUF spec's gguf_type). */
typedef enum mk_gguf_value_type {
    MK_GGUF_TYPE_UINT8 = 0,
    MK_GGUF_TYPE_INT8 = 1,
    MK_GGUF_TYPE_UINT16 = 2,
    MK_GGUF_TYPE_INT16 = 3,
    MK_GGUF_TYPE_UINT32 = 4,
    MK_GGUF_TYPE_INT32 = 5,
    MK_GGUF_TYPE_FLOAT32 = 6,
    MK_GGUF_TYPE_BOOL = 7,
    MK_GGUF_TYPE_STRING = 8,
    MK_GGUF_TYPE_ARRAY = 9,
    MK_GGUF_TYPE_UINT64 = 10,
    MK_GGUF_TYPE_INT64 = 11,
    MK_GGUF_TYPE_FLOAT64 = 12,
} mk_gguf_value_type;

/* ggml tensor types (the ids stored in the file). The reader knows the block layout of
 * every id listed here (so files holding them open and can be inspected); the ones
 * marked * can be dequantized by mk_gguf_tensor_to_f32 / mk_gguf_dequantize. */
typedef enum mk_ggml_type {
    MK_GGML_TYPE_F32 = 0,   /* * */
    MK_GGML_TYPE_F16 = 1,   /* * */
    MK_GGML_TYPE_Q4_0 = 2,  /* * */
    MK_GGML_TYPE_Q4_1 = 3,  /* * */
    MK_GGML_TYPE_Q5_0 = 6,  /* * */
    MK_GGML_TYPE_Q5_1 = 7,  /* * */
    MK_GGML_TYPE_Q8_0 = 8,  /* * */
    MK_GGML_TYPE_Q8_1 = 9,
    MK_GGML_TYPE_Q2_K = 10, /* * */
    MK_GGML_TYPE_Q3_K = 11, /* * */
    MK_GGML_TYPE_Q4_K = 12, /* * */
    MK_GGML_TYPE_Q5_K = 13, /* * */
    MK_GGML_TYPE_Q6_K = 14, /* * */
    MK_GGML_TYPE_Q8_K = 15,
    MK_GGML_TYPE_IQ2_XXS = 16,
    MK_GGML_TYPE_IQ2_XS = 17,
    MK_GGML_TYPE_IQ3_XXS = 18,
    MK_GGML_TYPE_IQ1_S = 19,
    MK_GGML_TYPE_IQ4_NL = 20,
    MK_GGML_TYPE_IQ3_S = 21,
    MK_GGML_TYPE_IQ2_S = 22,
    MK_GGML_TYPE_IQ4_XS = 23,
    MK_GGML_TYPE_I8 = 24,
    MK_GGML_TYPE_I16 = 25,
    MK_GGML_TYPE_I32 = 26,
    MK_GGML_TYPE_I64 = 27,
    MK_GGML_TYPE_F64 = 28,
    MK_GGML_TYPE_IQ1_M = 29,
    MK_GGML_TYPE_BF16 = 30, /* * */
    MK_GGML_TYPE_TQ1_0 = 34,
    MK_GGML_TYPE_TQ2_0 = 35,
    MK_GGML_TYPE_MXFP4 = 39,
} mk_ggml_type;

/* Name ("Q4_1") of a ggml type id, or NULL for an unknown id. */
const char *mk_ggml_type_name(uint32_t type);
/* Elements per block and bytes per block; false for an unknown id. */
bool mk_ggml_type_layout(uint32_t type, size_t *block_elements, size_t *block_bytes);
/* True when mk_gguf_dequantize supports the type. */
bool mk_ggml_type_can_dequantize(uint32_t type);
/* Byte offsets in a block of the type's f16 scales (d, then dmin or m where it has one;
 * -1: none); false for a type without them or unknown. */
bool mk_ggml_type_f16_scales(uint32_t type, int offsets[2]);

/* The eight 6-bit scales and mins of a Q4_K or Q5_K super-block from its 12 packed scale
 * bytes (the one reading of that packing: the dequantizer and the cpu dots use it), four
 * at a time in 32-bit words of bytes: bytes 0-3 hold scales 0-3 in their low six bits,
 * bytes 4-7 mins 0-3; bytes 8-11 the low four bits of scales 4-7 (low nibbles) and of mins
 * 4-7 (high nibbles), whose top two bits are the top bits of bytes 0-3 and 4-7. */
static inline uint32_t mk_k4_word(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline void mk_k4_scales_mins(const uint8_t *scales, uint8_t sc[8], uint8_t mn[8]) {
    const uint32_t a = mk_k4_word(scales), b = mk_k4_word(scales + 4), c = mk_k4_word(scales + 8);
    const uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, low2 = 0x03030303u;
    const uint32_t words[4] = {a & low6, (c & low4) | ((a >> 6) & low2) << 4, b & low6,
                               ((c >> 4) & low4) | ((b >> 6) & low2) << 4};
    for (int i = 0; i < 8; i++) {
        sc[i] = (uint8_t)(words[i / 4] >> (8 * (i % 4)));
        mn[i] = (uint8_t)(words[2 + i / 4] >> (8 * (i % 4)));
    }
}

/* The sixteen signed scales of a Q3_K super-block from its 12 packed bytes (the one reading
 * of that packing: the dequantizer and the cpu dots use it): scale i's low four bits are the
 * low (i < 8) or high (i >= 8) nibble of byte i % 8, its top two bits are bits 2 (i / 4)
 * and up of byte 8 + i % 4; the 6-bit value less 32. */
static inline void mk_k3_scales(const uint8_t *s, int8_t scale[16]) {
    for (int i = 0; i < 16; i++) {
        const unsigned lo = i < 8 ? (s[i] & 0x0fu) : (unsigned)(s[i - 8] >> 4);
        const unsigned hi = (unsigned)(s[8 + i % 4] >> (2 * (i / 4))) & 3u;
        scale[i] = (int8_t)((int)(lo | (hi << 4)) - 32);
    }
}

/* IQ4_NL's and IQ4_XS's 16 non-uniform values: a 4-bit index q stands for mk_iq4_values[q]
 * (times the block's scale). */
static const int8_t mk_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* The signed scale of sub-block ib (0..7, 32 values each) of an IQ4_XS super-block b (d f16,
 * scales_h u16, scales_l[4], qs[128]): the low four bits are nibble ib % 2 of scales_l[ib / 2],
 * the top two bits 2 ib of scales_h; the 6-bit value less 32. */
static inline int mk_iq4xs_scale(const uint8_t *b, int ib) {
    const unsigned h = (unsigned)b[2] | (unsigned)b[3] << 8;
    const unsigned lo = (unsigned)(b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0fu, hi = (h >> (2 * ib)) & 3u;
    return (int)(lo | hi << 4) - 32;
}

/* ----------------------------------------------------------------- open/close -- */

mk_status mk_gguf_open(const char *path, mk_gguf **out);
mk_status mk_gguf_open_memory(const void *data, size_t len, mk_gguf **out);
void mk_gguf_close(mk_gguf *g);

uint32_t mk_gguf_version(const mk_gguf *g);
size_t mk_gguf_alignment(const mk_gguf *g);
size_t mk_gguf_data_offset(const mk_gguf *g); /* file offset of the aligned data section */
size_t mk_gguf_file_size(const mk_gguf *g);

/* ------------------------------------------------------------------- metadata -- */

size_t mk_gguf_kv_count(const mk_gguf *g);
/* Index of `key` or -1. */
int64_t mk_gguf_find_key(const mk_gguf *g, const char *key);
const char *mk_gguf_key_at(const mk_gguf *g, size_t index); /* NULL past the end */
/* Value type of key at index (MK_GGUF_TYPE_ARRAY for arrays). */
mk_gguf_value_type mk_gguf_type_at(const mk_gguf *g, size_t index);

/* Typed lookups. MK_ERR_GGUF_MISSING if the key is absent, MK_ERR_GGUF_VALUE_TYPE if the
 * stored type does not convert. Integer getters accept any integer type (and bool) whose
 * value fits the requested type; f32 accepts f32, f64 (rounded) and integers. */
mk_status mk_gguf_get_u32(const mk_gguf *g, const char *key, uint32_t *out);
mk_status mk_gguf_get_i32(const mk_gguf *g, const char *key, int32_t *out);
mk_status mk_gguf_get_u64(const mk_gguf *g, const char *key, uint64_t *out);
mk_status mk_gguf_get_i64(const mk_gguf *g, const char *key, int64_t *out);
mk_status mk_gguf_get_f32(const mk_gguf *g, const char *key, float *out);
mk_status mk_gguf_get_bool(const mk_gguf *g, const char *key, bool *out);
/* String value as (pointer into the file, length); not NUL-terminated. */
mk_status mk_gguf_get_string(const mk_gguf *g, const char *key, const char **str, size_t *len);
/* Copy a string value NUL-terminated into buf[cap]; MK_ERR_INVALID_ARGUMENT if it does
 * not fit. */
mk_status mk_gguf_get_string_copy(const mk_gguf *g, const char *key, char *buf, size_t cap);

/* Arrays: element type and count; MK_ERR_GGUF_VALUE_TYPE if the key is not an array. */
mk_status mk_gguf_get_array_info(const mk_gguf *g, const char *key, mk_gguf_value_type *elem_type,
                                 size_t *count);
/* Raw little-endian elements of a scalar-typed array (count * element size bytes). */
mk_status mk_gguf_get_array_data(const mk_gguf *g, const char *key, const void **data,
                                 size_t *count);
/* Element i of a string array (pointer into the file, length). */
mk_status mk_gguf_get_array_string(const mk_gguf *g, const char *key, size_t index,
                                   const char **str, size_t *len);

/* -------------------------------------------------------------------- tensors -- */

typedef struct mk_gguf_tensor_info {
    const char *name;     /* NUL-terminated, owned by the handle */
    uint32_t n_dims;      /* 1..4 */
    uint64_t dims[MK_GGUF_MAX_DIMS]; /* fastest first: dims[0] = row length; unused = 1 */
    uint32_t type;        /* mk_ggml_type */
    uint64_t n_elements;  /* product of dims */
    size_t offset;        /* relative to the data section (aligned) */
    size_t n_bytes;       /* bytes of data */
    const void *data;     /* inside the mapping / borrowed bytes */
} mk_gguf_tensor_info;

size_t mk_gguf_tensor_count(const mk_gguf *g);
/* Tensor at index (file order); NULL past the end. */
const mk_gguf_tensor_info *mk_gguf_tensor_at(const mk_gguf *g, size_t index);
/* Lookup by name (binary search); NULL if absent. */
const mk_gguf_tensor_info *mk_gguf_find_tensor(const mk_gguf *g, const char *name);
/* Same, as a status: MK_ERR_GGUF_MISSING with the name in the message. */
mk_status mk_gguf_tensor_info_get(const mk_gguf *g, const char *name,
                                  const mk_gguf_tensor_info **out);

/* Dequantize the whole tensor `name` to float32. n_elements must equal the tensor's
 * element count (MK_ERR_GGUF_DIMS otherwise); out[n_elements] is owned by the caller.
 * Element order is the file's: row r (dims[0] elements) starts at out + r * dims[0]. */
mk_status mk_gguf_tensor_to_f32(const mk_gguf *g, const char *name, float *out,
                                size_t n_elements);
/* Dequantize rows [row_start, row_start + n_rows) of a tensor viewed as
 * [n_elements / dims[0], dims[0]]; out[n_rows * dims[0]]. Lets a caller take a slice
 * (one expert, one row block) without dequantizing the whole tensor. */
mk_status mk_gguf_tensor_rows_to_f32(const mk_gguf *g, const char *name, size_t row_start,
                                     size_t n_rows, float *out);
/* Raw kernel: n elements (a multiple of the type's block size) of `type` from src
 * (src_bytes must be exactly n / block_elements * block_bytes) to out[n]. */
mk_status mk_gguf_dequantize(uint32_t type, const void *src, size_t src_bytes, float *out,
                             size_t n);

/* MK_ERR_NONFINITE naming the first value of src (src_bytes of `type`) that is NaN or
 * infinite: every value of F32, F16 and BF16, the f16 scales of each block of the
 * quantized types (a finite scale cannot make a value non-finite); MK_OK otherwise, and for
 * the types mk_gguf_dequantize does not take. The tensor loaders run it on every tensor
 * they hand out, so a model whose weights hold NaN or Inf is refused at load, not run. */
mk_status mk_gguf_check_finite(uint32_t type, const void *src, size_t src_bytes);

/* ------------------------------------------------------------------ architecture -- */

/* Copy general.architecture NUL-terminated into arch[arch_cap]. Call this and check the
 * certified-architecture registry BEFORE reading hyper-parameters (mk_gguf_read_hparams,
 * model/model.h: the dense-llama keys live there, not in this generic reader) or weights. */
mk_status mk_gguf_architecture(const mk_gguf *g, char *arch, size_t arch_cap);

#ifdef __cplusplus
}
#endif
#endif /* MK_GGUF_H */
