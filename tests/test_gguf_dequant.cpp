// Dequantization of every supported ggml type equals an independent implementation:
// the PyPI `gguf` package (gguf.quants.dequantize). Fixtures are produced by
// scripts/make_dequant_fixtures.py into tests/fixtures/dequant/:
//  - synthetic.gguf (written by gguf.GGUFWriter) with one tensor per supported type and
//    metadata of every value type; synthetic_<TYPE>.f32 are the reference values;
//  - smollm2_<i>.f32: row slices of the default model's real tensors (one per type in
//    the model), checked when models/SmolLM2-135M-Instruct.Q4_1.gguf is present.
//
// Comparison is bit-exact: every format is defined as float32 products of a f16 scale
// (and min) with small integers, and both implementations evaluate the same expression
// in the same order in float32 (see host/model/gguf_dequant.c).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <algorithm>
#include <unistd.h>

#include "model/gguf.h"
#include "meshkern.h"
#include "mk_test_util.h"

namespace {

const std::string kDir = std::string(MK_FIXTURE_DIR) + "/dequant/";
const std::string kModel = mk_test_model_path();

bool read_f32(const std::string &path, std::vector<float> &out) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (bytes.size() % 4) return false;
    out.resize(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return true;
}

std::vector<std::vector<std::string>> read_manifest(const std::string &path) {
    std::vector<std::vector<std::string>> rows;
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream ss(line);
        std::vector<std::string> cols;
        std::string c;
        while (ss >> c) cols.push_back(c);
        rows.push_back(cols);
    }
    return rows;
}

// Bitwise equality (so NaN payloads, -0 and infinities count); reports first mismatches.
::testing::AssertionResult bits_equal(const float *got, const float *want, size_t n) {
    size_t bad = 0;
    std::ostringstream msg;
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        std::memcpy(&a, &got[i], 4);
        std::memcpy(&b, &want[i], 4);
        if (a != b) {
            if (bad < 10) msg << "\n  [" << i << "] got " << got[i] << " (0x" << std::hex << a << ") want "
                              << want[i] << " (0x" << b << ")" << std::dec;
            bad++;
        }
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << bad << " of " << n << " values differ" << msg.str();
}

struct Gguf {
    mk_gguf *g = nullptr;
    ~Gguf() { mk_gguf_close(g); }
};

} // namespace

TEST(gguf_dequant, SyntheticEveryTypeMatchesGgufPackage) {
    Gguf f;
    ASSERT_EQ(mk_gguf_open((kDir + "synthetic.gguf").c_str(), &f.g), MK_OK) << mk_last_error();
    auto rows = read_manifest(kDir + "synthetic_manifest.txt");
    ASSERT_EQ(rows.size(), 15u) << "one tensor per supported type";
    std::vector<std::string> seen;
    for (const auto &r : rows) {
        ASSERT_EQ(r.size(), 4u);
        const std::string &name = r[0], &type = r[1];
        const size_t n = std::stoul(r[2]);
        SCOPED_TRACE(name + " " + type);
        const mk_gguf_tensor_info *t = mk_gguf_find_tensor(f.g, name.c_str());
        ASSERT_NE(t, nullptr);
        ASSERT_STREQ(mk_ggml_type_name(t->type), type.c_str());
        EXPECT_TRUE(mk_ggml_type_can_dequantize(t->type));
        ASSERT_EQ(t->n_elements, n);
        std::vector<float> want;
        ASSERT_TRUE(read_f32(kDir + r[3], want));
        ASSERT_EQ(want.size(), n);
        // whole tensor, with sentinels after the output
        std::vector<float> got(n + 8, 12345.0f);
        ASSERT_EQ(mk_gguf_tensor_to_f32(f.g, name.c_str(), got.data(), n), MK_OK) << mk_last_error();
        EXPECT_TRUE(bits_equal(got.data(), want.data(), n));
        for (size_t i = n; i < n + 8; i++) EXPECT_EQ(got[i], 12345.0f) << "sentinel " << i;
        // the second row alone
        const size_t row = (size_t)t->dims[0];
        std::vector<float> r1(row);
        ASSERT_EQ(mk_gguf_tensor_rows_to_f32(f.g, name.c_str(), 1, 1, r1.data()), MK_OK) << mk_last_error();
        EXPECT_TRUE(bits_equal(r1.data(), want.data() + row, row));
        seen.push_back(type);
    }
    for (const char *must : {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q3_K", "Q6_K", "IQ4_NL", "IQ4_XS"})
        EXPECT_NE(std::find(seen.begin(), seen.end(), must), seen.end()) << must;
}

TEST(gguf_dequant, SyntheticMetadataWrittenByGgufPackage) {
    Gguf f;
    ASSERT_EQ(mk_gguf_open((kDir + "synthetic.gguf").c_str(), &f.g), MK_OK) << mk_last_error();
    char arch[32];
    ASSERT_EQ(mk_gguf_architecture(f.g, arch, sizeof arch), MK_OK);
    EXPECT_STREQ(arch, "meshkern-test");
    EXPECT_EQ(mk_gguf_version(f.g), 3u);
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float fl;
    bool b;
    ASSERT_EQ(mk_gguf_get_u32(f.g, "test.u8", &u32), MK_OK);
    EXPECT_EQ(u32, 200u);
    ASSERT_EQ(mk_gguf_get_i32(f.g, "test.i8", &i32), MK_OK);
    EXPECT_EQ(i32, -5);
    ASSERT_EQ(mk_gguf_get_u32(f.g, "test.u16", &u32), MK_OK);
    EXPECT_EQ(u32, 65000u);
    ASSERT_EQ(mk_gguf_get_i32(f.g, "test.i16", &i32), MK_OK);
    EXPECT_EQ(i32, -30000);
    ASSERT_EQ(mk_gguf_get_u32(f.g, "test.u32", &u32), MK_OK);
    EXPECT_EQ(u32, 4000000000u);
    ASSERT_EQ(mk_gguf_get_i32(f.g, "test.i32", &i32), MK_OK);
    EXPECT_EQ(i32, -2000000000);
    ASSERT_EQ(mk_gguf_get_f32(f.g, "test.f32", &fl), MK_OK);
    EXPECT_EQ(fl, 1.5f);
    ASSERT_EQ(mk_gguf_get_bool(f.g, "test.bool", &b), MK_OK);
    EXPECT_TRUE(b);
    ASSERT_EQ(mk_gguf_get_u64(f.g, "test.u64", &u64), MK_OK);
    EXPECT_EQ(u64, (1ull << 40) + 3);
    ASSERT_EQ(mk_gguf_get_i64(f.g, "test.i64", &i64), MK_OK);
    EXPECT_EQ(i64, -(1ll << 40) - 3);
    ASSERT_EQ(mk_gguf_get_f32(f.g, "test.f64", &fl), MK_OK);
    EXPECT_EQ(fl, 0.1f);
    const char *s;
    size_t n;
    ASSERT_EQ(mk_gguf_get_string(f.g, "test.string", &s, &n), MK_OK);
    EXPECT_EQ(std::string(s, n), "h\xc3\xa9llo");
    mk_gguf_value_type et;
    ASSERT_EQ(mk_gguf_get_array_info(f.g, "test.arr_i32", &et, &n), MK_OK);
    EXPECT_EQ(et, MK_GGUF_TYPE_INT32);
    EXPECT_EQ(n, 3u);
    ASSERT_EQ(mk_gguf_get_array_info(f.g, "test.arr_str", &et, &n), MK_OK);
    EXPECT_EQ(et, MK_GGUF_TYPE_STRING);
    ASSERT_EQ(n, 3u);
    ASSERT_EQ(mk_gguf_get_array_string(f.g, "test.arr_str", 1, &s, &n), MK_OK);
    EXPECT_EQ(std::string(s, n), "bc");
    ASSERT_EQ(mk_gguf_get_array_string(f.g, "test.arr_str", 2, &s, &n), MK_OK);
    EXPECT_EQ(n, 0u);
}

TEST(gguf_dequant, SmolLM2TensorsMatchGgufPackage) {
    Gguf f;
    MK_REQUIRE_MODEL_FILE(kModel);
    ASSERT_EQ(mk_gguf_open(kModel.c_str(), &f.g), MK_OK) << kModel << " is present but does not open: " << mk_last_error();
    auto rows = read_manifest(kDir + "smollm2_manifest.txt");
    ASSERT_GE(rows.size(), 3u);
    std::vector<std::string> types;
    for (const auto &r : rows) {
        ASSERT_EQ(r.size(), 8u);
        const std::string &name = r[0], &type = r[1];
        SCOPED_TRACE(name + " rows " + r[4] + "+" + r[5]);
        const mk_gguf_tensor_info *t = mk_gguf_find_tensor(f.g, name.c_str());
        ASSERT_NE(t, nullptr);
        EXPECT_STREQ(mk_ggml_type_name(t->type), type.c_str());
        EXPECT_EQ(t->dims[0], std::stoull(r[2]));
        EXPECT_EQ(t->dims[1], std::stoull(r[3]));
        EXPECT_EQ(mk_gguf_data_offset(f.g) + t->offset, std::stoull(r[6])) << "absolute data offset";
        const size_t row0 = std::stoul(r[4]), nrows = std::stoul(r[5]), row = (size_t)t->dims[0];
        std::vector<float> want;
        ASSERT_TRUE(read_f32(kDir + r[7], want));
        ASSERT_EQ(want.size(), nrows * row);
        std::vector<float> got(nrows * row + 4, -7.0f);
        ASSERT_EQ(mk_gguf_tensor_rows_to_f32(f.g, name.c_str(), row0, nrows, got.data()), MK_OK)
            << mk_last_error();
        EXPECT_TRUE(bits_equal(got.data(), want.data(), want.size()));
        for (size_t i = want.size(); i < got.size(); i++) EXPECT_EQ(got[i], -7.0f) << "sentinel";
        types.push_back(type);
    }
    for (const char *must : {"F32", "Q8_0", "Q4_1"})
        EXPECT_NE(std::find(types.begin(), types.end(), must), types.end()) << must;
}

TEST(gguf_dequant, RawKernelArgumentChecks) {
    float out[64];
    uint8_t blk[40] = {0};
    EXPECT_EQ(mk_gguf_dequantize(MK_GGML_TYPE_Q8_0, blk, 34, out, 32), MK_OK);
    for (int i = 0; i < 32; i++) EXPECT_EQ(out[i], 0.0f);
    EXPECT_ERROR(mk_gguf_dequantize(MK_GGML_TYPE_Q8_0, blk, 35, out, 32), MK_ERR_GGUF_DATA_BOUNDS,
                 "32 elements need 34 bytes, got 35");
    EXPECT_ERROR(mk_gguf_dequantize(MK_GGML_TYPE_Q8_0, blk, 34, out, 16), MK_ERR_GGUF_DIMS,
                 "16 elements is not a multiple of the block size 32");
    EXPECT_ERROR(mk_gguf_dequantize(MK_GGML_TYPE_Q8_0, nullptr, 34, out, 32), MK_ERR_INVALID_ARGUMENT, "NULL buffer");
    EXPECT_ERROR(mk_gguf_dequantize(MK_GGML_TYPE_Q8_K, blk, 34, out, 32), MK_ERR_GGUF_TENSOR_TYPE,
                 "Q8_K (15) is not supported for dequantization");
    EXPECT_ERROR(mk_gguf_dequantize(4, blk, 34, out, 32), MK_ERR_GGUF_TENSOR_TYPE, "unknown ggml tensor type 4");
    EXPECT_EQ(mk_gguf_dequantize(MK_GGML_TYPE_F32, blk, 0, out, 0), MK_OK);
    size_t be = 0, bb = 0;
    EXPECT_TRUE(mk_ggml_type_layout(MK_GGML_TYPE_Q4_1, &be, &bb));
    EXPECT_EQ(be, 32u);
    EXPECT_EQ(bb, 20u);
    EXPECT_TRUE(mk_ggml_type_layout(MK_GGML_TYPE_Q6_K, &be, &bb));
    EXPECT_EQ(be, 256u);
    EXPECT_EQ(bb, 210u);
    EXPECT_FALSE(mk_ggml_type_layout(5, &be, &bb));
    EXPECT_EQ(mk_ggml_type_name(5), nullptr);
}
