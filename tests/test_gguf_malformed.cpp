// Malformed-GGUF suite: every structural defect of a GGUF image yields its specific
// MK_ERR_GGUF_* status and a message, never an out-of-bounds read or a crash.
//
// Images are built in memory by a small writer (mktest::Builder below) and handed to
// mk_gguf_open_memory in a heap block of exactly their length, so AddressSanitizer
// (-DMESHKERN_SANITIZE=ON) flags any read past the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

#include "model/gguf.h"
#include "model/model.h" /* mk_gguf_read_hparams */
#include "meshkern.h"

#include <cstring>
#include <string>
#include <vector>

namespace mktest {

inline void put_u8(std::vector<uint8_t> &b, uint8_t v) { b.push_back(v); }
inline void put_u16(std::vector<uint8_t> &b, uint16_t v) {
    for (int i = 0; i < 2; i++) b.push_back((uint8_t)(v >> (8 * i)));
}
inline void put_u32(std::vector<uint8_t> &b, uint32_t v) {
    for (int i = 0; i < 4; i++) b.push_back((uint8_t)(v >> (8 * i)));
}
inline void put_u64(std::vector<uint8_t> &b, uint64_t v) {
    for (int i = 0; i < 8; i++) b.push_back((uint8_t)(v >> (8 * i)));
}
inline void put_f32(std::vector<uint8_t> &b, float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    put_u32(b, u);
}
inline void put_f64(std::vector<uint8_t> &b, double f) {
    uint64_t u;
    std::memcpy(&u, &f, 8);
    put_u64(b, u);
}
inline void put_str(std::vector<uint8_t> &b, const std::string &s) {
    put_u64(b, s.size());
    b.insert(b.end(), s.begin(), s.end());
}
inline void patch_u32(std::vector<uint8_t> &b, size_t at, uint32_t v) {
    for (int i = 0; i < 4; i++) b[at + i] = (uint8_t)(v >> (8 * i));
}
inline void patch_u64(std::vector<uint8_t> &b, size_t at, uint64_t v) {
    for (int i = 0; i < 8; i++) b[at + i] = (uint8_t)(v >> (8 * i));
}

enum : uint32_t {
    T_U8 = 0, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64
};

// Where each part of a built image lies (file offsets).
struct Layout {
    size_t header_end = 0;
    std::vector<size_t> kv_start, kv_end;
    std::vector<size_t> info_start, info_end;
    std::vector<size_t> info_offset_field; // file offset of each tensor's u64 offset field
    std::vector<size_t> info_type_field;
    size_t infos_end = 0;
    size_t data_start = 0;
    std::vector<size_t> tensor_data_start;
    size_t total = 0;
};

struct Builder {
    uint32_t magic = 0x46554747u;
    uint32_t version = 3;
    size_t alignment = 32;              // used to place data; add the key yourself if != 32
    bool override_counts = false;       // write n_kv_override / n_tensors_override
    uint64_t n_kv_override = 0, n_tensors_override = 0;

    struct Kv {
        std::vector<uint8_t> bytes; // key + type + value, already encoded
    };
    struct Tensor {
        std::string name;
        std::vector<uint64_t> dims;
        uint32_t type = 0;
        std::vector<uint8_t> data;
        bool offset_set = false;
        uint64_t offset = 0;
    };
    std::vector<Kv> kvs;
    std::vector<Tensor> tensors;

    // ---- metadata ----
    Builder &kv_raw(const std::vector<uint8_t> &bytes) {
        kvs.push_back({bytes});
        return *this;
    }
    std::vector<uint8_t> head(const std::string &key, uint32_t type) {
        std::vector<uint8_t> b;
        put_str(b, key);
        put_u32(b, type);
        return b;
    }
    Builder &kv_u8(const std::string &k, uint8_t v) { auto b = head(k, T_U8); put_u8(b, v); return kv_raw(b); }
    Builder &kv_i8(const std::string &k, int8_t v) { auto b = head(k, T_I8); put_u8(b, (uint8_t)v); return kv_raw(b); }
    Builder &kv_u16(const std::string &k, uint16_t v) { auto b = head(k, T_U16); put_u16(b, v); return kv_raw(b); }
    Builder &kv_i16(const std::string &k, int16_t v) { auto b = head(k, T_I16); put_u16(b, (uint16_t)v); return kv_raw(b); }
    Builder &kv_u32(const std::string &k, uint32_t v) { auto b = head(k, T_U32); put_u32(b, v); return kv_raw(b); }
    Builder &kv_i32(const std::string &k, int32_t v) { auto b = head(k, T_I32); put_u32(b, (uint32_t)v); return kv_raw(b); }
    Builder &kv_u64(const std::string &k, uint64_t v) { auto b = head(k, T_U64); put_u64(b, v); return kv_raw(b); }
    Builder &kv_i64(const std::string &k, int64_t v) { auto b = head(k, T_I64); put_u64(b, (uint64_t)v); return kv_raw(b); }
    Builder &kv_f32(const std::string &k, float v) { auto b = head(k, T_F32); put_f32(b, v); return kv_raw(b); }
    Builder &kv_f64(const std::string &k, double v) { auto b = head(k, T_F64); put_f64(b, v); return kv_raw(b); }
    Builder &kv_bool(const std::string &k, bool v) { auto b = head(k, T_BOOL); put_u8(b, v ? 1 : 0); return kv_raw(b); }
    Builder &kv_str(const std::string &k, const std::string &v) { auto b = head(k, T_STR); put_str(b, v); return kv_raw(b); }
    Builder &kv_arr_i32(const std::string &k, const std::vector<int32_t> &v) {
        auto b = head(k, T_ARR);
        put_u32(b, T_I32);
        put_u64(b, v.size());
        for (int32_t x : v) put_u32(b, (uint32_t)x);
        return kv_raw(b);
    }
    Builder &kv_arr_str(const std::string &k, const std::vector<std::string> &v) {
        auto b = head(k, T_ARR);
        put_u32(b, T_STR);
        put_u64(b, v.size());
        for (const auto &s : v) put_str(b, s);
        return kv_raw(b);
    }

    // ---- tensors ----
    Builder &tensor(const std::string &name, std::vector<uint64_t> dims, uint32_t type,
                    std::vector<uint8_t> data) {
        Tensor t;
        t.name = name;
        t.dims = std::move(dims);
        t.type = type;
        t.data = std::move(data);
        tensors.push_back(std::move(t));
        return *this;
    }
    Builder &tensor_f32(const std::string &name, std::vector<uint64_t> dims, const std::vector<float> &v) {
        std::vector<uint8_t> d;
        for (float f : v) put_f32(d, f);
        return tensor(name, std::move(dims), 0, std::move(d));
    }
    // F32 tensor filled with a simple pattern, sized from dims.
    Builder &tensor_f32_fill(const std::string &name, std::vector<uint64_t> dims, float base = 0.0f) {
        uint64_t n = 1;
        for (uint64_t d : dims) n *= d;
        std::vector<float> v(n);
        for (uint64_t i = 0; i < n; i++) v[i] = base + 0.25f * (float)(i % 17);
        return tensor_f32(name, std::move(dims), v);
    }

    std::vector<uint8_t> build(Layout *layout = nullptr) const {
        Layout L;
        std::vector<uint8_t> b;
        put_u32(b, magic);
        put_u32(b, version);
        put_u64(b, override_counts ? n_tensors_override : tensors.size());
        put_u64(b, override_counts ? n_kv_override : kvs.size());
        L.header_end = b.size();
        for (const auto &kv : kvs) {
            L.kv_start.push_back(b.size());
            b.insert(b.end(), kv.bytes.begin(), kv.bytes.end());
            L.kv_end.push_back(b.size());
        }
        // data offsets: packed in order, each aligned
        std::vector<uint64_t> offs;
        uint64_t cur = 0;
        for (const auto &t : tensors) {
            cur = (cur + alignment - 1) / alignment * alignment;
            offs.push_back(t.offset_set ? t.offset : cur);
            cur += t.data.size();
        }
        for (size_t i = 0; i < tensors.size(); i++) {
            const auto &t = tensors[i];
            L.info_start.push_back(b.size());
            put_str(b, t.name);
            put_u32(b, (uint32_t)t.dims.size());
            for (uint64_t d : t.dims) put_u64(b, d);
            L.info_type_field.push_back(b.size());
            put_u32(b, t.type);
            L.info_offset_field.push_back(b.size());
            put_u64(b, offs[i]);
            L.info_end.push_back(b.size());
        }
        L.infos_end = b.size();
        while (b.size() % alignment) b.push_back(0);
        L.data_start = b.size();
        cur = 0;
        for (size_t i = 0; i < tensors.size(); i++) {
            const auto &t = tensors[i];
            cur = (cur + alignment - 1) / alignment * alignment;
            while (b.size() < L.data_start + cur) b.push_back(0);
            L.tensor_data_start.push_back(b.size());
            b.insert(b.end(), t.data.begin(), t.data.end());
            cur += t.data.size();
        }
        L.total = b.size();
        if (layout) *layout = L;
        return b;
    }
};

} // namespace mktest

using namespace mktest;

namespace {

// ------------------------------------------------------------------ helpers --

struct Opened {
    mk_gguf *g = nullptr;
    std::unique_ptr<uint8_t[]> bytes;
    ~Opened() { mk_gguf_close(g); }
};

mk_status open_owned(const std::vector<uint8_t> &img, Opened &o, size_t len = SIZE_MAX) {
    if (len == SIZE_MAX) len = img.size();
    o.bytes.reset(new uint8_t[len ? len : 1]);
    if (len) std::memcpy(o.bytes.get(), img.data(), len);
    return mk_gguf_open_memory(o.bytes.get(), len, &o.g);
}

// The message must name the problem: `needle` is a part of it specific to the case.
::testing::AssertionResult message_names(const char *needle) {
    const std::string m = mk_last_error();
    if (m.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "message '" << m << "' does not contain '" << needle << "'";
}

// Expect `img` (first len bytes) to fail with `want` and a message containing `needle`.
void expect_status(const std::vector<uint8_t> &img, mk_status want, const char *needle, const char *what,
                   size_t len = SIZE_MAX) {
    Opened o;
    mk_status st = open_owned(img, o, len);
    EXPECT_EQ(st, want) << what << ": got " << mk_status_name(st) << " (" << mk_last_error() << ")";
    if (st != MK_OK) {
        EXPECT_TRUE(message_names(needle)) << what;
        EXPECT_EQ(o.g, nullptr) << what;
    }
}

// What the message of each structural failure says, whatever the case.
const char *structural_needle(mk_status st) {
    switch (st) {
        case MK_ERR_GGUF_TRUNCATED: return "truncated";
        case MK_ERR_GGUF_COUNT: return "declares";
        case MK_ERR_GGUF_STRING: return "past the end of the file";
        case MK_ERR_GGUF_DATA_BOUNDS: return "past the end of the data section";
        default: return "(no needle for this status)";
    }
}

std::vector<uint8_t> f16_bytes(const std::vector<uint16_t> &h) {
    std::vector<uint8_t> b;
    for (uint16_t x : h) put_u16(b, x);
    return b;
}

// Q8_0 block: d = 1.0 (f16 0x3c00) then 32 int8 values
std::vector<uint8_t> q8_0_blocks(const std::vector<int8_t> &q, uint16_t d = 0x3c00) {
    std::vector<uint8_t> b;
    for (size_t i = 0; i < q.size(); i += 32) {
        put_u16(b, d);
        for (size_t j = 0; j < 32; j++) b.push_back((uint8_t)q[i + j]);
    }
    return b;
}

Builder valid_builder() {
    Builder b;
    b.kv_str("general.architecture", "llama")
        .kv_u8("test.u8", 200)
        .kv_i8("test.i8", -5)
        .kv_u16("test.u16", 65000)
        .kv_i16("test.i16", -30000)
        .kv_u32("test.u32", 4000000000u)
        .kv_i32("test.i32", -2000000000)
        .kv_f32("test.f32", 1.5f)
        .kv_bool("test.bool", true)
        .kv_u64("test.u64", (1ull << 40) + 3)
        .kv_i64("test.i64", -(1ll << 40) - 3)
        .kv_f64("test.f64", 0.1)
        .kv_arr_i32("test.arr_i32", {1, -2, 3})
        .kv_arr_str("test.arr_str", {"a", "bc", ""})
        .kv_str("test.pad", "xyz");
    b.tensor_f32("a", {8}, {0, 1, 2, 3, -4, 5.5f, 6, 7});
    b.tensor("b", {4, 2}, MK_GGML_TYPE_F16,
             f16_bytes({0x3c00, 0xc000, 0x0001, 0x8000, 0x7c00, 0x3555, 0x0400, 0xfbff}));
    std::vector<int8_t> q(64);
    for (int i = 0; i < 64; i++) q[i] = (int8_t)(i * 4 - 128);
    b.tensor("c", {32, 2}, MK_GGML_TYPE_Q8_0, q8_0_blocks(q, 0x3800 /* 0.5 */));
    return b;
}

// A tiny llama model: vocab 16, hidden 8, 2 layers, 2 heads, 1 kv head, ff 12.
struct LlamaOpts {
    std::string arch = "llama";
    std::string key_prefix = "llama";
    uint32_t hidden = 8, layers = 2, heads = 2, kv_heads = 1, ff = 12, vocab = 16;
    bool with_kv_heads = true, with_vocab_key = true, with_output = false, with_rope_dims = true;
    uint32_t rope_dims = 4;
    bool with_block_count = true;
    bool bad_attn_k = false, drop_last_ffn_down = false, with_tokens = false;
};

Builder llama_builder(const LlamaOpts &o) {
    Builder b;
    const std::string p = o.key_prefix + ".";
    b.kv_str("general.architecture", o.arch);
    b.kv_u32(p + "context_length", 256);
    b.kv_u32(p + "embedding_length", o.hidden);
    if (o.with_block_count) b.kv_u32(p + "block_count", o.layers);
    b.kv_u32(p + "feed_forward_length", o.ff);
    b.kv_u32(p + "attention.head_count", o.heads);
    if (o.with_kv_heads) b.kv_u32(p + "attention.head_count_kv", o.kv_heads);
    b.kv_f32(p + "rope.freq_base", 100000.0f);
    b.kv_f32(p + "attention.layer_norm_rms_epsilon", 1e-5f);
    if (o.with_rope_dims) b.kv_u32(p + "rope.dimension_count", o.rope_dims);
    if (o.with_vocab_key) b.kv_u32(p + "vocab_size", o.vocab);
    if (o.with_tokens) {
        std::vector<std::string> toks;
        for (uint32_t i = 0; i < o.vocab; i++) toks.push_back("t" + std::to_string(i));
        b.kv_arr_str("tokenizer.ggml.tokens", toks);
    }
    const uint64_t hd = o.hidden / o.heads, q = o.heads * hd, kv = o.kv_heads * hd;
    b.tensor_f32_fill("token_embd.weight", {o.hidden, o.vocab});
    b.tensor_f32_fill("output_norm.weight", {o.hidden}, 1.0f);
    if (o.with_output) b.tensor_f32_fill("output.weight", {o.hidden, o.vocab});
    for (uint32_t l = 0; l < o.layers; l++) {
        const std::string n = "blk." + std::to_string(l) + ".";
        b.tensor_f32_fill(n + "attn_norm.weight", {o.hidden}, 1.0f);
        b.tensor_f32_fill(n + "attn_q.weight", {o.hidden, q});
        b.tensor_f32_fill(n + "attn_k.weight", {o.hidden, o.bad_attn_k ? kv + 1 : kv});
        b.tensor_f32_fill(n + "attn_v.weight", {o.hidden, kv});
        b.tensor_f32_fill(n + "attn_output.weight", {q, o.hidden});
        b.tensor_f32_fill(n + "ffn_norm.weight", {o.hidden}, 1.0f);
        b.tensor_f32_fill(n + "ffn_gate.weight", {o.hidden, o.ff});
        b.tensor_f32_fill(n + "ffn_up.weight", {o.hidden, o.ff});
        if (!(o.drop_last_ffn_down && l + 1 == o.layers))
            b.tensor_f32_fill(n + "ffn_down.weight", {o.ff, o.hidden});
    }
    return b;
}

const std::set<mk_status> kStructural = {
    MK_ERR_GGUF_TRUNCATED, MK_ERR_GGUF_MAGIC,       MK_ERR_GGUF_VERSION,     MK_ERR_GGUF_COUNT,
    MK_ERR_GGUF_STRING,    MK_ERR_GGUF_VALUE_TYPE,  MK_ERR_GGUF_TENSOR_TYPE, MK_ERR_GGUF_DIMS,
    MK_ERR_GGUF_ALIGNMENT, MK_ERR_GGUF_DATA_BOUNDS,
};

} // namespace

// ================================================================ valid image ==

TEST(gguf_valid, OpensAndReadsEveryValueType) {
    Layout L;
    auto img = valid_builder().build(&L);
    Opened o;
    ASSERT_EQ(open_owned(img, o), MK_OK) << mk_last_error();
    mk_gguf *g = o.g;
    EXPECT_EQ(mk_gguf_version(g), 3u);
    EXPECT_EQ(mk_gguf_alignment(g), 32u);
    EXPECT_EQ(mk_gguf_data_offset(g), L.data_start);
    EXPECT_EQ(mk_gguf_kv_count(g), 15u);
    EXPECT_EQ(mk_gguf_tensor_count(g), 3u);

    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f;
    bool bl;
    ASSERT_EQ(mk_gguf_get_u32(g, "test.u8", &u32), MK_OK);
    EXPECT_EQ(u32, 200u);
    ASSERT_EQ(mk_gguf_get_i32(g, "test.i8", &i32), MK_OK);
    EXPECT_EQ(i32, -5);
    ASSERT_EQ(mk_gguf_get_u32(g, "test.u16", &u32), MK_OK);
    EXPECT_EQ(u32, 65000u);
    ASSERT_EQ(mk_gguf_get_i32(g, "test.i16", &i32), MK_OK);
    EXPECT_EQ(i32, -30000);
    ASSERT_EQ(mk_gguf_get_u32(g, "test.u32", &u32), MK_OK);
    EXPECT_EQ(u32, 4000000000u);
    // coercion limits: u32 4e9 does not fit int32; negative does not fit unsigned
    EXPECT_EQ(mk_gguf_get_i32(g, "test.u32", &i32), MK_ERR_GGUF_VALUE_TYPE);
    EXPECT_EQ(mk_gguf_get_u64(g, "test.i8", &u64), MK_ERR_GGUF_VALUE_TYPE);
    EXPECT_EQ(mk_gguf_get_u32(g, "test.u64", &u32), MK_ERR_GGUF_VALUE_TYPE);
    ASSERT_EQ(mk_gguf_get_u64(g, "test.u64", &u64), MK_OK);
    EXPECT_EQ(u64, (1ull << 40) + 3);
    ASSERT_EQ(mk_gguf_get_i64(g, "test.i64", &i64), MK_OK);
    EXPECT_EQ(i64, -(1ll << 40) - 3);
    ASSERT_EQ(mk_gguf_get_f32(g, "test.f32", &f), MK_OK);
    EXPECT_EQ(f, 1.5f);
    ASSERT_EQ(mk_gguf_get_f32(g, "test.f64", &f), MK_OK);
    EXPECT_EQ(f, 0.1f);
    ASSERT_EQ(mk_gguf_get_f32(g, "test.u16", &f), MK_OK);
    EXPECT_EQ(f, 65000.0f);
    ASSERT_EQ(mk_gguf_get_bool(g, "test.bool", &bl), MK_OK);
    EXPECT_TRUE(bl);
    EXPECT_EQ(mk_gguf_get_u32(g, "test.f32", &u32), MK_ERR_GGUF_VALUE_TYPE);
    EXPECT_EQ(mk_gguf_get_u32(g, "general.architecture", &u32), MK_ERR_GGUF_VALUE_TYPE);
    EXPECT_EQ(mk_gguf_get_u32(g, "no.such.key", &u32), MK_ERR_GGUF_MISSING);
    EXPECT_NE(std::string(mk_last_error()).find("no.such.key"), std::string::npos);

    const char *s;
    size_t n;
    ASSERT_EQ(mk_gguf_get_string(g, "general.architecture", &s, &n), MK_OK);
    EXPECT_EQ(std::string(s, n), "llama");
    char buf[6];
    ASSERT_EQ(mk_gguf_get_string_copy(g, "general.architecture", buf, sizeof buf), MK_OK);
    EXPECT_STREQ(buf, "llama");
    EXPECT_EQ(mk_gguf_get_string_copy(g, "general.architecture", buf, 5), MK_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(mk_gguf_get_string(g, "test.u8", &s, &n), MK_ERR_GGUF_VALUE_TYPE);

    mk_gguf_value_type et;
    ASSERT_EQ(mk_gguf_get_array_info(g, "test.arr_i32", &et, &n), MK_OK);
    EXPECT_EQ(et, MK_GGUF_TYPE_INT32);
    EXPECT_EQ(n, 3u);
    const void *data;
    ASSERT_EQ(mk_gguf_get_array_data(g, "test.arr_i32", &data, &n), MK_OK);
    int32_t arr[3];
    std::memcpy(arr, data, sizeof arr);
    EXPECT_EQ(arr[0], 1);
    EXPECT_EQ(arr[1], -2);
    EXPECT_EQ(arr[2], 3);
    ASSERT_EQ(mk_gguf_get_array_info(g, "test.arr_str", &et, &n), MK_OK);
    EXPECT_EQ(et, MK_GGUF_TYPE_STRING);
    ASSERT_EQ(n, 3u);
    const char *want[] = {"a", "bc", ""};
    for (size_t i = 0; i < 3; i++) {
        ASSERT_EQ(mk_gguf_get_array_string(g, "test.arr_str", i, &s, &n), MK_OK);
        EXPECT_EQ(std::string(s, n), want[i]);
    }
    EXPECT_EQ(mk_gguf_get_array_string(g, "test.arr_str", 3, &s, &n), MK_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(mk_gguf_get_array_string(g, "test.arr_i32", 0, &s, &n), MK_ERR_GGUF_VALUE_TYPE);
    EXPECT_EQ(mk_gguf_get_array_data(g, "test.arr_str", &data, &n), MK_ERR_GGUF_VALUE_TYPE);
    EXPECT_EQ(mk_gguf_get_array_info(g, "test.u8", &et, &n), MK_ERR_GGUF_VALUE_TYPE);
    EXPECT_EQ(mk_gguf_find_key(g, "test.pad"), 14);
    EXPECT_STREQ(mk_gguf_key_at(g, 0), "general.architecture");
    EXPECT_EQ(mk_gguf_key_at(g, 15), nullptr);

    // tensors
    const mk_gguf_tensor_info *t = mk_gguf_find_tensor(g, "b");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->n_dims, 2u);
    EXPECT_EQ(t->dims[0], 4u);
    EXPECT_EQ(t->dims[1], 2u);
    EXPECT_EQ(t->dims[2], 1u);
    EXPECT_EQ(t->n_elements, 8u);
    EXPECT_EQ(t->n_bytes, 16u);
    EXPECT_EQ(t->type, (uint32_t)MK_GGML_TYPE_F16);
    EXPECT_EQ((const uint8_t *)t->data - o.bytes.get(), (ptrdiff_t)L.tensor_data_start[1]);
    float fb[8];
    ASSERT_EQ(mk_gguf_tensor_to_f32(g, "b", fb, 8), MK_OK);
    const float want_b[8] = {1.0f, -2.0f, 0x1p-24f, -0.0f, INFINITY, 0.33325195f, 0x1p-14f, -65504.0f};
    for (int i = 0; i < 8; i++) EXPECT_EQ(fb[i], want_b[i]) << i;
    EXPECT_TRUE(std::signbit(fb[3]));
    float fa[8];
    ASSERT_EQ(mk_gguf_tensor_to_f32(g, "a", fa, 8), MK_OK);
    EXPECT_EQ(fa[5], 5.5f);
    float fc[64];
    ASSERT_EQ(mk_gguf_tensor_to_f32(g, "c", fc, 64), MK_OK);
    for (int i = 0; i < 64; i++) EXPECT_EQ(fc[i], 0.5f * (float)(i * 4 - 128)) << i;
    float row1[32];
    ASSERT_EQ(mk_gguf_tensor_rows_to_f32(g, "c", 1, 1, row1), MK_OK);
    EXPECT_EQ(row1[0], fc[32]);
    EXPECT_EQ(mk_gguf_tensor_rows_to_f32(g, "c", 1, 2, row1), MK_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(mk_gguf_tensor_to_f32(g, "c", fc, 63), MK_ERR_GGUF_DIMS);
    EXPECT_EQ(mk_gguf_tensor_to_f32(g, "zz", fc, 64), MK_ERR_GGUF_MISSING);
    const mk_gguf_tensor_info *ti;
    EXPECT_EQ(mk_gguf_tensor_info_get(g, "zz", &ti), MK_ERR_GGUF_MISSING);
    EXPECT_NE(std::string(mk_last_error()).find("zz"), std::string::npos);
    EXPECT_STREQ(mk_gguf_tensor_at(g, 2)->name, "c");
    EXPECT_EQ(mk_gguf_tensor_at(g, 3), nullptr);
}

TEST(gguf_valid, Version2AndCustomAlignmentOpen) {
    Builder b = valid_builder();
    b.version = 2;
    expect_status(b.build(), MK_OK, "", "v2");
    Builder c = valid_builder();
    c.kv_u32("general.alignment", 64);
    c.alignment = 64;
    Layout L;
    auto img = c.build(&L);
    Opened o;
    ASSERT_EQ(open_owned(img, o), MK_OK) << mk_last_error();
    EXPECT_EQ(mk_gguf_alignment(o.g), 64u);
    EXPECT_EQ(mk_gguf_data_offset(o.g) % 64, 0u);
    Builder d = valid_builder();
    d.kv_u32("general.alignment", 1);
    d.alignment = 1;
    expect_status(d.build(), MK_OK, "", "alignment 1");
}

TEST(gguf_valid, EmptyFileWithoutTensorsOpens) {
    Builder b;
    expect_status(b.build(), MK_OK, "", "no kv, no tensors");
    b.kv_str("general.architecture", "llama");
    auto img = b.build();
    // no tensors: the file may end before the alignment padding
    expect_status(img, MK_OK, "", "no tensors, unpadded");
}

TEST(gguf_valid, OpensFromFileAndReportsIoErrors) {
    auto img = valid_builder().build();
    char path[] = "/tmp/mk_gguf_test_XXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, img.data(), img.size()), (ssize_t)img.size());
    close(fd);
    mk_gguf *g = nullptr;
    ASSERT_EQ(mk_gguf_open(path, &g), MK_OK) << mk_last_error();
    EXPECT_EQ(mk_gguf_file_size(g), img.size());
    mk_gguf_close(g);
    // truncated file: the message names the path
    ASSERT_EQ(truncate(path, 30), 0);
    EXPECT_NE(mk_gguf_open(path, &g), MK_OK);
    EXPECT_NE(std::string(mk_last_error()).find(path), std::string::npos) << mk_last_error();
    EXPECT_EQ(g, nullptr);
    ASSERT_EQ(truncate(path, 0), 0);
    EXPECT_EQ(mk_gguf_open(path, &g), MK_ERR_GGUF_TRUNCATED);
    EXPECT_TRUE(message_names("too short for a GGUF file"));
    unlink(path);
    EXPECT_EQ(mk_gguf_open("/nonexistent/model.gguf", &g), MK_ERR_IO);
    EXPECT_TRUE(message_names("cannot open '/nonexistent/model.gguf'"));
    EXPECT_EQ(mk_gguf_open("/tmp", &g), MK_ERR_IO);
    EXPECT_TRUE(message_names("'/tmp'"));
    EXPECT_EQ(mk_gguf_open(nullptr, &g), MK_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(message_names("NULL path"));
    EXPECT_EQ(mk_gguf_open_memory(nullptr, 10, &g), MK_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(message_names("NULL data"));
    mk_gguf_close(nullptr);
}

// =============================================================== truncation ==

TEST(gguf_malformed, TruncatedAtEverySectionBoundary) {
    Layout L;
    auto img = valid_builder().build(&L);
    ASSERT_NE(L.infos_end, L.data_start) << "image must have alignment padding";
    expect_status(img, MK_ERR_GGUF_TRUNCATED, "too short for the magic", "empty", 0);
    expect_status(img, MK_ERR_GGUF_TRUNCATED, "too short for the magic", "inside magic", 3);
    expect_status(img, MK_ERR_GGUF_TRUNCATED, "truncated: version", "after magic", 4);
    expect_status(img, MK_ERR_GGUF_TRUNCATED, "truncated: tensor count", "after version", 8);
    expect_status(img, MK_ERR_GGUF_TRUNCATED, "truncated: kv count", "after tensor count", 16);
    expect_status(img, MK_ERR_GGUF_COUNT, "key/values", "after header", L.header_end);
    for (size_t i = 0; i < L.kv_end.size(); i++) {
        Opened o;
        mk_status st = open_owned(img, o, L.kv_end[i]);
        EXPECT_TRUE(st == MK_ERR_GGUF_TRUNCATED || st == MK_ERR_GGUF_COUNT)
            << "after kv " << i << ": " << mk_status_name(st);
        EXPECT_TRUE(message_names(structural_needle(st))) << "after kv " << i;
    }
    for (size_t i = 0; i < L.info_end.size(); i++) {
        Opened o;
        mk_status st = open_owned(img, o, L.info_end[i]);
        EXPECT_TRUE(st == MK_ERR_GGUF_TRUNCATED || st == MK_ERR_GGUF_COUNT)
            << "after tensor info " << i << ": " << mk_status_name(st);
        EXPECT_TRUE(message_names(structural_needle(st))) << "after tensor info " << i;
    }
    expect_status(img, MK_ERR_GGUF_TRUNCATED, "data section would start", "before padding", L.infos_end);
    expect_status(img, MK_ERR_GGUF_DATA_BOUNDS, "past the end of the data section", "at data start", L.data_start);
    for (size_t i = 0; i < L.tensor_data_start.size(); i++)
        expect_status(img, MK_ERR_GGUF_DATA_BOUNDS, "past the end of the data section", "at tensor data",
                      L.tensor_data_start[i] + 1);
    expect_status(img, MK_ERR_GGUF_DATA_BOUNDS, "past the end of the data section", "last byte missing", L.total - 1);
}

TEST(gguf_malformed, TruncatedAtEveryByte) {
    Layout L;
    auto img = valid_builder().build(&L);
    for (size_t len = 0; len < img.size(); len++) {
        Opened o;
        mk_status st = open_owned(img, o, len);
        ASSERT_NE(st, MK_OK) << "len " << len;
        EXPECT_TRUE(kStructural.count(st)) << "len " << len << ": " << mk_status_name(st);
        EXPECT_TRUE(message_names(structural_needle(st))) << "len " << len;
        EXPECT_EQ(o.g, nullptr);
        if (len >= L.data_start) {
            EXPECT_EQ(st, MK_ERR_GGUF_DATA_BOUNDS) << "len " << len;
        } else if (len >= L.infos_end || len < L.header_end) {
            EXPECT_EQ(st, MK_ERR_GGUF_TRUNCATED) << "len " << len;
        } else {
            EXPECT_TRUE(st == MK_ERR_GGUF_TRUNCATED || st == MK_ERR_GGUF_COUNT || st == MK_ERR_GGUF_STRING)
                << "len " << len << ": " << mk_status_name(st);
        }
    }
}

// ========================================================== header defects ==

TEST(gguf_malformed, BadMagic) {
    auto img = valid_builder().build();
    for (const char *m : {"GGUG", "GGML", "\0\0\0\0", "FUGG"}) {
        auto bad = img;
        std::memcpy(bad.data(), m, 4);
        expect_status(bad, MK_ERR_GGUF_MAGIC, "not a GGUF file: magic is", m);
    }
}

TEST(gguf_malformed, BadVersion) {
    for (uint32_t v : {0u, 1u, 4u, 0xffffffffu, 0x03000000u}) {
        Builder b = valid_builder();
        b.version = v;
        expect_status(b.build(), MK_ERR_GGUF_VERSION, ("version " + std::to_string(v) + " is not supported").c_str(),
                      "bad version");
        EXPECT_NE(std::string(mk_last_error()).find(std::to_string(v)), std::string::npos);
    }
}

TEST(gguf_malformed, AbsurdCounts) {
    for (uint64_t n : std::initializer_list<uint64_t>{UINT64_MAX, 1ull << 63, 1ull << 40, 1000000ull}) {
        Builder b = valid_builder();
        b.override_counts = true;
        b.n_kv_override = n;
        b.n_tensors_override = b.tensors.size();
        expect_status(b.build(), MK_ERR_GGUF_COUNT, "key/values", "kv count");
        b.n_kv_override = b.kvs.size();
        b.n_tensors_override = n;
        expect_status(b.build(), MK_ERR_GGUF_COUNT, "tensors, which need", "tensor count");
    }
    // a tensor count that fits the header check but not what is left after the metadata
    Builder b = valid_builder();
    b.override_counts = true;
    b.n_kv_override = b.kvs.size();
    auto img = b.build();
    const size_t after_header = img.size() - 24;
    b.n_tensors_override = after_header / 33;
    expect_status(b.build(), MK_ERR_GGUF_COUNT, "after the metadata", "tensor count after metadata");
    // one more kv than present: runs out of bytes reading it
    b.n_tensors_override = b.tensors.size();
    b.n_kv_override = b.kvs.size() + 1;
    Opened o;
    mk_status st = open_owned(b.build(), o);
    EXPECT_TRUE(kStructural.count(st)) << mk_status_name(st);
}

// ======================================================== metadata defects ==

TEST(gguf_malformed, StringLengthsPastTheEnd) {
    for (uint64_t len : std::initializer_list<uint64_t>{UINT64_MAX, 1ull << 62, 100000ull}) {
        // key length
        {
            Builder b = valid_builder();
            std::vector<uint8_t> kv;
            put_u64(kv, len);
            kv.insert(kv.end(), {'k', 'e', 'y'});
            put_u32(kv, T_U8);
            put_u8(kv, 1);
            b.kv_raw(kv);
            expect_status(b.build(), MK_ERR_GGUF_STRING, "key at byte", "key length");
        }
        // string value length
        {
            Builder b = valid_builder();
            auto kv = b.head("s", T_STR);
            put_u64(kv, len);
            kv.insert(kv.end(), {'a', 'b'});
            b.kv_raw(kv);
            expect_status(b.build(), MK_ERR_GGUF_STRING, "string value", "value length");
        }
        // string inside an array
        {
            Builder b = valid_builder();
            auto kv = b.head("arr", T_ARR);
            put_u32(kv, T_STR);
            put_u64(kv, 2);
            put_str(kv, "ok");
            put_u64(kv, len);
            b.kv_raw(kv);
            expect_status(b.build(), MK_ERR_GGUF_STRING, "array string", "array string length");
        }
        // tensor name length
        {
            Layout L;
            auto img = valid_builder().build(&L);
            patch_u64(img, L.info_start[1], len);
            expect_status(img, MK_ERR_GGUF_STRING, "tensor name at byte", "tensor name length");
        }
    }
}

TEST(gguf_malformed, EmptyAndDuplicateNames) {
    {
        Builder b = valid_builder();
        b.kv_u8("", 1);
        expect_status(b.build(), MK_ERR_GGUF_STRING, "empty metadata key", "empty key");
    }
    {
        Builder b = valid_builder();
        b.kv_u8("test.u8", 1);
        expect_status(b.build(), MK_ERR_GGUF_STRING, "duplicate metadata key 'test.u8'", "duplicate key");
    }
    {
        Builder b = valid_builder();
        b.kv_u8(std::string("a\0b", 3), 1);
        expect_status(b.build(), MK_ERR_GGUF_STRING, "contains a NUL byte", "NUL in key");
    }
    {
        Builder b = valid_builder();
        b.tensor_f32("a", {4}, {1, 2, 3, 4});
        expect_status(b.build(), MK_ERR_GGUF_STRING, "duplicate tensor name 'a'", "duplicate tensor");
    }
    {
        Builder b = valid_builder();
        b.tensor_f32("", {4}, {1, 2, 3, 4});
        expect_status(b.build(), MK_ERR_GGUF_STRING, "empty tensor name", "empty tensor name");
    }
}

TEST(gguf_malformed, AbsurdArrayCounts) {
    struct Case {
        uint32_t elem;
        uint64_t count;
    } cases[] = {{T_U32, 1ull << 62}, {T_U64, 1ull << 61}, {T_U64, (1ull << 61) + 1}, {T_U8, UINT64_MAX},
                 {T_STR, UINT64_MAX}, {T_STR, 1ull << 60}, {T_F64, 0x2000000000000001ull}, {T_U16, 5000}};
    for (const Case &c : cases) {
        Builder b = valid_builder();
        auto kv = b.head("arr", T_ARR);
        put_u32(kv, c.elem);
        put_u64(kv, c.count);
        put_u32(kv, 7);
        b.kv_raw(kv);
        expect_status(b.build(), MK_ERR_GGUF_COUNT, "array 'arr' at byte",
                      ("array elem " + std::to_string(c.elem) + " count " + std::to_string(c.count)).c_str());
    }
}

TEST(gguf_malformed, UnknownValueTypes) {
    for (uint32_t t : {13u, 14u, 100u, 0xffffffffu}) {
        Builder b = valid_builder();
        auto kv = b.head("bad", t);
        put_u64(kv, 0);
        b.kv_raw(kv);
        expect_status(b.build(), MK_ERR_GGUF_VALUE_TYPE, "key 'bad' has unknown value type", "value type");
        Builder c = valid_builder();
        auto kv2 = c.head("bad", T_ARR);
        put_u32(kv2, t);
        put_u64(kv2, 1);
        put_u64(kv2, 0);
        c.kv_raw(kv2);
        expect_status(c.build(), MK_ERR_GGUF_VALUE_TYPE, "array 'bad' has unknown element type", "array element type");
    }
    Builder b = valid_builder();
    auto kv = b.head("nested", T_ARR);
    put_u32(kv, T_ARR);
    put_u64(kv, 1);
    put_u32(kv, T_U8);
    put_u64(kv, 1);
    put_u8(kv, 1);
    b.kv_raw(kv);
    expect_status(b.build(), MK_ERR_GGUF_VALUE_TYPE, "nests arrays", "nested array");
}

TEST(gguf_malformed, BadAlignmentValues) {
    for (uint32_t a : {0u, 3u, 48u, 0x80000001u}) {
        Builder b = valid_builder();
        b.kv_u32("general.alignment", a);
        expect_status(b.build(), MK_ERR_GGUF_ALIGNMENT, "is not a power of two", ("alignment " + std::to_string(a)).c_str());
    }
    Builder b = valid_builder();
    b.kv_str("general.alignment", "32");
    expect_status(b.build(), MK_ERR_GGUF_ALIGNMENT, "must be an unsigned 32-bit integer", "alignment as string");
    Builder c = valid_builder();
    c.kv_i32("general.alignment", -32);
    expect_status(c.build(), MK_ERR_GGUF_ALIGNMENT, "must be an unsigned 32-bit integer", "negative alignment");
}

// ========================================================== tensor defects ==

TEST(gguf_malformed, TensorDataPastTheEnd) {
    for (uint64_t off : std::initializer_list<uint64_t>{1ull << 20, UINT64_MAX - 31, (uint64_t)INT64_MAX + 1, 96ull}) {
        Builder b = valid_builder();
        b.tensors[2].offset_set = true;
        b.tensors[2].offset = off;
        const std::string needle = "tensor 'c' data [" + std::to_string(off) + ", +68) lies past the end";
        expect_status(b.build(), MK_ERR_GGUF_DATA_BOUNDS, needle.c_str(), "offset past the end");
    }
    // large dims that fit in memory arithmetic but not in the file
    Builder b = valid_builder();
    b.tensor("big", {1u << 20, 1u << 20}, MK_GGML_TYPE_F32, {});
    expect_status(b.build(), MK_ERR_GGUF_DATA_BOUNDS, "tensor 'big' data", "big tensor");
}

// Every tensor owns its bytes: a header edit that re-points a tensor into another's data
// ran and produced other tokens with no error. Refused, naming both tensors and ranges.
TEST(gguf_malformed, OverlappingTensorData) {
    const struct {
        size_t tensor;
        uint64_t offset;
        const char *needle;
    } cases[] = {
        {1, 0, "tensor 'b' data [0, +16) overlaps tensor 'a' data [0, +32)"},      // same start
        {2, 32, "tensor 'c' data [32, +68) overlaps tensor 'b' data [32, +16)"},   // onto the next one
        {2, 0, "tensor 'c' data [0, +68) overlaps tensor 'a' data [0, +32)"},      // over two of them
        {1, 64, "tensor 'c' data [64, +68) overlaps tensor 'b' data [64, +16)"},   // into a later one
    };
    for (const auto &c : cases) {
        Builder b = valid_builder();
        b.tensors[c.tensor].offset_set = true;
        b.tensors[c.tensor].offset = c.offset;
        expect_status(b.build(), MK_ERR_GGUF_DATA_BOUNDS, c.needle, c.needle);
    }
}

TEST(gguf_malformed, MisalignedOffsets) {
    for (uint64_t off : std::initializer_list<uint64_t>{1ull, 16ull, 33ull, 31ull}) {
        Builder b = valid_builder();
        b.tensors[1].offset_set = true;
        b.tensors[1].offset = off;
        expect_status(b.build(), MK_ERR_GGUF_ALIGNMENT, "is not a multiple of the alignment 32",
                      ("offset " + std::to_string(off)).c_str());
    }
    // aligned to 32 but the file declares 64
    Builder b = valid_builder();
    b.kv_u32("general.alignment", 64);
    b.alignment = 64;
    b.tensors[1].offset_set = true;
    b.tensors[1].offset = 32;
    expect_status(b.build(), MK_ERR_GGUF_ALIGNMENT, "offset 32 is not a multiple of the alignment 64",
                  "offset 32 under alignment 64");
}

TEST(gguf_malformed, UnknownTensorType) {
    for (uint32_t t : {4u, 5u, 31u, 42u, 1000u, 0xffffffffu}) {
        Layout L;
        auto img = valid_builder().build(&L);
        patch_u32(img, L.info_type_field[0], t);
        expect_status(img, MK_ERR_GGUF_TENSOR_TYPE, ("unknown ggml type " + std::to_string(t)).c_str(), "tensor type");
    }
}

TEST(gguf_malformed, BadDimensions) {
    {
        Builder b = valid_builder();
        b.tensor("nd0", {}, MK_GGML_TYPE_F32, {});
        expect_status(b.build(), MK_ERR_GGUF_DIMS, "has 0 dimensions", "n_dims 0");
    }
    {
        Builder b = valid_builder();
        b.tensor("nd5", {1, 1, 1, 1, 1}, MK_GGML_TYPE_F32, {0, 0, 0, 0});
        expect_status(b.build(), MK_ERR_GGUF_DIMS, "has 5 dimensions", "n_dims 5");
    }
    {
        Layout L;
        auto img = valid_builder().build(&L);
        patch_u32(img, L.info_start[0] + 8 + 1, 0xffffffffu); // n_dims of tensor "a"
        expect_status(img, MK_ERR_GGUF_DIMS, "has 4294967295 dimensions", "n_dims huge");
    }
    {
        Builder b = valid_builder();
        b.tensor("zero", {4, 0}, MK_GGML_TYPE_F32, {});
        expect_status(b.build(), MK_ERR_GGUF_DIMS, "has a zero dimension (dim 1)", "zero dim");
    }
    for (std::vector<uint64_t> dims : std::vector<std::vector<uint64_t>>{
             {1ull << 32, 1ull << 32},
             {UINT64_MAX},
             {1ull << 62, 4},
             {1ull << 16, 1ull << 16, 1ull << 16, 1ull << 16},
             {1ull << 31, 1ull << 31} /* 2^62 elements: byte size overflows */}) {
        Builder b = valid_builder();
        b.tensor("ovf", dims, MK_GGML_TYPE_F32, {});
        expect_status(b.build(), MK_ERR_GGUF_DIMS, "overflows", "dimension overflow");
    }
    {
        Builder b = valid_builder();
        b.tensor("q", {31}, MK_GGML_TYPE_Q8_0, std::vector<uint8_t>(34));
        expect_status(b.build(), MK_ERR_GGUF_DIMS, "row length 31 is not a multiple of the Q8_0 block size",
                      "row not a multiple of the block");
    }
}

TEST(gguf_malformed, UnsupportedDequantType) {
    Builder b = valid_builder();
    b.tensor("iq", {256}, MK_GGML_TYPE_IQ2_XXS, std::vector<uint8_t>(66));
    Opened o;
    ASSERT_EQ(open_owned(b.build(), o), MK_OK) << mk_last_error(); // known layout: opens
    float out[256];
    EXPECT_EQ(mk_gguf_tensor_to_f32(o.g, "iq", out, 256), MK_ERR_GGUF_TENSOR_TYPE);
    EXPECT_NE(std::string(mk_last_error()).find("IQ2_XXS"), std::string::npos) << mk_last_error();
    EXPECT_EQ(mk_gguf_dequantize(77, out, 4, out, 1), MK_ERR_GGUF_TENSOR_TYPE);
    EXPECT_TRUE(message_names("unknown ggml tensor type 77"));
    EXPECT_EQ(mk_gguf_dequantize(MK_GGML_TYPE_Q4_0, out, 18, out, 31), MK_ERR_GGUF_DIMS);
    EXPECT_TRUE(message_names("31 elements is not a multiple of the block size 32"));
    EXPECT_EQ(mk_gguf_dequantize(MK_GGML_TYPE_Q4_0, out, 17, out, 32), MK_ERR_GGUF_DATA_BOUNDS);
    EXPECT_TRUE(message_names("32 elements need 18 bytes, got 17"));
}

// ======================================================== hyper-parameters ==

TEST(gguf_hparams, TinyLlama) {
    LlamaOpts opts;
    Opened o;
    ASSERT_EQ(open_owned(llama_builder(opts).build(), o), MK_OK) << mk_last_error();
    mk_hparams hp;
    char arch[32];
    ASSERT_EQ(mk_gguf_read_hparams(o.g, &hp, arch, sizeof arch), MK_OK) << mk_last_error();
    EXPECT_STREQ(arch, "llama");
    EXPECT_EQ(hp.vocab, 16u);
    EXPECT_EQ(hp.hidden, 8u);
    EXPECT_EQ(hp.n_layers, 2u);
    EXPECT_EQ(hp.n_heads, 2u);
    EXPECT_EQ(hp.n_kv_heads, 1u);
    EXPECT_EQ(hp.head_dim, 4u);
    EXPECT_EQ(hp.intermediate, 12u);
    EXPECT_EQ(hp.rms_eps, 1e-5f);
    EXPECT_EQ(hp.rope_theta, 100000.0f);
    EXPECT_EQ(hp.rope_layout, MK_ROPE_ADJACENT_PAIRS);
    EXPECT_TRUE(hp.tied_embeddings);
    EXPECT_EQ(hp.max_context, 256u);
    char small[3];
    EXPECT_EQ(mk_gguf_read_hparams(o.g, &hp, small, sizeof small), MK_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(message_names("does not fit 3 bytes"));
    EXPECT_EQ(mk_gguf_architecture(o.g, arch, sizeof arch), MK_OK);
    EXPECT_STREQ(arch, "llama");
}

TEST(gguf_hparams, DefaultsAndFallbacks) {
    LlamaOpts opts;
    opts.with_output = true;
    opts.with_kv_heads = false; // default = head_count
    opts.kv_heads = 2;
    opts.with_rope_dims = false;
    opts.with_vocab_key = false;
    opts.with_tokens = true;
    Opened o;
    ASSERT_EQ(open_owned(llama_builder(opts).build(), o), MK_OK) << mk_last_error();
    mk_hparams hp;
    ASSERT_EQ(mk_gguf_read_hparams(o.g, &hp, nullptr, 0), MK_OK) << mk_last_error();
    EXPECT_FALSE(hp.tied_embeddings);
    EXPECT_EQ(hp.n_kv_heads, 2u);
    EXPECT_EQ(hp.vocab, 16u);
    // vocabulary from the embedding when neither key nor tokens exist
    opts.with_tokens = false;
    Opened o2;
    ASSERT_EQ(open_owned(llama_builder(opts).build(), o2), MK_OK);
    ASSERT_EQ(mk_gguf_read_hparams(o2.g, &hp, nullptr, 0), MK_OK) << mk_last_error();
    EXPECT_EQ(hp.vocab, 16u);
}

TEST(gguf_hparams, OtherArchitectureWithItsOwnKeys) {
    LlamaOpts opts;
    opts.arch = opts.key_prefix = "qwen3";
    Opened o;
    ASSERT_EQ(open_owned(llama_builder(opts).build(), o), MK_OK);
    mk_hparams hp;
    char arch[32];
    EXPECT_EQ(mk_gguf_read_hparams(o.g, &hp, arch, sizeof arch), MK_OK) << mk_last_error();
    EXPECT_STREQ(arch, "qwen3");
    // advertised "gpt2" but keys under llama.*: missing
    opts.arch = "gpt2";
    opts.key_prefix = "llama";
    Opened o2;
    ASSERT_EQ(open_owned(llama_builder(opts).build(), o2), MK_OK);
    EXPECT_EQ(mk_gguf_read_hparams(o2.g, &hp, arch, sizeof arch), MK_ERR_GGUF_MISSING);
    EXPECT_NE(std::string(mk_last_error()).find("gpt2."), std::string::npos) << mk_last_error();
    EXPECT_EQ(mk_gguf_architecture(o2.g, arch, sizeof arch), MK_OK);
    EXPECT_STREQ(arch, "gpt2");
}

TEST(gguf_hparams, InconsistentOrMissing) {
    struct Case {
        const char *what;
        LlamaOpts opts;
        mk_status want;
        const char *needle;
    };
    std::vector<Case> cases;
    {
        LlamaOpts o;
        o.with_block_count = false;
        cases.push_back({"no block_count", o, MK_ERR_GGUF_MISSING, "required key 'llama.block_count' is missing"});
    }
    {
        LlamaOpts o;
        o.heads = 3; // 8 % 3 != 0
        o.rope_dims = 2;
        cases.push_back({"heads do not divide hidden", o, MK_ERR_GGUF_HPARAMS, "is not divisible by head_count 3"});
    }
    {
        LlamaOpts o;
        o.heads = 4;
        o.kv_heads = 3;
        o.rope_dims = 2;
        cases.push_back({"kv heads do not divide heads", o, MK_ERR_GGUF_HPARAMS, "is not divisible by head_count_kv 3"});
    }
    {
        LlamaOpts o;
        o.rope_dims = 2;
        cases.push_back({"partial rope", o, MK_ERR_GGUF_HPARAMS, "partial RoPE"});
    }
    {
        LlamaOpts o;
        o.bad_attn_k = true;
        cases.push_back({"attn_k shape", o, MK_ERR_GGUF_HPARAMS, "attn_k"});
    }
    {
        LlamaOpts o;
        o.drop_last_ffn_down = true;
        cases.push_back({"missing blk.1.ffn_down", o, MK_ERR_GGUF_MISSING, "'blk.1.ffn_down.weight' is missing"});
    }
    {
        LlamaOpts o;
        o.vocab = 15; // vocab_size key says 15 but the embedding is built with it too...
        cases.push_back({"consistent vocab 15", o, MK_OK, ""});
    }
    for (const Case &c : cases) {
        Opened o;
        ASSERT_EQ(open_owned(llama_builder(c.opts).build(), o), MK_OK) << c.what << ": " << mk_last_error();
        mk_hparams hp;
        mk_status st = mk_gguf_read_hparams(o.g, &hp, nullptr, 0);
        EXPECT_EQ(st, c.want) << c.what << ": " << mk_last_error();
        if (st != MK_OK) {
            EXPECT_TRUE(message_names(c.needle)) << c.what;
        }
    }
    // vocab_size key disagreeing with the embedding
    {
        LlamaOpts lo;
        Builder b = llama_builder(lo);
        b.kvs.erase(b.kvs.begin() + 10); // drop llama.vocab_size (index 10 in llama_builder)
        b.kv_u32("llama.vocab_size", 17);
        Opened o;
        ASSERT_EQ(open_owned(b.build(), o), MK_OK);
        mk_hparams hp;
        EXPECT_EQ(mk_gguf_read_hparams(o.g, &hp, nullptr, 0), MK_ERR_GGUF_HPARAMS);
        EXPECT_NE(std::string(mk_last_error()).find("token_embd"), std::string::npos) << mk_last_error();
    }
    // no architecture key
    {
        Builder b;
        b.kv_u32("llama.block_count", 2);
        Opened o;
        ASSERT_EQ(open_owned(b.build(), o), MK_OK);
        mk_hparams hp;
        EXPECT_EQ(mk_gguf_read_hparams(o.g, &hp, nullptr, 0), MK_ERR_GGUF_MISSING);
        EXPECT_TRUE(message_names("general.architecture is missing"));
    }
}

// ===================================================================== fuzz ==

namespace {
// Use an opened handle the way a loader would; must never crash.
void exercise(mk_gguf *g) {
    for (size_t i = 0; i < mk_gguf_kv_count(g); i++) {
        const char *k = mk_gguf_key_at(g, i);
        uint64_t u;
        int64_t s;
        float f;
        bool b;
        const char *str;
        size_t n;
        mk_gguf_value_type et;
        (void)mk_gguf_get_u64(g, k, &u);
        (void)mk_gguf_get_i64(g, k, &s);
        (void)mk_gguf_get_f32(g, k, &f);
        (void)mk_gguf_get_bool(g, k, &b);
        (void)mk_gguf_get_string(g, k, &str, &n);
        if (mk_gguf_get_array_info(g, k, &et, &n) == MK_OK && n > 0) {
            (void)mk_gguf_get_array_string(g, k, n - 1, &str, &n);
        }
    }
    std::vector<float> buf;
    for (size_t i = 0; i < mk_gguf_tensor_count(g); i++) {
        const mk_gguf_tensor_info *t = mk_gguf_tensor_at(g, i);
        if (t->n_elements > (1u << 22)) continue; // bounded by the file anyway
        buf.assign(t->n_elements, 0.0f);
        (void)mk_gguf_tensor_to_f32(g, t->name, buf.data(), buf.size());
    }
    mk_hparams hp;
    char arch[64];
    (void)mk_gguf_read_hparams(g, &hp, arch, sizeof arch);
}
} // namespace

TEST(gguf_fuzz, SeededRandomMutationsNeverCrash) {
    std::vector<std::vector<uint8_t>> seeds = {valid_builder().build(), llama_builder(LlamaOpts()).build()};
    std::mt19937_64 rng(0x6d65736b6b65726eull);
    const uint64_t interesting[] = {0, 1, 0x7f, 0x80, 0xff, 0xffff, 0xffffffffull, 0x7fffffffffffffffull,
                                    UINT64_MAX, 32, 31, 4096};
    int opened = 0, failed = 0;
    for (int iter = 0; iter < 20000; iter++) {
        std::vector<uint8_t> img = seeds[iter % seeds.size()];
        const int n_mut = 1 + (int)(rng() % 6);
        for (int m = 0; m < n_mut && !img.empty(); m++) {
            const size_t at = rng() % img.size();
            switch (rng() % 5) {
            case 0: img[at] = (uint8_t)rng(); break;
            case 1: img[at] ^= (uint8_t)(1u << (rng() % 8)); break;
            case 2: {
                uint64_t v = interesting[rng() % (sizeof interesting / sizeof interesting[0])];
                for (size_t k = 0; k < 8 && at + k < img.size(); k++) img[at + k] = (uint8_t)(v >> (8 * k));
                break;
            }
            case 3: img.resize(at); break;
            default: {
                // smash the first 64 bytes harder: counts and the first key live there
                const size_t a2 = rng() % std::min<size_t>(img.size(), 64);
                img[a2] = (uint8_t)rng();
                break;
            }
            }
        }
        Opened o;
        mk_status st = open_owned(img, o);
        if (st == MK_OK) {
            opened++;
            exercise(o.g);
        } else {
            failed++;
            ASSERT_TRUE(kStructural.count(st) || st == MK_ERR_OUT_OF_MEMORY)
                << "iter " << iter << ": " << mk_status_name(st);
            ASSERT_STRNE(mk_last_error(), "") << "iter " << iter;
        }
    }
    EXPECT_GT(failed, 0);
    EXPECT_GT(opened, 0); // some mutations hit only values or tensor data
    std::printf("fuzz: %d opened, %d refused\n", opened, failed);
}
