// The embedded default model, SmolLM2-135M-Instruct (Q4_1 GGUF), through the GGUF reader:
// header, hyper-parameters, tensor table and types, every tensor dequantizes, and slices
// equal the `gguf` package's dequantization (tests/fixtures/dequant/smollm2_*).
// Skips by the suite's rule (tests/mk_test_util.h) when the model file is absent.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>
#include <vector>

#include "model/gguf.h"
#include "model/model.h" /* mk_gguf_read_hparams */
#include "meshkern.h"
#include "mk_test_util.h"

namespace {

const std::string kModel = mk_test_model_path();
const std::string kDir = std::string(MK_FIXTURE_DIR) + "/dequant/";

class gguf_smollm2 : public ::testing::Test {
  protected:
    mk_gguf *g = nullptr;
    void SetUp() override {
        MK_REQUIRE_MODEL_FILE(kModel);
        ASSERT_EQ(mk_gguf_open(kModel.c_str(), &g), MK_OK) << kModel << " is present but does not open: " << mk_last_error();
    }
    void TearDown() override { mk_gguf_close(g); }
};

bool read_f32(const std::string &path, std::vector<float> &out) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    out.resize(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), out.size() * 4);
    return bytes.size() % 4 == 0;
}

} // namespace

TEST_F(gguf_smollm2, Header) {
    EXPECT_EQ(mk_gguf_version(g), 3u);
    EXPECT_EQ(mk_gguf_file_size(g), 98362432u);
    EXPECT_EQ(mk_gguf_alignment(g), 32u);
    EXPECT_EQ(mk_gguf_data_offset(g), 1785664u);
    EXPECT_EQ(mk_gguf_kv_count(g), 33u);
    EXPECT_EQ(mk_gguf_tensor_count(g), 272u);
    char name[128];
    ASSERT_EQ(mk_gguf_get_string_copy(g, "general.name", name, sizeof name), MK_OK);
    EXPECT_STREQ(name, "Smollm2 135M 8k Lc100K Mix1 Ep2");
    uint32_t ft;
    ASSERT_EQ(mk_gguf_get_u32(g, "general.file_type", &ft), MK_OK);
    EXPECT_EQ(ft, 3u); // MOSTLY_Q4_1
}

TEST_F(gguf_smollm2, HyperParameters) {
    mk_hparams hp;
    char arch[32];
    ASSERT_EQ(mk_gguf_architecture(g, arch, sizeof arch), MK_OK);
    EXPECT_STREQ(arch, "llama");
    EXPECT_TRUE(mk_is_certified_architecture(arch));
    ASSERT_EQ(mk_gguf_read_hparams(g, &hp, arch, sizeof arch), MK_OK) << mk_last_error();
    EXPECT_STREQ(arch, "llama");
    EXPECT_EQ(hp.vocab, 49152u);
    EXPECT_EQ(hp.hidden, 576u);
    EXPECT_EQ(hp.n_layers, 30u);
    EXPECT_EQ(hp.n_heads, 9u);
    EXPECT_EQ(hp.n_kv_heads, 3u);
    EXPECT_EQ(hp.head_dim, 64u);
    EXPECT_EQ(hp.intermediate, 1536u);
    EXPECT_EQ(hp.max_context, 8192u);
    EXPECT_EQ(hp.rope_theta, 100000.0f);
    EXPECT_EQ(hp.rms_eps, 1e-5f);
    EXPECT_EQ(hp.rope_layout, MK_ROPE_ADJACENT_PAIRS);
    EXPECT_TRUE(hp.tied_embeddings); // no output.weight: lm_head = token_embd
    EXPECT_EQ(mk_gguf_find_tensor(g, "output.weight"), nullptr);
}

TEST_F(gguf_smollm2, Tokenizer) {
    mk_gguf_value_type et;
    size_t n;
    ASSERT_EQ(mk_gguf_get_array_info(g, "tokenizer.ggml.tokens", &et, &n), MK_OK);
    EXPECT_EQ(et, MK_GGUF_TYPE_STRING);
    EXPECT_EQ(n, 49152u);
    const char *s;
    size_t len;
    ASSERT_EQ(mk_gguf_get_array_string(g, "tokenizer.ggml.tokens", 0, &s, &len), MK_OK);
    EXPECT_EQ(std::string(s, len), "<|endoftext|>");
    ASSERT_EQ(mk_gguf_get_array_string(g, "tokenizer.ggml.tokens", 1, &s, &len), MK_OK);
    EXPECT_EQ(std::string(s, len), "<|im_start|>");
    ASSERT_EQ(mk_gguf_get_array_info(g, "tokenizer.ggml.merges", &et, &n), MK_OK);
    EXPECT_EQ(n, 48900u);
    uint32_t eos;
    ASSERT_EQ(mk_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos), MK_OK);
    EXPECT_EQ(eos, 2u);
}

TEST_F(gguf_smollm2, TensorTableAndTypes) {
    std::map<std::string, int> types;
    size_t bytes = 0;
    for (size_t i = 0; i < mk_gguf_tensor_count(g); i++) {
        const mk_gguf_tensor_info *t = mk_gguf_tensor_at(g, i);
        types[mk_ggml_type_name(t->type)]++;
        bytes += t->n_bytes;
        EXPECT_TRUE(mk_ggml_type_can_dequantize(t->type)) << t->name;
        EXPECT_EQ(t->offset % 32, 0u) << t->name;
    }
    EXPECT_EQ(types.size(), 3u);
    EXPECT_EQ(types["F32"], 61);   // 2 norms x 30 layers + output_norm
    EXPECT_EQ(types["Q4_1"], 210); // 7 matrices x 30 layers
    EXPECT_EQ(types["Q8_0"], 1);   // token_embd
    EXPECT_EQ(mk_gguf_data_offset(g) + bytes, mk_gguf_file_size(g));
    for (const auto &kv : types) std::printf("  %-5s %d tensors\n", kv.first.c_str(), kv.second);
    const mk_gguf_tensor_info *e = mk_gguf_find_tensor(g, "token_embd.weight");
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->type, (uint32_t)MK_GGML_TYPE_Q8_0);
    EXPECT_EQ(e->n_dims, 2u);
    EXPECT_EQ(e->dims[0], 576u);
    EXPECT_EQ(e->dims[1], 49152u);
    EXPECT_EQ(e->n_bytes, 576u / 32 * 34 * 49152u);
    const mk_gguf_tensor_info *q = mk_gguf_find_tensor(g, "blk.29.attn_q.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->type, (uint32_t)MK_GGML_TYPE_Q4_1);
}

// Every tensor dequantizes to finite values; whole-tensor and row-sliced paths agree.
TEST_F(gguf_smollm2, EveryTensorDequantizes) {
    std::vector<float> buf, rows;
    for (size_t i = 0; i < mk_gguf_tensor_count(g); i++) {
        const mk_gguf_tensor_info *t = mk_gguf_tensor_at(g, i);
        buf.assign(t->n_elements, NAN);
        ASSERT_EQ(mk_gguf_tensor_to_f32(g, t->name, buf.data(), buf.size()), MK_OK) << mk_last_error();
        size_t nonfinite = 0;
        double sumsq = 0;
        for (float v : buf) {
            if (!std::isfinite(v)) nonfinite++;
            sumsq += (double)v * v;
        }
        EXPECT_EQ(nonfinite, 0u) << t->name;
        EXPECT_GT(sumsq, 0.0) << t->name;
        const size_t row = (size_t)t->dims[0], n_rows = t->n_elements / row;
        rows.assign(row, NAN);
        ASSERT_EQ(mk_gguf_tensor_rows_to_f32(g, t->name, n_rows - 1, 1, rows.data()), MK_OK);
        EXPECT_EQ(std::memcmp(rows.data(), buf.data() + (n_rows - 1) * row, row * 4), 0) << t->name;
    }
    // element-count mismatch is refused
    buf.resize(576);
    EXPECT_EQ(mk_gguf_tensor_to_f32(g, "blk.0.attn_norm.weight", buf.data(), 575), MK_ERR_GGUF_DIMS);
}

TEST_F(gguf_smollm2, SlicesMatchFixtures) {
    // whole token_embd (Q8_0) against the first/last-row fixtures
    const mk_gguf_tensor_info *e = mk_gguf_find_tensor(g, "token_embd.weight");
    ASSERT_NE(e, nullptr);
    std::vector<float> embd(e->n_elements);
    ASSERT_EQ(mk_gguf_tensor_to_f32(g, "token_embd.weight", embd.data(), embd.size()), MK_OK);
    std::vector<float> first, last;
    ASSERT_TRUE(read_f32(kDir + "smollm2_2.f32", first)) << "fixture missing";
    ASSERT_TRUE(read_f32(kDir + "smollm2_3.f32", last));
    ASSERT_EQ(first.size(), 2u * 576);
    EXPECT_EQ(std::memcmp(embd.data(), first.data(), first.size() * 4), 0);
    EXPECT_EQ(std::memcmp(embd.data() + embd.size() - last.size(), last.data(), last.size() * 4), 0);
    // Q4_1 attn_q, first four rows
    std::vector<float> q(576 * 576), want;
    ASSERT_EQ(mk_gguf_tensor_to_f32(g, "blk.0.attn_q.weight", q.data(), q.size()), MK_OK);
    ASSERT_TRUE(read_f32(kDir + "smollm2_4.f32", want));
    EXPECT_EQ(std::memcmp(q.data(), want.data(), want.size() * 4), 0);
    // F32 norm
    std::vector<float> norm(576);
    ASSERT_EQ(mk_gguf_tensor_to_f32(g, "blk.0.attn_norm.weight", norm.data(), 576), MK_OK);
    ASSERT_TRUE(read_f32(kDir + "smollm2_0.f32", want));
    EXPECT_EQ(std::memcmp(norm.data(), want.data(), 576 * 4), 0);
}
