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

#include "cpu_ops.h"
#include "gguf.h"
#include "mk_test_util.h"

namespace {

// ---------------------------------------------------------------- quantizers (tests) --

void put_f16(std::vector<uint8_t> &o, float v) {
    const uint16_t h = mk_f32_to_f16(v);
    o.push_back((uint8_t)(h & 0xff));
    o.push_back((uint8_t)(h >> 8));
}

// ggml's formats written from their definition: nearest level, scale from the block range.
void quantize(uint32_t type, const float *x, size_t n, std::vector<uint8_t> &o) {
    if (type == MK_GGML_TYPE_F32) {
        o.insert(o.end(), (const uint8_t *)x, (const uint8_t *)(x + n));
        return;
    }
    if (type == MK_GGML_TYPE_F16 || type == MK_GGML_TYPE_BF16) {
        for (size_t i = 0; i < n; i++) {
            const uint16_t h = type == MK_GGML_TYPE_F16 ? mk_f32_to_f16(x[i]) : mk_f32_to_bf16(x[i]);
            o.push_back((uint8_t)(h & 0xff));
            o.push_back((uint8_t)(h >> 8));
        }
        return;
    }
    const size_t be = type == MK_GGML_TYPE_Q4_K || type == MK_GGML_TYPE_Q6_K ? 256 : 32;
    for (size_t b = 0; b < n / be; b++) {
        const float *v = x + b * be;
        float amax = 0, lo = v[0], hi = v[0];
        for (size_t i = 0; i < be; i++) {
            amax = std::max(amax, std::fabs(v[i]));
            lo = std::min(lo, v[i]);
            hi = std::max(hi, v[i]);
        }
        switch (type) {
            case MK_GGML_TYPE_Q8_0: {
                const float d = amax / 127;
                put_f16(o, d);
                const float dd = mk_f16_to_f32(mk_f32_to_f16(d));
                for (size_t i = 0; i < 32; i++) o.push_back((uint8_t)(int8_t)std::lround(dd ? v[i] / dd : 0));
                break;
            }
            case MK_GGML_TYPE_Q4_0: case MK_GGML_TYPE_Q4_1: {
                const bool min = type == MK_GGML_TYPE_Q4_1;
                const float d = min ? (hi - lo) / 15 : amax / 7, m = min ? lo : 0;
                put_f16(o, d);
                if (min) put_f16(o, m);
                const float dd = mk_f16_to_f32(mk_f32_to_f16(d)), mm = mk_f16_to_f32(mk_f32_to_f16(m));
                auto level = [&](float val) {
                    const long q = dd ? std::lround((val - mm) / dd) + (min ? 0 : 8) : (min ? 0 : 8);
                    return (uint8_t)std::min(15L, std::max(0L, q));
                };
                for (size_t i = 0; i < 16; i++) o.push_back((uint8_t)(level(v[i]) | (level(v[i + 16]) << 4)));
                break;
            }
            case MK_GGML_TYPE_Q4_K: {
                // One scale and min per super-block (sub-block scales 1, mins 1): coarse but
                // a valid Q4_K block that exercises every field.
                const float d = (hi - lo) / 15, m = -lo;
                put_f16(o, d);
                put_f16(o, m);
                const float dd = mk_f16_to_f32(mk_f32_to_f16(d)), mm = mk_f16_to_f32(mk_f32_to_f16(m));
                const uint8_t scales[12] = {1, 1, 1, 1, 1, 1, 1, 1, 0x11, 0x11, 0x11, 0x11};
                o.insert(o.end(), scales, scales + 12);
                auto level = [&](float val) {
                    const long q = dd ? std::lround((val + mm) / dd) : 0;
                    return (uint8_t)std::min(15L, std::max(0L, q));
                };
                for (int j = 0; j < 4; j++)
                    for (int l = 0; l < 32; l++)
                        o.push_back((uint8_t)(level(v[64 * j + l]) | (level(v[64 * j + 32 + l]) << 4)));
                break;
            }
            case MK_GGML_TYPE_Q6_K: {
                const float d = amax / 31; // every sub-block scale 1
                const float dd = mk_f16_to_f32(mk_f32_to_f16(d));
                uint8_t ql[128] = {}, qh[64] = {};
                for (int h = 0; h < 2; h++)
                    for (int k = 0; k < 4; k++)
                        for (int l = 0; l < 32; l++) {
                            const float val = v[128 * h + 32 * k + l];
                            const int q = (int)std::min(63L, std::max(0L, (dd ? std::lround(val / dd) : 0) + 32));
                            ql[64 * h + l + 32 * (k & 1)] |= (uint8_t)((q & 15) << (4 * (k >> 1)));
                            qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * k));
                        }
                o.insert(o.end(), ql, ql + 128);
                o.insert(o.end(), qh, qh + 64);
                for (int i = 0; i < 16; i++) o.push_back(1);
                put_f16(o, d);
                break;
            }
        }
    }
}

// --------------------------------------------------------------- GGUF writer (tests) --

struct GgufWriter {
    std::vector<uint8_t> head, data;
    uint64_t n_kv = 0, n_tensors = 0;
    std::vector<uint8_t> kv, infos;

    static void put(std::vector<uint8_t> &o, const void *p, size_t n) {
        o.insert(o.end(), (const uint8_t *)p, (const uint8_t *)p + n);
    }
    static void put_str(std::vector<uint8_t> &o, const std::string &s) {
        const uint64_t n = s.size();
        put(o, &n, 8);
        put(o, s.data(), s.size());
    }
    void kv_u32(const std::string &k, uint32_t v) {
        put_str(kv, k);
        const uint32_t t = MK_GGUF_TYPE_UINT32;
        put(kv, &t, 4);
        put(kv, &v, 4);
        n_kv++;
    }
    void kv_f32(const std::string &k, float v) {
        put_str(kv, k);
        const uint32_t t = MK_GGUF_TYPE_FLOAT32;
        put(kv, &t, 4);
        put(kv, &v, 4);
        n_kv++;
    }
    void kv_str(const std::string &k, const std::string &v) {
        put_str(kv, k);
        const uint32_t t = MK_GGUF_TYPE_STRING;
        put(kv, &t, 4);
        put_str(kv, v);
        n_kv++;
    }
    // A [rows, cols] tensor (cols fastest) of `type`, quantized from x.
    void tensor(const std::string &name, uint32_t type, const std::vector<float> &x, size_t rows, size_t cols) {
        while (data.size() % 32) data.push_back(0);
        const uint64_t offset = data.size();
        quantize(type, x.data(), x.size(), data);
        put_str(infos, name);
        const uint32_t n_dims = rows == 1 ? 1 : 2;
        put(infos, &n_dims, 4);
        const uint64_t d0 = cols, d1 = rows;
        put(infos, &d0, 8);
        if (n_dims == 2) put(infos, &d1, 8);
        put(infos, &type, 4);
        put(infos, &offset, 8);
        n_tensors++;
    }
    std::vector<uint8_t> bytes() const {
        std::vector<uint8_t> f;
        put(f, "GGUF", 4);
        const uint32_t version = 3;
        put(f, &version, 4);
        put(f, &n_tensors, 8);
        put(f, &n_kv, 8);
        put(f, kv.data(), kv.size());
        put(f, infos.data(), infos.size());
        while (f.size() % 32) f.push_back(0);
        put(f, data.data(), data.size());
        return f;
    }
};

// A random llama model with hidden 64, 4 heads (2 kv), head_dim 16, ffn 256, 3 layers,
// vocab 40; every matrix quantized to the type `pick` chooses for it.
struct TempModel {
    std::string path;
    ModelPtr model;
    template <typename Pick> explicit TempModel(Pick pick, bool tied) {
        const size_t hidden = 256, ffn = 512, layers = 3, vocab = 40, heads = 4, kv_heads = 2, hd = 64;
        std::mt19937 rng(77);
        std::normal_distribution<float> nd(0.0f, 0.08f), norm(1.0f, 0.05f);
        auto random = [&](size_t n, bool is_norm) {
            std::vector<float> v(n);
            for (auto &x : v) x = is_norm ? norm(rng) : nd(rng);
            return v;
        };
        GgufWriter w;
        w.kv_str("general.architecture", "llama");
        w.kv_u32("llama.context_length", 64);
        w.kv_u32("llama.embedding_length", (uint32_t)hidden);
        w.kv_u32("llama.block_count", (uint32_t)layers);
        w.kv_u32("llama.feed_forward_length", (uint32_t)ffn);
        w.kv_u32("llama.attention.head_count", (uint32_t)heads);
        w.kv_u32("llama.attention.head_count_kv", (uint32_t)kv_heads);
        w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
        w.kv_f32("llama.rope.freq_base", 10000.0f);
        w.tensor("token_embd.weight", pick("token_embd"), random(vocab * hidden, false), vocab, hidden);
        w.tensor("output_norm.weight", MK_GGML_TYPE_F32, random(hidden, true), 1, hidden);
        if (!tied) w.tensor("output.weight", pick("output"), random(vocab * hidden, false), vocab, hidden);
        for (size_t l = 0; l < layers; l++) {
            const std::string b = "blk." + std::to_string(l) + ".";
            w.tensor(b + "attn_norm.weight", MK_GGML_TYPE_F32, random(hidden, true), 1, hidden);
            w.tensor(b + "attn_q.weight", pick("attn_q"), random(heads * hd * hidden, false), heads * hd, hidden);
            w.tensor(b + "attn_k.weight", pick("attn_k"), random(kv_heads * hd * hidden, false), kv_heads * hd, hidden);
            w.tensor(b + "attn_v.weight", pick("attn_v"), random(kv_heads * hd * hidden, false), kv_heads * hd, hidden);
            w.tensor(b + "attn_output.weight", pick("attn_output"), random(hidden * heads * hd, false), hidden, heads * hd);
            w.tensor(b + "ffn_norm.weight", MK_GGML_TYPE_F32, random(hidden, true), 1, hidden);
            w.tensor(b + "ffn_gate.weight", pick("ffn_gate"), random(ffn * hidden, false), ffn, hidden);
            w.tensor(b + "ffn_up.weight", pick("ffn_up"), random(ffn * hidden, false), ffn, hidden);
            w.tensor(b + "ffn_down.weight", pick("ffn_down"), random(hidden * ffn, false), hidden, ffn);
        }
        char tmpl[] = "/tmp/mk_native_XXXXXX";
        const int fd = mkstemp(tmpl);
        EXPECT_GE(fd, 0);
        path = tmpl;
        const std::vector<uint8_t> bytes = w.bytes();
        EXPECT_EQ(write(fd, bytes.data(), bytes.size()), (ssize_t)bytes.size());
        close(fd);
        mk_model *m = nullptr;
        EXPECT_EQ(mk_model_open_gguf(path.c_str(), &m), MK_OK) << mk_last_error();
        model.reset(m);
    }
    ~TempModel() {
        model.reset();
        std::remove(path.c_str());
    }
};

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
    for (size_t i = 0; i < 8; i++) {
        // Root-mean-square error relative to the logits' RMS: a few percent from 8-bit
        // activations on this small random model (a wrong kernel gives ~100%).
        double ref_sq = 0.0, err_sq = 0.0;
        for (size_t j = 0; j < ref.logits[i].size(); j++) {
            ref_sq += (double)ref.logits[i][j] * ref.logits[i][j];
            const double e = (double)ref.logits[i][j] - whole.logits[i][j];
            err_sq += e * e;
        }
        EXPECT_LE(std::sqrt(err_sq / ref_sq), activations_quantized ? 0.06 : 1e-5) << "step " << i;
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
                                           Mix{"Q6_K", MK_GGML_TYPE_Q6_K, MK_GGML_TYPE_Q4_K, true},
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
