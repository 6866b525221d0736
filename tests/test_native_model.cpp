// Native weight mode end to end on small random models written as GGUF files with their
// matrices quantized in the test (Q8_0, Q4_1, Q4_0, Q4_K, Q6_K, F16, BF16): whole vs split
// bit-exact, 1/2/3 threads bit-exact, close to the F32 parity mode on the same file, and
// the weight mode bound into the recipe digest.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "backend/cpu/cpu_native.h"
#include "backend/cpu/cpu_ops.h"
#include "model/gguf.h"
#include "mk_native_gguf.h"
#include "mk_test_util.h"

namespace {

using namespace mk_native_gguf;

mk_range_options native_options(size_t threads) {
    mk_range_options o = mk_range_options_default();
    o.max_context = 64;
    o.backend.weight_dtype = MK_DTYPE_NATIVE;
    o.backend.threads = threads;
    return o;
}

struct Mix {
    const char *name;
    uint32_t layers, embd;
    bool tied;
};

class NativeModel : public ::testing::TestWithParam<Mix> {};

// Whole vs every split bit-exact, 1/2/3 threads bit-exact, and close to F32 parity mode.
TEST_P(NativeModel, SplitsAndThreadCountsAreBitIdentical) {
    const Mix mix = GetParam();
    TempModel tm([&](const std::string &part) {
        // Mixed formats inside one model: the mlp in the chosen format, attention Q8_0.
        if (part.rfind("attn", 0) == 0 && mix.layers != MK_GGML_TYPE_F16 && mix.layers != MK_GGML_TYPE_BF16)
            return (uint32_t)MK_GGML_TYPE_Q8_0;
        return part == "token_embd" || part == "output" ? mix.embd : mix.layers;
    }, mix.tied);
    ASSERT_TRUE(tm.model);
    const std::vector<int32_t> prompt = {3, 17, 39, 0, 22};
    const Decode whole = decode_greedy(tm.model.get(), {}, native_options(2), prompt, 8);
    ASSERT_EQ(whole.logits.size(), 8u);
    for (const std::vector<int64_t> &cuts : std::vector<std::vector<int64_t>>{{0}, {1}, {0, 1}}) {
        const Decode split = decode_greedy(tm.model.get(), cuts, native_options(2), prompt, 8);
        ASSERT_EQ(split.logits.size(), 8u);
        for (size_t i = 0; i < 8; i++) EXPECT_TRUE(bit_identical(whole.logits[i], split.logits[i])) << "cut " << cuts[0] << " step " << i;
        EXPECT_EQ(whole.tokens, split.tokens);
    }
    // A prompt long enough for the prefill path (dequantized tiles + SGEMM).
    std::vector<int32_t> long_prompt(40);
    for (size_t i = 0; i < long_prompt.size(); i++) long_prompt[i] = (int32_t)((i * 7 + 3) % 40);
    const Decode long_whole = decode_greedy(tm.model.get(), {}, native_options(2), long_prompt, 3);
    const Decode long_split = decode_greedy(tm.model.get(), {0, 1}, native_options(3), long_prompt, 3);
    ASSERT_EQ(long_whole.logits.size(), 3u);
    ASSERT_EQ(long_split.logits.size(), 3u);
    for (size_t i = 0; i < 3; i++) EXPECT_TRUE(bit_identical(long_whole.logits[i], long_split.logits[i])) << "long prompt, step " << i;
    for (size_t threads : {1u, 3u}) {
        const Decode other = decode_greedy(tm.model.get(), {1}, native_options(threads), prompt, 8);
        ASSERT_EQ(other.logits.size(), 8u);
        for (size_t i = 0; i < 8; i++) EXPECT_TRUE(bit_identical(whole.logits[i], other.logits[i])) << threads << " threads, step " << i;
    }
    // The same file in F32 parity mode: the native logits differ only by the 8-bit
    // activation rounding (teacher-forced on the native tokens).
    mk_range_options f32 = native_options(1);
    f32.backend.weight_dtype = MK_DTYPE_F32;
    const Decode ref = decode_greedy(tm.model.get(), {}, f32, prompt, 8, &whole.tokens);
    ASSERT_EQ(ref.logits.size(), 8u);
    const bool activations_quantized = mix.layers != MK_GGML_TYPE_F16 && mix.layers != MK_GGML_TYPE_BF16;
    // Q2_K's four levels with a min per 16 values (d q - m, q in 0..3) put most of a weight
    // in its min, which multiplies the activation group sums' rounding: 3.0-7.6% measured
    // where the other formats stay under 6%.
    const double bound = mix.layers == MK_GGML_TYPE_Q2_K ? 0.09 : 0.06;
    for (size_t i = 0; i < 8; i++) {
        // Root-mean-square error relative to the logits' RMS: a few percent from 8-bit
        // activations on this small random model (a wrong kernel gives ~100%).
        double ref_sq = 0.0, err_sq = 0.0;
        for (size_t j = 0; j < ref.logits[i].size(); j++) {
            ref_sq += (double)ref.logits[i][j] * ref.logits[i][j];
            const double e = (double)ref.logits[i][j] - whole.logits[i][j];
            err_sq += e * e;
        }
        EXPECT_LE(std::sqrt(err_sq / ref_sq), activations_quantized ? bound : 1e-5) << "step " << i;
        if (!activations_quantized) {
            EXPECT_EQ(ref.tokens[i], whole.tokens[i]);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, NativeModel,
                         ::testing::Values(Mix{"Q8_0", MK_GGML_TYPE_Q8_0, MK_GGML_TYPE_Q8_0, true},
                                           Mix{"Q4_1", MK_GGML_TYPE_Q4_1, MK_GGML_TYPE_Q8_0, true},
                                           Mix{"Q4_0", MK_GGML_TYPE_Q4_0, MK_GGML_TYPE_Q4_0, false},
                                           Mix{"Q4_K", MK_GGML_TYPE_Q4_K, MK_GGML_TYPE_Q6_K, false},
                                           Mix{"Q5_0", MK_GGML_TYPE_Q5_0, MK_GGML_TYPE_Q5_1, false},
                                           Mix{"Q5_1", MK_GGML_TYPE_Q5_1, MK_GGML_TYPE_Q5_0, true},
                                           Mix{"Q5_K", MK_GGML_TYPE_Q5_K, MK_GGML_TYPE_Q5_K, true},
                                           Mix{"Q3_K", MK_GGML_TYPE_Q3_K, MK_GGML_TYPE_Q6_K, false},
                                           Mix{"Q6_K", MK_GGML_TYPE_Q6_K, MK_GGML_TYPE_Q4_K, true},
                                           Mix{"Q2_K", MK_GGML_TYPE_Q2_K, MK_GGML_TYPE_Q4_K, false},
                                           Mix{"IQ4_NL", MK_GGML_TYPE_IQ4_NL, MK_GGML_TYPE_IQ4_XS, false},
                                           Mix{"IQ4_XS", MK_GGML_TYPE_IQ4_XS, MK_GGML_TYPE_IQ4_NL, true},
                                           Mix{"F16", MK_GGML_TYPE_F16, MK_GGML_TYPE_F16, true},
                                           Mix{"BF16", MK_GGML_TYPE_BF16, MK_GGML_TYPE_F32, false}),
                         [](const ::testing::TestParamInfo<Mix> &i) { return std::string(i.param.name); });

// The weight mode is part of the recipe digest: a native head's bundle is refused by an
// F32 tail of the same file, and accepted by a native one.
TEST(NativeModelDigest, BundleOfAnotherWeightModeIsRefused) {
    TempModel tm([](const std::string &) { return (uint32_t)MK_GGML_TYPE_Q8_0; }, true);
    ASSERT_TRUE(tm.model);
    mk_range_options f32 = native_options(1);
    f32.backend.weight_dtype = MK_DTYPE_F32;
    Pipeline native(tm.model.get(), {1}, native_options(2)), parity(tm.model.get(), {1}, f32);
    MK_ASSERT_OK(native.status());
    MK_ASSERT_OK(parity.status());
    EXPECT_STRNE(mk_range_recipe_digest(native.range(0)), mk_range_recipe_digest(parity.range(0)));
    mk_sequence *hs = nullptr, *ts = nullptr, *ns = nullptr;
    MK_ASSERT_OK(mk_sequence_open(native.range(0), &hs));
    MK_ASSERT_OK(mk_sequence_open(parity.range(1), &ts));
    MK_ASSERT_OK(mk_sequence_open(native.range(1), &ns));
    SequencePtr h(hs), t(ts), n(ns);
    const int32_t ids[] = {1, 7};
    mk_bundle *b = nullptr;
    MK_ASSERT_OK(mk_range_forward(native.range(0), hs, ids, 2, nullptr, nullptr, &b, nullptr));
    BundlePtr bundle(b);
    mk_tail_output *out = nullptr;
    EXPECT_EQ(mk_range_forward(parity.range(1), ts, nullptr, 0, bundle.get(), nullptr, nullptr, &out), MK_ERR_RECIPE_DIGEST);
    EXPECT_EQ(out, nullptr);
    MK_ASSERT_OK(mk_range_forward(native.range(1), ns, nullptr, 0, bundle.get(), nullptr, nullptr, &out));
    mk_tail_output_free(out);
}

// A model file whose weights hold NaN or Inf (a block's f16 scale or min, an F32 norm value,
// an F16 or BF16 value) is refused at load with MK_ERR_NONFINITE naming the tensor, in the
// native and the F32 weight modes, by the range that owns the tensor; the ranges of a
// split that do not own it load and run. (A NaN scale otherwise ran: NaN logits, and
// greedy decoding sampled token 0 from them at every step.)
TEST(NativeModelLoad, NonFiniteWeightsAreRefusedByTheRangeThatOwnsThem) {
    struct Case {
        const char *tensor;
        uint32_t type;
        size_t byte; // in the tensor's stored bytes
        std::vector<uint8_t> bits;
        int64_t layer; // the layer whose range owns the tensor
    };
    const uint8_t nan16[] = {0x00, 0x7e}, inf16[] = {0x00, 0x7c}, ninf16[] = {0x00, 0xfc};
    const std::vector<Case> cases = {
        {"blk.1.ffn_up.weight", MK_GGML_TYPE_Q4_K, 3 * 144 + 0, {nan16, nan16 + 2}, 1},       // d of block 3
        {"blk.1.ffn_gate.weight", MK_GGML_TYPE_Q4_K, 7 * 144 + 2, {inf16, inf16 + 2}, 1},     // dmin of block 7
        {"blk.2.attn_q.weight", MK_GGML_TYPE_Q6_K, 2 * 210 + 208, {ninf16, ninf16 + 2}, 2},   // d of block 2
        {"blk.0.attn_k.weight", MK_GGML_TYPE_Q4_1, 5 * 20 + 2, {nan16, nan16 + 2}, 0},        // m of block 5
        {"blk.0.ffn_up.weight", MK_GGML_TYPE_Q5_1, 4 * 24 + 2, {inf16, inf16 + 2}, 0},        // m of block 4
        {"blk.2.attn_output.weight", MK_GGML_TYPE_Q5_0, 6 * 22, {nan16, nan16 + 2}, 2},        // d of block 6
        {"blk.1.ffn_down.weight", MK_GGML_TYPE_Q5_K, 1 * 176 + 2, {ninf16, ninf16 + 2}, 1},   // dmin of block 1
        {"blk.0.ffn_gate.weight", MK_GGML_TYPE_Q3_K, 2 * 110 + 108, {nan16, nan16 + 2}, 0},   // d of block 2
        {"blk.2.ffn_down.weight", MK_GGML_TYPE_Q8_0, 34, {inf16, inf16 + 2}, 2},              // d of block 1
        {"blk.0.attn_v.weight", MK_GGML_TYPE_Q4_0, 9 * 18, {nan16, nan16 + 2}, 0},            // d of block 9
        {"blk.1.attn_v.weight", MK_GGML_TYPE_IQ4_NL, 3 * 18, {inf16, inf16 + 2}, 1},         // d of block 3
        {"blk.0.attn_q.weight", MK_GGML_TYPE_Q2_K, 2 * 84 + 82, {ninf16, ninf16 + 2}, 0},     // dmin of block 2
        {"blk.2.attn_k.weight", MK_GGML_TYPE_IQ4_XS, 1 * 136, {nan16, nan16 + 2}, 2},        // d of block 1
        {"blk.1.attn_output.weight", MK_GGML_TYPE_F16, 2 * 1001, {inf16, inf16 + 2}, 1},      // value 1001
        {"blk.2.ffn_up.weight", MK_GGML_TYPE_BF16, 2 * 77, {0xc0, 0x7f}, 2},                 // value 77
        {"blk.1.attn_norm.weight", MK_GGML_TYPE_F32, 4 * 13, {0x00, 0x00, 0xc0, 0x7f}, 1},   // value 13
        {"output.weight", MK_GGML_TYPE_Q8_0, 0, {nan16, nan16 + 2}, 2},                      // the tail's head
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.tensor);
        const std::string part = c.tensor;
        auto pick = [&](const std::string &p) {
            return part.find(p + ".weight") != std::string::npos && c.type != MK_GGML_TYPE_F32 ? c.type
                                                                                                 : (uint32_t)MK_GGML_TYPE_Q8_0;
        };
        int edits = 0;
        TempModel tm(pick, false, [&](const std::string &name, uint32_t type, uint8_t *bytes, size_t n) {
            if (name != c.tensor) return;
            ASSERT_EQ(type, c.type);
            ASSERT_LE(c.byte + c.bits.size(), n);
            std::memcpy(bytes + c.byte, c.bits.data(), c.bits.size());
            edits++;
        });
        ASSERT_EQ(edits, 1);
        ASSERT_TRUE(tm.model);
        for (mk_dtype mode : {MK_DTYPE_NATIVE, MK_DTYPE_F32}) {
            SCOPED_TRACE(mk_dtype_name(mode));
            mk_range_options o = native_options(1);
            o.backend.weight_dtype = mode;
            mk_range *r = nullptr;
            EXPECT_EQ(mk_range_create(tm.model.get(), 0, 2, &o, &r), MK_ERR_NONFINITE);
            EXPECT_EQ(r, nullptr);
            EXPECT_NE(std::string(mk_last_error()).find(c.tensor), std::string::npos) << mk_last_error();
            for (int64_t layer = 0; layer < 3; layer++) {
                const mk_status s = mk_range_create(tm.model.get(), layer, layer, &o, &r);
                if (layer == c.layer) {
                    EXPECT_EQ(s, MK_ERR_NONFINITE) << "layer " << layer;
                    EXPECT_EQ(r, nullptr);
                } else {
                    EXPECT_EQ(s, MK_OK) << "layer " << layer << ": " << mk_last_error();
                }
                mk_range_free(r);
                r = nullptr;
            }
        }
    }
}

// A prefill's path depends on its rows alone, not on what the range reserved: a prompt of
// exactly MK_NATIVE_GEMM_MIN_ROWS tokens (the tiled SGEMM) gives the same bits on a range
// reserved for exactly that many rows as on one reserved for more; one row fewer (the dot
// kernels) too.
TEST(NativeModelRows, PrefillBitsDoNotDependOnTheReservedRows) {
    TempModel tm([](const std::string &) { return (uint32_t)MK_GGML_TYPE_Q8_0; }, true);
    ASSERT_TRUE(tm.model);
    for (size_t rows : {(size_t)MK_NATIVE_GEMM_MIN_ROWS - 1, (size_t)MK_NATIVE_GEMM_MIN_ROWS}) {
        SCOPED_TRACE(std::to_string(rows) + " rows");
        std::vector<int32_t> prompt(rows);
        for (size_t i = 0; i < rows; i++) prompt[i] = (int32_t)((i * 11 + 5) % 40);
        mk_range_options exact = native_options(2), roomy = native_options(2);
        exact.max_batch_tokens = rows;
        const Decode a = decode_greedy(tm.model.get(), {}, exact, prompt, 1);
        const Decode b = decode_greedy(tm.model.get(), {}, roomy, prompt, 1);
        ASSERT_EQ(a.logits.size(), 1u);
        ASSERT_EQ(b.logits.size(), 1u);
        EXPECT_TRUE(bit_identical(a.logits[0], b.logits[0]));
    }
}

// Native mode on a source without a stored format (a random model) keeps F32 weights and
// the SGEMM products of the F32 mode; only attention accumulates in float instead of
// double, so the two agree to float rounding. The cuda backend refuses the mode.
TEST(NativeModelDigest, RandomModelInNativeModeEqualsF32Mode) {
    ModelPtr model = make_random_model(gqa_tied_hparams());
    mk_range_options native = mk_range_options_default();
    native.backend.weight_dtype = MK_DTYPE_NATIVE;
    const Decode a = decode_greedy(model.get(), {2}, native, {1, 2, 3}, 4);
    const Decode b = decode_greedy(model.get(), {2}, mk_range_options_default(), {1, 2, 3}, 4);
    ASSERT_EQ(a.logits.size(), 4u);
    ASSERT_EQ(b.logits.size(), 4u);
    EXPECT_EQ(a.tokens, b.tokens);
    for (size_t i = 0; i < 4; i++) {
        float scale = 0.0f;
        for (float x : b.logits[i]) scale = std::max(scale, std::fabs(x));
        for (size_t j = 0; j < b.logits[i].size(); j++) ASSERT_NEAR(a.logits[i][j], b.logits[i][j], 1e-5f * scale) << i;
    }
    mk_backend_config cuda = mk_backend_config_default(MK_BACKEND_CUDA);
    cuda.weight_dtype = MK_DTYPE_NATIVE;
    mk_range_options o = mk_range_options_default();
    o.backend = cuda;
    mk_range *r = nullptr;
    EXPECT_NE(mk_range_create(model.get(), 0, 4, &o, &r), MK_OK);
    EXPECT_EQ(r, nullptr);
}

} // namespace

namespace {

// The KV cache in F16: whole vs split bit-exact in both weight modes, close to the F32
// cache (keys and values rounded to F16), and bound into the recipe digest.
TEST(KvCacheF16, SplitsStayBitExactAndTheResultIsCloseToF32) {
    TempModel tm([](const std::string &) { return (uint32_t)MK_GGML_TYPE_Q8_0; }, true);
    ASSERT_TRUE(tm.model);
    const std::vector<int32_t> prompt = {5, 9, 33, 2, 17, 8};
    for (mk_dtype weights : {MK_DTYPE_NATIVE, MK_DTYPE_F32}) {
        SCOPED_TRACE(mk_dtype_name(weights));
        mk_range_options o = native_options(2);
        o.backend.weight_dtype = weights;
        const Decode f32_kv = decode_greedy(tm.model.get(), {}, o, prompt, 10);
        o.backend.kv_dtype = MK_DTYPE_F16;
        const Decode whole = decode_greedy(tm.model.get(), {}, o, prompt, 10, &f32_kv.tokens);
        const Decode split = decode_greedy(tm.model.get(), {0, 1}, o, prompt, 10, &f32_kv.tokens);
        ASSERT_EQ(whole.logits.size(), 10u);
        ASSERT_EQ(split.logits.size(), 10u);
        bool any_difference = false;
        for (size_t i = 0; i < 10; i++) {
            EXPECT_TRUE(bit_identical(whole.logits[i], split.logits[i])) << "step " << i;
            any_difference |= !bit_identical(whole.logits[i], f32_kv.logits[i]);
            float scale = 0.0f, worst = 0.0f;
            for (float v : f32_kv.logits[i]) scale = std::max(scale, std::fabs(v));
            for (size_t j = 0; j < whole.logits[i].size(); j++)
                worst = std::max(worst, std::fabs(whole.logits[i][j] - f32_kv.logits[i][j]));
            // F16 keeps 11 significant bits. With 8-bit activations (native) a small change
            // flips some rounding decisions, so the difference is of the activation
            // quantization's own size there.
            EXPECT_LE(worst, (weights == MK_DTYPE_NATIVE ? 0.1f : 2e-3f) * scale) << "step " << i;
        }
        EXPECT_TRUE(any_difference) << "the F16 cache was not used";
        Pipeline a(tm.model.get(), {1}, o);
        o.backend.kv_dtype = MK_DTYPE_F32;
        Pipeline b(tm.model.get(), {1}, o);
        MK_ASSERT_OK(a.status());
        MK_ASSERT_OK(b.status());
        EXPECT_STRNE(mk_range_recipe_digest(a.range(0)), mk_range_recipe_digest(b.range(0)));
    }
    mk_range_options bad = native_options(1);
    bad.backend.kv_dtype = MK_DTYPE_BF16;
    mk_range *r = nullptr;
    EXPECT_EQ(mk_range_create(tm.model.get(), 0, 2, &bad, &r), MK_ERR_DTYPE);
    EXPECT_EQ(r, nullptr);
}

} // namespace
